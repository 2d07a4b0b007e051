"""The triage kind: a support ticket answered with a category, a priority and a reply.

Its fields and their tolerant parsing are in `fields.py`, its SLA order in `sla.py`, its item
page parts in templates/kinds/triage/. The ticket flow (creating tickets, the SLA list, the
API) is the `icrlhf.triage` app, above generation and memory."""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.utils import timezone

from icrlhf.kinds.base import Final, Parsed, QueueKind
from icrlhf.kinds.labels import answer_key
from icrlhf.kinds.triage.fields import (
    PRIORITIES,
    TriageParseError,
    fields_text,
    fields_validate,
    triage_instructions,
    triage_parse,
    triage_partial,
    triage_schema,
)
from icrlhf.kinds.triage.sla import sla_ordered
from icrlhf.queues.models import Item, Queue

# What a triage decision writes on its ticket, and an undo puts back.
_TICKET_FIELDS = ("category", "priority", "ticket_status", "triaged_at")


class TriageKind(QueueKind):
    name = "triage"
    takes_tickets = True
    item_noun = "ticket"
    candidate_template = "kinds/triage/candidate.html"
    corrections_template = "kinds/triage/corrections.html"
    correction_fields = ("category", "priority", "reply")
    decided_event = "ticket.triaged"
    undone_event = "ticket.triage_undone"
    priorities = PRIORITIES

    def webhook_wanted(self, *, final_fields: dict[str, str] | None) -> bool:
        # A ticket none of whose triages was acceptable was not triaged: nothing to tell.
        return final_fields is not None

    def webhook_extra(self, *, item: Item, final_fields: dict[str, str] | None) -> dict[str, Any]:
        # The ticket as it is now (restored, after an undo) and the triage decided.
        return {
            "ticket": {
                "id": item.pk,
                "external_id": item.external_id,
                "subject": item.subject,
                "status": item.ticket_status,
                "category": item.category,
                "priority": item.priority,
            },
            "triage": final_fields,
        }

    def instructions(self, queue: Queue) -> str:
        return triage_instructions(queue.categories)

    def response_format(self, queue: Queue) -> dict[str, Any]:
        # The server holds the answer to the schema (llama.cpp turns it into a grammar):
        # a category and a priority from the lists, by construction.
        return {
            "type": "json_schema",
            "json_schema": {"name": "triage", "strict": True, "schema": triage_schema(queue)},
        }

    def parse(self, text: str, queue: Queue) -> Parsed:
        # An unparsable answer is kept with its raw text and the reason: it may still be the
        # best starting point for the reviewer's correction.
        try:
            return Parsed(fields=triage_parse(text, queue.categories).as_dict())
        except TriageParseError as error:
            return Parsed(error=str(error))

    def prefill(self, *, text: str, fields: dict[str, str] | None, queue: Queue) -> dict[str, str]:
        # An invalid answer still offers what could be read, and its raw text as the reply.
        return dict(fields) if fields else triage_partial(text, queue.categories)

    def category_choices(
        self, *, proposed: Sequence[dict[str, str]], queue: Queue
    ) -> tuple[list[str], list[str]]:
        # The candidates' categories in their order, then the rest alphabetically.
        likely = list(dict.fromkeys(p["category"] for p in proposed if p.get("category")))
        return likely, sorted(set(queue.categories) - set(likely), key=str.lower)

    def example_text(self, *, text: str, fields: dict[str, str] | None) -> str:
        # Remembered in the same form as a confirmed triage.
        return fields_text(fields) if fields else text

    def vote_key(self, *, text: str, queue: Queue) -> str:
        # A ticket's category and priority are what memory vouches for: the replies to
        # two tickets of one kind are never word for word alike.
        fields = self.parse(text, queue).fields
        if not fields:
            return answer_key(text)  # unreadable: its own words, never a label read off a reply
        return f"triage:{fields['category']}:{fields['priority']}"

    def final(
        self, *, picked_fields: dict[str, str] | None, corrections: dict[str, str], queue: Queue
    ) -> Final:
        """The picked candidate's fields with the reviewer's corrections on top."""
        base: dict[str, Any] = dict(picked_fields or {})
        merged = {
            key: corrections.get(key) or base.get(key) or ""
            for key in ("category", "priority", "reply")
        }
        try:
            confirmed = fields_validate(
                category=str(merged["category"]),
                priority=str(merged["priority"] or "normal"),
                reply=str(merged["reply"]),
                categories=queue.categories,
            )
        except TriageParseError as error:
            raise ValidationError(f"The triage is incomplete: {error}") from error
        return Final(fields=confirmed.as_dict(), text=confirmed.as_text())

    def on_decision(self, *, item_id: int, final: Final) -> dict[str, Any]:
        """The confirmed triage is written back to the ticket; returns the ticket's fields as
        they were."""
        ticket = Item.objects.filter(pk=item_id)
        before = ticket.values(*_TICKET_FIELDS).get()
        ticket.update(
            category=final.fields.get("category", ""),
            priority=final.fields.get("priority", Item.Priority.NORMAL),
            ticket_status=Item.TicketStatus.OPEN,
            triaged_at=timezone.now(),
        )
        triaged_at = before["triaged_at"]
        return {**before, "triaged_at": triaged_at.isoformat() if triaged_at else None}

    def on_undo(self, *, item_id: int, replaced: dict[str, Any]) -> None:
        """The ticket gets back its category, priority, status and untriaged time, and with
        them its place in the SLA order."""
        restored = {key: replaced[key] for key in _TICKET_FIELDS if key in replaced}
        if restored.get("triaged_at"):
            restored["triaged_at"] = datetime.fromisoformat(restored["triaged_at"])
        Item.objects.filter(pk=item_id).update(**restored)

    def review_order(self, items: QuerySet[Item]) -> QuerySet[Item]:
        """The most urgent ticket first."""
        return sla_ordered(items)
