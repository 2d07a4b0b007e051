"""The call log's dead letters as an operator handles them, on the machine's Redis and the
test database: `manage.py call_log_dead_letters` lists them (never what the end user wrote),
writes them again once their cause is fixed (`--retry`), or drops them (`--discard`)."""

import io
import json
import uuid
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from icrlhf.gateway import call_log
from icrlhf.gateway.models import Call
from icrlhf.gateway.services import CallLogged
from icrlhf.integrations import journal
from tests.factories import QueueFactory
from tests.support.caches import cache_in_redis

pytestmark = [
    pytest.mark.django_db(transaction=True),  # the writer closes its connection, as in its thread
    pytest.mark.usefixtures("redis_cache"),
]

SECRET = "My IBAN is DE89 3704 0044 0532 0130 00"


def answered(queue: Any, *, refused: bool = False) -> str:
    """A call answered and handed over to the journal; `refused`: its row holds a number no
    database stores (what 1e999 was before the gateway refused it), as a row it refuses."""
    logged = CallLogged(
        call_id=str(uuid.uuid4()),
        queue_id=queue.pk,
        token_id=None,
        answered_at=timezone.now().isoformat(),
        stream=False,
        source="model",
        memory="empty",
        request_text=SECRET,
        context=[{"role": "user", "content": SECRET}],
        request_hash="hash",
        options={"limit": float("inf")} if refused else {},
        examples=[],
        top_score=None,
        retrieval_ms=1.0,
        holdout=False,
        capture="",
        memory_confidence=None,
        trajectory_key="",
        end_user="",
        model="the-model",
        answer_text="Answer.",
        total_ms=10.0,
        continuation_hash="",
        prefix_hashes={},
        tool_names=[],
    )
    call_log.call_log(logged)
    return logged.call_id


def set_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer writes what waits: a refused row is a dead letter at its first try."""
    monkeypatch.setattr(journal, "TRIES", 1)
    call_log.writer().drain()


def fixed(call_id: str) -> None:
    """The cause of a dead letter fixed: its row is one the database stores."""
    dead = journal._dead_key(journal.CALLS)
    client = journal._client()
    for at, raw in enumerate(client.lrange(dead, 0, -1)):
        letter = json.loads(raw)
        if letter["key"] == call_id:
            letter["entry"]["options"] = {}
            client.lset(dead, at, json.dumps(letter))


def command(*args: str) -> str:
    out = io.StringIO()
    call_command("call_log_dead_letters", *args, stdout=out)
    return out.getvalue()


def test_the_list_names_each_dead_letter_and_never_what_the_end_user_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue, gone = QueueFactory(slug="helpdesk"), QueueFactory(slug="gone")
    refused = answered(queue, refused=True)
    written = answered(queue)
    orphan = answered(gone, refused=True)
    set_aside(monkeypatch)
    assert Call.objects.filter(pk=written).exists()
    gone_id = gone.pk
    gone.delete()

    listed = command()

    assert SECRET not in listed and "DE89" not in listed  # PostgreSQL's 2nd line quotes it
    first, second, total = listed.splitlines()
    assert first.startswith(f"{orphan}  queue #{gone_id} (deleted)  answered ")
    assert second.startswith(f"{refused}  queue helpdesk  answered ")
    assert "  tries 1  " in first
    assert "Error: " in first  # the error's first line: DataError or IntegrityError
    assert total == "2 dead letters."

    report = json.loads(command("--json").splitlines()[-1])
    assert report["count"] == 2
    assert [letter["call_id"] for letter in report["dead_letters"]] == [orphan, refused]
    assert report["dead_letters"][1]["queue"] == "helpdesk"
    assert report["dead_letters"][1]["tries"] == 1
    assert SECRET not in json.dumps(report)


def test_retry_writes_those_whose_cause_was_fixed_and_keeps_the_others_with_their_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = QueueFactory(slug="helpdesk")
    mended, still_refused = answered(queue, refused=True), answered(queue, refused=True)
    set_aside(monkeypatch)
    fixed(mended)

    said = command("--retry")

    assert Call.objects.get(pk=mended).queue == queue
    assert not Call.objects.filter(pk=still_refused).exists()
    assert "1 written, 1 failed again (kept, with their error), 0 too old to keep" in said
    assert said.startswith(f"{still_refused}  queue helpdesk  answered ")  # what is left
    assert SECRET not in said
    [letter] = call_log.dead_letters()
    assert (letter.call_id, letter.tries) == (still_refused, 2)

    fixed(still_refused)
    report = json.loads(command("--retry", "--json").splitlines()[-1])
    assert report == {"written": 1, "kept": 0, "expired": 0, "dead_letters": []}
    assert Call.objects.filter(pk=still_refused).exists()
    assert journal.counts(journal.CALLS) == journal.Counts(waiting=0, dead_letters=0)


def test_a_letter_past_the_call_logs_retention_is_dropped_unwritten_by_a_retry(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.CALL_RETENTION_DAYS = 1
    old = answered(QueueFactory(), refused=True)
    set_aside(monkeypatch)
    fixed(old)
    later = journal.time.time() + 24 * 3600 + 1
    monkeypatch.setattr(journal.time, "time", lambda: later)

    report = json.loads(command("--retry", "--json").splitlines()[-1])

    assert (report["written"], report["expired"]) == (0, 1)
    assert not Call.objects.filter(pk=old).exists()


def test_discard_drops_them_and_says_how_many(monkeypatch: pytest.MonkeyPatch) -> None:
    queue = QueueFactory()
    answered(queue, refused=True)
    answered(queue, refused=True)
    set_aside(monkeypatch)

    assert command("--discard") == "2 dead letters discarded.\n"

    assert call_log.dead_letters() == []
    assert json.loads(command("--discard", "--json")) == {"discarded": 0}


def test_without_a_journal_there_is_nothing_to_list(settings: Any) -> None:
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

    assert "No journal" in command()
    assert json.loads(command("--retry", "--json")) == {"journal": "none"}


def test_a_redis_out_of_reach_is_a_clear_error(settings: Any) -> None:
    cache_in_redis(settings)
    settings.CACHES["default"]["LOCATION"] = "redis://127.0.0.1:9/0"  # nothing listens there

    with pytest.raises(CommandError, match="The journal could not be reached"):
        command()
