"""What the item page says while candidates are coming: the generation's state in words, each
waiting candidate's, and failures as a reviewer can read them (the raw text is for admins)."""

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings

from icrlhf.generation.models import Candidate, Generation

# A finished generation is ranked by the memory worker soon after; the page keeps polling
# until then, so that it shows the order a reload would show. Past this, it stops waiting.
RANKING_WAIT = timedelta(seconds=30)

# The errors the LLM integration writes are "<kind>: <upstream's detail>", possibly after
# one of these prefixes (icrlhf/generation/pipeline.py).
_RETRYING = "Retrying: "
_GAVE_UP = re.compile(r"^Gave up after (\d+) attempts\. ")
_KIND = re.compile(r"^([A-Z][^:\n]{2,80}): (.+)$", re.DOTALL)
_TIMEOUT_KIND = "The model did not answer in time"


@dataclass(frozen=True)
class Problem:
    summary: str  # for every reviewer
    detail: str  # the upstream's own words: admins only ("" for everyone else)


@dataclass(frozen=True)
class Waiting:
    state: str
    elapsed_s: int


def generation_settled(*, generation: Generation, decided: bool, now: datetime) -> bool:
    """Nothing on the page can change any more without the reviewer: the generation is
    finished and ranked (or failed, decided on, or its ranking long overdue)."""
    if not generation.is_finished:
        return False
    return (
        generation.status == Generation.Status.FAILED
        or generation.ranked_at is not None
        or decided
        or generation.finished_at is None
        or now - generation.finished_at > RANKING_WAIT
    )


def candidate_problem(*, candidate: Candidate, show_detail: bool) -> Problem:
    """A candidate's error as a sentence: "The model did not answer within 60 s", not the
    client library's exception text."""
    message = candidate.error.removeprefix(_RETRYING)
    gave_up = _GAVE_UP.match(message)
    message = message[gave_up.end() :] if gave_up else message
    kind = _KIND.match(message)
    summary, detail = (kind.group(1), kind.group(2)) if kind else (message, "")
    if summary == _TIMEOUT_KIND:
        summary = f"The model did not answer within {settings.LLM_TIMEOUT_S:g} s"
    if gave_up:
        summary = f"{summary}; gave up after {gave_up.group(1)} attempts"
    return Problem(summary=summary, detail=detail if show_detail else "")


def candidate_waiting(*, candidate: Candidate, now: datetime) -> str:
    """A pending or running candidate's state: queued, generating, or retrying and when."""
    retrying = candidate.error.startswith(_RETRYING)
    # `attempts` counts the tries claimed so far, the first one included; the numbers are
    # capped, so that a redelivered task never reads as "retry 4 of 3".
    most = settings.LLM_MAX_RETRIES
    retry = f"retry {min(max(candidate.attempts - 1, 1), most)} of {most}"
    if candidate.status == Candidate.Status.RUNNING:
        started = candidate.started_at or now
        seconds = max(0, int((now - started).total_seconds()))
        return f"Generating ({retry}), {seconds} s…" if retrying else f"Generating, {seconds} s…"
    if retrying:
        summary = candidate_problem(candidate=candidate, show_detail=False).summary
        attempt = f"retrying ({min(max(candidate.attempts, 1), most)} of {most})"
        if candidate.retry_at is not None and candidate.retry_at > now:
            left = int((candidate.retry_at - now).total_seconds()) + 1
            return f"{summary}; {attempt} in {left} s."
        return f"{summary}; {attempt} now."
    return "Queued for the model."


def generation_waiting(
    *, generation: Generation, candidates: list[Candidate], ahead: int, now: datetime
) -> Waiting | None:
    """The generation's state while the reviewer waits for it; None once all have arrived."""
    elapsed = max(0, int((now - generation.created_at).total_seconds()))
    if generation.status == Generation.Status.PENDING:
        state = f"queued, {ahead} ahead" if ahead else "queued, next in line"
    elif generation.status == Generation.Status.PREPARING:
        state = "retrieving examples"
    elif generation.status == Generation.Status.RUNNING:
        statuses = {c.status for c in candidates}
        if Candidate.Status.RUNNING in statuses:
            state = "generating"
        elif any(c.retry_at is not None and c.retry_at > now for c in candidates):
            state = "retrying"
        else:
            state = f"waiting for the model, {ahead} ahead" if ahead else "waiting for the model"
    else:
        return None
    return Waiting(state=state, elapsed_s=elapsed)


def generations_ahead(*, generation: Generation) -> int:
    """Unfinished generations older than this one, in any queue: the workers take them first."""
    if generation.is_finished:
        return 0
    return Generation.objects.filter(
        status__in=[
            Generation.Status.PENDING,
            Generation.Status.PREPARING,
            Generation.Status.RUNNING,
        ],
        created_at__lt=generation.created_at,
    ).count()
