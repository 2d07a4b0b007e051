"""Personal data out of a text before it is stored or embedded: e-mail addresses, phone
numbers, payment card and IBAN numbers become placeholders a reviewer sees in their place.

Each kind is confirmed by a well-kept library, not guessed by a pattern: phone numbers are
found by Google's libphonenumber (`phonenumbers`, valid numbers only, in the region of
REDACTION_PHONE_REGION or written with their +country code), card numbers must pass the
Luhn check and IBANs their ISO 13616 check (`python-stdnum`), e-mail addresses the standard's
syntax (`email-validator`, no DNS lookup). A number that fails its check (an order number,
a date) is left alone."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import phonenumbers
from django.conf import settings
from email_validator import EmailNotValidError, validate_email
from stdnum import iban, luhn

EMAIL, PHONE, CARD, IBAN = "[email]", "[phone]", "[card number]", "[IBAN]"

# Where to look; each candidate is then confirmed by its library. Cards: 13–19 digits in
# groups; IBANs: two letters, two check digits, then up to 30 letters and digits in groups.
_CARD_CANDIDATE = re.compile(r"\b\d(?:[ -]?\d){12,18}\b")
_IBAN_CANDIDATE = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b", re.IGNORECASE)
# An address candidate ends at spaces and at the characters that surround one in text and in
# JSON, escaped JSON too (`{"to":"ana@example.com"}`, `\\"ana@example.com\\"`,
# `mail:ana@example.com`); the validator then decides.
_TOKEN = re.compile(r"[^\s\"'\\<>()\[\]{},;:]+@[^\s\"'\\<>()\[\]{},;:]+")
_EDGE_PUNCTUATION = "<>()[]{}\"'.,;:!?"


@dataclass
class Redacted:
    text: str
    counts: dict[str, int] = field(default_factory=dict)


def _emails(text: str, counts: dict[str, int]) -> str:
    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        core = token.strip(_EDGE_PUNCTUATION)
        try:
            validate_email(core, check_deliverability=False)
        except EmailNotValidError:
            return token
        counts[EMAIL] = counts.get(EMAIL, 0) + 1
        return token.replace(core, EMAIL)

    return _TOKEN.sub(replace, text)


def _checked(
    text: str,
    pattern: re.Pattern[str],
    valid: Callable[[str], bool],
    placeholder: str,
    counts: dict[str, int],
) -> str:
    def replace(match: re.Match[str]) -> str:
        if not valid(re.sub(r"[ -]", "", match.group(0))):
            return match.group(0)
        counts[placeholder] = counts.get(placeholder, 0) + 1
        return placeholder

    return pattern.sub(replace, text)


def _phones(text: str, counts: dict[str, int]) -> str:
    found = list(
        phonenumbers.PhoneNumberMatcher(
            text, settings.REDACTION_PHONE_REGION, leniency=phonenumbers.Leniency.VALID
        )
    )
    for match in reversed(found):  # from the end, so earlier offsets stay right
        text = text[: match.start] + PHONE + text[match.end :]
    if found:
        counts[PHONE] = counts.get(PHONE, 0) + len(found)
    return text


def redact(text: str) -> Redacted:
    """The text with personal data replaced, and how many of each kind."""
    counts: dict[str, int] = {}
    text = _emails(text, counts)
    text = _checked(text, _IBAN_CANDIDATE, iban.is_valid, IBAN, counts)
    text = _checked(text, _CARD_CANDIDATE, luhn.is_valid, CARD, counts)
    text = _phones(text, counts)
    return Redacted(text=text, counts=counts)


def redact_json(value: Any) -> Any:
    """`value` with every string in it redacted, walking lists and dicts (tool calls, tool
    results, structured outputs). A tool call's `arguments` is JSON text: a placeholder holds
    no quote or backslash, so the text stays the same JSON with the data replaced."""
    if isinstance(value, str):
        return redact(value).text
    if isinstance(value, list):
        return [redact_json(each) for each in value]
    if isinstance(value, dict):
        return {key: redact_json(each) for key, each in value.items()}
    return value


# Where end users' words are going: the call log (and its agent steps and feedback), or
# review (items, memory, exports), which reviewers read and other callers' prompts receive.
type Destination = Literal["log", "review"]


def scrub[T](value: T, *, into: Destination) -> T:
    """The one redaction every way into storage goes through, under REDACTION: "all" redacts
    everything kept, "captured" what reaches review, memory and exports, "off" nothing."""
    mode = settings.REDACTION
    if mode == "off" or (mode == "captured" and into == "log"):
        return value
    return cast(T, redact_json(value))
