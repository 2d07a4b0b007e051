from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ingest.importing import ImportFileError, tickets_import
from icrlhf.queues.models import Queue


class Command(BaseCommand):
    help = "Import tickets from a .csv or .jsonl file: good rows in, bad rows reported."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", type=Path)
        parser.add_argument("--queue", required=True, help="The queue's slug.")

    def handle(self, *args: Any, **options: Any) -> None:
        queue = Queue.objects.filter(slug=options["queue"]).first()
        if queue is None:
            raise CommandError(f"No queue {options['queue']!r}.")
        path: Path = options["path"]
        if not path.is_file():
            raise CommandError(f"No file {path}.")
        try:
            report = tickets_import(queue=queue, data=path.read_bytes(), filename=path.name)
        except ImportFileError as error:
            raise CommandError(str(error)) from error
        self.stdout.write(
            f"{report.rows} rows: {report.created} imported, {report.existing} already there, "
            f"{len(report.problems)} refused"
        )
        for problem in report.problems:
            self.stdout.write(f"  row {problem.row}: {problem.message}")
        if report.problems:
            raise SystemExit(1)
