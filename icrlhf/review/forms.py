import re
import time
from dataclasses import dataclass, field
from typing import Any, cast

from django import forms
from django.http import QueryDict

from icrlhf.review.judgements import MAX_COMMENT_CHARS

# A decision "shown" longer ago than this did not take that long: the time is not recorded.
_MAX_DECIDE_MS = 24 * 3600 * 1000
_SHOWN = r"^[0-9]{1,18}(,[0-9]{1,18}){0,63}$"
_RATING_FIELD = re.compile(r"^rating_([0-9]{1,18})$")
_RATING_VALUE = re.compile(r"^[0-9]{1,2}$")  # ASCII digits only: int() takes "²" and worse


@dataclass(frozen=True)
class DecisionInput:
    """What a reviewer submitted, typed; the service decides what verdict it makes."""

    candidate_id: int | None  # None: none acceptable
    final_text: str = ""  # the picked candidate's editor, as submitted
    reason_tags: list[str] = field(default_factory=list)
    comment: str = ""
    time_to_decide_ms: int | None = None
    corrections: dict[str, str] = field(default_factory=dict)
    # The candidates the reviewer's page showed, by id, in its order (None: not sent).
    shown_candidate_ids: list[int] | None = None
    ratings: dict[int, int] = field(default_factory=dict)  # candidate id: 1…5


class DecisionForm(forms.Form):
    """`choice` is "c<candidate id>" or "none". Each candidate's editor posts
    final_text_<id>, the kind's corrections correction_<field> (`correction_fields`: its
    template's), the reasons reason_tags (the service checks them against the queue's): the
    form reads them all."""

    choice = forms.RegexField(regex=r"^(c\d+|none)$")
    comment = forms.CharField(required=False, max_length=MAX_COMMENT_CHARS)
    shown_at_ms = forms.IntegerField(required=False, min_value=0)
    shown_candidates = forms.RegexField(regex=_SHOWN, required=False)

    def __init__(self, data: QueryDict, *, correction_fields: tuple[str, ...]) -> None:
        super().__init__(data)
        self.correction_fields = correction_fields

    def decision_input(self) -> DecisionInput:
        """Call after is_valid()."""
        data: dict[str, Any] = self.cleaned_data
        candidate_id = None if data["choice"] == "none" else int(data["choice"][1:])
        elapsed_ms = None
        if data["shown_at_ms"]:
            elapsed_ms = int(time.time() * 1000) - data["shown_at_ms"]
            elapsed_ms = elapsed_ms if 0 <= elapsed_ms <= _MAX_DECIDE_MS else None
        return DecisionInput(
            candidate_id=candidate_id,
            final_text=_lines(
                self.data.get(f"final_text_{candidate_id}", "") if candidate_id else ""
            ),
            reason_tags=cast(QueryDict, self.data).getlist("reason_tags"),  # a POST
            comment=_lines(data["comment"]),
            time_to_decide_ms=elapsed_ms,
            corrections={
                key: _lines(self.data.get(f"correction_{key}", "")).strip()
                for key in self.correction_fields
            },
            shown_candidate_ids=_shown_ids(data["shown_candidates"]),
            ratings=data["ratings"],
        )

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        cleaned["ratings"] = ratings_of(self.data)
        return cleaned


class TryAgainForm(forms.Form):
    """ "Try again": the round's ratings (rating_<id>), reasons and comment, as a decision
    posts them; no pick."""

    comment = forms.CharField(required=False, max_length=MAX_COMMENT_CHARS)
    shown_candidates = forms.RegexField(regex=_SHOWN, required=False)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or {}
        cleaned["ratings"] = ratings_of(self.data)
        cleaned["reason_tags"] = cast(QueryDict, self.data).getlist("reason_tags")
        cleaned["shown_candidate_ids"] = _shown_ids(cleaned.get("shown_candidates") or "")
        return cleaned


def ratings_of(data: Any) -> dict[int, int]:
    """The optional ratings a page posted as rating_<candidate id>=1…5 (empty: not rated);
    the service checks the range and the candidates."""
    ratings = {}
    for key, value in data.items():
        matched = _RATING_FIELD.match(key)
        if matched and str(value).strip():
            if not _RATING_VALUE.match(str(value).strip()):
                raise forms.ValidationError("A rating is a whole number from 1 to 5.")
            ratings[int(matched.group(1))] = int(value)
    return ratings


def _shown_ids(shown: str) -> list[int] | None:
    """The candidate ids a page says it showed, in its order (None: not sent)."""
    return [int(pk) for pk in shown.split(",")] if shown else None


def _lines(text: str) -> str:
    """Browsers post a text box's line breaks as CRLF; answers keep them as LF."""
    return text.replace("\r\n", "\n")
