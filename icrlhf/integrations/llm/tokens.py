"""Token counts where an endpoint reports none: a close, conservative estimate."""

import json
import re
from collections.abc import Sequence
from typing import Any


def count_tokens(text: str) -> int:
    """Tokens of a text, for the example budget. An estimate (≈4 characters a token) that
    holds across models, so the budget means the same whichever model a queue uses."""
    return max(1, (len(text) + 3) // 4)


# Characters worth about a token each rather than a quarter: digits (SmolLM2's vocabulary and
# others' split numbers into single digits) and letters outside ASCII (most vocabularies learnt
# on English split them into bytes).
_DENSE = re.compile(r"[0-9]|[^\x00-\x7f]")


def prompt_tokens(messages: Sequence[dict[str, Any]], *, tools: Any = None) -> int:
    """Tokens of a prompt, estimated as `count_tokens` does, each digit and each letter
    outside ASCII counted as a token: each message as JSON (its text, its tool calls, and its
    role and keys, which stand for the template's markers), and the tools offered (the
    server writes their definitions into the prompt)."""
    texts = [json.dumps(message, ensure_ascii=False) for message in messages]
    if tools:
        texts.append(json.dumps(tools, ensure_ascii=False))
    return sum(count_tokens(text) + len(_DENSE.findall(text)) * 3 // 4 for text in texts)
