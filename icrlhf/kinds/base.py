"""A queue kind: everything that differs between kinds of queue, behind one interface.

The general kind (free-text answers) is this base class; another kind overrides what differs
for it. Each kind lives in its own package under icrlhf/kinds/ with its templates under
templates/kinds/<name>/, and is installed by one line in icrlhf/kinds/__init__.py
(INSTALLED_KINDS). Callers ask a kind what it does, never which kind it is."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from icrlhf.kinds.labels import answer_key, label_named
from icrlhf.queues.models import Item, Queue


@dataclass(frozen=True)
class Parsed:
    """A model's answer read as the kind's fields; `error` says why it could not be."""

    fields: dict[str, str] | None = None
    error: str = ""


@dataclass(frozen=True)
class Final:
    """What a reviewer confirmed, in the kind's fields and as the text memory keeps."""

    fields: dict[str, str]
    text: str


class QueueKind:
    name = "general"
    # Whether the queue's items are support tickets (subject, body, customer, channel,
    # priority, an SLA): the ticket flow (icrlhf.triage) then creates them (the queue page's
    # form, the tickets API, the items API, an import) and lists them most urgent first;
    # otherwise an item is a prompt and the queue page lists the recent ones.
    takes_tickets = False
    # What the pages call one of the queue's items.
    item_noun = "item"
    # The candidate's body on the item page, and the decision's extra controls ("": none).
    candidate_template = "kinds/general/candidate.html"
    corrections_template = ""
    # The fields its corrections template posts (each as `correction_<field>`): what a reviewer
    # corrects beside the picked answer; the decision form reads exactly these.
    correction_fields: tuple[str, ...] = ()
    # The decision webhook's events: a decision made, and one taken back.
    decided_event = "item.decided"
    undone_event = "item.decision_undone"

    def instructions(self, queue: Queue) -> str:
        """What the prompt asks for beyond the queue's own system prompt."""
        return ""

    def response_format(self, queue: Queue) -> dict[str, Any] | None:
        """Structured output to ask the model for (OpenAI's `response_format`), or None."""
        return None

    def parse(self, text: str, queue: Queue) -> Parsed:
        """The kind's fields in a model's (or a remembered) answer; none for free text."""
        return Parsed()

    def prefill(self, *, text: str, fields: dict[str, str] | None, queue: Queue) -> dict[str, str]:
        """What picking a candidate puts into the correction fields (none for free text)."""
        return {}

    def category_choices(
        self, *, proposed: Sequence[dict[str, str]], queue: Queue
    ) -> tuple[list[str], list[str]]:
        """The correction form's categories: those the candidates propose (`proposed`: their
        prefills), then every other one. None for a kind without a category."""
        return [], []

    def example_text(self, *, text: str, fields: dict[str, str] | None) -> str:
        """The text a candidate is remembered by."""
        return text

    def vote_key(self, *, text: str, queue: Queue) -> str:
        """What memory's votes are counted on for an answer (as `example_text` gives it): the
        label it names when the queue lists labels (an intent queue: "card_arrival" and
        "Card_arrival." are one vote), else the answer's own words."""
        label = label_named(text, queue.categories) if queue.categories else ""
        return f"label:{label}" if label else answer_key(text)

    def final(
        self, *, picked_fields: dict[str, str] | None, corrections: dict[str, str], queue: Queue
    ) -> Final | None:
        """The confirmed fields of a decision (picked candidate plus corrections), or None
        when the kind has no fields and the final text is the answer itself."""
        return None

    def on_decision(self, *, item_id: int, final: Final) -> dict[str, Any] | None:
        """Apply what a confirmed decision changes beyond the decision itself; returns what
        it replaced (JSON), for `on_undo`."""
        return None

    def on_undo(self, *, item_id: int, replaced: dict[str, Any]) -> None:
        """Put back what `on_decision` replaced."""

    def review_order(self, items: QuerySet[Item]) -> QuerySet[Item]:
        """The order reviewers are given items in: the oldest first."""
        return items.order_by("created_at")

    def webhook_wanted(self, *, final_fields: dict[str, str] | None) -> bool:
        """Whether a decision (or its undo) is sent to the queue's webhook at all."""
        return True

    def webhook_extra(self, *, item: Item, final_fields: dict[str, str] | None) -> dict[str, Any]:
        """What the kind adds to the decision webhook's body (a ticket's fields)."""
        return {}
