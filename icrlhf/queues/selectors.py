from django.db.models import Count, Q, QuerySet

from icrlhf.queues.models import Item, Queue


def queues_with_counts(*, queues: QuerySet[Queue]) -> QuerySet[Queue]:
    return queues.annotate(
        items_total=Count("items"),
        items_ready=Count("items", filter=Q(items__status=Item.Status.READY)),
        items_generating=Count("items", filter=Q(items__status=Item.Status.GENERATING)),
        items_decided=Count("items", filter=Q(items__status=Item.Status.DECIDED)),
        items_automated=Count("items", filter=Q(items__status=Item.Status.AUTOMATED)),
    )


def queue_items_recent(*, queue: Queue, limit: int = 50) -> QuerySet[Item]:
    return queue.items.order_by("-created_at")[:limit]


def captured_waiting(*, queue: Queue) -> int:
    """Captured gateway calls not decided yet (still generating, or ready for review)."""
    return queue.items.filter(
        source=Item.Source.GATEWAY, status__in=[Item.Status.GENERATING, Item.Status.READY]
    ).count()
