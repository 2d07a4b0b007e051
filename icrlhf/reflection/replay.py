"""A proposal tried before a person sees it: the batch's failed requests, and a sample of
past successes, answered again with the draft playbook (every proposed change applied) in
place of the one their prompt carried, at temperature 0, and scored the way the queue
scores: the label or the triage fields the reviewer chose, or, for free text, a judge."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from icrlhf.generation.prompts import playbook_block
from icrlhf.integrations import llm
from icrlhf.kinds import kind_of
from icrlhf.playbook.models import Entry
from icrlhf.playbook.selectors import prompt_text
from icrlhf.queues.models import Queue
from icrlhf.reflection.models import Mutation, Proposal
from icrlhf.review.models import Decision

SUCCESSES_SAMPLED = 10
JUDGE_MAX_TOKENS = 20


@dataclass(frozen=True)
class Replay:
    fixed: int
    failures: int
    broke: int
    successes: int
    scored_by: str


def draft_text(entries: Sequence[Entry], mutations: Sequence[Mutation]) -> str:
    """The playbook as prompts would carry it with every mutation applied."""
    rules = {e.key: (e.section, e.text) for e in entries}
    new_key = max(rules, default=0)
    for m in mutations:
        if m.op == Mutation.Op.ADD:
            new_key += 1  # as version_create numbers them: after every key so far
            rules[new_key] = (m.section, m.text)
        elif m.op == Mutation.Op.RETIRE:
            rules.pop(m.key or 0, None)
        else:
            rules[m.key or 0] = (m.section, m.text)
    ordered = sorted((section, key, text) for key, (section, text) in rules.items())
    return prompt_text(
        [Entry(key=key, section=section, text=text) for section, key, text in ordered]
    )


def with_playbook(messages: list[dict[str, Any]], *, old: str, new: str) -> list[dict[str, Any]]:
    """The messages with the system message's playbook block swapped for `new` (added after
    its first paragraph, the queue's system prompt, where it had none)."""
    if not messages or messages[0].get("role") != "system":
        return [{"role": "system", "content": new}, *messages]
    content = str(messages[0].get("content") or "")
    if old and old in content:
        content = content.replace(old, new, 1)
    else:
        head, _, rest = content.partition("\n\n")
        content = f"{head}\n\n{new}" + (f"\n\n{rest}" if rest else "")
    return [{**messages[0], "content": content}, *messages[1:]]


def scored_by(queue: Queue) -> str:
    if queue.kind == Queue.Kind.TRIAGE:
        return "the triage fields"
    if queue.categories:
        return "the label"
    return f"a judge ({settings.REFLECTOR_MODEL})"


def successes_sample(queue: Queue, *, excluding: Sequence[int]) -> list[Decision]:
    """The newest decisions whose first candidate was taken as it was."""
    return list(
        Decision.objects.standing()
        .filter(item__queue=queue)
        .first_taken()
        .exclude(pk__in=excluding)
        .select_related("item", "generation", "generation__playbook")
        .order_by("-pk")[:SUCCESSES_SAMPLED]
    )


def replay(*, proposal: Proposal, failures: Sequence[Decision], entries: Sequence[Entry]) -> Replay:
    """Raises llm.LLMError when the model cannot be asked (the proposal says so)."""
    queue = proposal.queue
    draft = playbook_block("draft", draft_text(entries, list(proposal.mutations.all())))
    successes = successes_sample(queue, excluding=[d.pk for d in failures])
    fixed = sum(_right(d, queue=queue, draft=draft) for d in failures if d.generation.messages)
    kept = sum(_right(d, queue=queue, draft=draft) for d in successes if d.generation.messages)
    asked = [d for d in successes if d.generation.messages]
    return Replay(
        fixed=fixed,
        failures=sum(1 for d in failures if d.generation.messages),
        broke=len(asked) - kept,
        successes=len(asked),
        scored_by=scored_by(queue),
    )


def _right(decision: Decision, *, queue: Queue, draft: str) -> bool:
    """Whether the request, answered again with the draft, gets the reviewer's answer (for
    a decision none was acceptable in, no answer is right)."""
    if decision.verdict == Decision.Verdict.NONE_ACCEPTABLE:
        return False
    generation = decision.generation
    played = generation.playbook
    old = playbook_block(played.number, played.prompt_text) if played else ""
    kind = kind_of(queue)
    answer = llm.complete(
        messages=with_playbook(list(generation.messages), old=old, new=draft),
        model=generation.model,
        params={**generation.params, "temperature": 0.0, "seed": 7},
        api_base=generation.api_base,
        response_format=kind.response_format(queue),
    )
    wanted = decision.final_text
    if queue.kind == Queue.Kind.TRIAGE or queue.categories:
        return kind.vote_key(text=answer.text, queue=queue) == kind.vote_key(
            text=wanted, queue=queue
        )
    return _judged_as_good(request=decision.item.input_text, preferred=wanted, answer=answer.text)


def _judged_as_good(*, request: str, preferred: str, answer: str) -> bool:
    verdict = llm.complete(
        messages=[
            {
                "role": "system",
                "content": "You compare an answer with the answer a reviewer preferred for the "
                "same request. Say whether it serves the person as well: the same facts, the "
                "same next step, nothing wrong or missing that the preferred one has.",
            },
            {
                "role": "user",
                "content": f"Request: {request}\n\nPreferred answer: {preferred}\n\n"
                f"Answer to judge: {answer}",
            },
        ],
        model=settings.REFLECTOR_MODEL,
        params={"temperature": 0.0, "seed": 7, "max_tokens": JUDGE_MAX_TOKENS},
        api_base=settings.REFLECTOR_API_BASE,
        response_format={
            "type": "json_schema",
            "json_schema": {
                "name": "judgement",
                "strict": True,
                "schema": {
                    "type": "object",
                    "properties": {"as_good": {"type": "boolean"}},
                    "required": ["as_good"],
                    "additionalProperties": False,
                },
            },
        },
    )
    try:
        return json.loads(verdict.text).get("as_good") is True
    except (json.JSONDecodeError, AttributeError):
        return False
