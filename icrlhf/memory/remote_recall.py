"""Retrieval for processes that do not own the embedded store (the gateway), asked of the
worker that does (`recall_owner`) over a private local socket (`integrations.local_socket`),
sending its queue's row and getting the examples' rows back.

Qdrant's local mode admits one process per folder: the worker that consumes the memory
queue. The gateway used to ask it through the broker (a task, then its result), which cost a
round trip through Redis and Celery's bookkeeping on every call, and the worker embedded the
requests one at a time. Now the owner listens on a socket of its own and answers the asks
that arrive together as one batch.

The socket is named by the broker and the memory queue, as the tasks were: whoever consumes
the queue answers. The socket keeps other users out (its folder, the peer's uid), and the
rows an answer holds are used only if the asking queue could have retrieved them
(`selectors`). The socket's failures reach the asker as the store's: VectorStoreUnavailable,
which a retrieval's callers already handle."""

import contextlib
import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Model

from icrlhf.integrations import local_socket
from icrlhf.integrations.embeddings import EmbeddingModelMissing
from icrlhf.integrations.vectors import VectorStoreUnavailable


def socket_path() -> Path:
    """Where the store's owner listens: named by the broker and the memory queue (the
    address the tasks used), in a folder only this service's user may enter. Raises
    VectorStoreUnavailable when that folder is someone else's."""
    with socket_failures_as_store_unavailable():
        return local_socket.private_socket_path(
            prefix="icrlhf-recall",
            address=f"{settings.CELERY_BROKER_URL} {settings.CELERY_MEMORY_QUEUE}",
        )


@contextlib.contextmanager
def socket_failures_as_store_unavailable() -> Iterator[None]:
    try:
        yield
    except local_socket.NobodyListens as error:
        raise VectorStoreUnavailable(f"{error}: is the memory worker running?") from error
    except local_socket.LocalSocketUnavailable as error:
        raise VectorStoreUnavailable(str(error)) from error


def ask(query: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """The owner's answer to one retrieval (`selectors.recall_as_json`'s form). Raises
    VectorStoreUnavailable when no owner listens or none answers in time, or when the one
    answering is not of this user, and EmbeddingModelMissing when the owner has no model."""
    path = socket_path()
    with socket_failures_as_store_unavailable():
        answer = local_socket.ask(path, query, timeout_s=timeout_s)
    return answer_read(answer)


def answer_read(answer: Any) -> dict[str, Any]:
    """The owner's answer, or the error it sent raised as the asker's own."""
    if not isinstance(answer, dict):
        raise VectorStoreUnavailable("The worker that owns the store sent an unreadable answer.")
    if answer.get("missing_model"):
        raise EmbeddingModelMissing(answer["error"])
    if "error" in answer:
        raise VectorStoreUnavailable(answer["error"])
    return answer


def row_sent(row: Model) -> dict[str, Any]:
    """A row as it crosses the socket: its loaded columns by attribute name, in JSON's types
    (a deferred column stays behind: reading it would cost a query)."""
    deferred = row.get_deferred_fields()
    return {
        field.attname: _json_value(field.value_from_object(row))
        for field in row._meta.concrete_fields
        if field.attname not in deferred
    }


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime | datetime.date):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def row_received[M: Model](model: type[M], sent: Any) -> M:
    """The row `row_sent` sent, as the database would have given it (`Model.from_db`: a
    column not sent is deferred). Raises ValueError for one that cannot be read."""
    if not isinstance(sent, dict):
        raise ValueError(f"A {model.__name__} row is not an object.")
    fields = [field for field in model._meta.concrete_fields if field.attname in sent]
    try:
        values = [field.to_python(sent[field.attname]) for field in fields]
    except ValidationError as error:
        raise ValueError(f"A {model.__name__} row cannot be read: {error.messages[0]}") from error
    return model.from_db("default", [field.attname for field in fields], values)
