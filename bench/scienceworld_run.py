"""bench_scienceworld's measurement, inside its world (see the command's docstring): bench_agent's
harness on ScienceWorld (the `scienceworld` package, Allen AI's text simulator of an elementary
science curriculum), an environment this project did not write, which scores every episode
itself and carries a gold action sequence for each of its task variations.

The agent calls the real gateway process with the `openai` client, in bench_agent's two forms:
`text` (one prompt a step; the action is the answer's text, as ScienceWorld's own agents
write it) and `tools` (one `act` tool whose argument is the action). Memory grows from the gold
trajectories of training and development variations, replayed in the simulator and stored
through the review flow's path; held-out test variations measure it."""

import json
import logging
import queue as threads_queue
import random
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from openai import OpenAI
from scienceworld import ScienceWorldEnv

from bench.agent_run import Step, _queue
from bench.reviewed import answer_chosen, examples_indexed
from icrlhf.insights.stats import wilson
from icrlhf.memory import curation
from icrlhf.memory.models import Example
from icrlhf.queues.models import Item, Queue

VARIANTS = ("text", "tools")
# The simplest of the package's 30 tasks: 3 to 11 gold steps, 300 variations (150 training,
# 75 development, 75 test), scored by the simulator (focus on a non-living thing, then move
# it to the named box; focusing on a living thing ends the episode with a negative score).
DEFAULT_TASKS = ("find-non-living-thing",)
# ScienceWorld's own "easy" setting: doors open, teleporting allowed, no electrical actions;
# its papers report the small models on it.
SIMPLIFICATIONS = "easy"
# What the simulator answers to an action it cannot parse.
NOT_UNDERSTOOD = "No known action matches that input."
ACTION_FORMS = (
    "look around, go to <place>, teleport to <place>, open <thing>, pick up <thing>, "
    "focus on <thing>, move <thing> to <container>"
)
TEXT_ACTIONS = f"Actions: {ACTION_FORMS}. Answer with one action only."
SYSTEM = (
    f"You act in a simulated house, one action a call with the act tool. Actions: {ACTION_FORMS}."
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "act",
            "description": "Do one action in the simulated house, e.g. `go to kitchen`.",
            "parameters": {
                "type": "object",
                "properties": {"action": {"type": "string"}},
                "required": ["action"],
            },
        },
    }
]
# The text prompt's memory of the episode: the latest actions (a gold run has at most 11).
ACTIONS_SHOWN = 6
TIMEOUT_S = 600

# The simulator's client logs every variation it loads, and py4j every message it sends.
for noisy in ("py4j", "scienceworld"):
    logging.getLogger(noisy).setLevel(logging.WARNING)


@dataclass(frozen=True)
class Variation:
    """One of a task's variations: its own house, objects and target box."""

    task: str
    index: int


@dataclass
class Episode:
    score: int = 0  # the simulator's, 0–100 (negative: a wrong focus ended it)
    completed: bool = False
    actions: list[str] = field(default_factory=list)
    understood: int = 0  # actions the simulator could parse
    error: str = ""  # the call that failed, which ended the episode

    @property
    def success(self) -> bool:
        return self.completed and self.score >= 100

    @property
    def steps(self) -> int:
        return len(self.actions)


# ---------------------------------------------------------------- the simulator


class Lab:
    """One ScienceWorld simulator (its own Java process) and the episode it is running."""

    def __init__(self, max_steps: int) -> None:
        self.env = ScienceWorldEnv("")
        self.max_steps = max_steps
        self.goal = ""
        self.verbs: set[str] = set()
        self.episode = Episode()

    def start(self, variation: Variation, *, gold: bool = False) -> str:
        """A fresh episode of `variation`; the first observation (the room the agent is in)."""
        self.env.load(variation.task, variation.index, SIMPLIFICATIONS, generateGoldPath=gold)
        self.env.server.reset()
        self.goal = str(self.env.get_task_description())
        # How the simulator's actions begin (its templates: `open OBJ`, `look around`, …).
        self.verbs = {str(template).split()[0] for template in self.env.get_possible_actions()}
        self.episode = Episode()
        observation = str(self.env.server.step("look around"))
        self.episode.score = self._score()  # some tasks count the start (being in the house)
        return observation

    def _score(self) -> int:
        return int(round(100 * float(self.env.server.getScore())))

    def names_an_action(self, text: str) -> bool:
        """Whether `text` begins as one of the simulator's actions does (a sentence about an
        action is not one)."""
        return bool(text) and text.split()[0] in self.verbs

    def gold(self) -> list[str]:
        """The loaded variation's gold action sequence (`start(gold=True)` made it)."""
        return [str(action) for action in self.env.get_gold_action_sequence()]

    @property
    def done(self) -> bool:
        return self.episode.completed or self.episode.steps >= self.max_steps

    def act(self, action: str) -> str:
        """Carry out one action; the observation. The wrapper's `step` also lists every valid
        action after each one, which doubles a step's time and which no agent here reads; the
        simulator's own step, score and completion are what `step` reads too."""
        observation = str(self.env.server.step(action))
        self.episode.actions.append(action)
        self.episode.understood += observation.strip() != NOT_UNDERSTOOD
        self.episode.score = self._score()
        # As the wrapper does: a negative score (a wrong focus) ends the episode.
        self.episode.completed = bool(self.env.server.getCompleted()) or self.episode.score < 0
        return observation

    def close(self) -> None:
        self.env.close()


@contextmanager
def labs(count: int, max_steps: int) -> Iterator[threads_queue.Queue[Lab]]:
    """`count` simulators started side by side, lent to one episode at a time."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        started = list(pool.map(lambda _: Lab(max_steps), range(count)))
    free: threads_queue.Queue[Lab] = threads_queue.Queue()
    for lab in started:
        free.put(lab)
    try:
        yield free
    finally:
        for lab in started:
            lab.close()


def lend[T](free: threads_queue.Queue[Lab], work: Callable[[Lab], T]) -> T:
    """`work` done with the first free simulator, given back after."""
    lab = free.get()
    try:
        return work(lab)
    finally:
        free.put(lab)


def variations(lab: Lab, tasks: list[str], *, seed: int) -> tuple[list[Variation], list[Variation]]:
    """The tasks' variations to store (training and development splits) and to hold out
    (the test split), each shuffled with the seed and interleaved task by task."""
    stored: list[list[Variation]] = []
    held_out: list[list[Variation]] = []
    rng = random.Random(seed)
    for task in tasks:
        lab.env.load(task, 0, SIMPLIFICATIONS)
        learn = [*lab.env.get_variations_train(), *lab.env.get_variations_dev()]
        test = list(lab.env.get_variations_test())
        rng.shuffle(learn)
        rng.shuffle(test)
        stored.append([Variation(task, int(index)) for index in learn])
        held_out.append([Variation(task, int(index)) for index in test])

    def interleaved(lists: list[list[Variation]]) -> list[Variation]:
        longest = max(len(each) for each in lists)
        return [each[i] for i in range(longest) for each in lists if i < len(each)]

    return interleaved(stored), interleaved(held_out)


# ---------------------------------------------------------------- the two kinds of agent


def text_prompt(goal: str, actions: list[str], observation: str) -> str:
    """The text agent's one message a step: the task, its latest actions, the observation."""
    done = "; ".join(actions[-ACTIONS_SHOWN:]) or "nothing yet"
    return (
        f"Task: {goal}\nDone so far: {done}\nObservation: {observation.strip()}\n"
        f"{TEXT_ACTIONS}\nNext action:"
    )


_PREFIX = re.compile(r"^(next action|action)\s*:\s*", re.IGNORECASE)


def text_action(answer: str) -> str:
    """The action in a text answer: its first line, without a label, quotes or a full stop;
    "" when there is none."""
    line = next((line for line in answer.strip().splitlines() if line.strip()), "")
    line = _PREFIX.sub("", line.strip()).strip(" `\"'*.")
    return line.lower()[:120]


def _tool_call(number: int, action: str) -> dict[str, Any]:
    return {
        "id": f"call_{number}",
        "type": "function",
        "function": {"name": "act", "arguments": json.dumps({"action": action})},
    }


def _tool_action(arguments: str) -> str:
    """The action from the model's JSON arguments (any key: a small model names it freely),
    or the raw text when it is not JSON."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return arguments.strip()
    if isinstance(parsed, dict) and parsed:
        return str(next(iter(parsed.values()))).strip()
    return str(parsed).strip()


def text_episode(
    client: OpenAI, model: str, lab: Lab, variation: Variation, max_tokens: int
) -> Episode:
    observation = lab.start(variation)
    while not lab.done:
        try:
            answer = client.chat.completions.create(
                model=model,
                messages=[
                    {
                        "role": "user",
                        "content": text_prompt(lab.goal, lab.episode.actions, observation),
                    }
                ],
                max_tokens=max_tokens,
            )
        except Exception as failure:  # the episode fails, as the application's would
            lab.episode.error = str(failure)[:300]
            break
        action = text_action(answer.choices[0].message.content or "")
        if not lab.names_an_action(action):  # as bench_agent's text agent: no action, no run
            break
        observation = lab.act(action)
    return lab.episode


def tools_first_message(goal: str, observation: str) -> str:
    return f"{goal}\n\n{observation.strip()}"


def tools_episode(
    client: OpenAI, model: str, lab: Lab, variation: Variation, max_tokens: int
) -> Episode:
    """The tool loop applications run, with the one `act` tool; an answer without a call
    ends the episode."""
    observation = lab.start(variation)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": tools_first_message(lab.goal, observation)},
    ]
    while not lab.done:
        try:
            answer = client.chat.completions.create(
                model=model,
                messages=messages,  # type: ignore[arg-type]
                tools=TOOLS,  # type: ignore[arg-type]
                max_tokens=max_tokens,
            )
        except Exception as failure:
            lab.episode.error = str(failure)[:300]
            break
        calls = list(answer.choices[0].message.tool_calls or [])[:1]  # one action a step
        if not calls:
            break
        call = calls[0]
        arguments = call.function.arguments  # type: ignore[union-attr]
        action = _tool_action(arguments)
        observation = lab.act(action)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {"name": "act", "arguments": arguments},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": observation})
    return lab.episode


EPISODES: dict[str, Callable[[OpenAI, str, Lab, Variation, int], Episode]] = {
    "text": text_episode,
    "tools": tools_episode,
}


# ---------------------------------------------------------------- gold trajectories


@dataclass
class Gold:
    """A variation's gold trajectory as lived in the simulator: whether it succeeded there, and
    its steps as each agent form would have lived them."""

    variation: Variation
    episode: Episode
    steps: dict[str, list[Step]]


def gold_replay(lab: Lab, variation: Variation) -> Gold:
    """The package's gold action sequence for `variation`, carried out in the simulator, with
    each step's decision point as the text and the tools agent would have met it."""
    observation = lab.start(variation, gold=True)
    goal = lab.goal
    first = tools_first_message(goal, observation)
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": first},
    ]
    steps: dict[str, list[Step]] = {"text": [], "tools": []}
    for number, action in enumerate(lab.gold()):
        if lab.episode.completed:  # the gold sequence may end on a free action after success
            break
        steps["text"].append(
            Step([], text_prompt(goal, lab.episode.actions, observation), "act", action)
        )
        latest = conversation[-1]
        # What the gateway retrieves with (gateway.services.decision_point).
        point = first if latest["role"] == "user" else f"{first}\n\n{latest['content']}"
        steps["tools"].append(Step(list(conversation), point, "act", action))
        observation = lab.act(action)
        call = _tool_call(number, action)
        conversation.append({"role": "assistant", "content": None, "tool_calls": [call]})
        conversation.append({"role": "tool", "tool_call_id": call["id"], "content": observation})
    return Gold(variation, lab.episode, steps)


def remember(queue: Queue, steps: list[Step], variant: str, reviewer: User) -> None:
    """A simulator-verified trajectory into memory, as bench_agent's `remember` stores the
    desk's: each step an item (its conversation and tools) whose one candidate is the step
    taken, picked by a reviewer; the decision stores the example and the worker indexes it."""
    for step in steps:
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
            model="gold",
            reviewer=reviewer,
            text=step.argument if variant == "text" else "",
            tool_calls=[] if variant == "text" else [_tool_call(0, step.argument)],
        )


# ---------------------------------------------------------------- the measurement


def score_interval(scores: list[int], *, resamples: int = 1000, seed: int = 0) -> list[float]:
    """A 95% bootstrap interval on the mean score (episodes resampled with replacement)."""
    values = np.asarray(scores, dtype=float)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return [round(float(low), 1), round(float(high), 1)]


def _run(
    variant: str,
    client: OpenAI,
    model: str,
    held_out: list[Variation],
    free: threads_queue.Queue[Lab],
    options: dict[str, Any],
) -> dict[str, Any]:
    episode = EPISODES[variant]

    def one(variation: Variation) -> Episode:
        return lend(free, lambda lab: episode(client, model, lab, variation, options["max_tokens"]))

    with ThreadPoolExecutor(max_workers=options["concurrency"]) as pool:
        episodes = list(pool.map(one, held_out))
    successes = sum(e.success for e in episodes)
    low, high = wilson(successes, len(episodes))
    succeeded = [e.steps for e in episodes if e.success]
    actions = sum(e.steps for e in episodes)
    scores = [e.score for e in episodes]
    return {
        "episodes": len(episodes),
        "success_rate": round(successes / len(episodes), 3),
        "success_ci95": [round(low, 3), round(high, 3)],
        "mean_score": round(sum(scores) / len(scores), 1),
        "score_ci95": score_interval(scores),
        "steps_per_success": round(sum(succeeded) / len(succeeded), 2) if succeeded else None,
        # Where the model cannot act at all: no action in an episode, or none the simulator
        # could parse.
        "episodes_without_an_action": sum(e.steps == 0 and not e.error for e in episodes),
        "actions": actions,
        "understood_share": round(sum(e.understood for e in episodes) / actions, 3)
        if actions
        else None,
        "failed_calls": sum(bool(e.error) for e in episodes),
        "first_error": next((e.error for e in episodes if e.error), ""),
        # What the agent did in the first few episodes, to read.
        "sample": [
            f"{v.task}#{v.index} ({e.score}): " + "; ".join(a[:40] for a in e.actions)
            for v, e in list(zip(held_out, episodes, strict=True))[:3]
        ],
    }


def measure(options: dict[str, Any]) -> dict[str, Any]:
    sizes = sorted({int(s) for s in str(options["sizes"]).split(",")})
    largest = max(sizes)
    tasks = [t for t in str(options["tasks"]).split(",") if t]
    variants = [v for v in str(options["variants"]).split(",") if v]
    reviewer = get_user_model().objects.create_user("bench-reviewer")
    queues: dict[str, Queue] = {}
    clients: dict[str, OpenAI] = {}
    for variant in variants:
        queues[variant], clients[variant] = _queue(f"scienceworld-{variant}", options)
    results: dict[str, dict[str, Any]] = {variant: {} for variant in variants}
    golds: list[Gold] = []
    with labs(options["concurrency"], options["max_steps"]) as free:
        stored, held_out = lend(free, lambda lab: variations(lab, tasks, seed=options["seed"]))
        if largest > len(stored) or options["held_out"] > len(held_out):
            raise ValueError(
                f"{', '.join(tasks)} have {len(stored)} variations to store and {len(held_out)} "
                f"to hold out; asked for {largest} and {options['held_out']}."
            )
        held_out = held_out[: options["held_out"]]
        remembered = 0
        for size in sizes:
            with ThreadPoolExecutor(max_workers=options["concurrency"]) as pool:
                replayed = list(
                    pool.map(
                        lambda v: lend(free, lambda lab: gold_replay(lab, v)),
                        stored[remembered:size],
                    )
                )
            golds += replayed
            for gold in replayed:
                if gold.episode.success:  # only what the simulator verified is stored
                    for variant in variants:
                        remember(queues[variant], gold.steps[variant], variant, reviewer)
            remembered = size
            examples_indexed(list(queues.values()), timeout_s=TIMEOUT_S)
            for variant in variants:
                results[variant][str(size)] = _run(
                    variant, clients[variant], queues[variant].slug, held_out, free, options
                )
        # The same memory, but k stored steps drawn at random in every prompt instead of the
        # nearest (pinned: pinned examples always come first).
        rng = random.Random(options["seed"])
        for variant in variants:
            ids = list(Example.objects.filter(queue=queues[variant]).values_list("pk", flat=True))
            pinned = rng.sample(ids, min(options["k"], len(ids)))
            curation.examples_status_set(ids=pinned, status=Example.Status.PINNED, actor=None)
            results[variant]["random"] = _run(
                variant, clients[variant], queues[variant].slug, held_out, free, options
            )
    return {
        "variants": results,
        "tasks": tasks,
        "simplifications": SIMPLIFICATIONS,
        "gold": {
            "replayed": len(golds),
            "succeeded": sum(g.episode.success for g in golds),
            "steps_per_trajectory": round(sum(g.episode.steps for g in golds) / len(golds), 2)
            if golds
            else None,
        },
        "held_out": len(held_out),
        "sizes": sizes,
        "k": options["k"],
        "max_steps": options["max_steps"],
    }
