"""The fault suite: the real loop under injected faults, with a table of what was lost.

Builds a throw-away world (SQLite file, Qdrant local folder, a private Valkey broker on a free
port) and runs the scenarios of bench.chaos in a child process configured for it: short
LLM timeout, sweepers every second. Prints, per fault: runs, decisions made, decisions lost,
items stuck, candidates stuck, examples not indexed, the most attempts any candidate took,
gateway calls answered and answered calls lost from the call log."""

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from bench.chaos import SCENARIOS
from bench.world import WorldCommand, world
from icrlhf.ops.stack import free_port

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
    ("calls_answered", "calls answered"),
    ("calls_lost", "calls lost"),
)
_TOTALS = (
    "decisions_made",
    "decisions_lost",
    "items_stuck",
    "candidates_stuck",
    "examples_unindexed",
    "calls_answered",
    "calls_lost",
)


class Command(WorldCommand):
    help = (
        "Inject faults into the real loop (worker, broker, gateway, vector store, LLM); "
        "print a table."
    )

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--only", default=",".join(SCENARIOS), help="Comma-separated scenario names."
        )
        parser.add_argument("--runs", type=int, default=1, help="Runs of each scenario.")
        parser.add_argument("--out", default=str(settings.VAR_DIR / "chaos"))

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        names = [name for name in options["only"].split(",") if name]
        unknown = sorted(set(names) - set(SCENARIOS))
        if unknown:
            raise CommandError(
                f"Unknown scenario: {', '.join(unknown)}. Known: {', '.join(SCENARIOS)}"
            )
        # A private broker on a free port: the scenarios kill and restart it.
        broker_url = f"redis://127.0.0.1:{free_port()}/0"
        with world("chaos", BROKER_URL=broker_url, **_WORLD) as here:
            outcomes = here.inside("chaos", {**options, "names": names})
        totals = {key: sum(o[key] for o in outcomes) for key in _TOTALS}
        result = {**totals, "faults": outcomes}
        out = Path(options["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "chaos.json").write_text(json.dumps(result, indent=2, sort_keys=True))
        return result

    def measure(self, options: dict[str, Any]) -> list[dict[str, Any]]:
        from dataclasses import asdict

        from bench.chaos import run

        return [asdict(o) for o in run(settings.VAR_DIR, options["names"], options["runs"])]

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        outcomes = result["faults"]
        width = max(len(o["fault"]) for o in outcomes)
        header = f"{'fault':<{width}} | " + " | ".join(title for _, title in _COLUMNS)
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for outcome in outcomes:
            cells = [f"{outcome[key]:>{len(title)}}" for key, title in _COLUMNS]
            self.stdout.write(f"{outcome['fault']:<{width}} | " + " | ".join(cells))
            for note in outcome["notes"]:
                self.stdout.write(f"  note: {note}")
        self.stdout.write(
            f"Total: {result['decisions_made']} decisions made, {result['decisions_lost']} lost, "
            f"{result['items_stuck']} items stuck, {result['candidates_stuck']} candidates stuck, "
            f"{result['examples_unindexed']} examples not indexed, "
            f"{result['calls_answered']} gateway calls answered, {result['calls_lost']} lost"
        )
        self.stdout.write(f"Table as JSON: {Path(options['out']) / 'chaos.json'}")
