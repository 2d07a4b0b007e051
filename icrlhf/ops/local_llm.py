"""Can this machine run the bundled local LLM? llama.cpp is compiled for a set of CPU
instructions; on a CPU without one of them it dies with SIGILL (or worse, a segfault) on the
first completion. `tools/install-llm` builds for the portable x86-64 baseline below; this
compares what the installed build needs with what the CPU has, before anything starts."""

import platform
import re
import signal
import subprocess
import sys
from pathlib import Path

# What `tools/install-llm` compiles for: x86-64 with AVX2 (Intel Haswell, 2013; AMD Excavator,
# 2015, and Zen), as llama.cpp's feature names print them.
PORTABLE_BASELINE = frozenset({"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"})
# llama.cpp's feature name → the flag /proc/cpuinfo shows for it.
CPU_FLAG_OF = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX_VNNI": "avx_vnni",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}
REBUILD_HINT = (
    "Rebuild it for this machine with `LLM_NATIVE=1 make run`, or use another model: set "
    "LLM_MODEL and LLM_API_BASE and run `manage.py runstack --no-local-llm`."
)


class LocalLLMUnsupported(RuntimeError):
    """The installed llama.cpp build cannot run on this CPU; the message says what to do."""


def llama_server_path() -> Path:
    """llama.cpp's server, which tools/install-llm puts beside this Python."""
    return Path(sys.executable).parent / "llama-server"


def build_features() -> frozenset[str]:
    """The instruction sets the installed llama-server was compiled for, read from the system
    info it prints before loading a model. It is given a model that does not exist, so it
    prints, fails to load and exits; a build this CPU cannot run dies in its own process."""
    server = llama_server_path()
    if not server.is_file():
        raise LocalLLMUnsupported(
            f"The local LLM's server is not installed ({server}): run `make run`, which builds it."
        )
    probe = subprocess.run(
        [
            str(server),
            "--verbosity",
            "4",  # trace: the level at which llama-server prints its system info
            "--model",
            "/nonexistent/model.gguf",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode < 0:
        name = signal.Signals(-probe.returncode).name
        raise LocalLLMUnsupported(
            f"The local LLM's server crashed on start ({name}): it was built for "
            f"instructions this CPU lacks. {REBUILD_HINT}"
        )
    system_info = re.search(r"system_info:.*", probe.stdout + probe.stderr)
    if system_info is None:
        last_lines = (probe.stdout + probe.stderr).strip().splitlines()[-1:] or ["no message"]
        raise LocalLLMUnsupported(
            f"The local LLM's server ({server}) printed no system info: {last_lines[0]}"
        )
    return features_of(system_info.group(0))


def features_of(system_info: str) -> frozenset[str]:
    """`CPU : SSE3 = 1 | AVX2 = 1 | … | LLAMAFILE = 1 |` → the CPU features that are on."""
    return frozenset(
        name
        for name, value in re.findall(r"(\w+) = (\w+)", system_info)
        if name in CPU_FLAG_OF and value == "1"
    )


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    match = re.search(r"^flags\s*:(.*)$", text, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else frozenset()


def cpu_problem(*, needed: frozenset[str], flags: frozenset[str], machine: str) -> str:
    """Why a build needing `needed` cannot run on this CPU, or "" when it can."""
    if machine not in {"x86_64", "AMD64"}:
        return f"The local LLM is built for x86-64 CPUs; this one is {machine}. {REBUILD_HINT}"
    missing = sorted(name for name in needed if CPU_FLAG_OF[name] not in flags)
    if not missing:
        return ""
    return (
        f"This CPU lacks {', '.join(missing)}, which the installed local LLM was built for "
        f"(the portable build needs AVX2: Intel since 2013, AMD since 2015). {REBUILD_HINT}"
    )


def local_llm_check() -> None:
    """Raises LocalLLMUnsupported with a plain message when the local LLM cannot run here."""
    problem = cpu_problem(needed=build_features(), flags=cpu_flags(), machine=platform.machine())
    if problem:
        raise LocalLLMUnsupported(problem)
