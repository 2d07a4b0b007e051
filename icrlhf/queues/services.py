from django.conf import settings
from django.core.exceptions import ValidationError

from icrlhf.queues.models import MAX_CANDIDATES


def item_input_validate(*, input_text: str) -> str:
    text = input_text.strip()
    if not text:
        raise ValidationError("The input is empty: type the prompt or ticket to answer.")
    if len(text) > settings.ITEM_INPUT_MAX_CHARS:
        raise ValidationError(
            f"The input has {len(text):,} characters; the limit is "
            f"{settings.ITEM_INPUT_MAX_CHARS:,}. Shorten it and try again."
        )
    return text


def candidate_count_validate(*, n_candidates: int) -> int:
    if not 1 <= n_candidates <= MAX_CANDIDATES:
        raise ValidationError(
            f"The number of candidates must be between 1 and {MAX_CANDIDATES}, not {n_candidates}."
        )
    return n_candidates
