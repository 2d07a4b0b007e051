"""The shape of an incoming ticket, shared by the API and the file import."""

import json
from datetime import UTC, datetime
from typing import Any, Literal

from django.conf import settings
from ninja import Field, Schema
from pydantic import field_validator, model_validator

from icrlhf.integrations.text_checks import refuse_unstorable_text

# Spelled out for the OpenAPI schema; tests/ingest/test_api_schema.py checks it against Item.
Priority = Literal["low", "normal", "high", "urgent"]
MAX_BATCH = 100


class TicketIn(Schema):
    subject: str = Field(..., min_length=1, max_length=500)
    body: str = Field(..., min_length=1, max_length=settings.ITEM_INPUT_MAX_CHARS)
    customer: str = Field("", max_length=200)
    channel: str = Field("", max_length=50)
    priority: Priority = "normal"
    sla_due_at: datetime | None = Field(None, description="Default: from the priority's SLA.")
    external_id: str = Field(
        "", max_length=200, description="The helpdesk's id; sending it again is idempotent."
    )
    category: str = Field("", max_length=200, description="Optional: one of the queue's.")

    # The whole ticket walked once: a NUL (PostgreSQL cannot store one; SQLite can: refused on
    # both, with one message), a lone surrogate, or a number JSON cannot store, anywhere in it
    # is refused with its place named, before anything is written.
    _storable = model_validator(mode="wrap")(refuse_unstorable_text)

    @field_validator("subject", "body")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("sla_due_at")
    @classmethod
    def aware(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("needs a time zone, e.g. 2026-11-21T12:00:00Z")
        # PostgreSQL refuses offsets beyond ±15:59 (Python allows ±23:59): store UTC.
        try:
            return value.astimezone(UTC)
        except OverflowError:  # year 1 at +14:00 is before the calendar starts, in UTC
            raise ValueError("is out of range") from None


class TicketOut(Schema):
    id: int
    external_id: str
    subject: str
    status: str = Field(..., description="Ticket status: new, open, pending or solved.")
    review_status: str = Field(..., description="generating, ready, decided or failed.")
    category: str
    priority: str
    sla_due_at: datetime | None
    triaged_at: datetime | None
    created: bool = Field(False, description="False when the external id was already known.")


class BatchIn(Schema):
    tickets: list[TicketIn] = Field(..., min_length=1, max_length=MAX_BATCH)


class ErrorOut(Schema):
    detail: str
    errors: list[dict[str, str]] = []


# Metadata is the sender's own: stored and returned as sent, within this size.
MAX_METADATA_CHARS = 10_000


class ItemIn(Schema):
    input: str = Field(
        ...,
        min_length=1,
        max_length=settings.ITEM_INPUT_MAX_CHARS,
        description="The prompt or message to answer. In a triage queue its first line is the "
        "ticket's subject.",
    )
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Your own fields, returned as sent (and in webhooks)."
    )
    external_id: str = Field(
        "", max_length=200, description="Your id for it; sending it again is idempotent."
    )

    # The whole item walked once, metadata's keys and values too: text or a number the
    # database cannot store is refused with its place named, before anything is written.
    _storable = model_validator(mode="wrap")(refuse_unstorable_text)

    @field_validator("input")
    @classmethod
    def not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("metadata")
    @classmethod
    def small_and_storable(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            text = json.dumps(value, allow_nan=False)
        except ValueError:
            raise ValueError("must be plain JSON: NaN and Infinity are not numbers") from None
        if len(text) > MAX_METADATA_CHARS:
            raise ValueError(f"is larger than {MAX_METADATA_CHARS:,} characters as JSON")
        if "\\u0000" in text:  # PostgreSQL cannot store NUL in JSON either
            raise ValueError("must not contain NUL (0x00) characters")
        return value


class ItemBatchIn(Schema):
    items: list[ItemIn] = Field(..., min_length=1, max_length=MAX_BATCH)


class CandidateOut(Schema):
    id: int
    label: int = Field(..., description="Its number on the review page.")
    status: str = Field(..., description="pending, running, done or failed.")
    source: str = Field(..., description="llm or memory.")
    served: bool = Field(..., description="The answer an application got (a captured call).")
    text: str
    fields: dict[str, str] | None
    confidence: float | None = Field(
        ...,
        description="Calibrated probability that reviewers accept it as it is (null until "
        "the queue is calibrated); candidates are numbered best first.",
    )


class DecisionOut(Schema):
    verdict: str = Field(..., description="chosen, edited or none_acceptable.")
    candidate_id: int | None
    final_fields: dict[str, str] | None
    decided_at: datetime


class AutomationOut(Schema):
    candidate_id: int
    confidence: float
    audit: bool = Field(..., description="Applied, and sampled for review all the same.")
    applied_at: datetime
    undone_at: datetime | None


class ItemOut(Schema):
    id: int
    external_id: str
    source: str
    status: str = Field(
        ..., description="generating, ready, decided, automated (applied without review) or failed."
    )
    input: str
    metadata: dict[str, Any]
    created_at: datetime
    candidates: list[CandidateOut] = Field(..., description="Of its latest generation.")
    decision: DecisionOut | None = Field(..., description="The first standing decision.")
    automation: AutomationOut | None = Field(
        ..., description="Its last automatic application, if the queue applied one."
    )
    final_text: str | None = Field(
        ...,
        description="What reviewers settled on once decided, or what was applied without review.",
    )
    created: bool = Field(False, description="False when the external id was already known.")
