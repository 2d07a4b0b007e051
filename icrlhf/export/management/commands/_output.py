"""What both export commands share: the queue named on the command line, and writing the
lines to a file or to standard output."""

import sys
from collections.abc import Iterable
from pathlib import Path

from django.core.management.base import CommandError, OutputWrapper

from icrlhf.queues.models import Queue


def queue_named(slug: str | None) -> Queue | None:
    if not slug:
        return None
    queue = Queue.objects.filter(slug=slug).first()
    if queue is None:
        raise CommandError(f"No queue {slug!r}.")
    return queue


def lines_write(lines: Iterable[str], out: str, stderr: OutputWrapper) -> None:
    """To the file `out`, or to standard output for "-"; a file's line count goes to stderr."""
    if out == "-":
        for line in lines:
            sys.stdout.write(line)
        return
    path = Path(out)
    count = 0
    with path.open("w", encoding="utf-8") as stream:
        for line in lines:
            stream.write(line)
            count += 1
    stderr.write(f"{count} lines written to {path}")
