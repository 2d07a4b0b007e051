"""The sweeper's read-only scan: generation work that no task will finish."""

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models.functions import Coalesce
from django.utils import timezone

from icrlhf.generation.models import Candidate, Generation


@dataclass(frozen=True)
class Sweep:
    prepare: list[int]  # generation ids to prepare again
    generate: list[int]  # candidate ids to generate again
    rank: list[int]  # finished generation ids to rank again


def generations_sweep(*, broker_backlog: int) -> Sweep:
    """Finds generation work that no task will finish, and says what to enqueue again.

    A running row whose lease expired lost its worker (killed, out of memory): it is claimable
    again (and a candidate out of attempts fails when its task claims it). A pending row has a
    message in the broker, unless the broker lost it (a restart). Rows that have waited longer
    than any retry would are stale; when the broker holds fewer messages (`broker_backlog`)
    than there are stale rows, some of their messages are certainly lost, and all of them are
    enqueued again. Counting rather than asking for an empty broker: the periodic tasks'
    own messages pass through the queues every second. Enqueuing twice is harmless: every
    task claims its row with a conditional UPDATE.
    """
    now = timezone.now()
    generate = set(
        Candidate.objects.filter(
            status=Candidate.Status.RUNNING, lease_expires_at__lt=now
        ).values_list("pk", flat=True)
    )
    prepare = set(
        Generation.objects.filter(
            status=Generation.Status.PREPARING, lease_expires_at__lt=now
        ).values_list("pk", flat=True)
    )
    lost_before = now - timedelta(seconds=settings.GENERATION_LOST_AFTER_S)
    stale_prepare = set(
        Generation.objects.filter(
            status=Generation.Status.PENDING, created_at__lt=lost_before
        ).values_list("pk", flat=True)
    )
    stale_candidates = list(
        Candidate.objects.filter(
            status=Candidate.Status.PENDING, generation__status=Generation.Status.RUNNING
        )
        # Waiting since its retry (or its ask for a share of the endpoint) was due, its
        # latest attempt, or its generation's preparation: a candidate waiting for a share
        # asks again every few seconds and is never stale while it does.
        .annotate(waiting_since=Coalesce("retry_at", "started_at", "generation__prepared_at"))
        .filter(waiting_since__lt=lost_before)
        .values_list("pk", "generation_id", "started_at")
    )
    stale_generate = {pk for pk, _, _ in stale_candidates}
    # The messages they wait for: a generation's never-started candidates share one; a
    # candidate that is waiting for its retry has its own.
    stale_generate_messages = len(
        {
            ("candidate", pk) if started else ("generation", generation)
            for pk, generation, started in stale_candidates
        }
    )
    # Within a day: older finished generations were never ranked (they predate ranking).
    stale_rank = set(
        Generation.objects.filter(
            status=Generation.Status.DONE,
            ranked_at__isnull=True,
            finished_at__lt=lost_before,
            finished_at__gt=now - timedelta(days=1),
        ).values_list("pk", flat=True)
    )
    if broker_backlog >= len(stale_prepare) + stale_generate_messages + len(stale_rank):
        stale_prepare, stale_generate, stale_rank = set(), set(), set()
    return Sweep(
        prepare=sorted(prepare | stale_prepare),
        generate=sorted(generate | stale_generate),
        rank=sorted(stale_rank),
    )
