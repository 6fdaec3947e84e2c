from django.apps import AppConfig


class CompactionAppConfig(AppConfig):
    name = "compaction_app"
    verbose_name = "Compaction"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register signal receivers, strategies and summarizers.
        from compaction_app import receivers, revocation  # noqa: F401
        from compaction_app.dashboard import login_throttle  # noqa: F401
        from compaction_app.summarizers import registry  # noqa: F401
