"""The embedded store's owner (the worker that consumes the memory queue) answering the
retrievals other processes ask of it (`remote_recall`), over its private socket
(`integrations.local_socket`).

One thread answers what has arrived since its last round: the requests' texts are embedded
as one batch (fastembed embeds a batch of short texts in about 70% of the time per text of
single calls, `bench_embedders`; a text embedded recently is not embedded again) and each is
then searched with its vector, as `selectors.examples_recall` searches in place. The asker
sends its queue's row (it has just read it, with the token) and gets the examples' rows
back, so neither reads what the other has. Writes (indexing, curation) are untouched: they
stay tasks of the memory queue, with their retries and sweeps."""

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import close_old_connections

from icrlhf.integrations import embeddings, local_socket
from icrlhf.integrations.embeddings import EmbeddingModelMissing
from icrlhf.integrations.local_socket import Asked, answered
from icrlhf.integrations.vectors import VectorStoreUnavailable
from icrlhf.memory import remote_recall, selectors
from icrlhf.memory.signatures import PLAIN, Signature
from icrlhf.queues.models import Queue

logger = logging.getLogger(__name__)

# What one round embeds at most: fastembed's batches, beyond which nothing is saved per text.
_ROUND = 32
# How many examples one ask may want, at most: far above any queue's (50 at most), low enough
# that the store's over-fetching (16 × k) stays a search.
_MAX_COUNT = 1000
# Ids as the database stores them (a bigger one would fail the round's one query).
_MAX_ID = 2**63 - 1


def recall_server(path: Path | None = None) -> local_socket.RoundServer:
    """The owner's end, listening at `path` (by default where `remote_recall` asks) once
    started."""
    return local_socket.RoundServer(
        path or remote_recall.socket_path(),
        answer_round=_answer_one_round,
        round_size=_ROUND,
        name="recall",
    )


def _answer_one_round(round_: list[Asked]) -> None:
    # The answering thread lives as long as the worker: its connection is health-checked
    # before the round, and replaced if it went bad, as before each task (worker/app.py).
    close_old_connections()
    try:
        answer_round(round_)
    except Exception:  # never let the answering thread die: the next round may succeed
        logger.exception("A round of retrievals failed")
        for each in round_:
            answered(each, {"error": "Retrieval failed in the worker."})


@dataclass(frozen=True)
class _Retrieval:
    """One ask's query, read and checked: what `selectors.examples_recall` is called with."""

    queue: Queue
    query_text: str
    k: int
    token_budget: int
    pool: int
    signature: Signature
    token_id: int | None  # the token the request came with (format examples may follow it)


def _retrieval_read(query: Any) -> _Retrieval:
    """The query an asker sent, or ValueError saying what is wrong with it: whatever the line
    held (the asker is of this user, but may be buggy), a malformed ask fails alone, before
    it can reach the round's shared work (its batch of texts, its one query of queues)."""
    if not isinstance(query, dict):
        raise ValueError("The retrieval request is not an object.")
    for name, highest in (
        ("queue_id", _MAX_ID),
        ("k", _MAX_COUNT),
        ("token_budget", _MAX_ID),
        ("pool", _MAX_COUNT),
    ):
        value = query.get(name)
        # bool is an int to Python, never a count here.
        if type(value) is not int or not 0 <= value <= highest:
            raise ValueError(f"The retrieval request's {name} is not a whole number in range.")
    token_id = query.get("token_id")
    if token_id is not None and (type(token_id) is not int or not 0 <= token_id <= _MAX_ID):
        raise ValueError("The retrieval request's token_id is not a whole number in range.")
    if not isinstance(query.get("query_text"), str):
        raise ValueError("The retrieval request's query_text is not a text.")
    signature = query.get("signature")
    try:
        read = PLAIN if signature is None else Signature.from_json(signature)
    except (AttributeError, TypeError, ValueError) as error:
        raise ValueError("The retrieval request's signature cannot be read.") from error
    queue = remote_recall.row_received(Queue, query.get("queue"))
    if queue.pk != query["queue_id"]:
        raise ValueError("The retrieval request's queue is not the one it names.")
    return _Retrieval(
        queue=queue,
        query_text=query["query_text"],
        k=query["k"],
        token_budget=query["token_budget"],
        pool=query["pool"],
        signature=read,
        token_id=token_id,
    )


def answer_round(round_: list[Asked]) -> None:
    """Embeds the round's texts as one batch, then searches each with its vector. An ask
    that cannot be read is answered with its error alone."""
    now = time.monotonic()
    waiting: list[tuple[Asked, _Retrieval]] = []
    for each in round_:
        if each.deadline <= now:
            each.done.set()  # its caller has stopped waiting: not searched for nothing
            continue
        try:
            waiting.append((each, _retrieval_read(each.request)))
        except ValueError as error:
            answered(each, {"error": str(error)})
    if not waiting:
        return
    try:
        vectors = embeddings.embed_texts([retrieval.query_text for _, retrieval in waiting])
    except EmbeddingModelMissing as error:
        for each, _ in waiting:
            answered(each, {"error": str(error), "missing_model": True})
        return
    for (each, retrieval), vector in zip(waiting, vectors, strict=True):
        try:
            recall = selectors.examples_recall(
                queue=retrieval.queue,
                query_text=retrieval.query_text,
                k=retrieval.k,
                token_budget=retrieval.token_budget,
                pool=retrieval.pool,
                signature=retrieval.signature,
                vector=vector,
                token_id=retrieval.token_id,
            )
            answer = selectors.recall_as_json(recall)
        except VectorStoreUnavailable as error:
            answer = {"error": str(error)}
        except Exception:
            logger.exception("A retrieval failed")
            answer = {"error": "Retrieval failed in the worker."}
        answered(each, answer)
