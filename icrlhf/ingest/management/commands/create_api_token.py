from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.ingest.models import DEFAULT_SCOPES, Scope
from icrlhf.ingest.services import token_create
from icrlhf.queues.models import Queue


class Command(BaseCommand):
    help = "Create an API token for one queue; the token is printed once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--queue", required=True, help="The queue's slug.")
        parser.add_argument("--name", required=True, help="Who uses it.")
        parser.add_argument(
            "--scope",
            action="append",
            choices=Scope.values,
            help=f"What it may call; repeat for several (default: {', '.join(DEFAULT_SCOPES)}).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        queue = Queue.objects.filter(slug=options["queue"]).first()
        if queue is None:
            raise CommandError(f"No queue {options['queue']!r}.")
        _record, token = token_create(
            queue=queue, name=options["name"], scopes=options["scope"] or None
        )
        self.stdout.write(token)
