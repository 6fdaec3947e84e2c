from django.urls import path

from sessions_app.api import call_views, search_views, views

urlpatterns = [
    path("sessions", views.SessionListView.as_view(), name="session-list"),
    path("sessions/<str:session_id>", views.SessionDetailView.as_view(), name="session-detail"),
    path(
        "sessions/<str:session_id>/events", views.SessionEventsView.as_view(), name="session-events"
    ),
    path(
        "sessions/<str:session_id>/threads",
        views.SessionThreadsView.as_view(),
        name="session-threads",
    ),
    path(
        "sessions/<str:session_id>/events/<str:event_id>",
        views.EventDetailView.as_view(),
        name="event-detail",
    ),
    path("sessions/<str:session_id>/usage", views.SessionUsageView.as_view(), name="session-usage"),
    path(
        "sessions/<str:session_id>/calls",
        call_views.SessionCallsView.as_view(),
        name="session-calls",
    ),
    path("calls", call_views.CallsView.as_view(), name="calls"),
    path("usage/calls", call_views.UsageOverTimeView.as_view(), name="usage-calls"),
    path("tokens/count", views.TokenCountView.as_view(), name="tokens-count"),
    path("models", views.ModelListView.as_view(), name="model-list"),
    # Search and recall (sessions_app/api/search_views.py).
    path(
        "sessions/<str:session_id>/search",
        search_views.SessionSearchView.as_view(),
        name="session-search",
    ),
    path("search", search_views.SearchView.as_view(), name="search"),
    path(
        "sessions/<str:session_id>/recall", search_views.RecallView.as_view(), name="session-recall"
    ),
]
