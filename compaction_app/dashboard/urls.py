from django.urls import path

from compaction_app.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.sessions_list, name="sessions"),
    path("get-started/", views.get_started, name="get-started"),
    path("calls/", views.calls_list, name="calls"),
    path("calls/<uuid:call_id>/", views.call_detail, name="call"),
    path("usage/", views.usage, name="usage"),
    path("sessions/<uuid:session_id>/", views.session_detail, name="session"),
    path("sessions/<uuid:session_id>/calls/", views.session_calls, name="session-calls"),
    path(
        "sessions/<uuid:session_id>/compact/preview/",
        views.compaction_preview,
        name="compaction-preview",
    ),
    path("sessions/<uuid:session_id>/compact/", views.compaction_start, name="compaction-start"),
    path(
        "sessions/<uuid:session_id>/auto-compact/",
        views.auto_compact_toggle,
        name="auto-compact",
    ),
    path(
        "sessions/<uuid:session_id>/compactions/<uuid:run_id>/",
        views.compaction_detail,
        name="compaction",
    ),
    path(
        "sessions/<uuid:session_id>/compactions/<uuid:run_id>/revert/",
        views.compaction_revert,
        name="compaction-revert",
    ),
    path("sessions/<uuid:session_id>/search/", views.session_search, name="session-search"),
    path(
        "sessions/<uuid:session_id>/events/<uuid:event_id>/pin/",
        views.event_pin,
        name="event-pin",
    ),
]
