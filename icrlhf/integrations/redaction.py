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

from icrlhf.integrations import untrusted_json

EMAIL, PHONE, CARD, IBAN = "[email]", "[phone]", "[card number]", "[IBAN]"

# Where to look; each candidate is then confirmed by its library. Cards: 13–19 digits in
# groups; IBANs: two letters, two check digits, then up to 30 letters and digits in groups.
_CARD_CANDIDATE = re.compile(r"\b\d(?:[ -]?\d){12,18}\b")
_IBAN_CANDIDATE = re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b", re.IGNORECASE)
# An address candidate ends at spaces and at the characters that surround one in text and in
# JSON, escaped JSON too (`{"to":"ana@example.com"}`, `\\"ana@example.com\\"`,
# `mail:ana@example.com`); the validator then decides. Runs are matched whole, and only those
# with an "@" inside are candidates: a pattern with the "@" in it backtracked over every start
# of a long run without one (a 200,000-character word took two minutes).
_TOKEN = re.compile(r"[^\s\"'\\<>()\[\]{},;:]+")
_EDGE_PUNCTUATION = "<>()[]{}\"'.,;:!?"


@dataclass
class Redacted:
    text: str
    counts: dict[str, int] = field(default_factory=dict)


def _emails(text: str, counts: dict[str, int]) -> str:
    if "@" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if "@" not in token[1:-1]:
            return token
        core = token.strip(_EDGE_PUNCTUATION)
        try:
            validate_email(core, check_deliverability=False)
        except EmailNotValidError:
            return token
        counts[EMAIL] = counts.get(EMAIL, 0) + 1
        return token.replace(core, EMAIL)

    return _TOKEN.sub(replace, text)


# A number's first groups, and a card number's last ones, may be something else than the
# number (an order's "7" before or after a card): this many of them are tried.
_GROUPS_TRIED = 3


def _numbers(
    text: str,
    *,
    pattern: re.Pattern[str],
    ends: Callable[[str], list[int]],
    valid: Callable[[str], bool],
    placeholder: str,
    counts: dict[str, int],
) -> str:
    """`text` with each number `pattern` finds that `valid` confirms replaced by `placeholder`:
    a candidate from its first group to the first of `ends(candidate)` that passes. A candidate
    that passes nowhere is searched again from its second group, up to _GROUPS_TRIED times:
    what comes before a number may be digits or letters of something else ("order 7 4111 …",
    "\\ud800 DE89 …", a word that looks like an IBAN's start); past that, the search goes on
    after it, so that a megabyte of groups stays a linear scan."""
    pieces: list[str] = []
    written = searched = retried = 0
    while (match := pattern.search(text, searched)) is not None:
        found = match.group(0)
        end = next((end for end in ends(found) if valid(found[:end])), None)
        if end is not None:
            pieces += [text[written : match.start()], placeholder]
            counts[placeholder] = counts.get(placeholder, 0) + 1
            written = searched = match.start() + end
            retried = 0
            continue
        separator = next((i for i, character in enumerate(found) if character in " -"), None)
        if separator is None or retried == _GROUPS_TRIED:
            searched, retried = match.end(), 0
        else:
            searched, retried = match.start() + separator + 1, retried + 1
    return "".join([*pieces, text[written:]])


def _card_ends(found: str) -> list[int]:
    separators = [index for index, character in enumerate(found) if character in " -"]
    return [len(found), *reversed(separators[-_GROUPS_TRIED + 1 :])]


def _is_card(found: str) -> bool:
    digits = re.sub(r"[ -]", "", found)
    return 13 <= len(digits) <= 19 and luhn.is_valid(digits)


def _iban_ends(found: str) -> list[int]:
    # The pattern runs on into the words after an IBAN ("… 6119 to other bank"): the longest
    # run of the candidate's groups that passes the check is the IBAN, the rest stays.
    return [len(found), *(i for i in range(len(found) - 1, 14, -1) if found[i] == " ")]


def _is_iban(found: str) -> bool:
    # ISO 7064's mod 97 first, at the cost of one big integer: 96 candidates in 97 fail it, and
    # the library's whole check (each country's length and format) is twenty times dearer.
    compact = found.replace(" ", "").upper()
    rearranged = compact[4:] + compact[:4]
    if not rearranged.isalnum() or int("".join(str(int(c, 36)) for c in rearranged)) % 97 != 1:
        return False
    return iban.is_valid(compact)


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
    # The matcher reads a number and the digits after it as one candidate, and drops it whole
    # when that is no valid number ("+1 650 253 0000 2 times"): what it left is searched
    # again, group by group, as card numbers are.
    return _numbers(
        text,
        pattern=_PHONE_CANDIDATE,
        ends=_phone_ends,
        valid=_is_phone,
        placeholder=PHONE,
        counts=counts,
    )


# Digits in groups, as numbers are written: "+1 650 253 0000", "(650) 253-0000"; a time
# after them is taken in ("2026-11-29 10:00"), so that a date and hour never end a number.
_PHONE_CANDIDATE = re.compile(r"(?<![\w+])\+?\(?\d(?:[ ().-]{1,2}\(?\d|\d){6,}(?::\d+)*")
# The longest phone number written with its separators: 15 digits (E.164) and a few more.
_PHONE_MAX_CHARS = 24


def _phone_ends(found: str) -> list[int]:
    """Where a number may end in the candidate: its end, then each group's, longest first,
    within a phone number's length."""
    groups = [i for i, character in enumerate(found) if character in " -.)("]
    return [end for end in [len(found), *reversed(groups)] if 7 <= end <= _PHONE_MAX_CHARS]


def _is_phone(found: str) -> bool:
    """What the matcher finds in `found` standing alone, all of it: its own checks apply
    (dates and times are not numbers)."""
    matches = phonenumbers.PhoneNumberMatcher(
        found, settings.REDACTION_PHONE_REGION, leniency=phonenumbers.Leniency.VALID
    )
    return any(m.raw_string.strip(" -.(") == found.strip(" -.(") for m in matches)


# Every kind of personal data found here holds a digit or an "@": a text with neither is
# returned as it is, at C speed (most words, keys and values are such texts).
_MAYBE_PERSONAL = re.compile(r"[\d@]")


def redact(text: str) -> Redacted:
    """The text with personal data replaced, and how many of each kind."""
    counts: dict[str, int] = {}
    if _MAYBE_PERSONAL.search(text) is None:
        return Redacted(text=text, counts=counts)
    text = _emails(text, counts)
    text = _numbers(
        text,
        pattern=_IBAN_CANDIDATE,
        ends=_iban_ends,
        valid=_is_iban,
        placeholder=IBAN,
        counts=counts,
    )
    text = _numbers(
        text,
        pattern=_CARD_CANDIDATE,
        ends=_card_ends,
        valid=_is_card,
        placeholder=CARD,
        counts=counts,
    )
    text = _phones(text, counts)
    return Redacted(text=text, counts=counts)


# What identifies a message or a tool call, never what someone wrote: left as it is at the
# envelope's own level, so that a result still answers its call (`call_4155552671` is an id,
# not a phone number). Inside a content, a call's arguments or a tool's result the same keys
# are words like any other (`lookup({"id": "ana@example.com"})`).
_MESSAGE_ENVELOPE = frozenset({"role", "tool_call_id"})
_TOOL_CALL_ENVELOPE = frozenset({"id", "type"})


def redact_json(value: Any) -> Any:
    """`value` with every string and number in it redacted, walking lists and dicts (messages,
    tool calls, tool results, structured outputs). A string that holds JSON (a tool call's
    `arguments`, a tool's result) is redacted as the JSON it holds, so it stays JSON: a number
    that is personal data becomes its placeholder as a string."""
    return _redacted(value, envelope=True)[0]


def _redacted(value: Any, *, envelope: bool) -> tuple[Any, bool]:
    """`value` redacted, and whether anything changed. `envelope`: `value` may be a message,
    a tool call or a list of them (not yet inside what someone wrote).

    Walked without recursion: a caller's value is as deep as a request's parser allowed.
    Each dict or list is copied into its holder, then its children are redacted into it."""
    changed = False
    top: list[Any] = [None]
    pending: list[tuple[list[Any] | dict[str, Any], int | str, Any, bool]] = [
        (top, 0, value, envelope)
    ]
    while pending:
        holder, slot, item, in_envelope = pending.pop()
        if isinstance(item, list):
            copy: list[Any] = [None] * len(item)
            holder[slot] = copy  # type: ignore[index]
            pending.extend((copy, i, child, in_envelope) for i, child in enumerate(item))
        elif isinstance(item, dict):
            kept = _envelope_keys(item) if in_envelope else frozenset()
            keys = _redacted_keys(list(item))
            changed = changed or keys != list(item)
            mapping: dict[str, Any] = dict.fromkeys(keys)  # the caller's key order
            holder[slot] = mapping  # type: ignore[index]
            for (key, child), new_key in zip(item.items(), keys, strict=True):
                if key in kept:
                    mapping[new_key] = child
                else:
                    # A message's or an action's tool calls are envelopes too.
                    envelope_below = in_envelope and key == "tool_calls"
                    pending.append((mapping, new_key, child, envelope_below))
        else:
            redacted = _redacted_scalar(item)
            changed = changed or redacted != item
            holder[slot] = redacted  # type: ignore[index]
    return top[0], changed


def _redacted_keys(keys: list[Any]) -> list[Any]:
    """An object's keys, redacted too: a tool's result is often keyed by the personal data
    itself (`{"ana@example.com": {...}}`). A key that became a placeholder is kept apart from
    every other key (`[email]`, `[email] 2`), so that no value is lost."""
    original = set(keys)
    redacted: list[Any] = []
    for key in keys:
        new_key = redact(key).text if isinstance(key, str) else key
        if new_key != key:
            base, number = new_key, 2
            while new_key in original or new_key in redacted:
                new_key, number = f"{base} {number}", number + 1
        redacted.append(new_key)
    return redacted


def _envelope_keys(item: dict[str, Any]) -> frozenset[str]:
    if "role" in item:  # a message
        return _MESSAGE_ENVELOPE
    if "function" in item:  # a tool call
        return _TOOL_CALL_ENVELOPE
    return frozenset()


def _redacted_scalar(value: Any) -> Any:
    if isinstance(value, str):
        return _redacted_text(value)
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        text = str(value)
        redacted = redact(text).text
        return value if redacted == text else redacted
    return value


def _redacted_text(text: str) -> str:
    if text.lstrip()[:1] in ("{", "["):
        try:
            parsed = untrusted_json.loads(text)
        except untrusted_json.NotJson:
            pass  # not JSON after all (or too deep to be read as JSON): redacted as text
        else:
            # What the string holds is someone's words, never an envelope. (This recursion
            # is bounded: each string nested in a string doubles its escapes.)
            redacted, changed = _redacted(parsed, envelope=False)
            # Unchanged, it is kept byte for byte (its spacing is the caller's).
            return untrusted_json.dumps(redacted) if changed else text
    return redact(text).text


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
