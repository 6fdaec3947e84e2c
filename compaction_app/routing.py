from django.urls import path

from compaction_app import consumers

websocket_urlpatterns = [
    path("ws/sessions/", consumers.SessionsConsumer.as_asgi()),
    path("ws/sessions/<uuid:session_id>/", consumers.SessionConsumer.as_asgi()),
]
