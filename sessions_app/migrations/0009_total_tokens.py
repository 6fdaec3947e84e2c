"""A provider usage stored without its total now has prompt + completion as its total (the
append does so from now on): the events that lack one get it, and their sessions'
reported_total_tokens counter is summed again from their events."""

from django.db import migrations
from django.db.models import Q, Sum, Value
from django.db.models.functions import Coalesce


def fill_totals(apps, schema_editor):
    Event = apps.get_model("sessions_app", "Event")
    Session = apps.get_model("sessions_app", "Session")
    missing = Event.objects.filter(total_tokens__isnull=True).filter(
        Q(prompt_tokens__isnull=False) | Q(completion_tokens__isnull=False)
    )
    session_ids = list(missing.values_list("session_id", flat=True).distinct())
    missing.update(
        total_tokens=Coalesce("prompt_tokens", Value(0)) + Coalesce("completion_tokens", Value(0))
    )
    for session_id in session_ids:
        total = Event.objects.filter(session_id=session_id).aggregate(t=Sum("total_tokens"))["t"]
        Session.objects.filter(pk=session_id).update(reported_total_tokens=total or 0)


class Migration(migrations.Migration):
    dependencies = [("sessions_app", "0008_calls")]

    operations = [migrations.RunPython(fill_totals, migrations.RunPython.noop)]
