"""A call's log row and its run's step, written after its answer, then its capture.

The view hands the row over to the call-log journal (`integrations.journal`: one Redis round
trip, durable) and answers; the writer (`manage.py call_log_writer`, or with
CALL_LOG_WRITER=gateway a thread of each gateway process) writes it, one writer across all
processes, in the order the calls were answered. An application that posts feedback on a
call as soon as it has the answer finds the row: the feedback waits while the row is still in
the journal (`trajectories.feedback`). A writer killed mid-burst leaves its rows in the
journal; the next writer, or the worker's sweep while no writer runs, writes them. A row the
database keeps refusing is set aside as a dead letter (counted on the gateway's /healthz and,
for admins, on the web app's call log page); an operator lists them, writes them again once
the cause is fixed, or discards them (`manage.py call_log_dead_letters`). Nothing stays in the
journal longer than the call log's retention.

Without Redis (the tests' cache) the row is written in place, before the answer."""

import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, close_old_connections

from icrlhf.gateway import capture
from icrlhf.gateway.models import Call
from icrlhf.gateway.services import CallLogged, call_record
from icrlhf.ingest.models import IntegrationToken
from icrlhf.integrations import journal
from icrlhf.queues.models import Queue

logger = logging.getLogger(__name__)

# Captures have threads of their own: however many wait, the writer stays free (what is still
# waiting when the process stops is captured by the sweep).
_capture_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gateway-capture")


def call_log(logged: CallLogged) -> None:
    """Log the call: through the journal, or in place when there is none (or it cannot be
    reached: a row written late is better than one lost)."""
    if journal.available():
        try:
            journal.add(
                journal.CALLS, logged.call_id, asdict(logged), run=_run(logged), keep_s=_keep_s()
            )
            return
        except journal.JournalUnavailable as error:
            logger.warning("Call %s logged in place: %s", logged.call_id, error)
    _written(call_record(logged))


def _run(logged: CallLogged) -> journal.Run:
    """The run the call's step joins, as far as the view knows it: its token's and end user's
    run under its key (or, unnamed, whichever of theirs its messages continue)."""
    return journal.Run(
        owner=str(logged.token_id), end_user=logged.end_user, key=logged.trajectory_key
    )


def _keep_s() -> float:
    """Nothing waits in the journal, nor as a dead letter, longer than the call log keeps
    what end users wrote (CALL_RETENTION_DAYS; 0, forever: the journal's own longest)."""
    days = settings.CALL_RETENTION_DAYS
    return days * 24 * 3600.0 if days > 0 else journal.KEEP_S


# The database down or busy: the entry waits, without counting a try towards a dead letter.
_TRANSIENT = (OperationalError, InterfaceError)


def entry_write(entry: dict[str, Any]) -> None:
    """A journal entry's row, written (the writer's `write`). What was deleted since the
    answer is deleted from the row as the database would have (a queue takes its calls with
    it, a token leaves them without one): else the entry would fail on every try. Looked for
    only once the row is refused: two queries of every row's eight otherwise."""
    close_old_connections()  # the writer's thread lives as long as its process
    logged = CallLogged.of_entry(entry)
    try:
        _written(call_record(logged))
        return
    except IntegrityError:  # the keys are checked as the row commits
        if not Queue.objects.filter(pk=logged.queue_id).exists():
            return
        token_id = logged.token_id
        if token_id is None or IntegrationToken.objects.filter(pk=token_id).exists():
            raise  # neither was deleted: the row itself is refused
    _written(call_record(replace(logged, token_id=None)))


def _written(call: Call | None) -> None:
    """Send the call to review if it was chosen for it, on a thread nobody waits for: a
    capture never delays the next row."""
    if call is not None and call.capture in capture.CAPTURING:
        _capture_threads.submit(_captured, call.pk)


def _captured(call_id: uuid.UUID) -> None:
    close_old_connections()
    try:
        capture.call_capture(call_id=call_id)
    except Exception:
        logger.exception("Gateway call %s could not be captured", call_id)


def writer() -> journal.Writer:
    """The call log's writer, for its process (or a gateway's) to start, and stop at its end."""
    return journal.Writer(journal.CALLS, entry_write, keep_s=_keep_s(), transient=_TRANSIENT)


def journal_sweep() -> int:
    """Write the rows no gateway is writing (the worker's periodic sweep)."""
    return journal.sweep(journal.CALLS, entry_write, keep_s=_keep_s(), transient=_TRANSIENT)


@dataclass(frozen=True)
class JournalState:
    """How the journal stands: "none" (the cache is not Redis: rows are written in place),
    "unreachable" (Redis is down: the same, until it is back) or "up", with its figures."""

    state: Literal["none", "unreachable", "up"]
    waiting: int = 0  # calls answered whose rows are still to be written
    dead_letters: int = 0  # rows the database kept refusing, set aside
    tries: int = journal.TRIES  # refusals after which a row is set aside
    keep_days: float = 0.0  # how long anything stays in the journal


def journal_state() -> JournalState:
    keep_days = min(_keep_s(), journal.KEEP_S) / (24 * 3600)  # the journal's own longest
    if not journal.available():
        return JournalState(state="none", keep_days=keep_days)
    try:
        counts = journal.counts(journal.CALLS)
    except journal.JournalUnavailable:
        return JournalState(state="unreachable", keep_days=keep_days)
    return JournalState(
        state="up",
        waiting=counts.waiting,
        dead_letters=counts.dead_letters,
        tries=journal.TRIES,
        keep_days=keep_days,
    )


def journal_health() -> str:
    """The journal's line on the health page: what waits to be written, and what was set
    aside (dead letters: rows the database kept refusing, in the gateway's log)."""
    state = journal_state()
    if state.state == "none":
        return "call log journal: none (the cache is not Redis: rows are written in place)"
    if state.state == "unreachable":
        return "call log journal: unreachable (rows are written in place)"
    return f"call log journal: {state.waiting} waiting, {state.dead_letters} dead letters"


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter as an operator sees it: never what the end user wrote."""

    call_id: str
    queue_id: int
    queue: str  # its slug, or "" when the queue was deleted since
    answered_at: datetime
    failed_at: datetime
    tries: int
    error: str  # the last error's first line: a database's later lines may quote the row


def dead_letters() -> list[DeadLetter]:
    """The call log's dead letters, newest first (none without a journal). Raises
    journal.JournalUnavailable when Redis cannot be reached."""
    if not journal.available():
        return []
    letters = journal.dead_letters(journal.CALLS)
    queue_ids = {int(letter["entry"]["queue_id"]) for letter in letters}
    slugs = dict(Queue.objects.filter(pk__in=queue_ids).values_list("pk", "slug"))
    return [
        DeadLetter(
            call_id=str(letter["key"]),
            queue_id=int(letter["entry"]["queue_id"]),
            queue=slugs.get(int(letter["entry"]["queue_id"]), ""),
            answered_at=datetime.fromisoformat(letter["entry"]["answered_at"]),
            failed_at=datetime.fromtimestamp(letter["failed_at"], tz=UTC),
            tries=int(letter.get("tries", journal.TRIES)),
            error=journal.error_line(str(letter["error"])),
        )
        for letter in letters
    ]


def dead_letters_retry() -> journal.Retried:
    """Write the dead letters again as the writer would (`entry_write`), once their cause is
    fixed: those written leave, the others stay with their new error; those past the call
    log's retention leave unwritten."""
    if not journal.available():
        return journal.Retried(written=0, kept=0, expired=0)
    return journal.dead_letters_retry(journal.CALLS, entry_write, keep_s=_keep_s())


def dead_letters_discard() -> int:
    """Drop the dead letters (rows that will never be written); returns how many."""
    if not journal.available():
        return 0
    return journal.dead_letters_discard(journal.CALLS)
