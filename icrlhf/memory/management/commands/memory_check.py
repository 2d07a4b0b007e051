import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from icrlhf.memory.tasks import memory_check
from icrlhf.memory.through_worker import run_in_worker


class Command(BaseCommand):
    help = "Compare the database's examples with the vector store; exit 1 on drift."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", help="Only this queue's slug.")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--timeout", type=float, default=120.0)

    def handle(self, *args: Any, **options: Any) -> None:
        report = run_in_worker(
            memory_check, timeout_s=options["timeout"], queue_slug=options["queue"]
        )
        if options["json"]:
            self.stdout.write(json.dumps(report, sort_keys=True))
        else:
            self.stdout.write(f"Embedding model: {report['embedding_model']}")
            for slug, queue in report["queues"].items():
                self.stdout.write(
                    f"{slug}: {queue['examples']} examples, {queue['points']} points, "
                    f"{queue['missing_in_store']} missing in the store, "
                    f"{queue['orphan_points']} orphan points, "
                    f"{queue['other_embedding_model']} from another embedding model"
                )
                for kind, ids in queue["samples"].items():
                    if ids:
                        self.stdout.write(f"  {kind}: {', '.join(ids)}")
            self.stdout.write("Drift found." if report["drift"] else "No drift.")
        if report["drift"]:
            raise SystemExit(1)
