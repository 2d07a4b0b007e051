"""How long the gateway keeps what end users wrote: CALL_RETENTION_DAYS.

A call older than that loses everything end users wrote or that identifies them: its
request, the caller's context, the answer and its tool calls, the call's options (`user`,
tools), its error (an upstream may quote the request) and the request's digest; its figures
(source, timings, tokens, scores, holdout, status) stay for the dashboard. A captured call's review
item is the queue's own data and keeps what review needs (its words, redacted, and the
tools offered), never the end user the call named (`user` is not copied). Steps
and feedback that old lose their words even while their run goes on; a run whose last step
is that old loses its key and its end user too (trajectories.services.trajectories_purge)."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from icrlhf.gateway.models import Call
from icrlhf.trajectories.services import trajectories_purge

PURGED = ""


def calls_purge(*, now: datetime) -> int:
    """Blanks the personal content of calls past the retention period; returns how many.
    CALL_RETENTION_DAYS = 0 keeps them forever."""
    days = settings.CALL_RETENTION_DAYS
    if days <= 0:
        return 0
    before = now - timedelta(days=days)
    expired = Call.objects.filter(created_at__lt=before).filter(
        ~Q(request_text=PURGED)
        | ~Q(answer_text=PURGED)
        | ~Q(context=[])
        | ~Q(tool_calls=[])
        | ~Q(options={})
        | ~Q(error=PURGED)
        | ~Q(request_hash=PURGED)
    )
    # The runs these calls made up hold the same words: their steps, goals and feedback.
    trajectories_purge(before=before)
    return expired.update(
        request_text=PURGED,
        context=[],
        answer_text=PURGED,
        tool_calls=[],
        options={},
        error=PURGED,
        request_hash=PURGED,
    )
