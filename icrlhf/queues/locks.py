"""The one way to lock a review item's row, for every flow that changes an item (claims,
decisions, automation, regenerating, ranking)."""

from django.db import connection
from django.db.models import QuerySet

from icrlhf.queues.models import Item


def _items_locked() -> QuerySet[Item]:
    # SQLite ignores FOR UPDATE, so a caller outside a transaction would pass every test there
    # and fail only on PostgreSQL: refuse it on both.
    if not connection.in_atomic_block:
        raise RuntimeError("An item is locked inside transaction.atomic(), never outside.")
    # The queue is read in the same query but not locked ("of self"): a lock over the join
    # would also hold up every other item, decision and capture of the queue.
    return Item.objects.select_for_update(of=("self",)).select_related("queue")


def item_lock(item_id: int) -> Item:
    """The item with its queue, its row locked until the transaction ends: claims, decisions,
    undos and rankings of one item take turns (a no-op on SQLite, whose write transactions
    take turns already).

    Lock order, on every path: the item first, then the rows that belong to it (its
    decisions, automations, claims, generations), then its queue's row. A flow that starts
    from a decision or an automation reads its item id unlocked and locks the item before
    locking that row: two transactions that lock in opposite orders can deadlock."""
    return _items_locked().get(pk=item_id)


def item_lock_if_present(item_id: int) -> Item | None:
    """`item_lock`, or None when the item is gone (deleted while its work was queued)."""
    return _items_locked().filter(pk=item_id).first()
