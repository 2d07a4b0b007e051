"""The vector helpers that retrieval's near-duplicate check relies on, and the embedded
store's searches in Qdrant Edge's engine, which must find what the store of record finds."""

import uuid
from typing import Any

import numpy
import pytest

from icrlhf.integrations import vectors


def test_a_unit_array_has_length_one_and_keeps_its_direction() -> None:
    unit = vectors.unit_array([3.0, 4.0])

    assert unit.tolist() == pytest.approx([0.6, 0.8])


def test_the_dot_product_of_unit_arrays_is_their_cosine() -> None:
    a, b = [1.0, 2.0, 3.0], [-2.0, 0.5, 4.0]

    assert float(vectors.unit_array(a) @ vectors.unit_array(b)) == pytest.approx(
        vectors.cosine(a, b)
    )


def test_a_zero_vector_stays_zero_rather_than_dividing_by_zero() -> None:
    assert vectors.unit_array([0.0, 0.0]).tolist() == [0.0, 0.0]


# --- The embedded store's searches, in Qdrant Edge's engine ---------------------------------

DIMENSIONS = 16


def _points(count: int, seed: int) -> list[vectors.Point]:
    rng = numpy.random.default_rng(seed)
    return [
        vectors.Point(
            id=uuid.uuid4(),
            vector=rng.normal(size=DIMENSIONS).tolist(),
            payload={"role": ("preferred", "rejected")[n % 2], "status": "active", "n": n},
        )
        for n in range(count)
    ]


def _as_the_store_answers(
    query: list[float], *, limit: int, match: dict[str, list[str]]
) -> list[tuple[uuid.UUID, float, dict[str, Any]]]:
    """The same search by the store of record itself (qdrant-client's local mode)."""
    from qdrant_client import models

    conditions = [
        models.FieldCondition(key=key, match=models.MatchAny(any=values))
        for key, values in match.items()
    ]
    with vectors._store() as client:
        found = client.query_points(
            "c",
            query=vectors.unit_array(query).tolist(),
            query_filter=models.Filter(must=conditions) if conditions else None,
            limit=limit,
        ).points
    return [(uuid.UUID(str(p.id)), round(p.score, 5), dict(p.payload or {})) for p in found]


def _searched(query: list[float], *, limit: int, match: dict[str, list[str]]) -> list[Any]:
    hits = vectors.search(collection="c", vector=query, limit=limit, match=match)
    return [(hit.id, round(hit.score, 5), hit.payload) for hit in hits]


@pytest.mark.usefixtures("vector_store")
def test_the_mirror_finds_what_the_store_finds_through_every_kind_of_write() -> None:
    points = _points(300, seed=1)
    vectors.upsert(collection="c", points=points[:200])
    queries = [point.vector for point in _points(5, seed=2)]
    vectors.search(collection="c", vector=queries[0], limit=1, match={})  # mirrored now
    vectors.upsert(collection="c", points=points[200:])
    vectors.delete(collection="c", ids=[point.id for point in points[:30]])
    vectors.payload_set(collection="c", ids=[points[40].id], payload={"status": "retired"})

    for query in queries:
        for match in ({}, {"role": ["preferred"], "status": ["active"]}):
            assert _searched(query, limit=20, match=match) == _as_the_store_answers(
                query, limit=20, match=match
            )
    hits = vectors.search(collection="c", vector=points[100].vector, limit=1, match={})
    assert hits[0].id == points[100].id
    assert hits[0].vector == pytest.approx(
        vectors.unit_array(points[100].vector).tolist(), abs=1e-6
    )


@pytest.mark.usefixtures("vector_store")
def test_a_store_opened_again_is_mirrored_again_from_what_it_holds() -> None:
    points = _points(100, seed=3)
    vectors.upsert(collection="c", points=points)
    query = _points(1, seed=4)[0].vector
    before = _searched(query, limit=10, match={})
    vectors.close()  # a restart: the mirror is gone, the folder stays

    vectors.warm_up()

    assert "c" in vectors._mirrors
    assert _searched(query, limit=10, match={}) == before


@pytest.mark.usefixtures("vector_store")
def test_a_mirror_that_falls_out_of_step_is_rebuilt_and_the_write_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    points = _points(50, seed=5)
    vectors.upsert(collection="c", points=points[:40])
    vectors.search(collection="c", vector=points[0].vector, limit=1, match={})
    real = vectors._edge_upsert

    def failing(shard: Any, added: Any) -> None:
        raise RuntimeError("the engine refused")

    monkeypatch.setattr(vectors, "_edge_upsert", failing)  # test double: one failed follow
    vectors.upsert(collection="c", points=points[40:])
    monkeypatch.setattr(vectors, "_edge_upsert", real)

    assert "c" not in vectors._mirrors
    hits = vectors.search(collection="c", vector=points[45].vector, limit=1, match={})
    assert hits[0].id == points[45].id  # in the store, so in the rebuilt mirror


@pytest.mark.usefixtures("vector_store")
def test_a_mirror_whose_build_fails_is_never_searched_half_built(
    monkeypatch: pytest.MonkeyPatch, vector_store: Any
) -> None:
    points = _points(30, seed=6)
    vectors.upsert(collection="c", points=points)
    real = vectors._edge_upsert

    def failing(shard: Any, added: Any) -> None:
        raise RuntimeError("the engine refused")

    monkeypatch.setattr(vectors, "_edge_upsert", failing)  # test double: a build that fails
    with pytest.raises(vectors.VectorStoreUnavailable):
        vectors.search(collection="c", vector=points[3].vector, limit=1, match={})
    assert "c" not in vectors._mirrors
    monkeypatch.setattr(vectors, "_edge_upsert", real)

    hits = vectors.search(collection="c", vector=points[3].vector, limit=1, match={})
    assert hits[0].id == points[3].id
    assert (vector_store.with_name(f"{vector_store.name}-search") / "c").is_dir()
