"""One code path for every export (command, download, API): filtered standing decisions,
assembled into canonical records chunk by chunk (memory stays flat however many there are),
derived into the requested format, one JSON line at a time."""

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from icrlhf.export import anonymity
from icrlhf.export.formats import FORMATS, SCHEMA_VERSION, Record, derive
from icrlhf.export.models import ExportRun
from icrlhf.export.selectors import ExportFilters, decisions_filtered
from icrlhf.generation.models import Candidate, Generation
from icrlhf.integrations.llm import sampling_params
from icrlhf.memory.models import Retrieval
from icrlhf.queues.models import Item
from icrlhf.review.models import Decision

CHUNK = 1000


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _chunks(decisions: QuerySet[Decision]) -> Iterator[list[dict[str, Any]]]:
    """Keyset pagination on (created_at, id): no offset scans, no snapshot held open."""
    fields = (
        "id",
        "created_at",
        "verdict",
        "chosen_candidate_id",
        "final_text",
        "final_fields",
        "final_tool_calls",
        "reason_tags",
        "comment",
        "ratings",
        "guideline_version",
        "time_to_decide_ms",
        "reviewer__username",
        "item_id",
        "generation_id",
    )
    ordered = decisions.order_by("created_at", "id")
    after: tuple[datetime, int] | None = None
    while True:
        page = ordered
        if after is not None:
            page = page.filter(Q(created_at__gt=after[0]) | Q(created_at=after[0], id__gt=after[1]))
        rows = list(page.values(*fields)[:CHUNK])
        if not rows:
            return
        yield rows
        after = (rows[-1]["created_at"], rows[-1]["id"])


def canonical_records(*, decisions: QuerySet[Decision], anonymize: bool) -> Iterator[Record]:
    """Each decision's record. End users' and reviewers' words pass the one redaction of
    every export (icrlhf.export.anonymity); anonymised, the identities are left out: the
    reviewer, the item's customer and the application's id for it (its external id).
    Read a chunk of decisions at a time, with what each record joins, in four queries."""
    for rows in _chunks(decisions):
        joined = _chunk_joined(rows)
        for row in rows:
            yield _record(row, joined=joined, anonymize=anonymize)


@dataclass(frozen=True)
class _Joined:
    """What a chunk of decisions' records join, by id: items, generations, and the
    generations' candidates and retrieved examples."""

    items: Mapping[int, Mapping[str, Any]]
    generations: Mapping[int, Mapping[str, Any]]
    candidates: dict[int, list[dict[str, Any]]]
    retrieved: dict[int, list[dict[str, Any]]]


def _chunk_joined(rows: list[dict[str, Any]]) -> _Joined:
    items = {
        i["id"]: i
        for i in Item.objects.filter(pk__in={r["item_id"] for r in rows}).values(
            "id",
            "input_text",
            "subject",
            "body",
            "customer",
            "channel",
            "priority",
            "category",
            "external_id",
            "source",
            "created_at",
            "queue__slug",
            "queue__name",
            "queue__kind",
        )
    }
    generation_ids = {r["generation_id"] for r in rows}
    generations = {
        g["id"]: g
        for g in Generation.objects.filter(pk__in=generation_ids).values(
            "id", "model", "params", "messages", "created_at", "blind"
        )
    }
    candidates: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for c in (
        Candidate.objects.filter(generation_id__in=generation_ids)
        .order_by("position")
        .values(
            "id",
            "generation_id",
            "position",
            "text",
            "status",
            "model",
            "fields",
            "source",
            "source_example_id",
            "rank",
        )
    ):
        candidates[c["generation_id"]].append(dict(c))
    retrieved: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in (
        Retrieval.objects.filter(generation_id__in=generation_ids)
        .order_by("rank")
        .values("generation_id", "example_id", "score", "rank")
    ):
        retrieved[r["generation_id"]].append(dict(r))
    return _Joined(items=items, generations=generations, candidates=candidates, retrieved=retrieved)


def _record(row: dict[str, Any], *, joined: _Joined, anonymize: bool) -> Record:
    item, generation = joined.items[row["item_id"]], joined.generations[row["generation_id"]]
    # Only sampling parameters: never endpoints or keys.
    params = sampling_params(generation["params"])
    return {
        "schema_version": SCHEMA_VERSION,
        "decision_id": row["id"],
        "decided_at": _iso(row["created_at"]),
        "queue": {
            "slug": item["queue__slug"],
            "name": item["queue__name"],
            "kind": item["queue__kind"],
        },
        "item": _item_record(item, anonymize=anonymize),
        "generation": {
            "id": generation["id"],
            "model": generation["model"],
            "params": params,
            "created_at": _iso(generation["created_at"]),
            # Shown in random order without the confidence (the blind share).
            "blind": generation["blind"],
        },
        "messages": anonymity.messages(generation["messages"], anonymize=anonymize),
        "candidates": [
            _candidate_record(c, generation=generation, params=params, anonymize=anonymize)
            for c in joined.candidates[row["generation_id"]]
        ],
        "verdict": row["verdict"],
        "chosen_candidate_id": row["chosen_candidate_id"],
        "final_text": anonymity.text(row["final_text"], anonymize=anonymize),
        "final_fields": anonymity.fields(row["final_fields"], anonymize=anonymize),
        "final_tool_calls": anonymity.tool_calls(row["final_tool_calls"], anonymize=anonymize),
        "reviewer": anonymity.identity(row["reviewer__username"], anonymize=anonymize),
        "reason_tags": row["reason_tags"],
        "comment": anonymity.text(row["comment"], anonymize=anonymize),
        # The reviewer's optional 1-5 ratings, by candidate id.
        "ratings": row["ratings"],
        "guideline_version": row["guideline_version"],
        "time_to_decide_ms": row["time_to_decide_ms"],
        "retrieved_examples": [
            {"id": str(r["example_id"]), "score": r["score"], "rank": r["rank"]}
            for r in joined.retrieved[row["generation_id"]]
        ],
    }


def _item_record(item: Mapping[str, Any], *, anonymize: bool) -> dict[str, Any]:
    return {
        "id": item["id"],
        "input": anonymity.text(item["input_text"], anonymize=anonymize),
        "subject": anonymity.text(item["subject"], anonymize=anonymize),
        "body": anonymity.text(item["body"], anonymize=anonymize),
        "customer": anonymity.identity(item["customer"], anonymize=anonymize),
        "channel": item["channel"],
        "priority": item["priority"],
        "category": item["category"],
        "external_id": anonymity.identity(item["external_id"], anonymize=anonymize),
        "source": item["source"],
        "created_at": _iso(item["created_at"]),
    }


def _candidate_record(
    c: dict[str, Any], *, generation: Mapping[str, Any], params: dict[str, Any], anonymize: bool
) -> dict[str, Any]:
    return {
        "id": c["id"],
        "position": c["position"],
        "text": anonymity.text(c["text"], anonymize=anonymize),
        "status": c["status"],
        # A memory candidate is a stored preferred answer, not a model sample.
        "source": c["source"],
        "source_example_id": str(c["source_example_id"]) if c["source_example_id"] else None,
        "model": c["model"] or generation["model"],
        "params": params if c["source"] == Candidate.Source.LLM else {},
        "fields": anonymity.fields(c["fields"], anonymize=anonymize),
        "rank": c["rank"],  # the ranking's place (1: first); null unranked
    }


def export_lines(*, fmt: str, filters: ExportFilters, consumer: str) -> Iterator[str]:
    """JSON lines of the export; the export is recorded once the last line is out."""
    if fmt not in FORMATS:
        raise ValueError(f"Unknown format {fmt!r}; choose one of {', '.join(FORMATS)}.")
    decisions = decisions_filtered(filters=filters, consumer=consumer)
    count, decided_until = 0, None
    for record in canonical_records(decisions=decisions, anonymize=filters.anonymize):
        decided_until = record["decided_at"]
        for line in derive(record, fmt):
            count += 1
            yield json.dumps(line, ensure_ascii=False) + "\n"
    ExportRun.objects.create(
        consumer=consumer,
        queue=filters.queue,
        format=fmt,
        filters=filters.describe(),
        records=count,
        decided_until=datetime.fromisoformat(decided_until) if decided_until else None,
    )
