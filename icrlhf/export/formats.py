"""The export formats. Each derived format is computed from the canonical record alone, so a
canonical export can be turned into any other later (the round trip is tested).

Canonical (schema_version 1): one record per decision — see docs/exports.md for every field.
Derived, each line one training example:
- trl:    {"prompt": [...], "chosen": [...], "rejected": [...]}  one per rejected candidate,
          plus the edit over its original when the reviewer edited;
- openai: {"input": {"messages": [...]}, "preferred_output": [...],
          "non_preferred_output": [...]}  the same pairs, OpenAI preference fine-tuning;
- kto:    {"prompt": [...], "completion": [...], "label": true|false}  one per answer.
"""

from collections.abc import Iterator
from typing import Any

SCHEMA_VERSION = 1
FORMATS = ("canonical", "trl", "openai", "kto")

Record = dict[str, Any]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def training_prompt(record: Record) -> list[dict[str, str]]:
    """The request as a policy would see it without memory: the system message sent, and the
    user's input (the retrieved example turns in between are left out)."""
    prompt = [m for m in record["messages"][:1] if m["role"] == "system"]
    return [*prompt, {"role": "user", "content": record["item"]["input"]}]


def preference_pairs(record: Record) -> list[tuple[str, str]]:
    """(preferred, rejected) texts: the final answer over every other answered candidate, and
    an edit over the candidate it was edited from. None for "none acceptable"."""
    if record["verdict"] not in {"chosen", "edited"}:
        return []
    final = record["final_text"]
    answered = [c for c in record["candidates"] if c["status"] == "done"]
    chosen_id = record["chosen_candidate_id"]
    pairs = [(final, c["text"]) for c in answered if c["id"] != chosen_id]
    if record["verdict"] == "edited":
        pairs += [(final, c["text"]) for c in answered if c["id"] == chosen_id]
    return pairs


def derive(record: Record, fmt: str) -> Iterator[Record]:
    if fmt == "canonical":
        yield record
        return
    prompt = training_prompt(record)
    if fmt == "trl":
        for preferred, rejected in preference_pairs(record):
            yield {
                "prompt": prompt,
                "chosen": _assistant(preferred),
                "rejected": _assistant(rejected),
            }
    elif fmt == "openai":
        for preferred, rejected in preference_pairs(record):
            yield {
                "input": {"messages": prompt},
                "preferred_output": _assistant(preferred),
                "non_preferred_output": _assistant(rejected),
            }
    elif fmt == "kto":
        answered = [c for c in record["candidates"] if c["status"] == "done"]
        if record["verdict"] in {"chosen", "edited"}:
            yield {"prompt": prompt, "completion": _assistant(record["final_text"]), "label": True}
        for candidate in answered:
            if record["verdict"] == "chosen" and candidate["id"] == record["chosen_candidate_id"]:
                continue
            yield {"prompt": prompt, "completion": _assistant(candidate["text"]), "label": False}
    else:
        raise ValueError(f"Unknown format {fmt!r}; choose one of {', '.join(FORMATS)}.")
