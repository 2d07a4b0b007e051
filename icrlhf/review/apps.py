import logging
from typing import Any

from django.apps import AppConfig

logger = logging.getLogger(__name__)


class ReviewConfig(AppConfig):
    name = "icrlhf.review"
    label = "review"

    def ready(self) -> None:
        from icrlhf.generation.signals import generation_ranked

        generation_ranked.connect(_generation_ranked, dispatch_uid="review.automation")


def _generation_ranked(sender: Any, *, generation_id: int, **kwargs: Any) -> None:
    """Above the queue's threshold, apply the first candidate. A failure here leaves the item
    with the reviewers, as if automation were off."""
    from icrlhf.review.automation import generation_consider

    try:
        generation_consider(generation_id=generation_id)
    except Exception:
        logger.exception("Automation of generation %s failed; it stays in review", generation_id)
