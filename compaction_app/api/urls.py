from django.urls import path

from compaction_app.api import calls, context, views

urlpatterns = [
    path("calls/<str:call_id>", calls.CallDetailView.as_view(), name="call-detail"),
    path(
        "sessions/<str:session_id>/context",
        context.SessionContextView.as_view(),
        name="session-context",
    ),
    path(
        "sessions/<str:session_id>/compactions",
        views.SessionCompactionsView.as_view(),
        name="session-compactions",
    ),
    path(
        "sessions/<str:session_id>/summary",
        views.SessionSummaryView.as_view(),
        name="session-summary",
    ),
    path(
        "compactions/<str:compaction_id>",
        views.CompactionDetailView.as_view(),
        name="compaction-detail",
    ),
    path(
        "compactions/<str:compaction_id>/revert",
        views.CompactionRevertView.as_view(),
        name="compaction-revert",
    ),
]
