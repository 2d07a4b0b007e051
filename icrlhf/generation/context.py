"""Retrieve, then build the prompt: the one step that readies a request for the model, in the
review worker (`pipeline.generation_prepare`) and in the gateway (`gateway.services.call_plan`)
alike. The caller's conversation as the prompt takes it, the signature the request is made
under, the queue's examples retrieved for it (none while memory is unavailable: better an
answer without memory than no answer), and the prompt built around them."""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from icrlhf.generation.prompts import Attempt, conversation_prompt, messages_build
from icrlhf.generation.selectors import prompt_examples
from icrlhf.integrations.embeddings import EmbeddingModelMissing
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.kinds import kind_of
from icrlhf.memory.selectors import Recall, RetrievedExample
from icrlhf.memory.signatures import Signature
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
    ) -> Recall: ...


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

    def messages(
        self,
        *,
        examples: Sequence[RetrievedExample],
        attempts: Sequence[Attempt] = (),
        attempts_feedback: str = "",
    ) -> list[dict[str, Any]]:
        """The prompt, with `examples` (those of the recall the caller sends: a held-out
        gateway call sends none) and a "try again" round's earlier `attempts`."""
        queue = self.queue
        return messages_build(
            system_prompt=self.system_prompt,
            instructions=kind_of(queue).instructions(queue),
            guidelines=queue.guidelines,
            guidelines_version=queue.guidelines_version,
            examples=prompt_examples(queue=queue, retrieved=examples),
            history=self.history,
            request=self.request,
            framing=queue.example_framing,
            attempts=attempts,
            attempts_feedback=attempts_feedback,
        )


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
) -> PromptContext:
    """Ready a request for the model: `conversation`, the caller's OpenAI messages (none for
    a request typed or imported for review: `query_text` is then the request itself);
    `query_text`, what retrieval looks for (the decision point); `signature`, the request's
    (`request_signature`); `pool`, how many neighbours to recall beside the prompt's
    examples."""
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
        )
    except (VectorStoreUnavailable, EmbeddingModelMissing) as error:
        recall, memory_error = Recall(examples=[], neighbours=[]), error
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
