"""The real local LLM for the LLM tier: llama.cpp's server with a model of the catalogue,
started as `make run` starts it, for one test module."""

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from django.conf import settings

from icrlhf.ops.catalogue import local_model
from icrlhf.ops.stack import free_port, http_ok, local_llm_command
from tests.support.waiting import wait_for


@contextmanager
def local_llm_server(
    name: str, *, log_dir: Path, slots: int, extra: Sequence[str] = (), timeout_s: float = 120
) -> Iterator[str]:
    """The server of the catalogue's model `name` (built by `make test`), its OpenAI API base
    while the block runs. `extra`: more of llama-server's options (the last one given wins)."""
    model = local_model(name)
    path = settings.VAR_DIR / "models" / model.file_name
    assert path.is_file(), (
        f"make test builds {name} (LOCAL_LLM={name} manage.py build_models --llm)"
    )
    port = free_port()
    with (log_dir / "llm.log").open("wb") as log:
        server = subprocess.Popen(
            [*local_llm_command(path, model=model, port=port, slots=slots), *extra],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        api_base = f"http://127.0.0.1:{port}/v1"
        try:
            wait_for(lambda: http_ok(f"{api_base}/models"), timeout_s=timeout_s, what="llama.cpp")
            yield api_base
        finally:
            server.terminate()
            server.wait(timeout=15)
