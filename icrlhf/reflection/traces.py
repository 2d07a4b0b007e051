"""What the reflector reads: decisions where the queue's first candidate lost, each as a dual
trace (the answers reviewers rejected beside the one they preferred, with their reasons),
redacted and clipped."""

from dataclasses import dataclass

from django.db.models import Q

from icrlhf.generation.models import Candidate
from icrlhf.integrations.redaction import redact
from icrlhf.queues.models import Queue
from icrlhf.review.models import Decision

# Enough of an answer to see what it does; a batch of ten stays within a small model's window.
TEXT_MAX_CHARS = 400
RIVALS_MAX = 2


@dataclass(frozen=True)
class DualTrace:
    decision_id: int
    request: str
    rejected: list[str]  # the ranking's first first
    preferred: str  # "" when none was acceptable
    verdict: str
    reasons: list[str]
    comment: str


def _clip(text: str) -> str:
    text = redact(" ".join(text.split())).text
    return text if len(text) <= TEXT_MAX_CHARS else text[: TEXT_MAX_CHARS - 1] + "…"


def losing_decisions(queue: Queue, *, after_id: int | None, limit: int) -> list[Decision]:
    """The queue's standing decisions newer than `after_id` whose first candidate (the
    ranking's) was not taken as it was, newest first."""
    won = Q(verdict=Decision.Verdict.CHOSEN, chosen_candidate__rank=1)
    found = Decision.objects.standing().filter(item__queue=queue).exclude(won)
    if after_id is not None:
        found = found.filter(pk__gt=after_id)
    return list(found.select_related("item").order_by("-pk")[:limit])


def dual_traces(decisions: list[Decision]) -> list[DualTrace]:
    answers: dict[int, list[Candidate]] = {}
    for candidate in Candidate.objects.filter(
        generation_id__in=[d.generation_id for d in decisions], status=Candidate.Status.DONE
    ).order_by("rank", "position"):
        answers.setdefault(candidate.generation_id, []).append(candidate)
    traces = []
    for decision in decisions:
        rivals = [
            c.text
            for c in answers.get(decision.generation_id, [])
            if c.pk != decision.chosen_candidate_id or decision.verdict == Decision.Verdict.EDITED
        ]
        traces.append(
            DualTrace(
                decision_id=decision.pk,
                request=_clip(decision.item.input_text),
                rejected=[_clip(text) for text in rivals[:RIVALS_MAX]],
                preferred=_clip(decision.final_text),
                verdict=decision.verdict,
                reasons=list(decision.reason_tags),
                comment=_clip(decision.comment),
            )
        )
    return traces
