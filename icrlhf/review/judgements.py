"""What a reviewer says about a round beyond the pick: ratings, reasons and a comment, checked
alike for a decision and for a "try again"."""

from django.core.exceptions import ValidationError

from icrlhf.generation.models import Candidate, Generation
from icrlhf.memory.services import RATINGS
from icrlhf.queues.models import Queue

MAX_COMMENT_CHARS = 5_000


def ratings_check(ratings: dict[int, int], *, generation: Generation) -> None:
    """Ratings are 1…5, each of a finished candidate of the round."""
    if any(rating not in RATINGS for rating in ratings.values()):
        raise ValidationError(f"A rating is {RATINGS.start} to {RATINGS.stop - 1}.")
    finished = set(
        generation.candidates.filter(status=Candidate.Status.DONE).values_list("pk", flat=True)
    )
    if not set(ratings) <= finished:
        raise ValidationError("A rating is for a candidate of this round that has an answer.")


def reasons_check(reasons: list[str], *, queue: Queue) -> None:
    unknown = [tag for tag in reasons if tag not in set(queue.reason_tags)]
    if unknown:
        raise ValidationError(f"Unknown reason: {', '.join(unknown)}.")


def comment_check(comment: str) -> None:
    if len(comment) > MAX_COMMENT_CHARS:
        raise ValidationError(f"The comment is longer than {MAX_COMMENT_CHARS:,} characters.")
