"""The embedder with the real model: a text asked again is answered from the process's recent
vectors, identical to a fresh embedding, and never through the model a second time."""

from collections.abc import Iterator
from typing import Any

import pytest
from cachetools import LRUCache

from icrlhf.integrations import embeddings


class _CountingModel:
    """Wraps the real model: counts the texts it is asked to embed."""

    def __init__(self, model: Any) -> None:
        self.model, self.texts, self.longest = model, 0, 0

    def embed(self, texts: list[str], **options: Any) -> Iterator[Any]:
        self.texts += len(texts)
        self.longest = max([self.longest, *map(len, texts)])
        return iter(self.model.embed(texts, **options))


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> _CountingModel:
    counting = _CountingModel(embeddings._model())
    monkeypatch.setattr(embeddings, "_model", lambda: counting)
    monkeypatch.setattr(embeddings, "_recent", LRUCache(maxsize=8))
    return counting


def test_a_repeated_text_is_embedded_once_and_gets_the_same_vector(
    counted: _CountingModel,
) -> None:
    first = embeddings.embed_text("Where is my card?")
    again = embeddings.embed_text("Where is my card?")

    assert again == first
    assert counted.texts == 1
    assert len(first) == embeddings.DIMENSIONS


def test_a_batch_embeds_only_the_texts_it_has_not_seen_in_order(counted: _CountingModel) -> None:
    known = embeddings.embed_text("Where is my card?")
    fresh_alone = embeddings._model().model.embed(["How do I reset my PIN?"])
    counted.texts = 0

    vectors = embeddings.embed_texts(
        ["How do I reset my PIN?", "Where is my card?", "How do I reset my PIN?"]
    )

    assert counted.texts == 1  # the new text once, the known one not at all
    assert vectors[1] == known
    assert vectors[0] == vectors[2]
    assert vectors[0] == pytest.approx(next(iter(fresh_alone)).tolist(), abs=1e-6)


def test_changing_a_returned_vector_does_not_change_what_is_kept(counted: _CountingModel) -> None:
    vector = embeddings.embed_text("Where is my card?")
    kept = list(vector)
    vector[0] = 42.0

    assert embeddings.embed_text("Where is my card?") == kept


def test_the_least_recent_text_leaves_a_full_cache(counted: _CountingModel) -> None:
    for n in range(9):  # one more than the cache holds
        embeddings.embed_text(f"request {n}")
    counted.texts = 0

    embeddings.embed_text("request 8")
    embeddings.embed_text("request 0")

    assert counted.texts == 1  # only the oldest was embedded again


def test_a_cache_of_size_zero_keeps_nothing(
    counted: _CountingModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embeddings, "_recent", LRUCache(maxsize=0))

    embeddings.embed_text("Where is my card?")
    embeddings.embed_text("Where is my card?")

    assert counted.texts == 2


# A megabyte of prose: far more than the model's 256 word pieces.
LONG = "Where is my card? I ordered it on Monday, 3 weeks ago, and paid the fee. " * 14_000


def test_the_model_gets_only_what_it_reads_and_the_vector_is_the_same(
    counted: _CountingModel,
) -> None:
    vector = embeddings.embed_text(LONG)

    assert counted.longest < len(LONG)  # not the whole megabyte
    assert counted.longest <= embeddings.READ_CHARS
    whole = next(iter(counted.model.model.embed([LONG])))  # the model, the whole text
    assert vector == pytest.approx(whole.tolist(), abs=1e-6)


def test_the_cache_keeps_a_digest_of_each_text_not_the_text(counted: _CountingModel) -> None:
    embeddings.embed_text(LONG)
    # Another text, the same as far as the model reads: the same vector, from the cache.
    embeddings.embed_text(LONG + " Thanks!")

    assert counted.texts == 1
    assert [len(key) for key in embeddings._recent] == [16]
