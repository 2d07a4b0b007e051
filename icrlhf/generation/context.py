"""Retrieve, then build the prompt: the one step that readies a request for the model, in the
review worker (`pipeline.generation_prepare`) and in the gateway (`gateway.services.call_plan`)
alike. The caller's conversation as the prompt takes it, the signature the request is made
under, the queue's examples retrieved for it (none while memory is unavailable: better an
answer without memory than no answer), and the prompt built around them, fitted to the
model's context window."""

import bisect
import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from icrlhf.generation.prompts import Attempt, conversation_prompt, messages_build
from icrlhf.generation.selectors import prompt_examples
from icrlhf.integrations import llm
from icrlhf.integrations.embeddings import EmbeddingModelMissing
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.kinds import kind_of
from icrlhf.memory.repeats import without_repeats
from icrlhf.memory.selectors import Recall, RetrievedExample
from icrlhf.memory.signatures import Signature
from icrlhf.playbook.selectors import PlaybookInForce, playbook_in_force
from icrlhf.queues.models import Queue


class Retrieve(Protocol):
    """How the caller's process reaches memory: `examples_recall` in the worker that owns the
    store, `examples_recall_anywhere` in any other."""

    def __call__(
        self,
        *,
        queue: Queue,
        query_text: str,
        k: int,
        token_budget: int,
        pool: int,
        signature: Signature,
        token_id: int | None,
    ) -> Recall: ...


# The fit counts with `llm.count_tokens` (≈4 characters a token; `llm.prompt_tokens`), not
# with the model's own tokenizer and chat template, which the server applies and this process
# does not have: JSON and short words take more tokens than that, and the template adds its
# markers. So the estimate is raised by a share and a few tokens before it is held against
# the window. Measured against the local llama.cpp server's own count of the rendered prompt
# (SmolLM2, its tool template), the server counted 0.86–1.01 times the estimate for English
# examples, 0.97–1.12 for tool calls, results and definitions, 1.11 for a text of numbers. A
# language the vocabulary was not learnt on counts more (French: 1.48): an install serving
# one sets its endpoints' windows lower (LLM_CONTEXT_WINDOW, LLM_ENDPOINTS).
FIT_SLACK = 1.25
FIT_MARGIN_TOKENS = 32


@dataclass(frozen=True)
class Room:
    """Where a prompt goes: the model's context window in tokens (None: unknown, and the
    prompt goes whole, as the upstream takes it), the tokens kept for the answer (the call's
    `max_tokens`), and the tools the call offers (the server writes them into the prompt)."""

    window: int | None
    answer_tokens: int
    tools: list[dict[str, Any]] | None = None

    @classmethod
    def of_call(
        cls, *, model: str, api_base: str, params: dict[str, Any], options: dict[str, Any]
    ) -> "Room":
        """The room of a call to `model` at `api_base` with its `params` (max_tokens) and its
        `options` (tools)."""
        return cls(
            window=llm.context_window(model, api_base),
            answer_tokens=int(params.get("max_tokens") or 0),
            tools=options.get("tools"),
        )

    def needed(self, messages: Sequence[dict[str, Any]]) -> int:
        """The window `messages` need, with the tools and the answer, and the slack."""
        estimate = llm.prompt_tokens(messages, tools=self.tools)
        return math.ceil(estimate * FIT_SLACK) + FIT_MARGIN_TOKENS + self.answer_tokens

    def fits(self, messages: Sequence[dict[str, Any]]) -> bool:
        return self.window is None or self.needed(messages) <= self.window


@dataclass(frozen=True)
class Prompt:
    """A prompt as sent: its messages, and the examples and attempts it carries."""

    messages: list[dict[str, Any]]
    examples: list[RetrievedExample]  # most similar first, as retrieved
    attempts: list[Attempt]  # oldest first


@dataclass(frozen=True)
class PromptContext:
    """A request readied for the model: what was retrieved for it, and the prompt's parts."""

    queue: Queue
    system_prompt: str  # the queue's, then the caller's own system text
    history: list[dict[str, Any]]  # the caller's turns before the request
    request: str | None  # None after a tool result: the model takes the next step
    signature: Signature
    recall: Recall
    retrieval_ms: float
    # Why nothing was retrieved, when memory was unavailable (the store or the embedder).
    memory_error: VectorStoreUnavailable | EmbeddingModelMissing | None = None

    @functools.cached_property
    def playbook(self) -> PlaybookInForce:
        """The queue's playbook in force, read once the prompt is wanted: a gateway call that
        memory answers needs none (its query was one of such a call's five)."""
        return playbook_in_force(self.queue)

    def fitted(
        self,
        *,
        examples: Sequence[RetrievedExample],
        attempts: Sequence[Attempt] = (),
        attempts_feedback: str = "",
        room: Room,
    ) -> Prompt:
        """The prompt, with `examples` (those of the recall the caller sends: a held-out
        gateway call sends none) and a "try again" round's earlier `attempts`, fitted to the
        `room` with its answer: as many of them as fit, the least similar examples dropped
        first (they come most similar first), then the oldest attempts. The caller's
        conversation is never cut: if it does not fit alone, it goes alone, and the upstream
        says what it says of a prompt too long."""
        queue = self.queue
        instructions = kind_of(queue).instructions(queue)
        # Once: with rewards, each example's rivals are read from the database.
        as_sent = prompt_examples(queue=queue, retrieved=examples)

        @functools.cache
        def dropping(count: int) -> Prompt:
            kept = len(examples) - min(count, len(examples))
            kept_attempts = list(attempts[max(0, count - len(examples)) :])
            messages = messages_build(
                system_prompt=self.system_prompt,
                instructions=instructions,
                playbook=self.playbook.text,
                playbook_version=self.playbook.number,
                examples=as_sent[:kept],
                history=self.history,
                request=self.request,
                framing=queue.example_framing,
                attempts=kept_attempts,
                attempts_feedback=attempts_feedback,
            )
            return Prompt(messages, list(examples[:kept]), kept_attempts)

        whole = dropping(0)
        if room.fits(whole.messages):
            return whole  # nearly always: one build, one count
        droppable = len(examples) + len(attempts)
        # The fewest dropped that fit (dropping more never makes a prompt longer); all of
        # them when even the conversation alone does not fit.
        fewest = bisect.bisect_left(
            range(1, droppable + 1), True, key=lambda count: room.fits(dropping(count).messages)
        )
        return dropping(min(droppable, fewest + 1))


def request_signature(
    *, conversation: Sequence[dict[str, Any]], options: dict[str, Any]
) -> Signature:
    """What a request is made under (`options`: its tool and output fields). After a tool
    result it is an agent's next step, and only other agents' steps fit it."""
    after_tool_result = bool(conversation) and conversation[-1].get("role") == "tool"
    return Signature.of_options(options, after_tool_result=after_tool_result)


def prompt_context(
    *,
    queue: Queue,
    query_text: str,
    conversation: Sequence[dict[str, Any]],
    signature: Signature,
    pool: int,
    retrieve: Retrieve,
    token_id: int | None = None,
) -> PromptContext:
    """Ready a request for the model: `conversation`, the caller's OpenAI messages (none for
    a request typed or imported for review: `query_text` is then the request itself);
    `query_text`, what retrieval looks for (the decision point); `signature`, the request's
    (`request_signature`); `pool`, how many neighbours to recall beside the prompt's
    examples; `token_id`, the token whose call this is (None for a request typed or
    imported for review): which calls' format examples the queue shares with it."""
    if conversation:
        system_prompt, history, request = conversation_prompt(
            system_prompt=queue.system_prompt, conversation=conversation
        )
    else:
        system_prompt, history, request = queue.system_prompt, [], query_text
    started = time.monotonic()
    memory_error: VectorStoreUnavailable | EmbeddingModelMissing | None = None
    try:
        recall = retrieve(
            queue=queue,
            query_text=query_text,
            k=queue.k_examples,
            token_budget=queue.example_token_budget,
            pool=pool,
            signature=signature,
            token_id=token_id,
        )
    except (VectorStoreUnavailable, EmbeddingModelMissing) as error:
        recall, memory_error = Recall(examples=[], neighbours=[]), error
    # Memory never teaches a loop: no step whose call the conversation already holds with its
    # result, nor one whose own turns repeat an answered call (memory.repeats). Neighbours too:
    # a looping step gets no vote in the ranking either.
    recall = replace(
        recall,
        examples=without_repeats(conversation, recall.examples),
        neighbours=without_repeats(conversation, recall.neighbours),
    )
    return PromptContext(
        queue=queue,
        system_prompt=system_prompt,
        history=history,
        request=request,
        signature=signature,
        recall=recall,
        retrieval_ms=(time.monotonic() - started) * 1000,
        memory_error=memory_error,
    )
