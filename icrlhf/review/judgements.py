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


def pick_agrees_check(ratings: dict[int, int], *, chosen_id: int) -> None:
    """A pick taken as it is cannot be rated below another candidate: its rating is the
    reward of a preferred example, and memory would learn the contrary of the ratings."""
    picked = ratings.get(chosen_id)
    if picked is not None and any(rating > picked for rating in ratings.values()):
        raise ValidationError(
            "You rated another candidate higher than the one you picked: pick that one, or "
            "change the ratings. Nothing was saved."
        )


def reasons_check(reasons: list[str], *, queue: Queue) -> None:
    unknown = [tag for tag in reasons if tag not in set(queue.reason_tags)]
    if unknown:
        raise ValidationError(f"Unknown reason: {', '.join(unknown)}.")


def comment_check(comment: str) -> None:
    if len(comment) > MAX_COMMENT_CHARS:
        raise ValidationError(f"The comment is longer than {MAX_COMMENT_CHARS:,} characters.")
