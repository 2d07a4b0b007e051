from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from icrlhf.ops.demo import (
    banking77_missing,
    demo_login_ensure,
    demo_queue_ensure,
    demo_triage_queue_ensure,
)


class Command(BaseCommand):
    help = "Create the demo login and the demo queue with a few Banking77 items (once)."

    def handle(self, *args: Any, **options: Any) -> None:
        login = demo_login_ensure()
        queue, created = demo_queue_ensure(data_dir=settings.SHARED_DATA_DIR)
        self.stdout.write(f"Demo login {login.username}; queue {queue.slug}: {created} new items")
        triage, tickets = demo_triage_queue_ensure(data_dir=settings.SHARED_DATA_DIR)
        if triage is not None:
            self.stdout.write(f"Triage queue {triage.slug}: {tickets} new tickets")
        if missing := banking77_missing(settings.SHARED_DATA_DIR):
            self.stderr.write(self.style.WARNING(missing))
