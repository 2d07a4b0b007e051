"""Does memory raise an agent's success in an environment this project did not write?
bench_agent's harness on ScienceWorld (the `scienceworld` package: Allen AI's text simulator of
an elementary science curriculum, run by its own Java process), through the real stack.

The simulator scores each episode itself (0–100, success at 100) and carries a gold action
sequence for each task variation. The agent calls the real gateway process with the `openai`
client, in bench_agent's two forms: text actions (one prompt a step with the task, the latest
actions and the observation; the action is the answer's text, as ScienceWorld's own agents
write it) and tool calling (one `act` tool whose argument is the action).

Memory grows by gold trajectories of the training and development variations (0, 10, 50, 200
by default), each replayed in the simulator (only a replay that succeeds is stored) and stored
step by step through the review flow's path, as bench_agent stores its desk's expert runs.
Each size is measured on the same held-out test variations, and once more with the largest
memory but k stored steps drawn at random instead of the nearest. Success rates come with
Wilson 95% intervals, mean scores with bootstrap ones; how many actions the simulator could
parse shows where a model cannot act at all.

Needs Java (`java` on the PATH: Debian's default-jre-headless)."""

from typing import Any

from django.core.management.base import CommandParser

from bench.world import WorldCommand, add_llm_options, llm_endpoint, world


class Command(WorldCommand):
    help = "Measure an agent's success in ScienceWorld through the gateway as memory grows."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--tasks",
            default="find-non-living-thing",
            help="ScienceWorld task names, comma-separated (their variations are interleaved).",
        )
        parser.add_argument(
            "--held-out", type=int, default=20, help="Test variations measured each time."
        )
        parser.add_argument("--sizes", default="0,10,50,200", help="Stored gold trajectories.")
        parser.add_argument("--variants", default="text,tools", help="text, tools or both.")
        parser.add_argument("--k", type=int, default=3, help="Examples in each prompt.")
        parser.add_argument(
            "--max-steps", type=int, default=12, help="Actions an episode may take."
        )
        parser.add_argument(
            "--framing",
            default="turns",
            choices=["turns", "reference"],
            help="How the text variant's examples are sent (tool steps are always turns).",
        )
        parser.add_argument("--max-tokens", type=int, default=30)
        parser.add_argument("--temperature", type=float, default=0.0)
        parser.add_argument(
            "--concurrency", type=int, default=2, help="Episodes (and simulators) at once."
        )
        parser.add_argument("--seed", type=int, default=5)
        add_llm_options(parser)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        import time

        started = time.monotonic()
        with llm_endpoint(options) as llm, world("bench-scienceworld", **llm) as here:
            here.worker(concurrency=2)
            _, options["gateway_url"] = here.gateway()
            result = dict(here.inside("bench_scienceworld", options))
        result["minutes"] = round((time.monotonic() - started) / 60, 1)
        return result

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        from bench.scienceworld_run import measure

        return measure(options)

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        gold = result["gold"]
        self.stdout.write(
            f"ScienceWorld {', '.join(result['tasks'])} ({result['simplifications']}): "
            f"{result['held_out']} held-out variations, k={result['k']}, at most "
            f"{result['max_steps']} actions; gold replays {gold['succeeded']}/{gold['replayed']} "
            f"succeeded ({gold['steps_per_trajectory']} steps each)"
        )
        for variant, rows in result["variants"].items():
            self.stdout.write(f"\n{variant}:")
            for memory, row in rows.items():
                label = (
                    f"{memory:>3} trajectories" if memory != "random" else "random k of the most"
                )
                low, high = row["success_ci95"]
                score_low, score_high = row["score_ci95"]
                understood = row["understood_share"]
                self.stdout.write(
                    f"  {label}: success {row['success_rate']:.0%} [{low:.0%}–{high:.0%}], "
                    f"score {row['mean_score']} [{score_low}–{score_high}], "
                    f"actions parsed {'–' if understood is None else f'{understood:.0%}'}, "
                    f"episodes without an action {row['episodes_without_an_action']}, "
                    f"failed calls {row['failed_calls']}"
                )
        self.stdout.write(f"{result['minutes']} min")
