from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from icrlhf.export.management.commands._output import lines_write, queue_named
from icrlhf.export.trajectories import (
    TRAJECTORY_FORMATS,
    TrajectoryFilters,
    trajectory_export_lines,
)


class Command(BaseCommand):
    help = "Export agent runs as canonical JSONL or a training format (openai, trl, pairs)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=TRAJECTORY_FORMATS, default="canonical")
        parser.add_argument("--out", default="-", help="A file, or - for standard output.")
        parser.add_argument("--queue", help="A queue's slug.")
        parser.add_argument("--outcome", default="", choices=["", "succeeded", "failed", "open"])
        parser.add_argument(
            "--anonymize",
            action="store_true",
            help="Drop the runs' keys and redact personal data from their text.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queue = queue_named(options["queue"])
        filters = TrajectoryFilters(
            queue=queue, outcome=options["outcome"], anonymize=options["anonymize"]
        )
        lines = trajectory_export_lines(fmt=options["format"], filters=filters, consumer="command")
        lines_write(lines, options["out"], self.stderr)
