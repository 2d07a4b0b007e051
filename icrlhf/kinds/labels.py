"""Reading which of a queue's labels an answer names, and the key memory's votes are counted
on. Pure functions, below every kind."""

import hashlib
import re


def label_words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9_ ]+", " ", text.lower().replace("-", "_")).split()


def label_named(answer: str, labels: list[str]) -> str:
    """The label a free-text answer names on its first line, compared case- and
    punctuation-blind (`Refund_not_showing_up`, `reverted_card_payment?`); failing that, the
    first word of that line that is a label; "" when none."""
    by_form = {"_".join(label_words(label)): label for label in labels}
    words = label_words((answer.strip().splitlines() or [""])[0])
    if "_".join(words) in by_form:
        return by_form["_".join(words)]
    return next((by_form[word] for word in words if word in by_form), "")


def answer_key(text: str) -> str:
    """Two answers count as the same when they differ only in case and whitespace."""
    return hashlib.sha256(" ".join(text.casefold().split()).encode()).hexdigest()[:20]
