"""The one place that turns text into vectors (fastembed, all-MiniLM-L6-v2, fully offline).

fastembed is imported on first use: the web process never embeds anything."""

import os
import threading
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING

from cachetools import LRUCache
from django.conf import settings

if TYPE_CHECKING:
    from fastembed import TextEmbedding

DIMENSIONS = 384
_BATCH_SIZE = 16  # fastembed's default of 256 peaks near 9 GB of memory.
_load_lock = threading.Lock()
# The vectors of recent texts: an application asking the same thing again (a retry, a stored
# request answered from memory, an agent's goal on every step) is not embedded twice. A
# vector costs ~4 ms of a core to make and ~3 KB to keep. Each process has its own; the
# model is fixed for a process's life, so an entry never goes stale.
_recent: LRUCache[str, tuple[float, ...]] = LRUCache(maxsize=settings.EMBEDDING_CACHE_SIZE)
_recent_lock = threading.Lock()


class EmbeddingModelMissing(RuntimeError):
    pass


@cache
def model_id() -> str:
    """Names the exact weights, so stored vectors can be checked against the running model."""
    marker = settings.EMBEDDING_MODEL_DIR / "MODEL_ID"
    if not marker.exists():
        raise EmbeddingModelMissing(
            f"No embedding model in {settings.EMBEDDING_MODEL_DIR}: run `python manage.py "
            "build_models` (make run and make test do it)."
        )
    return marker.read_text().strip()


@cache
def _model() -> "TextEmbedding":
    model_id()  # Fails with a clear message when the folder was never built.
    # The folder is built locally (`manage.py build_models`): never ask a model hub for it.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from fastembed import TextEmbedding

    return TextEmbedding(
        settings.EMBEDDING_MODEL_NAME,
        specific_model_path=str(settings.EMBEDDING_MODEL_DIR),
        threads=settings.EMBEDDING_THREADS,
    )


def embed_texts(texts: Sequence[str]) -> list[list[float]]:
    """The texts' vectors, in order: those embedded recently from the cache, the others (each
    distinct text once) in one batch."""
    model_id()  # Vectors are only made by a known, complete model folder.
    with _recent_lock:
        known = {text: _recent[text] for text in texts if text in _recent}
    missing = list(dict.fromkeys(text for text in texts if text not in known))
    if missing:
        with _load_lock:
            model = _model()
        made = [tuple(v.tolist()) for v in model.embed(missing, batch_size=_BATCH_SIZE)]
        with _recent_lock:
            for text, vector in zip(missing, made, strict=True):
                if _recent.maxsize:  # a cache of size 0 refuses every entry
                    _recent[text] = vector
        known |= dict(zip(missing, made, strict=True))
    return [list(known[text]) for text in texts]


def embed_text(text: str) -> list[float]:
    return embed_texts([text])[0]


def warm_up() -> None:
    """Load the model before the first request needs it (it costs a few hundred ms)."""
    embed_text("warm up")
