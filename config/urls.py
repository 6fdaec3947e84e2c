from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from compaction_app.api.metrics import metrics_view
from compaction_app.api.root import ApiRootView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", ApiRootView.as_view(), name="api-root"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include("sessions_app.api.urls")),
    path("api/v1/", include("compaction_app.api.urls")),
    path("gateway/", include("compaction_app.gateway.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("compaction_app.dashboard.urls")),
]

handler404 = "sessions_app.api.errors.not_found"
handler500 = "sessions_app.api.errors.server_error"
