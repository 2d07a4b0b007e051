"""The local LLM runs on any x86-64 CPU with AVX2: its build uses no instruction beyond that
baseline, and a CPU it cannot run on gets a plain message instead of a crash."""

from pathlib import Path
from typing import Any

import pytest

from icrlhf.ops.catalogue import CHATML_WITH_TOOLS, local_model
from icrlhf.ops.local_llm import (
    PORTABLE_BASELINE,
    build_features,
    cpu_flags,
    cpu_problem,
    features_of,
    local_llm_check,
)
from icrlhf.ops.stack import (
    chat_template_for,
    local_llm_command,
    local_llm_threads,
)


# These two run the installed server: the LLM tier's (`make test-fast` never builds it).
@pytest.mark.llm
def test_the_installed_llama_cpp_is_built_for_the_portable_baseline_only() -> None:
    features = build_features()  # read from the installed server's own system info
    assert "AVX2" in features, features
    beyond = features - PORTABLE_BASELINE
    assert not beyond, (
        f"llama.cpp was compiled with {sorted(beyond)}: a native build, which crashes on other "
        "CPUs. Reinstall with tools/install-llm (after removing its cached build)."
    )


@pytest.mark.llm
def test_this_machine_can_run_the_installed_build() -> None:
    local_llm_check()  # raises LocalLLMUnsupported with the reason otherwise


def test_system_info_is_read_feature_by_feature() -> None:
    info = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | LLAMAFILE = 1 | "
    assert features_of(info) == {"SSE3", "SSSE3", "AVX", "AVX2"}


def test_cpu_flags_come_from_proc_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nbugs\t\t:\n")
    assert cpu_flags(cpuinfo) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_a_cpu_without_avx2_is_told_what_to_do() -> None:
    problem = cpu_problem(
        needed=frozenset({"AVX", "AVX2", "FMA"}),
        flags=frozenset({"avx", "fma", "sse2"}),
        machine="x86_64",
    )
    assert "lacks AVX2" in problem
    assert "LLM_NATIVE=1 make run" in problem and "LLM_API_BASE" in problem


def test_a_native_build_on_a_cpu_without_avx512_is_named() -> None:
    problem = cpu_problem(
        needed=frozenset({"AVX2", "AVX512", "AMX_INT8"}),
        flags=frozenset({"avx2"}),
        machine="x86_64",
    )
    assert "lacks AMX_INT8, AVX512" in problem


def test_another_architecture_is_told_plainly() -> None:
    assert "x86-64" in cpu_problem(needed=frozenset(), flags=frozenset(), machine="aarch64")


def test_a_cpu_with_everything_needed_has_no_problem() -> None:
    flags = frozenset({"pni", "ssse3", "avx", "avx2", "f16c", "fma", "bmi2"})
    assert cpu_problem(needed=PORTABLE_BASELINE, flags=flags, machine="x86_64") == ""


def test_each_model_renders_with_its_catalogue_entrys_template_and_window(
    settings: Any,
) -> None:
    """SmolLM2's own template knows no tools: it gets the shipped one. Qwen2.5's own renders
    and reads Hermes-style <tool_call> JSON, in llama.cpp's Jinja engine."""
    smollm2, qwen = local_model("smollm2-135m"), local_model("qwen2.5-coder-0.5b")
    settings.LOCAL_LLM_CHAT_TEMPLATE = "auto"
    assert chat_template_for(smollm2) == CHATML_WITH_TOOLS
    assert chat_template_for(qwen) is None
    command = local_llm_command(Path("m.gguf"), model=smollm2, port=8012, slots=4)
    assert command[command.index("--chat-template-file") + 1] == str(CHATML_WITH_TOOLS)
    assert command[command.index("--kv-unified-per-slot") + 1] == "2048"
    assert command[command.index("--alias") + 1] == "smollm2"
    command = local_llm_command(Path("m.gguf"), model=qwen, port=8012, slots=4)
    assert "--jinja" in command and "--chat-template-file" not in command
    assert command[command.index("--kv-unified-per-slot") + 1] == "4096"
    assert command[command.index("--ctx-size") + 1] == str(4 * 4096)
    assert command[command.index("--alias") + 1] == "qwen2.5-coder-0.5b"

    settings.LOCAL_LLM_CHAT_TEMPLATE = "model"
    assert chat_template_for(smollm2) is None
    assert "--chat-template-file" not in local_llm_command(
        Path("m.gguf"), model=smollm2, port=8012, slots=4
    )

    settings.LOCAL_LLM_CHAT_TEMPLATE = "/etc/icrlhf/mine.jinja"
    assert chat_template_for(qwen) == Path("/etc/icrlhf/mine.jinja")


def test_the_local_llm_threads_sleep_instead_of_spinning_while_they_wait() -> None:
    """Spinning threads collapse to under a token a second when anything else is busy on the
    cores (docs/operators.md: the local LLM); `--poll 0` makes them sleep."""
    command = local_llm_command(
        Path("model.gguf"), model=local_model("smollm2-135m"), port=8012, slots=4
    )
    assert command[command.index("--poll") + 1] == "0"
    assert command[command.index("--threads") + 1] == str(local_llm_threads())
    one = local_llm_command(
        Path("model.gguf"), model=local_model("smollm2-135m"), port=8012, slots=1, threads=1
    )
    assert one[one.index("--threads") + 1] == "1"
