"""The one place that talks to the vector store (Qdrant: local folder or server).

With a local folder (the embedded default), qdrant-client's local mode is the store of record
(every write goes there first), and searches run in Qdrant Edge's engine (`qdrant-edge-py`):
each collection is mirrored into an Edge shard (its files beside the store's folder, in
`<QDRANT_PATH>-search`) built from the store on first use and kept in step with every write
here. Local mode searches in Python (a product with every
vector, then a copy and a pydantic object per hit; after a reload the vectors are float64):
~6-12 ms at 10k points, where the engine takes ~0.5 ms. Both admit one process per folder,
the one that owns the store, which is the only one to write it.

qdrant-client is imported on first use: the web process never talks to the store."""

import contextlib
import logging
import shutil
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from django.conf import settings

if TYPE_CHECKING:
    import numpy
    from numpy.typing import NDArray
    from qdrant_client import QdrantClient
    from qdrant_edge import ConditionType, EdgeShard

logger = logging.getLogger(__name__)

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
    """Open the store now (import, local folder, server connection: about a second) and, with
    a local folder, mirror its collections (see the module's note), so that neither the
    first decision's indexing nor the first retrieval is the slow one."""
    with _store() as client:
        if not settings.QDRANT_URL:
            for collection in client.get_collections().collections:
                _mirror(client, collection.name)


def close() -> None:
    """Release the store (local mode holds a folder lock until then) and its mirrors."""
    with _local_lock, _client_lock:
        for collection in list(_mirrors):
            _mirror_drop(collection)
        if _client.cache_info().currsize:
            _client().close()
            _client.cache_clear()


# Each collection's Edge shard, by name, while the store is local (see the module's note).
_mirrors: dict[str, "EdgeShard"] = {}
_MIRROR_PAGE = 1000

type _Units = list[tuple[str, list[float], dict[str, Any]]]


def _mirror_folder(collection: str) -> Path:
    """Where a collection's shard keeps its files: beside the store's folder, which only one
    process opens at a time (local mode locks it), so a folder left by a process that was
    killed is this process's to clear."""
    return settings.QDRANT_PATH.with_name(f"{settings.QDRANT_PATH.name}-search") / collection


def _mirror(client: "QdrantClient", collection: str) -> "EdgeShard":
    """The collection's Edge shard, built from the store the first time it is searched
    (~1 s for 10k points) and searched only once it holds every point; the caller holds the
    local lock."""
    if collection in _mirrors:
        return _mirrors[collection]
    from qdrant_edge import Distance, EdgeConfig, EdgeShard, EdgeVectorParams, Memory

    size = client.get_collection(collection).config.params.vectors.size  # type: ignore[union-attr]
    folder = _mirror_folder(collection)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    shard = EdgeShard.create(
        str(folder),
        EdgeConfig(
            vectors={"": EdgeVectorParams(size=size, distance=Distance.Dot)},
            # A copy, rebuilt from the store on every start: nothing of it needs a log, and
            # one thread searches it as one thread asks (the owner's).
            wal_enabled=False,
            payload_memory=Memory.Cached,
            max_search_threads=1,
        ),
    )
    try:
        offset = None
        while True:
            points, offset = client.scroll(
                collection, limit=_MIRROR_PAGE, offset=offset, with_payload=True, with_vectors=True
            )
            _edge_upsert(
                shard,
                [(str(p.id), cast(list[float], p.vector), dict(p.payload or {})) for p in points],
            )
            if offset is None:
                break
    except BaseException:
        shard.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    _mirrors[collection] = shard
    return shard


def _edge_upsert(shard: "EdgeShard", points: _Units) -> None:
    if not points:
        return
    from qdrant_edge import Point as EdgePoint
    from qdrant_edge import UpdateOperation

    shard.update(
        UpdateOperation.upsert_points(
            [
                EdgePoint(id=pid, vector={"": vector}, payload=payload)
                for pid, vector, payload in points
            ]
        )
    )


def _mirror_drop(collection: str) -> None:
    """Forget the collection's shard (it is built again from the store when next searched)."""
    shard = _mirrors.pop(collection, None)
    if shard is not None:
        shard.close()
        shutil.rmtree(_mirror_folder(collection), ignore_errors=True)


@contextlib.contextmanager
def _mirrored(collection: str) -> Iterator[None]:
    """Around a write that the mirror repeats, once the store has it: a mirror that failed
    to follow is dropped, to be rebuilt from the store when next searched, never searched
    out of step (the write itself stands)."""
    try:
        yield
    except Exception:
        logger.exception(
            "The search mirror of %s fell out of step: rebuilt from the store", collection
        )
        _mirror_drop(collection)


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

    units = [(str(point.id), unit_array(point.vector).tolist(), point.payload) for point in points]
    with _store() as client:
        _ensure_collection(client, collection, len(points[0].vector))
        client.upsert(
            collection,
            points=[
                models.PointStruct(id=pid, vector=vector, payload=payload)
                for pid, vector, payload in units
            ],
            wait=True,
        )
        if collection in _mirrors:
            with _mirrored(collection):
                _edge_upsert(_mirrors[collection], units)


def delete(*, collection: str, ids: Sequence[uuid.UUID]) -> None:
    from qdrant_client import models

    with _store() as client:
        if client.collection_exists(collection):
            client.delete(
                collection, points_selector=models.PointIdsList(points=[str(i) for i in ids])
            )
        if collection in _mirrors:
            from qdrant_edge import UpdateOperation

            with _mirrored(collection):
                _mirrors[collection].update(UpdateOperation.delete_points([str(i) for i in ids]))


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
    query = unit_array(vector).tolist()
    with_payload = list(payload_fields) if payload_fields is not None else True
    with _store() as client:
        if not client.collection_exists(collection):
            return []
        if not settings.QDRANT_URL:
            return _mirror_search(
                _mirror(client, collection),
                query=query,
                match=match,
                limit=limit,
                min_score=min_score,
                with_payload=with_payload,
                with_vectors=with_vectors,
            )
        result = client.query_points(
            collection,
            query=query,
            query_filter=query_filter,
            limit=limit,
            score_threshold=min_score,
            with_payload=with_payload,
            with_vectors=with_vectors,
        )
    return _hits(result.points)


def _hits(points: Sequence[Any]) -> list[Hit]:
    """Scored points (qdrant-client's or Qdrant Edge's: the same fields, the one unnamed
    vector) as hits."""
    return [
        Hit(
            id=uuid.UUID(str(point.id)),
            score=float(point.score),
            vector=cast(list[float], point.vector or []),
            payload=dict(point.payload or {}),
        )
        for point in points
    ]


def _mirror_search(
    shard: "EdgeShard",
    *,
    query: list[float],
    match: Mapping[str, Sequence[str | int]],
    limit: int,
    min_score: float | None,
    with_payload: list[str] | bool,
    with_vectors: bool,
) -> list[Hit]:
    from qdrant_edge import FieldCondition, Filter, MatchAny, Query, QueryRequest

    conditions: list[ConditionType] = [
        FieldCondition(key=key, match=MatchAny(any=cast("list[str] | list[int]", list(values))))
        for key, values in match.items()
    ]
    return _hits(
        shard.query(
            QueryRequest(
                limit=limit,
                query=Query.Nearest(query, using=""),
                filter=Filter(must=conditions) if conditions else None,
                score_threshold=min_score,
                with_payload=with_payload,
                with_vector=with_vectors,
            )
        )
    )


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
        if collection in _mirrors:
            from qdrant_edge import UpdateOperation

            with _mirrored(collection):
                _mirrors[collection].update(
                    UpdateOperation.set_payload([str(i) for i in ids], payload)
                )


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
        _mirror_drop(collection)


def vectors_of(*, collection: str, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[float]]:
    """The stored vectors of these points (fetched by id: fast in every mode)."""
    if not ids:
        return {}
    with _store() as client:
        if not client.collection_exists(collection):
            return {}
        points: Sequence[Any]
        if not settings.QDRANT_URL:
            # From the Edge shard the search reads too: local mode's own retrieve, in Python,
            # took 0.34 ms for a prompt's dozen points where the shard takes 0.05.
            points = _mirror(client, collection).retrieve(
                [str(i) for i in ids], with_payload=False, with_vector=True
            )
        else:
            # Without payloads: only the vectors are wanted.
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
