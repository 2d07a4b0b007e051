"""A proposal tried before a person sees it: the batch's failed requests, and a sample of
past successes, answered again with the draft playbook (every proposed change applied) in
place of the one their prompt carried, at temperature 0, and scored the way the queue
scores: the label or the triage fields the reviewer chose, or, for free text, a judge.

An agent's run is replayed at its corrected steps (failures: right when the answer is the
correction) and at a sample of accepted steps of other runs (successes: right when it is
the action taken). A step's prompt is rebuilt as the gateway builds it, from the call's
conversation and tools, but without examples: the correction is in memory itself now, and
would answer its own replay."""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from icrlhf.generation.context import Room, prompt_context, request_signature
from icrlhf.generation.prompts import playbook_block
from icrlhf.integrations import llm
from icrlhf.kinds import kind_of
from icrlhf.memory.selectors import Recall
from icrlhf.playbook.models import Entry
from icrlhf.playbook.selectors import prompt_text
from icrlhf.queues.models import Queue
from icrlhf.reflection.models import Mutation, Proposal
from icrlhf.reflection.traces import weak_steps_q
from icrlhf.review.models import Decision
from icrlhf.trajectories.models import Feedback, Step, Trajectory
from icrlhf.trajectories.selectors import APPROVAL_ALLOWS_MEMORY

SUCCESSES_SAMPLED = 10
# Accepted steps of agents' runs replayed beside the decisions' successes, when runs were read.
STEP_SUCCESSES_SAMPLED = 5
JUDGE_MAX_TOKENS = 20


@dataclass(frozen=True)
class Replay:
    fixed: int
    failures: int
    broke: int
    successes: int
    scored_by: str
    # Of the figures above, those of agents' steps (corrected, accepted).
    steps_fixed: int = 0
    steps_failed: int = 0
    steps_broke: int = 0
    steps_succeeded: int = 0


@dataclass(frozen=True)
class StepWanted:
    """An agent's step to replay, and the action that is right there."""

    step: Step
    text: str
    tool_calls: list[dict[str, Any]]


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


def corrected_steps(runs: Sequence[Trajectory]) -> list[StepWanted]:
    """The runs' steps that feedback corrected and whose call is still logged, each with its
    latest correction."""
    latest: dict[int, dict[str, Any]] = {}
    for feedback in (
        Feedback.objects.filter(trajectory__in=runs, step__call__isnull=False)
        .exclude(corrected_action={})
        .order_by("created_at", "pk")
    ):
        latest[feedback.step_id] = feedback.corrected_action  # type: ignore[index]
    steps = Step.objects.filter(pk__in=list(latest)).select_related("call", "trajectory")
    return [
        StepWanted(
            step=step,
            text=str(latest[step.pk].get("content") or ""),
            tool_calls=list(latest[step.pk].get("tool_calls") or []),
        )
        for step in steps.order_by("trajectory", "position")
    ]


def accepted_steps_sample(queue: Queue, *, excluding: Sequence[Trajectory]) -> list[StepWanted]:
    """The newest steps, of the queue's runs a reviewer has not kept out of memory, that
    nothing marked weak (rewarded low, corrected, of a failed run), with their call logged."""
    steps = (
        Step.objects.filter(
            trajectory__queue=queue,
            trajectory__approval__in=APPROVAL_ALLOWS_MEMORY,
            call__isnull=False,
        )
        .exclude(trajectory__in=excluding)
        .exclude(weak_steps_q(queue))
        .select_related("call", "trajectory")
        .order_by("-created_at", "-pk")[:STEP_SUCCESSES_SAMPLED]
    )
    return [StepWanted(step=s, text=s.action_text, tool_calls=s.tool_calls) for s in steps]


def replay(
    *,
    proposal: Proposal,
    failures: Sequence[Decision],
    entries: Sequence[Entry],
    runs: Sequence[Trajectory] = (),
) -> Replay:
    """Raises llm.LLMError when the model cannot be asked (the proposal says so)."""
    queue = proposal.queue
    draft = playbook_block("draft", draft_text(entries, list(proposal.mutations.all())))
    successes = successes_sample(queue, excluding=[d.pk for d in failures])
    fixed = sum(_right(d, queue=queue, draft=draft) for d in failures if d.generation.messages)
    kept = sum(_right(d, queue=queue, draft=draft) for d in successes if d.generation.messages)
    asked = [d for d in successes if d.generation.messages]
    step_failures = corrected_steps(runs)
    step_successes = accepted_steps_sample(queue, excluding=runs) if step_failures else []
    steps_fixed = sum(_step_right(s, queue=queue, draft=draft) for s in step_failures)
    steps_kept = sum(_step_right(s, queue=queue, draft=draft) for s in step_successes)
    return Replay(
        fixed=fixed + steps_fixed,
        failures=sum(1 for d in failures if d.generation.messages) + len(step_failures),
        broke=len(asked) - kept + len(step_successes) - steps_kept,
        successes=len(asked) + len(step_successes),
        scored_by=scored_by(queue),
        steps_fixed=steps_fixed,
        steps_failed=len(step_failures),
        steps_broke=len(step_successes) - steps_kept,
        steps_succeeded=len(step_successes),
    )


def _nothing_retrieved(**_: Any) -> Recall:
    return Recall(examples=[], neighbours=[])


def _step_right(wanted: StepWanted, *, queue: Queue, draft: str) -> bool:
    """Whether the step, asked again with the draft (its call's conversation and tools, the
    queue's prompt, no examples), takes the wanted action."""
    call = wanted.step.call
    assert call is not None  # selected with one
    model = queue.llm_model
    params = {"temperature": 0.0, "seed": 7, "max_tokens": queue.max_tokens}
    prompt = prompt_context(
        queue=queue,
        query_text=wanted.step.decision_point,
        conversation=call.context,
        signature=request_signature(conversation=call.context, options=call.options),
        pool=0,
        retrieve=_nothing_retrieved,
    )
    room = Room.of_call(model=model, api_base=queue.api_base, params=params, options=call.options)
    sent = prompt.fitted(examples=[], room=room)
    played = prompt.playbook
    old = playbook_block(played.number, played.text) if played.text else ""
    answer = llm.complete(
        messages=with_playbook(sent.messages, old=old, new=draft),
        model=model,
        params=params,
        api_base=queue.api_base,
        options=call.options or None,
    )
    if wanted.tool_calls or answer.tool_calls:
        return _calls(list(answer.tool_calls)) == _calls(wanted.tool_calls)
    if " ".join(answer.text.split()) == " ".join(wanted.text.split()):
        return True
    return _judged_as_good(
        request=wanted.step.trajectory.goal, preferred=wanted.text, answer=answer.text
    )


def _calls(tool_calls: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Tool calls compared by name and arguments (parsed, so that spacing and key order do
    not count), in any order."""
    compared = []
    for call in tool_calls:
        function = call.get("function") or {}
        arguments = function.get("arguments") or "{}"
        try:
            arguments = json.dumps(json.loads(arguments), sort_keys=True)
        except (TypeError, json.JSONDecodeError):
            arguments = str(arguments)
        compared.append((str(function.get("name") or ""), arguments))
    return sorted(compared)


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
