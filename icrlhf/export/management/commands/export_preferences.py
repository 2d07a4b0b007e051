from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.dateparse import parse_datetime

from icrlhf.export.formats import FORMATS
from icrlhf.export.management.commands._output import lines_write, queue_named
from icrlhf.export.selectors import ExportFilters
from icrlhf.export.services import export_lines
from icrlhf.review.models import Decision


def _when(value: str | None, name: str) -> datetime | None:
    if not value:
        return None
    parsed = parse_datetime(value if "T" in value else f"{value}T00:00:00+00:00")
    if parsed is None or parsed.tzinfo is None:
        raise CommandError(f"--{name} takes an ISO date or a date-time with a time zone.")
    return parsed


class Command(BaseCommand):
    help = "Export decisions as canonical JSONL or a training format (trl, openai, kto)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--format", choices=FORMATS, default="canonical")
        parser.add_argument("--out", default="-", help="A file, or - for standard output.")
        parser.add_argument("--queue", help="A queue's slug.")
        parser.add_argument("--from", dest="decided_from", help="Decided on or after (ISO).")
        parser.add_argument("--to", dest="decided_to", help="Decided before (ISO).")
        parser.add_argument("--reviewer", default="", help="A reviewer's username.")
        parser.add_argument("--verdict", default="", choices=["", *Decision.Verdict.values])
        parser.add_argument(
            "--since-last-export",
            action="store_true",
            help="Only what was decided after this command's previous export (same queue).",
        )
        parser.add_argument(
            "--anonymize",
            action="store_true",
            help="Drop reviewer and customer names and redact personal data from the text.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queue = queue_named(options["queue"])
        filters = ExportFilters(
            queue=queue,
            decided_from=_when(options["decided_from"], "from"),
            decided_to=_when(options["decided_to"], "to"),
            reviewer=options["reviewer"],
            verdict=options["verdict"],
            since_last_export=options["since_last_export"],
            anonymize=options["anonymize"],
        )
        lines = export_lines(fmt=options["format"], filters=filters, consumer="command")
        lines_write(lines, options["out"], self.stderr)
