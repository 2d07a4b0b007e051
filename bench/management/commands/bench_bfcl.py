"""Do examples teach a model to call tools it was never shown a call of? Public data, through
the real stack.

The Berkeley Function Calling Leaderboard's categories simple_python, multiple and parallel
(bench/bfcl.py; never its live_* ones, which the project holds back): almost every entry has
a tool set of its own, so a stored call is almost never of the tools a new request offers.
Memory holds gold calls of other entries (the possible answer's first value for each
parameter), stored through the review flow's path as a reviewer's pick; the held-out entries
are asked through the real gateway process with the `openai` client, as an application would,
and checked with an equivalent of BFCL's AST checker.

Arms: empty memory; at each stored size, the queue's examples of the same tool set only
(format examples off, what memory offered before) and with format examples (the nearest tool
calls of other tool sets fill the places left). Exact-call accuracy and the share of answers
with any tool call, each with a Wilson 95% interval.

Needs BFCL's data: `.venv/bin/pip install --no-deps bfcl-eval==2026.3.23` (its own
dependencies, torch among them, are not needed: only its data files are read)."""

import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from bench.bfcl import CATEGORIES
from bench.world import WorldCommand, add_llm_options, llm_endpoint, world


class Command(WorldCommand):
    help = "Measure tool-call accuracy on BFCL through the gateway as memory grows."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--stored", default="0,50,200", help="Stored gold calls.")
        parser.add_argument("--held-out", type=int, default=60, help="Entries asked each time.")
        parser.add_argument(
            "--categories",
            default=",".join(CATEGORIES),
            help=f"BFCL categories, among {', '.join(CATEGORIES)}.",
        )
        parser.add_argument("--k", type=int, default=3, help="Examples in each prompt.")
        parser.add_argument(
            "--token-budget", type=int, default=1200, help="The queue's example token budget."
        )
        parser.add_argument("--max-tokens", type=int, default=120)
        parser.add_argument("--temperature", type=float, default=0.0)
        parser.add_argument("--concurrency", type=int, default=2, help="Calls at once.")
        parser.add_argument(
            "--llm-threads",
            type=int,
            default=0,
            help="The local LLM's threads (default: the stack's). On a machine busy with other "
            "work, 1 thread decodes several times faster than 2 that wait for each other.",
        )
        parser.add_argument(
            "--llm-timeout",
            type=float,
            default=300.0,
            help="LLM_TIMEOUT_S in the world (s): accuracy is measured here, not latency.",
        )
        parser.add_argument("--seed", type=int, default=7)
        add_llm_options(parser)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        options["categories"] = [c for c in options["categories"].split(",") if c]
        unknown = set(options["categories"]) - set(CATEGORIES)
        if unknown:
            raise CommandError(
                f"Unknown or held-back categories: {', '.join(sorted(unknown))}; "
                f"use {', '.join(CATEGORIES)}."
            )
        try:
            import bfcl_eval  # noqa: F401 (its data files only)
        except ImportError as missing:
            raise CommandError(
                "BFCL's data is not installed: run `make install-test` (it installs bfcl-eval)."
            ) from missing
        started = time.monotonic()
        with (
            llm_endpoint(
                options, slots=options["concurrency"], threads=options["llm_threads"] or None
            ) as llm,
            world("bench-bfcl", **llm, LLM_TIMEOUT_S=str(options["llm_timeout"])) as here,
        ):
            here.worker(concurrency=2)
            _, options["gateway_url"] = here.gateway()
            result = dict(here.inside("bench_bfcl", options))
        result["minutes"] = round((time.monotonic() - started) / 60, 1)
        return result

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        from bench.bfcl import measure

        return measure(options)

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        self.stdout.write(
            f"BFCL {', '.join(result['categories'])}: {result['held_out']} held-out entries, "
            f"k={result['k']}"
        )
        for arm, row in result["arms"].items():
            low, high = row["accuracy_ci95"]
            called_low, called_high = row["any_call_ci95"]
            self.stdout.write(
                f"  {arm:>20}: exact call {row['accuracy']:.1%} [{low:.1%}–{high:.1%}], "
                f"any tool call {row['any_call']:.1%} [{called_low:.1%}–{called_high:.1%}], "
                f"foreign calls {row['foreign_calls']}, failed calls {row['failed_calls']} "
                f"({row['lost_to_deadline']} lost to the deadline, {row['refused_too_busy']} "
                "refused at once, the model too busy)"
            )
            self.stdout.write(f"{'':>24}{_time_line(row['time'])}")
        self.stdout.write(f"{result['minutes']} min")


def _time_line(spent: dict[str, Any]) -> str:
    """Where the calls' time went, p50/p95 in ms (– where the model's server reports none)."""

    def pair(name: str) -> str:
        low, high = spent[name]["p50"], spent[name]["p95"]
        return "–" if low is None else f"{low:.0f}/{high:.0f}"

    return (
        f"p50/p95 ms: call {pair('total_ms')}, waited {pair('waited_ms')}, "
        f"prompt read {pair('model_prompt_ms')} ({pair('prompt_tokens')} tokens, "
        f"{pair('cached_prompt_tokens')} cached), answer {pair('model_generation_ms')}; "
        f"asked twice {spent['asked_twice']}"
    )
