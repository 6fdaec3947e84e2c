from django.urls import path

from compaction_app.dashboard import consumers as dashboard_consumers
from compaction_app.realtime import consumers

websocket_urlpatterns = [
    path("ws/sessions/", consumers.SessionsConsumer.as_asgi()),
    path("ws/sessions/<uuid:session_id>/", consumers.SessionConsumer.as_asgi()),
    # HTML fragments for the dashboard's htmx ws extension.
    path("ws/dashboard/sessions/", dashboard_consumers.DashboardSessionsConsumer.as_asgi()),
    path(
        "ws/dashboard/sessions/<uuid:session_id>/",
        dashboard_consumers.DashboardSessionConsumer.as_asgi(),
    ),
]
