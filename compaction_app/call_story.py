"""A call's whole story for the API and the call page: the ledger's part
(sessions_app.call_story) with the compaction runs it names: the run the call triggered, the
runs whose summaries or placeholders it forwarded, and those reverted since."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from compaction_app.api.serializers import run_to_dict
from compaction_app.models import CompactionRun, Trigger
from sessions_app import call_story
from sessions_app.models import Call


def triggered_run(call: Call) -> CompactionRun | None:
    """The compaction the call ran while fitting (a gateway run of its session and thread
    begun between its arrival and its first send upstream)."""
    if call.session_id is None:
        return None
    return (
        CompactionRun.objects.filter(
            session_id=call.session_id,
            trigger=Trigger.GATEWAY,
            thread=call.thread,
            created_at__gte=call.started_at,
            created_at__lte=call_story.forwarded_at(call),
        )
        .order_by("created_at")
        .first()
    )


def call_story_document(
    *, user: AbstractBaseUser | AnonymousUser, call_id: Any
) -> tuple[Call, dict[str, Any]]:
    """The call (NotFound unless the user may see its session) and its story."""
    call = call_story.call_get(user=user, call_id=call_id)
    story = call_story.call_story(call=call)
    markers = story.pop("_markers")
    reverted = story.pop("_revertedMarkers")
    moment = call_story.forwarded_at(call)
    runs = {
        str(run.compaction_event_id): run
        for run in CompactionRun.objects.filter(compaction_event_id__in=markers + reverted)
    }
    triggered = triggered_run(call)
    story["compaction"] = run_to_dict(triggered) if triggered is not None else None
    story["runs"] = [
        {"markerId": marker, "compactionId": str(runs[marker].pk)}
        for marker in markers
        if marker in runs
    ]
    reverted_since = [
        runs[marker]
        for marker in reverted
        if marker in runs and (runs[marker].reverted_at or moment) > moment
    ]
    if reverted_since:
        story["request"]["notes"].insert(
            0,
            f"{len(reverted_since)} compaction run(s) in effect for this call were reverted "
            "since: what they had folded shows as kept here.",
        )
    summary_runs = {marker: str(runs[marker].pk) for marker in markers if marker in runs}
    for summary in story["request"]["summaries"]:
        summary["compactionId"] = summary_runs.get(summary["id"])
    return call, story
