"""`make run`'s process manager: supervisord restarts a part that dies, and the terminal says
which part, how it ended and the last lines of its log; a crash loop is stopped for good while
the other parts carry on."""

import io
import sys
from pathlib import Path

import pytest

from icrlhf.ops.supervision import MAX_CRASHES, Part, Supervisor
from tests.support.waiting import wait_for

# supervisord and the parts it keeps alive are real processes, restarted for real.
pytestmark = pytest.mark.integration


def supervisor_in(folder: Path, said: list[str]) -> Supervisor:
    return Supervisor(run_dir=folder / "run", log_dir=folder / "log", say=said.append)


def test_a_part_that_keeps_dying_is_reported_and_stopped_while_the_others_run(
    tmp_path: Path,
) -> None:
    said: list[str] = []
    supervisor = supervisor_in(tmp_path, said)
    crash = "print('disk full', flush=True); import time; time.sleep(0.3); raise SystemExit(3)"
    supervisor.add(Part("flaky", [sys.executable, "-c", crash], start_s=0))
    supervisor.add(Part("steady", [sys.executable, "-c", "import time; time.sleep(600)"]))
    supervisor.start()
    try:
        wait_for(lambda: supervisor.ended("flaky"), timeout_s=60, what="the crash loop's end")
        text = "\n".join(said)
        assert text.count("flaky ended (exit status 3)") == MAX_CRASHES
        assert "    | disk full" in text  # the last lines of its log
        assert f"flaky: ended {MAX_CRASHES} times in 10 minutes; stopped for good" in text
        wait_for(lambda: "STOPPED" in supervisor.control("status", "flaky"), what="flaky stopped")
        assert "RUNNING" in supervisor.control("status", "steady")
        assert not supervisor.ended("steady")
    finally:
        supervisor.stop()
    assert not supervisor.running()


def test_a_signal_a_restart_and_a_give_up_read_as_sentences(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = supervisor_in(tmp_path, said)
    supervisor.log_dir.mkdir(parents=True)
    supervisor.log_of("llm").write_text("loading model\nSegmentation fault\n")
    supervisord_log = io.StringIO(
        "2026-11-22 15:00:00,000 INFO exited: llm (terminated by SIGSEGV (core dumped); "
        "not expected)\n"
        "2026-11-22 15:00:01,000 INFO spawned: 'llm' with pid 4242\n"
        "2026-11-22 15:00:06,000 INFO success: llm entered RUNNING state, process has stayed "
        "up for > than 5 seconds (startsecs)\n"
        "2026-11-22 15:00:07,000 INFO spawned: 'web' with pid 4243\n"
        "2026-11-22 15:00:09,000 INFO gave up: worker entered FATAL state, too many start "
        "retries too quickly\n"
    )
    supervisor._relay_lines(supervisord_log)
    text = "\n".join(said)
    assert "llm ended (terminated by SIGSEGV (core dumped))" in text
    assert "    | Segmentation fault" in text
    assert "llm: restarting (pid 4242)" in text and "llm: running again" in text
    assert "web" not in text  # a first start is not news
    assert "worker: gave up after 5 failed starts; the rest of the stack carries on" in text
    assert supervisor.ended("worker") and not supervisor.ended("llm")


def test_percent_signs_survive_supervisord_s_config(tmp_path: Path) -> None:
    supervisor = supervisor_in(tmp_path, [])
    supervisor.add(Part("web", ["run", "--format", "%(message)s"], environment={"A": "50%"}))
    config = supervisor.config_text()
    assert "command = run --format '%%(message)s'" in config
    assert 'environment = A="50%%"' in config
