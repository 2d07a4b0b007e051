"""The one place that talks to the vector store (Qdrant: local folder or server).

qdrant-client is imported on first use: the web process never talks to the store."""

import contextlib
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings

if TYPE_CHECKING:
    import numpy
    from numpy.typing import NDArray
    from qdrant_client import QdrantClient

# Local mode allows one process per folder and is not thread-safe: every call takes this lock.
# A server needs no lock, and any number of workers may connect to it.
_local_lock = threading.RLock()
_client_lock = threading.Lock()

# A vector of length 1 (its dot product with another is their cosine).
type UnitVector = NDArray[numpy.float64]


class VectorStoreUnavailable(RuntimeError):
    """The store could not be reached or opened; the caller should try again later."""


@dataclass(frozen=True)
class Point:
    id: uuid.UUID
    vector: list[float]
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hit:
    id: uuid.UUID
    score: float
    vector: list[float]
    payload: dict[str, Any]


@cache
def _client() -> "QdrantClient":
    from qdrant_client import QdrantClient

    if settings.QDRANT_URL:
        return QdrantClient(
            url=settings.QDRANT_URL, api_key=settings.QDRANT_API_KEY or None, timeout=10
        )
    settings.QDRANT_PATH.mkdir(parents=True, exist_ok=True)
    return QdrantClient(path=str(settings.QDRANT_PATH))


@contextlib.contextmanager
def _store() -> Iterator["QdrantClient"]:
    lock = contextlib.nullcontext() if settings.QDRANT_URL else _local_lock
    with lock:
        try:
            with _client_lock:
                client = _client()
            yield client
        except VectorStoreUnavailable:
            raise
        except (ValueError, KeyError):
            raise  # Our own mistakes (a bad filter, a wrong size) must not look like an outage.
        except Exception as error:  # Connection refused, a locked folder, a 5xx from the server…
            raise VectorStoreUnavailable(f"The vector store is unavailable: {error}") from error


def warm_up() -> None:
    """Open the store now (import, local folder, server connection: about a second), so the
    first decision's indexing is not the slow one."""
    with _store():
        pass


def close() -> None:
    """Release the store (local mode holds a folder lock until then)."""
    with _local_lock, _client_lock:
        if _client.cache_info().currsize:
            _client().close()
            _client.cache_clear()


def _ensure_collection(client: "QdrantClient", name: str, dimensions: int) -> None:
    from qdrant_client import models

    if not client.collection_exists(name):
        client.create_collection(
            name,
            # Points are stored as unit vectors, so their dot product is their cosine; local mode
            # computes a dot product directly, where for cosine it re-measures every stored
            # vector on each search (~4x slower at 10k points).
            vectors_config=models.VectorParams(size=dimensions, distance=models.Distance.DOT),
        )


def upsert(*, collection: str, points: Sequence[Point]) -> None:
    if not points:
        return
    from qdrant_client import models

    with _store() as client:
        _ensure_collection(client, collection, len(points[0].vector))
        client.upsert(
            collection,
            points=[
                models.PointStruct(
                    id=str(point.id),
                    vector=unit_array(point.vector).tolist(),
                    payload=point.payload,
                )
                for point in points
            ],
            wait=True,
        )


def delete(*, collection: str, ids: Sequence[uuid.UUID]) -> None:
    from qdrant_client import models

    with _store() as client:
        if client.collection_exists(collection):
            client.delete(
                collection, points_selector=models.PointIdsList(points=[str(i) for i in ids])
            )


def search(
    *,
    collection: str,
    vector: list[float],
    limit: int,
    match: Mapping[str, Sequence[str | int]],
    min_score: float | None = None,
    with_vectors: bool = True,
    payload_fields: Sequence[str] | None = None,
) -> list[Hit]:
    """Nearest points whose payload field takes one of the given values, for every field
    (no fields: any point; much faster in local mode, which checks filters point by point).
    `payload_fields` limits the payload returned (local mode copies all it returns)."""
    from qdrant_client import models

    query_filter = None
    if match:
        query_filter = models.Filter(
            must=[
                models.FieldCondition(
                    # One field's values are all of one type (a role's names, a queue's id).
                    key=key,
                    match=models.MatchAny(any=cast("list[str] | list[int]", list(values))),
                )
                for key, values in match.items()
            ]
        )
    with _store() as client:
        if not client.collection_exists(collection):
            return []
        result = client.query_points(
            collection,
            query=unit_array(vector).tolist(),
            query_filter=query_filter,
            limit=limit,
            score_threshold=min_score,
            with_payload=list(payload_fields) if payload_fields is not None else True,
            with_vectors=with_vectors,
        )
    return [
        Hit(
            id=uuid.UUID(str(point.id)),
            score=float(point.score),
            vector=cast(list[float], point.vector or []),
            payload=dict(point.payload or {}),
        )
        for point in result.points
    ]


def count(*, collection: str) -> int:
    with _store() as client:
        if not client.collection_exists(collection):
            return 0
        return int(client.count(collection, exact=True).count)


def payload_set(*, collection: str, ids: Sequence[uuid.UUID], payload: dict[str, Any]) -> None:
    """Change fields of the points' payloads in place (no re-embedding, O(points changed))."""
    if not ids:
        return
    with _store() as client:
        if client.collection_exists(collection):
            client.set_payload(collection, payload=payload, points=[str(i) for i in ids], wait=True)


def point_ids(*, collection: str) -> set[uuid.UUID]:
    """Every point id in the collection (for drift checks)."""
    found: set[uuid.UUID] = set()
    with _store() as client:
        if not client.collection_exists(collection):
            return found
        offset = None
        while True:
            points, offset = client.scroll(
                collection, limit=1000, offset=offset, with_payload=False, with_vectors=False
            )
            found.update(uuid.UUID(str(point.id)) for point in points)
            if offset is None:
                return found


def collection_drop(*, collection: str) -> None:
    with _store() as client:
        if client.collection_exists(collection):
            client.delete_collection(collection)


def vectors_of(*, collection: str, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[float]]:
    """The stored vectors of these points (fetched by id: fast in every mode)."""
    if not ids:
        return {}
    with _store() as client:
        if not client.collection_exists(collection):
            return {}
        # Without payloads: local mode deep-copies every payload it returns.
        points = client.retrieve(
            collection, ids=[str(i) for i in ids], with_payload=False, with_vectors=True
        )
    return {uuid.UUID(str(point.id)): cast(list[float], point.vector) for point in points}


def search_among(
    *, collection: str, vector: list[float], ids: Sequence[uuid.UUID]
) -> dict[uuid.UUID, float]:
    """Similarity (cosine) of the given points to the vector, to rank pinned examples: the
    points are fetched by id and compared here, as an id filter is slow in local mode."""
    stored = vectors_of(collection=collection, ids=ids)
    return {point_id: cosine(vector, other) for point_id, other in stored.items()}


def unit_array(vector: Sequence[float]) -> UnitVector:
    """The vector scaled to length 1, as an array: the dot product of two is their cosine,
    computed without converting lists again for every pair."""
    import numpy

    array = numpy.asarray(vector, dtype=numpy.float64)
    norm = float(numpy.linalg.norm(array))
    return array / norm if norm else array


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    import numpy

    norms = float(numpy.linalg.norm(a) * numpy.linalg.norm(b))
    return float(numpy.dot(a, b)) / norms if norms else 0.0
