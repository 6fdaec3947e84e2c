"""`memory_flush` fires with the events a run is about to fold (kwargs: session_id, run_id,
events), so other code can save what matters before it leaves the active context."""

from django.dispatch import Signal

memory_flush = Signal()
