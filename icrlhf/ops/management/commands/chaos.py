"""The fault suite: the real loop under injected faults, with a table of what was lost.

Builds a throw-away world (SQLite file, Qdrant local folder, a private Valkey broker on a free
port) and runs the scenarios of icrlhf.ops.chaos in a child process configured for it: short
LLM timeout, sweepers every second. Prints, per fault: runs, decisions made, decisions lost,
items stuck, candidates stuck, examples not indexed, the most attempts any candidate took."""

import json
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ops.benchworld import manage_run, world_database, world_env, world_migrate
from icrlhf.ops.chaos import SCENARIOS
from icrlhf.ops.stack import free_port, port_open

# The world's settings: faults show within seconds instead of minutes.
_WORLD = {
    "LLM_MODEL": "openai/chaos",
    "LLM_TIMEOUT_S": "2",
    "LLM_MAX_RETRIES": "2",
    "GENERATION_SWEEP_INTERVAL_S": "1",
    "GENERATION_LOST_AFTER_S": "5",
    "MEMORY_SWEEP_INTERVAL_S": "1",
    "LOG_LEVEL": "WARNING",
}
_COLUMNS = (
    ("runs", "runs"),
    ("decisions_made", "decisions made"),
    ("decisions_lost", "decisions lost"),
    ("items_stuck", "items stuck"),
    ("candidates_stuck", "candidates stuck"),
    ("examples_unindexed", "examples unindexed"),
    ("max_attempts", "max attempts"),
)


class Command(BaseCommand):
    help = "Inject faults into the real loop (worker, broker, vector store, LLM); print a table."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--only", default=",".join(SCENARIOS), help="Comma-separated scenario names."
        )
        parser.add_argument("--runs", type=int, default=1, help="Runs of each scenario.")
        parser.add_argument("--out", default=str(settings.VAR_DIR / "chaos"))
        parser.add_argument("--json", action="store_true", help="End with one JSON line.")
        parser.add_argument("--inner", action="store_true", help="(internal)")
        parser.add_argument("--result-file", default="", help="(internal)")

    def handle(self, *args: Any, **options: Any) -> None:
        names = [name for name in options["only"].split(",") if name]
        unknown = sorted(set(names) - set(SCENARIOS))
        if unknown:
            raise CommandError(
                f"Unknown scenario: {', '.join(unknown)}. Known: {', '.join(SCENARIOS)}"
            )
        if options["inner"]:
            from icrlhf.ops.chaos import run

            result_file = Path(options["result_file"])
            outcomes = run(result_file.parent, names, options["runs"])
            result_file.write_text(json.dumps([asdict(o) for o in outcomes]))
            return
        with (
            tempfile.TemporaryDirectory(prefix="icrlhf-chaos-") as folder,
            world_database(Path(folder)) as database_url,
        ):
            tmp = Path(folder)
            port = free_port()
            if port_open("127.0.0.1", port):
                raise CommandError("No free port for the private broker.")
            env = world_env(
                tmp, database_url=database_url, BROKER_URL=f"redis://127.0.0.1:{port}/0", **_WORLD
            )
            world_migrate(env)
            result_file = tmp / "result.json"
            manage_run(
                env,
                "chaos",
                "--inner",
                f"--result-file={result_file}",
                f"--only={','.join(names)}",
                f"--runs={options['runs']}",
            )
            outcomes = json.loads(result_file.read_text())
        self.report(outcomes, Path(options["out"]), as_json=options["json"])

    def report(self, outcomes: list[dict[str, Any]], out: Path, *, as_json: bool) -> None:
        width = max(len(o["fault"]) for o in outcomes)
        header = f"{'fault':<{width}} | " + " | ".join(title for _, title in _COLUMNS)
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for outcome in outcomes:
            cells = [f"{outcome[key]:>{len(title)}}" for key, title in _COLUMNS]
            self.stdout.write(f"{outcome['fault']:<{width}} | " + " | ".join(cells))
            for note in outcome["notes"]:
                self.stdout.write(f"  note: {note}")
        totals = {
            key: sum(o[key] for o in outcomes)
            for key in (
                "decisions_made",
                "decisions_lost",
                "items_stuck",
                "candidates_stuck",
                "examples_unindexed",
            )
        }
        self.stdout.write(
            f"Total: {totals['decisions_made']} decisions made, {totals['decisions_lost']} lost, "
            f"{totals['items_stuck']} items stuck, {totals['candidates_stuck']} candidates stuck, "
            f"{totals['examples_unindexed']} examples not indexed"
        )
        result = {**totals, "faults": outcomes}
        out.mkdir(parents=True, exist_ok=True)
        (out / "chaos.json").write_text(json.dumps(result, indent=2, sort_keys=True))
        self.stdout.write(f"Table as JSON: {out / 'chaos.json'}")
        if as_json:
            self.stdout.write(json.dumps(result, sort_keys=True))
