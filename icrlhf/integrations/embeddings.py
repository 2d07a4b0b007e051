"""The one place that turns text into vectors (fastembed, all-MiniLM-L6-v2, fully offline).

fastembed is imported on first use: the web process never embeds anything."""

import hashlib
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
# The model reads a text's first 256 word pieces (ops/models_build.py) and nothing after them,
# and a word piece is a few characters (about 4 in English prose, spaces included): 32 a piece
# keeps all that the model reads of any real text, while a megabyte's request is not
# tokenised whole only for most of its pieces to be dropped.
READ_CHARS = 256 * 32
_load_lock = threading.Lock()
# The vectors of recent texts: an application asking the same thing again (a retry, a stored
# request answered from memory, an agent's goal on every step) is not embedded twice. A
# vector costs ~4 ms of a core to make and ~3 KB to keep; its key, a digest of the text the
# model read, 16 bytes (not the text: 4096 texts of up to a megabyte each). Each process has
# its own; the model is fixed for a process's life, so an entry never goes stale.
_recent: LRUCache[bytes, tuple[float, ...]] = LRUCache(maxsize=settings.EMBEDDING_CACHE_SIZE)
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


def _key(read: str) -> bytes:
    # surrogatepass: a digest is never what fails on a text (the model says what it refuses).
    return hashlib.blake2b(read.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def embed_texts(texts: Sequence[str]) -> list[list[float]]:
    """The texts' vectors, in order: those embedded recently from the cache, the others (each
    distinct text once) in one batch. Only a text's first READ_CHARS characters are read."""
    model_id()  # Vectors are only made by a known, complete model folder.
    read = [text[:READ_CHARS] for text in texts]
    keys = [_key(each) for each in read]
    text_of = dict(zip(keys, read, strict=True))
    with _recent_lock:
        known = {key: _recent[key] for key in keys if key in _recent}
    missing = [key for key in dict.fromkeys(keys) if key not in known]
    if missing:
        with _load_lock:
            model = _model()
        made = [
            tuple(v.tolist())
            for v in model.embed([text_of[key] for key in missing], batch_size=_BATCH_SIZE)
        ]
        with _recent_lock:
            for key, vector in zip(missing, made, strict=True):
                if _recent.maxsize:  # a cache of size 0 refuses every entry
                    _recent[key] = vector
        known |= dict(zip(missing, made, strict=True))
    return [list(known[key]) for key in keys]


def embed_text(text: str) -> list[float]:
    return embed_texts([text])[0]


def warm_up() -> None:
    """Load the model before the first request needs it (it costs a few hundred ms)."""
    embed_text("warm up")
