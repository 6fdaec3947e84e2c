from django.apps import AppConfig


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    verbose_name = "Sessions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from sessions_app import (
            exact_counts,
            receivers,  # noqa: F401  (connects the search receivers)
        )
        from sessions_app.signals import events_appended

        events_appended.connect(
            exact_counts.on_events_appended, dispatch_uid="sessions_app.exact_counts"
        )
