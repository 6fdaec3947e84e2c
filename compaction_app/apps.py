from django.apps import AppConfig


class CompactionAppConfig(AppConfig):
    name = "compaction_app"
    verbose_name = "Compaction"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register signal receivers, strategies and summarizers.
        # Registered in every process (web servers too), not only in workers: the services
        # send tasks by name through compaction_app.enqueue.
        from compaction_app import (
            receivers,  # noqa: F401
            tasks,  # noqa: F401
        )
        from compaction_app.dashboard import login_throttle  # noqa: F401
        from compaction_app.realtime import revocation  # noqa: F401
        from compaction_app.summarizers import registry  # noqa: F401
