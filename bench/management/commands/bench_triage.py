"""Triage by the real local model (llama.cpp with LOCAL_LLM's model or --local-llm's),
through the real worker:

(a) the share of valid proposals (a category of the queue's and a priority) on the demo's
    tickets and on Banking77 tickets, the model held to the queue's schema (structured
    output; before it, none of the demo's 24 proposals was valid);
(b) category accuracy of the first proposal on held-out Banking77 tickets at 0, 150 and 600
    stored decisions. The stored decisions are recorded straight from the gold labels (a
    reviewer confirming the right category), not generated first: what is measured is what
    the memory of confirmed triages does for the next ticket.

Tickets are the Banking77 message as the body and its first five words as the subject, as
the demo seeds them."""

from typing import Any

from django.core.management.base import CommandParser

from bench.world import (
    WorldCommand,
    add_llm_options,
    add_reflector_options,
    inside_with_local_llm,
)


class Command(WorldCommand):
    help = "Measure the local model's triage: valid proposals, and accuracy as memory grows."

    def add_options(self, parser: CommandParser) -> None:
        parser.add_argument("--tickets", type=int, default=200, help="Banking77 tickets for (a).")
        parser.add_argument("--held-out", type=int, default=60, help="Tickets scored in (b).")
        parser.add_argument("--sizes", default="0,150,600", help="Stored decisions for (b).")
        parser.add_argument("--candidates", type=int, default=1, help="N per ticket in (a).")
        parser.add_argument("--seed", type=int, default=11)
        parser.add_argument(
            "--playbook-rounds",
            type=int,
            default=0,
            help="After the largest size: --playbook-tickets tickets triaged by the model and "
            "decided as a reviewer would, this many rounds of reflection on them (each "
            "approved without a person), then the held-out tickets with the learned "
            "playbook, without memory with it, and with a control learned from them shuffled.",
        )
        parser.add_argument(
            "--playbook-tickets", type=int, default=60, help="Tickets reviewed for reflection."
        )
        add_llm_options(parser)
        add_reflector_options(parser)

    def outside(self, options: dict[str, Any]) -> dict[str, Any]:
        return inside_with_local_llm("bench_triage", options)

    def measure(self, options: dict[str, Any]) -> dict[str, Any]:
        from bench.triage_run import measure

        return measure(options, sizes=sorted({int(s) for s in options["sizes"].split(",")}))

    def report(self, result: dict[str, Any], options: dict[str, Any]) -> None:
        for name in ("demo", "banking77"):
            part = result["valid"][name]
            self.stdout.write(
                f"Valid proposals, {name} ({part['tickets']} tickets, {part['proposals']} "
                f"proposals, {part['failed_calls']} calls failed): {part['valid_share']:.1%}"
            )
        for size, row in result["accuracy"].items():
            self.stdout.write(
                f"{size:>4} stored decisions: first proposal's category right on "
                f"{row['accuracy']:.1%} of {row['tickets']} held-out tickets "
                f"(valid {row['valid_share']:.0%})"
            )
        if result["playbook"]:
            self._playbook_report(result["playbook"])
        self.stdout.write(f"{result['minutes']} min")

    def _playbook_report(self, playbook: dict[str, Any]) -> None:
        reviewed = playbook["reviewed"]
        self.stdout.write(
            f"Reviewed for reflection: {reviewed['tickets']} tickets, the first proposal "
            f"right on {reviewed['first_right']}, corrected on {reviewed['corrected']}; "
            f"{len(playbook['playbook_rounds'])} rounds learned "
            f"{len(playbook['playbook_entries'])} rules:"
        )
        for entry in playbook["playbook_entries"]:
            self.stdout.write(f"  - {entry}")
        for name, key in (
            ("with memory, no playbook", "examples_only"),
            ("with memory and the learned playbook", "with_playbook"),
            ("without memory, with the learned playbook", "playbook_alone"),
            ("with memory and the control playbook", "with_control_playbook"),
        ):
            row = playbook.get(key)
            if row is not None:
                low, high = row["accuracy_ci95"]
                self.stdout.write(
                    f"  {name}: category right {row['accuracy']:.1%} [{low:.0%}–{high:.0%}] "
                    f"of {row['tickets']}"
                )
