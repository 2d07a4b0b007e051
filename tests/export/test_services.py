import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from icrlhf.export.formats import FORMATS, derive
from icrlhf.export.models import ExportRun
from icrlhf.export.selectors import ExportFilters, ExportSize, export_size
from icrlhf.export.services import export_lines
from icrlhf.generation.models import Candidate
from icrlhf.ingest.services import token_create
from icrlhf.memory.models import Example, Retrieval
from icrlhf.review.decisions import decision_record, decision_undo
from icrlhf.review.models import Decision
from tests.factories import ItemFactory, QueueFactory, UserFactory, member_add, ready_generation

pytestmark = pytest.mark.django_db

CANONICAL_KEYS = {
    "schema_version",
    "decision_id",
    "decided_at",
    "queue",
    "item",
    "generation",
    "messages",
    "candidates",
    "verdict",
    "chosen_candidate_id",
    "final_text",
    "final_fields",
    "final_tool_calls",
    "reviewer",
    "reason_tags",
    "comment",
    "ratings",
    "guideline_version",
    "time_to_decide_ms",
    "retrieved_examples",
}


def decided(queue: Any, reviewer: Any, verdict: str, texts: list[str], **extra: Any) -> Decision:
    item = ItemFactory(queue=queue, input_text=f"Question for {verdict}?")
    generation = ready_generation(item, texts)
    generation.messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": item.input_text},
    ]
    generation.params = {"temperature": 0.7, "max_tokens": 64}
    generation.save()
    first = generation.candidates.order_by("position").first()
    return decision_record(
        item_id=item.pk,
        reviewer=reviewer,
        verdict=verdict,
        candidate_id=None if verdict == "none_acceptable" else first.pk,
        **extra,
    )


@pytest.fixture
def decisions(queue: Any, user: Any) -> dict[str, Decision]:
    chosen = decided(queue, user, "chosen", ["a1", "a2", "a3", "a4"])
    # A failed candidate has no text: it is in the record but never in a pair.
    Candidate.objects.filter(generation=chosen.generation, text="a4").update(
        status="failed", text=""
    )
    edited = decided(queue, user, "edited", ["b1", "b2", "b3"], final_text="b1, improved")
    none = decided(queue, user, "none_acceptable", ["c1", "c2"], comment="all wrong")
    example = Example.objects.filter(decision=chosen, role="preferred").get()
    Retrieval.objects.create(generation=edited.generation, example=example, score=0.81, rank=1)
    undone = decided(queue, user, "chosen", ["d1", "d2"])
    decision_undo(decision_id=undone.pk, reviewer=user)  # superseded: never exported
    return {"chosen": chosen, "edited": edited, "none": none}


def export(fmt: str, **filters: Any) -> list[dict[str, Any]]:
    lines = export_lines(fmt=fmt, filters=ExportFilters(**filters), consumer="tests")
    return [json.loads(line) for line in lines]


def test_the_canonical_record_has_every_documented_field(
    decisions: dict[str, Decision], user: Any
) -> None:
    records = export("canonical")
    assert [r["verdict"] for r in records] == ["chosen", "edited", "none_acceptable"]
    for record in records:
        assert set(record) == CANONICAL_KEYS
        assert record["schema_version"] == 1
        assert set(record["item"]) == {
            "id",
            "input",
            "subject",
            "body",
            "customer",
            "channel",
            "priority",
            "category",
            "external_id",
            "source",
            "created_at",
        }
        assert all(
            set(c)
            == {
                "id",
                "position",
                "text",
                "status",
                "source",
                "source_example_id",
                "model",
                "params",
                "fields",
                "rank",
            }
            for c in record["candidates"]
        )
        assert record["generation"]["blind"] is False
        assert record["reviewer"] == user.username
    chosen, edited, none = records
    assert chosen["final_text"] == "a1" and chosen["chosen_candidate_id"] == (
        decisions["chosen"].chosen_candidate_id
    )
    assert chosen["candidates"][0]["params"] == {"temperature": 0.7, "max_tokens": 64}
    assert edited["final_text"] == "b1, improved"
    assert edited["retrieved_examples"][0]["score"] == 0.81
    assert none["comment"] == "all wrong" and none["chosen_candidate_id"] is None
    assert none["ratings"] == {}
    rated = {str(decisions["chosen"].chosen_candidate_id): 5}
    Decision.objects.filter(pk=decisions["chosen"].pk).update(ratings=rated)
    assert export("canonical")[0]["ratings"] == rated


def test_a_memory_candidate_is_exported_as_such(queue: Any, user: Any) -> None:
    earlier = decided(queue, user, "chosen", ["stored answer", "other"])
    stored = Example.objects.get(decision=earlier, role="preferred")
    later = decided(queue, user, "chosen", ["stored answer", "model answer"])
    Candidate.objects.filter(generation=later.generation, text="stored answer").update(
        source=Candidate.Source.MEMORY, source_example=stored, model="memory"
    )
    record = next(r for r in export("canonical") if r["decision_id"] == later.pk)
    by_text = {c["text"]: c for c in record["candidates"]}
    assert by_text["stored answer"]["source"] == "memory"
    assert by_text["stored answer"]["source_example_id"] == str(stored.pk)
    assert by_text["stored answer"]["params"] == {}  # not sampled from a model
    assert by_text["model answer"]["source"] == "llm"
    assert by_text["model answer"]["source_example_id"] is None
    assert by_text["model answer"]["params"] == {"temperature": 0.7, "max_tokens": 64}


def test_trl_pairs_n_minus_one_per_choice_plus_one_per_edit(decisions: Any) -> None:
    pairs = export("trl")
    assert all(set(p) == {"prompt", "chosen", "rejected"} for p in pairs)
    by_chosen = [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs]
    assert by_chosen == [
        ("a1", "a2"),
        ("a1", "a3"),  # N−1 (the failed one has no text)
        ("b1, improved", "b2"),
        ("b1, improved", "b3"),
        ("b1, improved", "b1"),  # +1: edit ≻ original
    ]
    assert pairs[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Question for chosen?"},
    ]
    assert all(p["chosen"][0]["role"] == "assistant" for p in pairs)


def test_openai_preference_lines_have_its_shape(decisions: Any) -> None:
    lines = export("openai")
    assert len(lines) == 5
    for line in lines:
        assert set(line) == {"input", "preferred_output", "non_preferred_output"}
        assert set(line["input"]) == {"messages"}
        assert line["preferred_output"][0]["role"] == "assistant"
        assert line["non_preferred_output"][0]["role"] == "assistant"


def test_kto_labels_every_answer(decisions: Any) -> None:
    lines = export("kto")
    assert all(set(line) == {"prompt", "completion", "label"} for line in lines)
    labelled = [(line["completion"][0]["content"], line["label"]) for line in lines]
    assert labelled == [
        ("a1", True),
        ("a2", False),
        ("a3", False),
        ("b1, improved", True),
        ("b1", False),
        ("b2", False),
        ("b3", False),
        ("c1", False),
        ("c2", False),
    ]


def test_a_canonical_export_derives_into_what_the_database_exports(
    decisions: Any, tmp_path: Path
) -> None:
    path = tmp_path / "canonical.jsonl"
    call_command("export_preferences", format="canonical", out=str(path))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for fmt in FORMATS:
        from_file = [line for record in records for line in derive(record, fmt)]
        assert from_file == export(fmt), fmt


def test_filters(decisions: dict[str, Decision], queue: Any, user: Any) -> None:
    other = UserFactory()
    queue.members.add(other)
    late = decided(queue, other, "chosen", ["e1", "e2"])
    Decision.objects.filter(pk=late.pk).update(created_at=timezone.now() + timedelta(days=3))
    elsewhere = decided(QueueFactory(members=[user]), user, "chosen", ["f1", "f2"])
    assert len(export("canonical")) == 5
    assert {r["decision_id"] for r in export("canonical", queue=queue)} == {
        *(d.pk for d in decisions.values()),
        late.pk,
    }
    assert [r["decision_id"] for r in export("canonical", reviewer=other.username)] == [late.pk]
    assert [r["verdict"] for r in export("canonical", verdict="edited")] == ["edited"]
    soon = timezone.now() + timedelta(days=1)
    assert [r["decision_id"] for r in export("canonical", decided_from=soon)] == [late.pk]
    assert late.pk not in {r["decision_id"] for r in export("canonical", decided_to=soon)}
    assert {r["reviewer"] for r in export("canonical", anonymize=True)} == {None}
    assert elsewhere.pk in {r["decision_id"] for r in export("canonical")}


def test_since_last_export_takes_only_what_is_new(decisions: Any, queue: Any, user: Any) -> None:
    assert len(export("canonical", queue=queue, since_last_export=True)) == 3
    assert export("canonical", queue=queue, since_last_export=True) == []
    newer = decided(queue, user, "chosen", ["g1", "g2"])
    assert [r["decision_id"] for r in export("canonical", queue=queue, since_last_export=True)] == [
        newer.pk
    ]


def test_no_secret_ever_leaves(decisions: Any, queue: Any, settings: Any) -> None:
    settings.LLM_API_KEY = "sk-live-very-secret"
    queue.api_base, queue.webhook_secret = "https://user:hunter2@llm.example.com/v1", "whsec_x"
    queue.save()
    _record, token = token_create(queue=queue, name="helpdesk")
    text = "".join(
        line
        for fmt in FORMATS
        for line in export_lines(fmt=fmt, filters=ExportFilters(), consumer="tests")
    )
    assert "b1, improved" in text
    for secret in ("sk-live-very-secret", "hunter2", "whsec_x", token, "llm.example.com"):
        assert secret not in text


def test_curators_download_and_reviewers_cannot(
    decisions: Any, queue: Any, logged_in: Client
) -> None:
    assert logged_in.post("/export/", {"format": "trl"}).status_code == 403
    curator = UserFactory()
    member_add(queue, curator, "curator")
    client = Client()
    client.force_login(curator)
    assert client.get("/export/").status_code == 200
    response = client.post("/export/", {"format": "trl", "queue": queue.pk, "anonymize": "on"})
    assert response.status_code == 200 and response.streaming
    assert response["Content-Disposition"].startswith('attachment; filename="icrlhf-trl-')
    lines = b"".join(response.streaming_content).decode().splitlines()  # type: ignore[arg-type]
    assert len(lines) == 5
    bad = client.post("/export/", {"format": "csv"})
    assert bad.status_code == 400 and "Select a valid choice" in bad.content.decode()


def test_the_api_exports_its_queue_with_a_token(decisions: Any, queue: Any, client: Client) -> None:
    """Only to a token given the export scope: a default token (items, gateway, feedback)
    is refused the whole queue's decisions."""
    _record, helpdesk = token_create(queue=queue, name="helpdesk")
    refused = client.get(
        "/api/v1/exports/preferences?format=kto", HTTP_AUTHORIZATION=f"Bearer {helpdesk}"
    )
    assert refused.status_code == 403 and "export" in refused.json()["detail"]
    _record, token = token_create(queue=queue, name="trainer", scopes=["export"])
    assert client.get("/api/v1/items/1", HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 403
    decided(QueueFactory(), UserFactory(), "chosen", ["x1", "x2"])  # another queue's
    response = client.get(
        "/api/v1/exports/preferences?format=kto", HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert response.status_code == 200
    lines = b"".join(response.streaming_content).decode().splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 9
    assert client.get("/api/v1/exports/preferences").status_code == 401
    bad = client.get("/api/v1/exports/preferences?format=xml", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert bad.status_code == 422


@pytest.mark.parametrize("role", ["reviewer", "curator", "admin"])
def test_all_queues_means_the_queues_the_exporter_may_export(
    decisions: Any, queue: Any, role: str
) -> None:
    """A curator of one queue who picks "All queues", or names a reviewer of another queue,
    gets their own queue's decisions and nothing of any other; an admin gets every queue."""
    other_queue = QueueFactory()
    stranger = UserFactory()
    other_queue.members.add(stranger)
    foreign = decided(other_queue, stranger, "chosen", ["secret answer", "other"])
    exporter = UserFactory(groups=["admin"] if role == "admin" else [])
    if role != "admin":
        member_add(queue, exporter, role)
    client = Client()
    client.force_login(exporter)
    if role == "reviewer":  # reviewers export nothing, of any queue
        assert client.post("/export/", {"format": "canonical", "queue": ""}).status_code == 403
        return

    def exported(**form: str) -> list[dict[str, Any]]:
        response = client.post("/export/", {"format": "canonical", "queue": "", **form})
        assert response.status_code == 200
        content = b"".join(response.streaming_content).decode()  # type: ignore[arg-type]
        return [json.loads(line) for line in content.splitlines()]

    everything = exported()
    by_stranger = exported(reviewer=stranger.username)
    ids = {record["decision_id"] for record in everything}
    if role == "curator":
        assert foreign.pk not in ids and ids == {d.pk for d in decisions.values()}
        assert by_stranger == []
        # Naming the other queue is refused outright.
        refused = client.post("/export/", {"format": "canonical", "queue": other_queue.pk})
        assert refused.status_code == 400
    else:
        assert foreign.pk in ids
        assert [r["decision_id"] for r in by_stranger] == [foreign.pk]


def test_the_size_counts_the_lines_each_format_writes(
    decisions: dict[str, Decision], queue: Any, user: Any
) -> None:
    """Counted in the database, it agrees with what the export writes: for every format, and
    with a filter, and an edit whose original failed (no pair for it)."""
    edited = decided(queue, user, "edited", ["h1", "h2"], final_text="h1, better")
    Candidate.objects.filter(generation=edited.generation, text="h1").update(status="failed")
    decided(QueueFactory(members=[user]), user, "chosen", ["i1", "i2", "i3"])
    for filters in [ExportFilters(), ExportFilters(queue=queue), ExportFilters(verdict="edited")]:
        for fmt in FORMATS:
            size = export_size(fmt=fmt, filters=filters, consumer="tests")
            written = list(export_lines(fmt=fmt, filters=filters, consumer="tests"))
            assert size.records == len(written), (fmt, filters)
            assert size.decisions == len(
                list(export_lines(fmt="canonical", filters=filters, consumer="tests"))
            )
    assert export_size(
        fmt="trl", filters=ExportFilters(verdict="none_acceptable"), consumer="t"
    ) == (ExportSize(format="trl", records=0, decisions=1))


def test_the_page_counts_what_the_filters_export_as_they_change(
    decisions: dict[str, Decision], queue: Any
) -> None:
    curator = UserFactory()
    member_add(queue, curator, "curator")
    decided(QueueFactory(), UserFactory(), "chosen", ["not", "theirs"])  # another queue's
    client = Client()
    client.force_login(curator)

    page = client.get("/export/").content.decode()
    assert "<strong>3 records</strong> will be exported." in page  # canonical, all their queues
    assert "The form counts" not in page  # the comment stays one
    assert 'hx-get="/export/"' in page and 'hx-params="not csrfmiddlewaretoken"' in page

    def size(**filters: str) -> str:
        response = client.get("/export/", {"queue": "", **filters}, HTTP_HX_REQUEST="true")
        assert response.status_code == 200
        return response.content.decode()

    trl = size(format="trl")
    assert "<strong>5 records</strong> will be exported, from 3 decisions." in trl
    assert "<form" not in trl and 'id="export-size"' in trl  # the count alone
    assert "<strong>1 record</strong> will be exported." in size(
        format="canonical", verdict="edited"
    )
    assert "Nothing to export" in size(format="trl", verdict="none_acceptable")
    assert "Fix the fields above" in size(format="xml")
    assert ExportRun.objects.count() == 0  # counting is not exporting


def test_reviewers_cannot_count_an_export_either(decisions: Any, logged_in: Client) -> None:
    response = logged_in.get("/export/", {"format": "canonical"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 403


def test_anonymised_the_decisions_export_redacts_every_text_and_leaves_identities_out(
    queue: Any, user: Any, settings: Any
) -> None:
    """As the runs' export does (export/anonymity.py): whatever REDACTION says."""
    settings.REDACTION = "off"
    email, card = "ana.silva@example.com", "4111 1111 1111 1111"
    item = ItemFactory(
        queue=queue,
        input_text=f"I am {email}.",
        subject=f"From {email}",
        body=f"Card {card}",
        customer="Ana Silva",
        external_id="crm-ana-silva",
    )
    generation = ready_generation(item, [f"Mail {email}?", "Sorry."])
    generation.messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "name": "ana_silva", "content": item.input_text},
    ]
    generation.save()
    first = generation.candidates.order_by("position").first()
    decision = decision_record(
        item_id=item.pk,
        reviewer=user,
        verdict="edited",
        candidate_id=first.pk,
        final_text=f"We wrote to {email}.",
        comment=f"Customer {email} again",
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "mail", "arguments": json.dumps({"to": email})},
    }
    Candidate.objects.filter(generation=generation).update(fields={"reply": f"To {email}"})
    Decision.objects.filter(pk=decision.pk).update(
        final_fields={"reply": f"To {email}"}, final_tool_calls=[call]
    )

    for fmt in FORMATS:
        text = "".join(
            export_lines(fmt=fmt, filters=ExportFilters(anonymize=True), consumer="tests")
        )
        assert text and email not in text and card not in text, fmt
        assert "Ana Silva" not in text and "ana_silva" not in text and "crm-ana" not in text
    [record] = export("canonical", anonymize=True)
    assert record["item"]["input"] == "I am [email]."
    assert record["item"]["customer"] is None and record["item"]["external_id"] is None
    assert record["final_tool_calls"][0]["id"] == "call_1"
    assert json.loads(record["final_tool_calls"][0]["function"]["arguments"]) == {"to": "[email]"}
    # Not anonymised, with REDACTION off, everything is as it was written.
    [kept] = export("canonical")
    assert kept["item"]["customer"] == "Ana Silva" and email in kept["comment"]
