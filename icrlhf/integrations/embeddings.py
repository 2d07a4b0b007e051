"""The one place that turns text into vectors (fastembed, all-MiniLM-L6-v2, fully offline).

fastembed is imported on first use: the web process never embeds anything."""

import os
import threading
from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from fastembed import TextEmbedding

DIMENSIONS = 384
_BATCH_SIZE = 16  # fastembed's default of 256 peaks near 9 GB of memory.
_load_lock = threading.Lock()


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
    model_id()  # Vectors are only made by a known, complete model folder.
    with _load_lock:
        model = _model()
    return [vector.tolist() for vector in model.embed(list(texts), batch_size=_BATCH_SIZE)]


def embed_text(text: str) -> list[float]:
    return embed_texts([text])[0]


def warm_up() -> None:
    """Load the model before the first request needs it (it costs a few hundred ms)."""
    embed_text("warm up")
