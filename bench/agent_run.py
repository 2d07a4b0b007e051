"""bench_agent's measurement, inside its world (see the command's docstring): the agent calls
the real gateway process with the `openai` client; the gateway retrieves from the real worker's
store and calls the configured model."""

import json
import random
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from openai import OpenAI

from bench.agent_env import (
    MAX_STEPS,
    SYSTEM,
    TOOLS,
    Desk,
    Task,
    argument_name,
    expert,
    tasks,
    text_action,
    text_prompt,
)
from bench.playbook_arms import playbook_arms
from bench.reviewed import answer_chosen, examples_indexed
from icrlhf.ingest.services import token_create
from icrlhf.insights.stats import wilson
from icrlhf.integrations import embeddings
from icrlhf.memory import curation
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item, Queue

VARIANTS = ("tools", "text")
TIMEOUT_S = 600
# The text variant's first observation: nothing has been done yet.
NOTHING_YET = "nothing yet"


@dataclass(frozen=True)
class Step:
    """One decision of an expert trajectory: the conversation before it and the action."""

    conversation: list[dict[str, Any]]
    decision_point: str  # what the gateway retrieves with (and the example is stored under)
    tool: str
    argument: str


@dataclass
class Episode:
    success: bool
    actions: list[tuple[str, str]]
    error: str = ""  # the call that failed, which ended the episode
    # The gateway's id of each step's call (X-Icrlhf-Call), for feedback on one step.
    calls: list[str] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.actions)


# ---------------------------------------------------------------- the two kinds of agent


def _run_header(run_id: str) -> dict[str, str]:
    """Names the episode's trajectory, so that feedback can name it too."""
    return {"X-Icrlhf-Trajectory": run_id} if run_id else {}


def _tool_call(number: int, tool: str, argument: str) -> dict[str, Any]:
    return {
        "id": f"call_{number}",
        "type": "function",
        "function": {"name": tool, "arguments": json.dumps({argument_name(tool): argument})},
    }


def _argument(arguments: str) -> str:
    """The one argument the desk's tools take, from the model's JSON (any key: a small model
    names it freely), or the raw text when it is not JSON."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and parsed:
        return str(next(iter(parsed.values())))
    return str(parsed)


def tools_episode(
    client: OpenAI, model: str, task: Task, max_tokens: int, run_id: str = ""
) -> Episode:
    """The tool loop applications run: call with `tools`, carry out the calls, send back the
    results, until the model ends the conversation or acts on the order."""
    desk = Desk(task)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task.goal},
    ]
    error = ""
    call_ids: list[str] = []
    while not desk.done:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                max_tokens=max_tokens,
                extra_headers=_run_header(run_id),
            )
            answer = raw.parse()
        except Exception as failure:  # the episode fails, as the application's would
            error = str(failure)[:300]
            break
        call_ids.append(raw.headers.get("X-Icrlhf-Call", ""))
        message = answer.choices[0].message
        calls = list(message.tool_calls or [])[:1]  # one action a step
        if not calls:
            desk.act("reply", message.content or "")
            break
        call = calls[0]
        name = call.function.name  # type: ignore[union-attr]
        arguments = call.function.arguments  # type: ignore[union-attr]
        observation = desk.act(name, _argument(arguments))
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": name, "arguments": arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
    return Episode(success=desk.success, actions=desk.actions, error=error, calls=call_ids)


def text_episode(
    client: OpenAI, model: str, task: Task, max_tokens: int, run_id: str = ""
) -> Episode:
    """The icrl library's form: one prompt a step with the goal and the latest observation;
    the action is the answer's text."""
    desk = Desk(task)
    observation, error = NOTHING_YET, ""
    call_ids: list[str] = []
    while not desk.done:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": text_prompt(task.goal, observation)}],
                max_tokens=max_tokens,
                extra_headers=_run_header(run_id),
            )
            answer = raw.parse()
        except Exception as failure:
            error = str(failure)[:300]
            break
        call_ids.append(raw.headers.get("X-Icrlhf-Call", ""))
        action = text_action(answer.choices[0].message.content or "")
        if action is None:
            desk.act("reply", answer.choices[0].message.content or "")
            break
        observation = desk.act(*action)
    return Episode(success=desk.success, actions=desk.actions, error=error, calls=call_ids)


EPISODES: dict[str, Callable[[OpenAI, str, Task, int, str], Episode]] = {
    "tools": tools_episode,
    "text": text_episode,
}


# ---------------------------------------------------------------- expert trajectories


def expert_steps(task: Task, variant: str) -> list[Step]:
    """The expert's trajectory as the agent of `variant` would have lived it."""
    steps: list[Step] = []
    desk = Desk(task)
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task.goal},
    ]
    observation = NOTHING_YET
    for number, (tool, argument) in enumerate(expert(task)):
        if variant == "text":
            point = text_prompt(task.goal, observation)
            steps.append(Step([], point, tool, argument))
        else:
            latest = conversation[-1]
            point = task.goal if latest["role"] == "user" else f"{task.goal}\n\n{latest['content']}"
            steps.append(Step(list(conversation), point, tool, argument))
        observation = desk.act(tool, argument)
        call = _tool_call(number, tool, argument)
        conversation.append({"role": "assistant", "content": None, "tool_calls": [call]})
        conversation.append({"role": "tool", "tool_call_id": call["id"], "content": observation})
    return steps


def remember(queue: Queue, task: Task, variant: str, reviewer: User) -> None:
    """An environment-verified trajectory into memory, through the review flow's own path: each
    step an item (the conversation and tools it was taken with) whose one candidate is the
    step taken, picked by a reviewer; the decision stores the example and the worker indexes
    it."""
    for step in expert_steps(task, variant):
        tool_calls = [] if variant == "text" else [_tool_call(0, step.tool, step.argument)]
        item = Item.objects.create(
            queue=queue,
            input_text=step.decision_point,
            source=Item.Source.GATEWAY,
            status=Item.Status.READY,
            conversation=step.conversation,
            call_options={"tools": TOOLS} if variant == "tools" else {},
        )
        answer_chosen(
            item,
            model="expert",
            reviewer=reviewer,
            text=f"{step.tool} {step.argument}" if variant == "text" else "",
            tool_calls=tool_calls,
        )


# ---------------------------------------------------------------- retrieval queries (item 4)


def _query(step: Step, how: str, task: Task) -> str:
    turns = [m for m in step.conversation if m["role"] != "system"]
    if how == "last_user_message":
        return task.goal  # in a tool loop, the only user message is the goal
    if how == "goal_and_latest_observation":
        return step.decision_point
    return "\n".join(  # the whole conversation
        str(m.get("content") or json.dumps(m.get("tool_calls"))) for m in turns
    )


def retrieval_queries(stored: list[Task], held_out: list[Task]) -> dict[str, dict[str, float]]:
    """Which query finds a step whose action is the right next one: for each held-out expert
    step, the stored steps nearest by each query (stored under the same query), and the share
    whose nearest (top-1), or majority of the nearest three (top-3), took the same action."""
    result: dict[str, dict[str, float]] = {}
    pairs = [(task, step) for task in stored for step in expert_steps(task, "tools")]
    asked = [(task, step) for task in held_out for step in expert_steps(task, "tools")]
    for how in ("last_user_message", "goal_and_latest_observation", "whole_conversation"):
        keys = np.array(embeddings.embed_texts([_query(s, how, t) for t, s in pairs]))
        queries = np.array(embeddings.embed_texts([_query(s, how, t) for t, s in asked]))
        similarity = queries @ keys.T
        top1 = top3 = 0
        for row, (_, step) in zip(similarity, asked, strict=True):
            nearest = np.argsort(-row)[:3]
            tools = [pairs[i][1].tool for i in nearest]
            top1 += tools[0] == step.tool
            top3 += max(set(tools), key=tools.count) == step.tool
        result[how] = {
            "top1_right_action": round(top1 / len(asked), 3),
            "top3_majority_right_action": round(top3 / len(asked), 3),
            "steps": len(asked),
        }
    return result


# ---------------------------------------------------------------- learning from feedback


def failing_step(task: Task, actions: list[tuple[str, str]]) -> int | None:
    """The first step at which the agent left the expert's way (another tool, another order,
    a reply without the delivery day); None when it never did."""
    for number, ((name, argument), (tool, right)) in enumerate(
        zip(actions, expert(task), strict=False)
    ):
        if name != tool:
            return number
        if tool == "reply" and task.day.lower() not in argument.lower():
            return number
        if tool != "reply" and argument != right:
            return number
    return len(actions) if len(actions) < len(expert(task)) else None


def expert_correction(task: Task, variant: str, number: int) -> dict[str, Any]:
    """The desk's expert action at step `number`, as the feedback API's corrected_action."""
    tool, argument = expert(task)[number]
    if variant == "text":
        return {"content": f"{tool} {argument}"}
    return {"tool_calls": [_tool_call(number, tool, argument)]}


def _feedback_post(url: str, api_key: str, body: dict[str, Any]) -> None:
    """POST feedback as an application does. A call is logged once its answer has been sent:
    the API answers 404 for a moment after, so that is retried."""
    for _ in range(40):
        response = httpx.post(
            url, json=body, headers={"Authorization": f"Bearer {api_key}"}, timeout=60
        )
        if response.status_code != 404:
            break
        time.sleep(0.25)
    response.raise_for_status()


def own_episodes(
    arm: str,
    variant: str,
    client: OpenAI,
    model: str,
    tasks_: list[Task],
    options: dict[str, Any],
) -> dict[str, Any]:
    """The agent's own episodes on `tasks_`, told how they went by the desk alone, through the
    feedback API as an application tells the gateway. `rewarded`: the episode's success on
    the run (reward 1 or 0), and the queue's reward rule stores the run's steps as preferred
    or rejected. `corrected`: a success the same way; a failure as a correction on the call
    where the agent left the expert's way (reward 0, corrected_action: the expert's action
    there), which stores the expert's action as that step's preferred example and the
    agent's as its rejected rival. No person decides anything."""
    episode = EPISODES[variant]
    feedback_url = f"{options['web_url']}/api/v1/feedback"
    api_key = str(client.api_key)

    def attempt(task: Task) -> tuple[Episode, bool]:
        run_id = f"{variant}-{uuid.uuid4().hex[:12]}"
        lived = episode(client, model, task, options["max_tokens"], run_id)
        if not lived.steps or lived.error:
            return lived, False
        failed_at = None if lived.success else failing_step(task, lived.actions)
        if arm == "corrected" and failed_at is not None and failed_at < len(lived.calls):
            body = {
                "call_id": lived.calls[failed_at],
                "reward": 0.0,
                "corrected_action": expert_correction(task, variant, failed_at),
            }
            _feedback_post(feedback_url, api_key, body)
            return lived, True
        body = {"trajectory_id": run_id, "reward": float(lived.success), "success": lived.success}
        _feedback_post(feedback_url, api_key, body)
        return lived, False

    with ThreadPoolExecutor(max_workers=options["concurrency"]) as pool:
        done = list(pool.map(attempt, tasks_))
    episodes = [lived for lived, _ in done]
    training = {
        "episodes": len(episodes),
        "succeeded": sum(e.success for e in episodes),
        "failed_calls": sum(bool(e.error) for e in episodes),
    }
    if arm == "corrected":
        training["corrected"] = sum(corrected for _, corrected in done)
    return training


# ---------------------------------------------------------------- the measurement


def _run(
    variant: str, client: OpenAI, model: str, held_out: list[Task], options: dict[str, Any]
) -> dict[str, Any]:
    episode = EPISODES[variant]
    with ThreadPoolExecutor(max_workers=options["concurrency"]) as pool:
        episodes = list(
            pool.map(lambda task: episode(client, model, task, options["max_tokens"], ""), held_out)
        )
    successes = sum(e.success for e in episodes)
    low, high = wilson(successes, len(episodes))
    succeeded = [e.steps for e in episodes if e.success]
    return {
        "episodes": len(episodes),
        "success_rate": round(successes / len(episodes), 3),
        "success_ci95": [round(low, 3), round(high, 3)],
        "steps_per_success": round(sum(succeeded) / len(succeeded), 2) if succeeded else None,
        "failed_calls": sum(bool(e.error) for e in episodes),
        "first_error": next((e.error for e in episodes if e.error), ""),
        # What the agent did in the first few episodes, to read (goal kind: actions).
        "sample": [
            f"{task.kind}: " + "; ".join(f"{name}({argument[:40]})" for name, argument in e.actions)
            for task, e in list(zip(held_out, episodes, strict=True))[:3]
        ],
    }


def _queue(slug: str, options: dict[str, Any], **rule: Any) -> tuple[Queue, OpenAI]:
    queue = Queue.objects.create(
        slug=slug,
        name=slug,
        system_prompt="",  # the agent's own system message says what the task is
        k_examples=options["k"],
        example_token_budget=4000,
        max_tokens=options["max_tokens"],
        temperature=options["temperature"],
        memory_candidates=0,
        capture_percent=0,
        example_framing=options["framing"],
        **rule,
    )
    client = OpenAI(
        base_url=options["gateway_url"],
        api_key=token_create(queue=queue, name="bench")[1],
        timeout=TIMEOUT_S,
        max_retries=0,
    )
    return queue, client


def _learnt_curve(
    arm: str,
    sizes: list[int],
    stored: list[Task],
    held_out: list[Task],
    reviewer: User,
    options: dict[str, Any],
) -> dict[str, dict[str, Any]]:
    """Memory grown by the application's feedback instead of reviews, on the same training
    goals the reviewed curve stored (`own_episodes`). `rewarded`: the smallest non-zero size
    is seeded with reviewed trajectories (a 135M model that never succeeds alone has nothing
    to learn from a reward: the icrl library seeds too). `corrected`: no seed; a failure's
    correction teaches from the first episode on."""
    seeds = min((s for s in sizes if s > 0), default=0) if arm == "rewarded" else 0
    curves: dict[str, dict[str, Any]] = {}
    for variant in options["variants"]:
        queue, client = _queue(f"agent-{variant}-{arm}", options, reward_threshold=0.5)
        for task in stored[:seeds]:
            remember(queue, task, variant, reviewer)
        done, curve = seeds, {}
        for size in (s for s in sizes if s >= seeds and s > 0):
            training = own_episodes(arm, variant, client, queue.slug, stored[done:size], options)
            done = size
            examples_indexed([queue], timeout_s=TIMEOUT_S)
            row = _run(variant, client, queue.slug, held_out, options)
            row["training"] = training
            live = Example.objects.filter(queue=queue).exclude(status=Example.Status.RETIRED)
            row["preferred_steps"] = live.filter(role=Example.Role.PREFERRED).count()
            row["rejected_steps"] = live.filter(role=Example.Role.REJECTED).count()
            curve[str(size)] = row
        curves[variant] = {"seeded_with": seeds, "curve": curve}
        if arm == "corrected" and options.get("playbook_rounds"):
            curves[variant]["playbook"] = _playbook(
                variant, queue, client, held_out, reviewer, options
            )
    return curves


def _playbook(
    variant: str,
    queue: Queue,
    client: OpenAI,
    held_out: list[Task],
    reviewer: User,
    options: dict[str, Any],
) -> dict[str, Any]:
    """The playbook's arms on the queue's runs (its failures corrected by the desk): the
    held-out goals with memory and the learned playbook, without memory (k=0) and with it,
    and with memory and the control playbook."""
    plain, plain_client = _queue(f"{queue.slug}-plain", {**options, "k": 0})
    return playbook_arms(
        queue=queue,
        plain=plain,
        reviewer=reviewer,
        rounds=options["playbook_rounds"],
        rng=random.Random(options["seed"]),
        evaluate=lambda: _run(variant, client, queue.slug, held_out, options),
        alone=lambda: _run(variant, plain_client, plain.slug, held_out, options),
    )


def measure(options: dict[str, Any]) -> dict[str, Any]:
    sizes = sorted({int(s) for s in str(options["sizes"]).split(",")})
    largest = max(sizes)
    every = tasks(largest + options["held_out"], seed=options["seed"])
    held_out, stored = every[: options["held_out"]], every[options["held_out"] :]
    reviewer = get_user_model().objects.create_user("bench-reviewer")
    queues: dict[str, Queue] = {}
    clients: dict[str, OpenAI] = {}
    for variant in options["variants"]:
        queues[variant], clients[variant] = _queue(f"agent-{variant}", options)
    results: dict[str, dict[str, Any]] = {variant: {} for variant in options["variants"]}
    remembered = 0
    for size in sizes:
        for task in stored[remembered:size]:
            for variant in options["variants"]:
                remember(queues[variant], task, variant, reviewer)
        remembered = size
        examples_indexed(list(queues.values()), timeout_s=TIMEOUT_S)
        for variant in options["variants"]:
            results[variant][str(size)] = _run(
                variant, clients[variant], queues[variant].slug, held_out, options
            )
    learnt = {
        arm: _learnt_curve(arm, sizes, stored, held_out, reviewer, options)
        if arm in options["learning"]
        else {}
        for arm in ("rewarded", "corrected")
    }
    # The same memory, but k stored steps drawn at random in every prompt instead of the
    # nearest (pinned: pinned examples always come first).
    rng = random.Random(options["seed"])
    for variant in options["variants"]:
        ids = list(Example.objects.filter(queue=queues[variant]).values_list("pk", flat=True))
        pinned = rng.sample(ids, min(options["k"], len(ids)))
        curation.examples_status_set(ids=pinned, status=Example.Status.PINNED, actor=None)
        results[variant]["random"] = _run(
            variant, clients[variant], queues[variant].slug, held_out, options
        )
    return {
        "variants": results,
        "rewarded": learnt["rewarded"],
        "corrected": learnt["corrected"],
        "retrieval_queries": retrieval_queries(stored, held_out),
        "held_out": len(held_out),
        "sizes": sizes,
        "k": options["k"],
        "max_steps": MAX_STEPS,
    }
