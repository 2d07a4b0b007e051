"""The reflector's prompt and the answer it is held to: mutations of the playbook, each citing
the decisions it rests on (a JSON schema the server turns into a grammar)."""

from collections.abc import Sequence
from typing import Any

from icrlhf.playbook.models import SECTION_MAX_CHARS
from icrlhf.reflection.traces import DualTrace, RunTrace

MUTATIONS_MAX = 3
RULE_MAX_CHARS = 200
WHY_MAX_CHARS = 160

INSTRUCTIONS = f"""You improve the playbook of a review queue: the rules every answer of the \
queue follows. You are shown decisions where the queue's first answer lost: for each, the \
request, answers the reviewers rejected, and the answer they preferred (or none), with their \
reasons. Find what the preferred answers do that the rejected ones do not, as general rules.

Propose at most {MUTATIONS_MAX} changes: "add" a rule, "edit" a rule (name its id, give its \
new words), or "retire" a rule the decisions contradict (name its id). Each change cites the \
numbers of the decisions it rests on. A rule is one plain sentence of at most \
{RULE_MAX_CHARS} characters, general (never one customer's details), with no links or \
markup; it never asks to reveal examples, other customers' messages or instructions. Do not \
propose again what the log says a curator rejected. If the decisions show no general rule, \
propose none."""

# Added when the batch holds agents' runs (a batch of decisions alone is asked as before).
RUNS_INSTRUCTIONS = """You are also shown runs of an agent the queue serves: its goal, and \
steps it took, those marked "weak" rewarded low by the application or corrected (with the \
action that would have been right), beside steps it accepted. Rules may come from what the \
weak steps did wrong; cite a run by its number as you cite a decision."""


def mutations_schema() -> dict[str, Any]:
    mutation = {
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": ["add", "edit", "retire"]},
            "entry": {"type": "string", "pattern": "^(E[0-9]{1,4})?$"},
            # Everything is bounded: at temperature 0 a model held to a grammar may repeat
            # itself inside a string, or list numbers, until its tokens run out (the 1.5B
            # wrote one rule's text to 700 tokens, cut mid-string: no JSON). With the bounds,
            # llama.cpp's grammar made the 135M model 1.6 times slower, the 1.5B no slower.
            "section": {"type": "string", "maxLength": SECTION_MAX_CHARS},
            "text": {"type": "string", "maxLength": RULE_MAX_CHARS},
            "cites": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 10},
            "why": {"type": "string", "maxLength": WHY_MAX_CHARS},
        },
        "required": ["op", "entry", "section", "text", "cites", "why"],
        "additionalProperties": False,
    }
    return {
        "type": "json_schema",
        "json_schema": {
            "name": "playbook_mutations",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {
                    "mutations": {"type": "array", "items": mutation, "maxItems": MUTATIONS_MAX}
                },
                "required": ["mutations"],
                "additionalProperties": False,
            },
        },
    }


def reflector_messages(
    *,
    version_number: int | None,
    entries: Sequence[tuple[str, str, str]],
    log: Sequence[str],
    traces: Sequence[DualTrace],
    runs: Sequence[RunTrace] = (),
) -> list[dict[str, Any]]:
    """`entries`: (name, section, text) of the playbook in force; `log`: what curators
    decided of earlier proposals, newest first. The decisions are numbered from 1, then the
    runs."""
    playbook = (
        "\n".join(f"{name} ({section}): {text}" for name, section, text in entries)
        if entries
        else "(no rules yet)"
    )
    parts = [f"The playbook (version {version_number or 0}):\n{playbook}"]
    if log:
        parts.append("What curators decided of earlier proposals:\n" + "\n".join(log))
    # Numbered in the batch (1, 2, …), not by their ids: a small model copies a short number.
    for number, trace in enumerate(traces, start=1):
        lines = [f"Decision {number}", f"Request: {trace.request}"]
        lines += [f"Rejected answer: {text}" for text in trace.rejected]
        if trace.preferred:
            kind = "written by the reviewer" if trace.verdict == "edited" else "picked"
            lines.append(f"Preferred answer ({kind}): {trace.preferred}")
        else:
            lines.append("Preferred answer: none was acceptable")
        if trace.reasons:
            lines.append("Reasons: " + ", ".join(trace.reasons))
        if trace.comment:
            lines.append(f"Comment: {trace.comment}")
        parts.append("\n".join(lines))
    for number, run in enumerate(runs, start=len(traces) + 1):
        parts.append(_run_lines(number, run))
    return [
        {
            "role": "system",
            "content": f"{INSTRUCTIONS}\n\n{RUNS_INSTRUCTIONS}" if runs else INSTRUCTIONS,
        },
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _reward(value: float | None) -> str:
    return "" if value is None else f"reward {value:g}"


def _run_lines(number: int, run: RunTrace) -> str:
    lines = [f"Run {number}", f"Goal: {run.goal}"]
    if run.steps_hidden:
        lines.append(f"({run.steps_hidden} other steps not shown)")
    for step in run.steps:
        marks = ", ".join(filter(None, ["weak" if step.weak else "accepted", _reward(step.reward)]))
        lines.append(f"Step {step.position + 1} ({marks}): {step.action}")
        if step.correction:
            lines.append(f"  Would have been right: {step.correction}")
        if step.comment:
            lines.append(f"  Comment: {step.comment}")
    ended = ", ".join(filter(None, [run.outcome, _reward(run.reward)]))
    if ended:
        lines.append(f"The run: {ended}")
    return "\n".join(lines)
