"""The call log's writer as a process of its own (CALL_LOG_WRITER=process, the default): it
writes the rows the gateway's processes hand over through the journal, until it is stopped."""

import signal
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from icrlhf.gateway import call_log
from icrlhf.integrations import journal


class Command(BaseCommand):
    help = (
        "Write the gateway's call log from its journal until stopped (SIGTERM or Ctrl-C); "
        "what is waiting then is written before it ends. make run and docker-compose start it."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        if not journal.available():
            raise CommandError(
                "The cache is not Redis, so there is no journal: each gateway process writes its "
                "call log in place. Set CACHE_URL to the broker's Redis."
            )
        stopped = threading.Event()
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda *_: stopped.set())
        writer = call_log.writer()
        writer.start()
        self.stdout.write("Writing the gateway's call log (SIGTERM or Ctrl-C stops).")
        while not stopped.wait(1.0):  # a timed wait: the signal's handler runs between waits
            pass
        writer.stop()  # writes what is left, while holding the journal's lock
        self.stdout.write("Stopped.")
