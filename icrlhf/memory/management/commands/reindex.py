from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from icrlhf.memory.tasks import memory_reindex
from icrlhf.memory.through_worker import run_in_worker


class Command(BaseCommand):
    help = "Rebuild the vector store's collections from the database (same point ids)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", help="Only this queue's slug.")
        parser.add_argument("--timeout", type=float, default=3600.0)

    def handle(self, *args: Any, **options: Any) -> None:
        result = run_in_worker(
            memory_reindex, timeout_s=options["timeout"], queue_slug=options["queue"]
        )
        for slug, count in result["reindexed"].items():
            self.stdout.write(f"{slug}: {count} examples re-indexed")
