import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import QuerySet

from icrlhf.generation.models import Candidate, Generation
from icrlhf.generation.prompts import Attempt, PromptExample
from icrlhf.integrations import llm
from icrlhf.memory import selectors as memory_selectors
from icrlhf.memory.models import Example, Retrieval
from icrlhf.memory.selectors import RetrievedExample
from icrlhf.memory.signatures import action_text
from icrlhf.queues.models import Item, Queue

# A "try again" prompt carries at most this many earlier attempts (the latest ones): the
# paper keeps them all, a prompt has a budget.
MAX_ATTEMPTS = 12


@dataclass(frozen=True)
class Progress:
    ready: int  # done: a candidate the reviewer can pick
    failed: int
    total: int


def generation_latest(*, item: Item) -> Generation | None:
    return item.generations.order_by("-created_at").first()


def generation_candidates(*, generation: Generation) -> QuerySet[Candidate]:
    return generation.candidates.select_related("source_example__decision").order_by("position")


def generation_progress(*, generation: Generation) -> Progress:
    candidates = list(generation.candidates.values_list("status", flat=True))
    return Progress(
        ready=candidates.count(Candidate.Status.DONE),
        failed=candidates.count(Candidate.Status.FAILED),
        total=len(candidates),
    )


@dataclass(frozen=True)
class BelowMinimum:
    example: Example
    score: float


@dataclass(frozen=True)
class Retrievals:
    """What a generation's retrieval found: the examples in its prompt, best first, and those
    its queue's minimum similarity (`minimum`, None before retrieval) kept out."""

    used: list[Retrieval]
    below_minimum: list[BelowMinimum]
    minimum: float | None


def generation_retrievals(*, generation: Generation) -> Retrievals:
    recorded = generation.below_minimum or []
    rows = Example.objects.select_related("decision").in_bulk(
        [entry["example"] for entry in recorded]
    )
    return Retrievals(
        used=list(generation.retrievals.select_related("example__decision__item").order_by("rank")),
        # An example deleted since is no longer shown.
        below_minimum=[
            BelowMinimum(example=rows[uuid.UUID(entry["example"])], score=entry["score"])
            for entry in recorded
            if uuid.UUID(entry["example"]) in rows
        ],
        minimum=generation.min_similarity,
    )


def item_token_id(*, item: Item) -> int | None:
    """The token whose gateway call the item captured; None for an item typed or imported."""
    if item.source != Item.Source.GATEWAY:
        return None
    # By relation name: the gateway, whose call rows these are, sits above generation.
    return (
        Item.objects.filter(pk=item.pk, calls__token__isnull=False)
        .values_list("calls__token_id", flat=True)
        .first()
    )


def prompt_examples(*, queue: Queue, retrieved: Sequence[RetrievedExample]) -> list[PromptExample]:
    """The retrieved examples as the prompt sends them: with their rewards and their rivals'
    when the queue puts rewards beside examples."""
    if not queue.example_rewards:
        return [PromptExample.of(r.example, format_only=r.format_only) for r in retrieved]
    rivals = memory_selectors.examples_rivals(examples=[r.example for r in retrieved])
    return [
        PromptExample.of(
            r.example, rewarded=True, rivals=rivals[r.example.pk], format_only=r.format_only
        )
        for r in retrieved
    ]


@dataclass(frozen=True)
class SentBack:
    """An answer a reviewer sent back with "try again", with the reward it was given."""

    candidate: Candidate
    action: str  # its words and tool calls as one text: what tells two answers apart
    reward: float


def rounds_sent_back(*, item: Item, before: Generation) -> list[Generation]:
    """The item's rounds before `before` that a reviewer sent back with "try again"."""
    return list(item.generations.filter(pk__lt=before.pk, try_again__isnull=False).order_by("pk"))


def answers_sent_back(
    *, item: Item, before: Generation, rounds: list[Generation] | None = None
) -> list[SentBack]:
    """The answers of the item's rounds before `before` that a reviewer sent back with "try
    again" (`rounds`, when the caller has read them), oldest first: each answer once, where
    and with the reward of its latest round."""
    latest: dict[str, SentBack] = {}
    if rounds is None:
        rounds = rounds_sent_back(item=item, before=before)
    for generation in rounds:
        given = (generation.try_again or {}).get("rewards", {})
        for candidate in generation.candidates.filter(status=Candidate.Status.DONE).order_by(
            "position"
        ):
            action = action_text(candidate.text, candidate.tool_calls).strip()
            if action:
                latest.pop(action, None)  # re-inserted: its latest round places it
                reward = float(given.get(str(candidate.pk), 0.0))
                latest[action] = SentBack(candidate, action, reward)
    return list(latest.values())


@dataclass(frozen=True)
class Attempts:
    """A round's context of earlier attempts: the answers already rewarded, oldest first, as
    many of the latest as the prompt's budget takes, and what was said about them; and every
    answer sent back (none is offered again from memory)."""

    attempts: list[Attempt]
    feedback: str
    sent_back: frozenset[str]


def attempts_earlier(*, item: Item, before: Generation, token_budget: int) -> Attempts:
    """The answers already rewarded when `before` is generated: those a reviewer sent back
    with "try again" (their ratings as rewards), and the answer the application was served
    and rewarded low (a low-reward capture, in this round) unless a reviewer rated it since."""
    rounds = rounds_sent_back(item=item, before=before)
    sent_back = answers_sent_back(item=item, before=before, rounds=rounds)
    rewarded = [(s.action, s.reward) for s in sent_back]
    said = []
    for verdict in (generation.try_again for generation in rounds):
        reasons = ", ".join((verdict or {}).get("reasons", []))
        comment = str((verdict or {}).get("comment", "")).strip()
        said.append(" — ".join(part for part in (reasons, comment) if part))
    # Only a captured gateway call's item has an answer it was served.
    served = (
        before.candidates.filter(served=True, reward__isnull=False)
        .values_list("text", "tool_calls", "reward")
        .first()
        if item.source == Item.Source.GATEWAY
        else None
    )
    if served is not None:
        text, tool_calls, reward = served
        action = action_text(text, tool_calls).strip()
        if action and action not in {a for a, _ in rewarded}:
            rewarded.append((action, float(reward or 0.0)))
            said.append(
                f"the application rewarded the answer it was served {float(reward or 0.0):.2f}"
            )
    # The latest attempts that fit the budget (an attempt is never cut).
    kept: list[Attempt] = []
    used = 0
    for action, reward in reversed(rewarded[-MAX_ATTEMPTS:]):
        used += llm.count_tokens(action)
        if used > token_budget:
            break
        kept.insert(0, Attempt(action, reward))
    return Attempts(
        attempts=kept,
        feedback="; ".join(s for s in said if s),
        sent_back=frozenset(s.action for s in sent_back),
    )
