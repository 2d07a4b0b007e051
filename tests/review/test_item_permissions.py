"""The item page's permissions (review.selectors.item_permissions), by table: each row is
where an item stands for one user, and what the page then lets them do. The HTML tests show
the controls; these say why each one is there or not, one fact at a time."""

from dataclasses import asdict, replace
from datetime import UTC, datetime

import pytest

from icrlhf.review.models import Automation
from icrlhf.review.selectors import ItemPermissions, ItemStanding, item_permissions

# A reviewer on a ready item nobody holds: the page claims it as it loads, and they decide.
OPEN = ItemStanding(
    reviewer=True,
    open_to_pick=True,
    free_slot=True,
    decided_by_me=False,
    claimed_by_me=False,
    claimed_by_others=False,
    skipped_by_me=False,
    decided=False,
    has_generation=True,
    ready_or_failed=True,
    automation=None,
)
NOTHING = ItemPermissions(
    claim_on_load=False,
    can_decide=False,
    can_regenerate=False,
    can_undo_automation=False,
    blind=False,
    skipped_before=False,
)
UNDONE_AT = datetime(2026, 11, 29, tzinfo=UTC)


def applied(*, audit: bool = False, audited: bool = False, undone: bool = False) -> Automation:
    """An automation as the page reads it (never saved: the rule reads three fields)."""
    return Automation(
        audit=audit,
        audit_decision_id=1 if audited else None,
        undone_at=UNDONE_AT if undone else None,
    )


CASES = {
    "a reviewer on an open item claims it on load, decides and regenerates": (
        OPEN,
        replace(NOTHING, claim_on_load=True, can_decide=True, can_regenerate=True),
    ),
    "a viewer may do nothing": (replace(OPEN, reviewer=False), NOTHING),
    "with no free slot the page claims nothing and offers no choice": (
        replace(OPEN, free_slot=False),
        replace(NOTHING, can_regenerate=True),
    ),
    "the reviewer's own claim lets them decide without claiming again": (
        replace(OPEN, claimed_by_me=True, free_slot=False),
        replace(NOTHING, can_decide=True, can_regenerate=True),
    ),
    "another reviewer's claim stops regenerating, not a free slot's choice": (
        replace(OPEN, claimed_by_others=True),
        replace(NOTHING, claim_on_load=True, can_decide=True),
    ),
    "having decided, the reviewer neither decides again nor regenerates": (
        replace(OPEN, decided_by_me=True, decided=True),
        NOTHING,
    ),
    "another's decision stops regenerating (it would replace what they chose)": (
        replace(OPEN, decided=True),
        replace(NOTHING, claim_on_load=True, can_decide=True),
    ),
    "an item that wants no more decisions is not claimed or decided": (
        replace(OPEN, open_to_pick=False),
        replace(NOTHING, can_regenerate=True),
    ),
    "without a generation there is nothing to pick": (
        replace(OPEN, has_generation=False),
        replace(NOTHING, claim_on_load=True, can_regenerate=True),
    ),
    "a generating item cannot be regenerated": (
        replace(OPEN, ready_or_failed=False),
        replace(NOTHING, claim_on_load=True, can_decide=True),
    ),
    "a skipped item says so until the reviewer decides it": (
        replace(OPEN, claimed_by_me=True, skipped_by_me=True),
        replace(NOTHING, can_decide=True, can_regenerate=True, skipped_before=True),
    ),
    "a decided item no longer says it was skipped": (
        replace(OPEN, claimed_by_me=True, skipped_by_me=True, decided_by_me=True, decided=True),
        NOTHING,
    ),
    "an automation applied without audit can be undone by a reviewer": (
        replace(OPEN, open_to_pick=False, automation=applied()),
        replace(NOTHING, can_regenerate=True, can_undo_automation=True),
    ),
    "a viewer cannot undo an automation": (
        replace(OPEN, reviewer=False, open_to_pick=False, automation=applied()),
        NOTHING,
    ),
    "an undone automation is neither undone again nor hidden": (
        replace(OPEN, automation=applied(undone=True)),
        replace(NOTHING, claim_on_load=True, can_decide=True, can_regenerate=True),
    ),
    "an audit not yet decided is blind, and is not undone from the page": (
        replace(OPEN, automation=applied(audit=True)),
        replace(NOTHING, claim_on_load=True, can_decide=True, can_regenerate=True, blind=True),
    ),
    "a decided audit is no longer blind": (
        replace(OPEN, decided=True, automation=applied(audit=True, audited=True)),
        replace(NOTHING, claim_on_load=True, can_decide=True),
    ),
    "an undone audit is not blind": (
        replace(OPEN, automation=applied(audit=True, undone=True)),
        replace(NOTHING, claim_on_load=True, can_decide=True, can_regenerate=True),
    ),
}


@pytest.mark.parametrize(("standing", "expected"), CASES.values(), ids=CASES.keys())
def test_the_item_page_permissions(standing: ItemStanding, expected: ItemPermissions) -> None:
    assert asdict(item_permissions(standing)) == asdict(expected)
