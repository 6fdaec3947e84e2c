from django.urls import path

from compaction_app.gateway import views

app_name = "gateway"

urlpatterns = [
    path("openai/v1/chat/completions", views.openai_chat_completions, name="openai-chat"),
    path("openai/v1/models", views.openai_models, name="openai-models"),
    path("anthropic/v1/messages", views.anthropic_messages, name="anthropic-messages"),
    path(
        "anthropic/v1/messages/count_tokens",
        views.anthropic_count_tokens,
        name="anthropic-count-tokens",
    ),
]
