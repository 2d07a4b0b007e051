from icrlhf.queues.models import Item
from icrlhf.review.models import Decision


def decision_latest(*, item: Item) -> Decision | None:
    return (
        item.decisions.select_related("reviewer", "chosen_candidate")
        .order_by("-created_at")
        .first()
    )
