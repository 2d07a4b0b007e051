"""The call log's dead letters (rows the database kept refusing): list them, write them again
once their cause is fixed, or drop them."""

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from icrlhf.gateway import call_log
from icrlhf.integrations import journal


class Command(BaseCommand):
    help = (
        "List the call log's dead letters (calls answered whose row the database kept "
        "refusing); --retry writes them again, --discard drops them."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--retry",
            action="store_true",
            help="Write each again; those written leave, the others stay with their new error.",
        )
        action.add_argument("--discard", action="store_true", help="Drop them all.")
        parser.add_argument(
            "--json", action="store_true", help="Print one JSON object instead, as last line."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if call_log.journal_state().state == "none":
            said = "No journal (the cache is not Redis: rows are written in place), no dead letter."
            self._out(options, {"journal": "none"}, said)
            return
        try:
            if options["retry"]:
                self._retry(options)
            elif options["discard"]:
                discarded = call_log.dead_letters_discard()
                self._out(options, {"discarded": discarded}, f"{discarded} dead letters discarded.")
            else:
                self._list(options)
        except journal.JournalUnavailable as error:
            raise CommandError(str(error)) from error

    def _retry(self, options: dict[str, Any]) -> None:
        retried = call_log.dead_letters_retry()
        left = call_log.dead_letters()
        said = (
            f"{retried.written} written, {retried.kept} failed again (kept, with their error), "
            f"{retried.expired} too old to keep (dropped unwritten)."
        )
        if not options["json"]:
            self._lines(left)
        self._out(options, {**asdict(retried), "dead_letters": _listed(left)}, said)

    def _list(self, options: dict[str, Any]) -> None:
        letters = call_log.dead_letters()
        if not options["json"]:
            self._lines(letters)
        self._out(
            options,
            {"count": len(letters), "dead_letters": _listed(letters)},
            f"{len(letters)} dead letters.",
        )

    def _lines(self, letters: list[call_log.DeadLetter]) -> None:
        for letter in letters:
            queue = letter.queue or f"#{letter.queue_id} (deleted)"
            self.stdout.write(
                f"{letter.call_id}  queue {queue}"
                f"  answered {letter.answered_at.isoformat(timespec='seconds')}"
                f"  tries {letter.tries}  {letter.error}"
            )

    def _out(self, options: dict[str, Any], report: dict[str, Any], said: str) -> None:
        self.stdout.write(json.dumps(report, sort_keys=True) if options["json"] else said)


def _listed(letters: list[call_log.DeadLetter]) -> list[dict[str, Any]]:
    return [
        {
            **asdict(letter),
            "answered_at": letter.answered_at.isoformat(),
            "failed_at": letter.failed_at.isoformat(),
        }
        for letter in letters
    ]
