"""Does memory raise an agent's success? A support-desk agent, through the real stack.

The environment (bench/agent_env.py) is a small support desk that checks its goals itself:
refund the damaged order, escalate the lost one, tell the customer the late one's delivery
day. The agent calls the real gateway process with the `openai` client, in two forms: OpenAI
tool calling (the desk's four tools), and the icrl library's text actions (one prompt a step
with the goal and the latest observation; the action is the answer's text).

Memory grows by environment-verified trajectories (0, 10, 50, 200 by default): the desk's
own resolving actions, stored through the review flow's path (an item with the step's
conversation and tools, its action picked by a reviewer), as a support team would store what
worked. Each size is measured on the same held-out goals, and once more with the largest
memory but k stored steps drawn at random instead of the nearest: does retrieval matter, or
only having examples? Success rates come with Wilson 95% intervals.

With `--learning rewarded` (by default with the reviewed curve), a second memory grows from
rewards alone (issue 29, item 7): seeded with the smallest size's reviewed trajectories, then
each further trajectory is one of the agent's own episodes on the same training goals; the
desk's own success is POSTed to the feedback API (reward 1 or 0) and the queue's reward rule
stores the run's steps as preferred or rejected. No person decides anything.

With `--learning corrected` (by default too; issue 48, item 2), a third memory grows from
corrections, with no seed and no reviewer: the agent's own episodes on the same training
goals; a success is POSTed as the rewarded memory's are, a failure as a correction on the
call where the agent left the expert's way (reward 0, `corrected_action`: the desk's expert
action there), which stores the expert's action as that step's preferred example and the
agent's as its rejected rival.

It also measures the retrieval query (issue 28, item 4): for the held-out expert steps, how
often the nearest stored step took the same action, with the stored steps keyed and
searched by the last user message, by the goal and latest observation, or by the whole
conversation."""

from typing import Any

from django.core.management.base import CommandParser

from bench.world import (
    WorldCommand,
    add_llm_options,
    add_reflector_options,
    llm_endpoint,
    reflector_endpoint,
    world,
)


class Command(WorldCommand):
    help = "Measure an agent's success through the gateway as memory grows."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--held-out", type=int, default=30, help="Goals measured each time.")
        parser.add_argument("--sizes", default="0,10,50,200", help="Stored trajectories.")
        parser.add_argument("--variants", default="tools,text", help="tools, text or both.")
        parser.add_argument(
            "--learning",
            default="reviewed,rewarded,corrected",
            help="How memory grows: reviewed (expert runs a reviewer picked), rewarded (the "
            "agent's own runs, rewarded by the desk through the feedback API), corrected (the "
            "agent's own failures, corrected by the desk's expert action through the feedback "
            "API), or several.",
        )
        parser.add_argument("--k", type=int, default=3, help="Examples in each prompt.")
        parser.add_argument(
            "--framing",
            default="turns",
            choices=["turns", "reference"],
            help="How the text variant's examples are sent (tool steps are always turns).",
        )
        parser.add_argument("--max-tokens", type=int, default=60)
        parser.add_argument("--temperature", type=float, default=0.0)
        parser.add_argument("--concurrency", type=int, default=4, help="Episodes at once.")
        parser.add_argument("--seed", type=int, default=5)
        parser.add_argument(
            "--playbook-rounds",
            type=int,
            default=0,
            help="With --learning corrected, at its largest size: this many rounds of "
            "reflection on its runs (each approved without a person), then the held-out goals "
            "with the learned playbook, without memory with it, and with a control playbook "
            "learned from the runs shuffled.",
        )
        add_llm_options(parser)
        add_reflector_options(parser)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        import time

        options["variants"] = [v for v in options["variants"].split(",") if v]
        options["learning"] = [v for v in options["learning"].split(",") if v]
        started = time.monotonic()
        with (
            llm_endpoint(options) as llm,
            reflector_endpoint(options) as reflector,
            world("bench-agent", **llm, **reflector) as here,
        ):
            here.worker(concurrency=2)
            _, options["gateway_url"] = here.gateway()
            if {"rewarded", "corrected"} & set(options["learning"]):  # feedback: the web app
                _, options["web_url"] = here.web(workers=1)
            result = dict(here.inside("bench_agent", options))
        result["minutes"] = round((time.monotonic() - started) / 60, 1)
        return result

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        from bench.agent_run import measure

        return measure(options)

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        self.stdout.write(
            f"{result['held_out']} held-out goals, k={result['k']}, "
            f"at most {result['max_steps']} steps"
        )
        for variant, rows in result["variants"].items():
            self.stdout.write(f"\n{variant}:")
            for memory, row in rows.items():
                label = (
                    f"{memory:>3} trajectories" if memory != "random" else "random k of the most"
                )
                low, high = row["success_ci95"]
                self.stdout.write(
                    f"  {label}: success {row['success_rate']:.0%} [{low:.0%}–{high:.0%}], "
                    f"steps per success {row['steps_per_success']}, "
                    f"failed calls {row['failed_calls']}"
                )
        told = {
            "rewarded": "rewarded by the desk",
            "corrected": "failures corrected by the desk's expert action",
        }
        for arm, how in told.items():
            for variant, learnt in result[arm].items():
                self.stdout.write(
                    f"\n{variant}, memory from the agent's own episodes, {how} (seeded with "
                    f"{learnt['seeded_with']} reviewed runs):"
                )
                for size, row in learnt["curve"].items():
                    low, high = row["success_ci95"]
                    training = row["training"]
                    corrected = (
                        f", {training['corrected']} corrected" if "corrected" in training else ""
                    )
                    self.stdout.write(
                        f"  {size:>3} trajectories: success {row['success_rate']:.0%} "
                        f"[{low:.0%}–{high:.0%}]; own episodes {training['episodes']}, "
                        f"{training['succeeded']} succeeded{corrected}; steps stored "
                        f"preferred {row['preferred_steps']}, rejected {row['rejected_steps']}"
                    )
        for variant, learnt in result["corrected"].items():
            if "playbook" in learnt:
                self._playbook_report(variant, learnt["playbook"])
        self.stdout.write("\nRetrieval query (held-out expert steps, nearest stored step):")
        for how, row in result["retrieval_queries"].items():
            self.stdout.write(
                f"  {how}: right action top-1 {row['top1_right_action']:.0%}, "
                f"top-3 majority {row['top3_majority_right_action']:.0%}"
            )
        self.stdout.write(f"{result['minutes']} min")

    def _playbook_report(self, variant: str, playbook: dict[str, Any]) -> None:
        rounds = playbook["playbook_rounds"]
        self.stdout.write(
            f"\n{variant}, the playbook learned from the corrected runs in {len(rounds)} "
            f"rounds: {len(playbook['playbook_entries'])} rules"
        )
        for entry in playbook["playbook_entries"]:
            self.stdout.write(f"  - {entry}")
        for name, key in (
            ("with memory and the learned playbook", "with_playbook"),
            ("without memory, with the learned playbook", "playbook_alone"),
            ("with memory and the control playbook", "with_control_playbook"),
        ):
            row = playbook.get(key)
            if row is None:
                continue
            low, high = row["success_ci95"]
            self.stdout.write(f"  {name}: success {row['success_rate']:.0%} [{low:.0%}–{high:.0%}]")
