"""The embedder benchmark's logic: retrieval quality and speed of candidate embedding models
against the product's own (all-MiniLM-L6-v2, int8 ONNX).

Quality is kNN top-1 on labelled intents: a fixed, seeded split stores some messages with their
label; each held-out message gets the label of its nearest stored one by cosine. Speed is what
the product pays: one text a call (a gateway request), one thread as the product embeds, and
batches of 8 (requests arriving together, were they embedded in one call) and of 32 (bulk
indexing).

Each candidate is a folder that fastembed's `specific_model_path` loads as
all-MiniLM-L6-v2's architecture (a BERT ONNX graph with `last_hidden_state`, mean pooling and
its tokenizer files), the same layout `manage.py build_models` assembles for the product.
"""

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from django.conf import settings

from bench.learning import Labelled, labelled_split
from bench.world import ROOT, percentile
from icrlhf.insights.stats import wilson

if TYPE_CHECKING:
    from fastembed import TextEmbedding

BASELINE = "baseline"
DATASETS = {
    "banking77": settings.SHARED_DATA_DIR / "banking77" / "test.csv",
    "clinc150": ROOT / "bench" / "data" / "clinc150" / "test.csv",
}
# The product's batch for indexing (icrlhf.integrations.embeddings): fastembed's default of 256
# peaks near 9 GB.
_QUALITY_BATCH = 16
_SPEED_BATCHES = (8, 32)
_BATCH_TEXTS = 32  # texts timed per `--batches`, at each batch size
_WARM_UP_CALLS = 5


@dataclass(frozen=True)
class Candidate:
    name: str
    folder: Path


def candidates_parse(spec: str) -> list[Candidate]:
    """`baseline,name=/path/to/folder,…` → candidates; `baseline` is the product's own folder."""
    candidates: list[Candidate] = []
    for part in (piece.strip() for piece in spec.split(",")):
        if not part:
            continue
        if part == BASELINE:
            candidates.append(Candidate(BASELINE, settings.EMBEDDING_MODEL_DIR))
            continue
        name, separator, folder = part.partition("=")
        if not separator or not name or not folder:
            raise ValueError(f"{part!r}: expected `baseline` or `name=/path/to/folder`")
        candidates.append(Candidate(name.strip(), Path(folder.strip())))
    names = [candidate.name for candidate in candidates]
    if len(set(names)) != len(names):
        raise ValueError(f"a name is given twice in {names}")
    if not candidates:
        raise ValueError("no model to measure")
    return candidates


def model_load(folder: Path) -> "TextEmbedding":
    """The candidate loaded as the product loads its model (icrlhf.integrations.embeddings
    binds that to the one folder in settings; this loads any folder the same way)."""
    if not (folder / "model.onnx").is_file():
        raise FileNotFoundError(f"no model.onnx in {folder}")
    # Local folders only: without this a missing file costs ~40 s of retries against a hub.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from fastembed import TextEmbedding

    return TextEmbedding(
        settings.EMBEDDING_MODEL_NAME,
        specific_model_path=str(folder),
        threads=settings.EMBEDDING_THREADS,
    )


def _unit_vectors(model: "TextEmbedding", texts: Sequence[str]) -> np.ndarray:
    vectors = np.array(list(model.embed(list(texts), batch_size=_QUALITY_BATCH)), dtype=np.float32)
    # Cosine, whatever the model's own normalisation.
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.asarray(vectors / np.maximum(norms, 1e-12))


def knn_top1_hits(
    model: "TextEmbedding", *, stored: Sequence[Labelled], held_out: Sequence[Labelled]
) -> int:
    """How many held-out messages the nearest stored message (by cosine) labels right."""
    stored_vectors = _unit_vectors(model, [example.text for example in stored])
    held_vectors = _unit_vectors(model, [example.text for example in held_out])
    nearest = np.argmax(held_vectors @ stored_vectors.T, axis=1)
    return sum(
        stored[int(index)].label == example.label
        for index, example in zip(nearest, held_out, strict=True)
    )


def _cycled(texts: Sequence[str], count: int) -> Iterator[str]:
    for n in range(count):
        yield texts[n % len(texts)]


def speed(
    model: "TextEmbedding", texts: Sequence[str], *, single_calls: int, batches: int
) -> dict[str, float]:
    """ms per single-text call (p50, p95) and texts/s in batches of 8 and of 32 (`batches` of
    32 texts each way), after a warm-up (the first calls pay for ONNX Runtime's allocations,
    which a running worker has paid already)."""
    for text in _cycled(texts, _WARM_UP_CALLS):
        list(model.embed([text], batch_size=1))
    single_ms: list[float] = []
    for text in _cycled(texts, single_calls):
        started = time.perf_counter()
        list(model.embed([text], batch_size=1))
        single_ms.append((time.perf_counter() - started) * 1000)
    result = {
        "single_p50_ms": round(percentile(single_ms, 50), 2),
        "single_p95_ms": round(percentile(single_ms, 95), 2),
    }
    batch_texts = list(_cycled(texts, _BATCH_TEXTS * batches))
    for size in _SPEED_BATCHES:
        list(model.embed(batch_texts[:size], batch_size=size))  # a new shape's allocations
        started = time.perf_counter()
        for start in range(0, len(batch_texts), size):
            list(model.embed(batch_texts[start : start + size], batch_size=size))
        batch_s = time.perf_counter() - started
        result[f"batch{size}_texts_per_s"] = round(len(batch_texts) / batch_s, 1)
    return result


def splits(
    datasets: Sequence[str], *, stored: int, held_out: int, seed: int
) -> dict[str, tuple[list[Labelled], list[Labelled]]]:
    """Each data set's (stored, held-out) messages: the same for every model."""
    result: dict[str, tuple[list[Labelled], list[Labelled]]] = {}
    for name in datasets:
        held, kept = labelled_split(DATASETS[name], seed=seed, test=held_out, stream=stored)
        result[name] = (kept, held)
    return result


def measure(
    candidates: Sequence[Candidate],
    *,
    datasets: Sequence[str],
    stored: int,
    held_out: int,
    seed: int,
    single_calls: int,
    batches: int,
) -> dict[str, Any]:
    """Every candidate on the same splits, one after another (one process, one thread)."""
    data = splits(datasets, stored=stored, held_out=held_out, seed=seed)
    # Speed is timed on the held-out requests: short texts, as the product embeds them.
    speed_texts = [example.text for example in data[datasets[0]][1]]
    models: dict[str, dict[str, Any]] = {}
    for candidate in candidates:
        started = time.perf_counter()
        model = model_load(candidate.folder)
        row: dict[str, Any] = {
            "folder": str(candidate.folder),
            "model_mb": round((candidate.folder / "model.onnx").stat().st_size / 1e6, 1),
            "load_s": round(time.perf_counter() - started, 2),
        }
        for name, (kept, held) in data.items():
            hits = knn_top1_hits(model, stored=kept, held_out=held)
            row[f"{name}_top1"] = round(hits / len(held), 4)
            row[f"{name}_top1_ci"] = [round(bound, 4) for bound in wilson(hits, len(held))]
            row[f"{name}_hits"] = hits
        row.update(speed(model, speed_texts, single_calls=single_calls, batches=batches))
        models[candidate.name] = row
        del model  # One model in memory at a time.
    baseline = models.get(BASELINE)
    for row in models.values():
        row["difference_points"] = (
            {
                name: round((row[f"{name}_top1"] - baseline[f"{name}_top1"]) * 100, 1)
                for name in datasets
            }
            if baseline is not None
            else None
        )
    return {
        "datasets": list(datasets),
        "stored": stored,
        "held_out": held_out,
        "seed": seed,
        "threads": settings.EMBEDDING_THREADS,
        "single_calls": single_calls,
        "batch_texts": _BATCH_TEXTS * batches,
        "models": models,
    }


def table(result: dict[str, Any]) -> list[str]:
    """The result as a Markdown table, one row a model."""
    datasets: list[str] = result["datasets"]
    header = ["model", "MB"]
    for name in datasets:
        header += [f"{name} top-1 (95% CI)", "Δ points"]
    header += ["single p50 ms", "single p95 ms"]
    header += [f"batch-{size} texts/s" for size in _SPEED_BATCHES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, row in result["models"].items():
        cells = [model, f"{row['model_mb']:.0f}"]
        for name in datasets:
            low, high = row[f"{name}_top1_ci"]
            cells.append(f"{row[f'{name}_top1'] * 100:.1f} ({low * 100:.1f}–{high * 100:.1f})")
            difference = (row["difference_points"] or {}).get(name)
            cells.append("" if difference is None else f"{difference:+.1f}")
        cells += [
            f"{row['single_p50_ms']:.2f}",
            f"{row['single_p95_ms']:.2f}",
        ]
        cells += [f"{row[f'batch{size}_texts_per_s']:.0f}" for size in _SPEED_BATCHES]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
