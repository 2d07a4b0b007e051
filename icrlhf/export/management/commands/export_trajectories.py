import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.export.trajectories import (
    TRAJECTORY_FORMATS,
    TrajectoryFilters,
    trajectory_export_lines,
)
from icrlhf.queues.models import Queue


class Command(BaseCommand):
    help = "Export agent runs as canonical JSONL or a training format (openai, trl, pairs)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=TRAJECTORY_FORMATS, default="canonical")
        parser.add_argument("--out", default="-", help="A file, or - for standard output.")
        parser.add_argument("--queue", help="A queue's slug.")
        parser.add_argument("--outcome", default="", choices=["", "succeeded", "failed", "open"])

    def handle(self, *args: Any, **options: Any) -> None:
        queue = None
        if options["queue"]:
            queue = Queue.objects.filter(slug=options["queue"]).first()
            if queue is None:
                raise CommandError(f"No queue {options['queue']!r}.")
        filters = TrajectoryFilters(queue=queue, outcome=options["outcome"])
        lines = trajectory_export_lines(fmt=options["format"], filters=filters, consumer="command")
        if options["out"] == "-":
            for line in lines:
                sys.stdout.write(line)
            return
        path = Path(options["out"])
        count = 0
        with path.open("w", encoding="utf-8") as out:
            for line in lines:
                out.write(line)
                count += 1
        self.stderr.write(f"{count} lines written to {path}")
