"""Ticket import from CSV or JSON Lines: every good row imported, every bad row reported.

Each row is created in its own transaction, so a row is either wholly in or wholly out."""

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from pydantic import ValidationError as SchemaError

from icrlhf.ingest.schemas import TicketIn
from icrlhf.queues.models import Item, Queue
from icrlhf.triage.services import ticket_create

MAX_ROWS = 10_000
MAX_BYTES = 10 * 1024 * 1024
REQUIRED_COLUMNS = ("subject", "body")


class ImportFileError(ValueError):
    """The file as a whole cannot be read; nothing was imported."""


@dataclass(frozen=True)
class RowProblem:
    row: int
    message: str


@dataclass
class ImportReport:
    created: int = 0
    existing: int = 0
    problems: list[RowProblem] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return self.created + self.existing + len(self.problems)


def _rows(data: bytes, filename: str) -> list[tuple[int, Any]]:
    if len(data) > MAX_BYTES:
        raise ImportFileError(f"The file is larger than {MAX_BYTES // (1024 * 1024)} MB.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ImportFileError("The file is not UTF-8 text; save it as UTF-8 and retry.") from error
    name = filename.lower()
    rows: list[tuple[int, Any]]
    if name.endswith(".csv"):
        reader = csv.DictReader(io.StringIO(text, newline=""))
        columns = [c.strip().lower() for c in reader.fieldnames or []]
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise ImportFileError(
                f"The CSV has no {' or '.join(missing)} column (its header row: "
                f"{', '.join(columns) or 'empty'})."
            )
        try:
            rows = [
                (number, {(k or "").strip().lower(): v for k, v in row.items()})
                for number, row in enumerate(reader, start=2)
            ]
        except csv.Error as error:
            raise ImportFileError(f"The CSV is malformed: {error}.") from error
    elif name.endswith((".jsonl", ".ndjson")):
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as error:
                rows.append((number, error))
            except RecursionError:  # nested deeper than the parser goes: a row, not a crash
                rows.append((number, json.JSONDecodeError("nested too deeply", line, 0)))
    else:
        raise ImportFileError("Upload a .csv or a .jsonl file.")
    if not rows:
        raise ImportFileError("The file has no tickets in it.")
    if len(rows) > MAX_ROWS:
        raise ImportFileError(f"The file has {len(rows):,} rows; the limit is {MAX_ROWS:,}.")
    return rows


def _row_problem(error: SchemaError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in error.errors()
    )


def tickets_import(*, queue: Queue, data: bytes, filename: str) -> ImportReport:
    report = ImportReport()
    for number, row in _rows(data, filename):
        if isinstance(row, json.JSONDecodeError):
            report.problems.append(RowProblem(number, f"not valid JSON ({row.msg})"))
            continue
        if not isinstance(row, dict):
            report.problems.append(RowProblem(number, "not a JSON object"))
            continue
        # Empty CSV cells mean "not given": let the defaults apply.
        values = {k: v for k, v in row.items() if k and v not in ("", None)}
        try:
            ticket = TicketIn.model_validate(values)
            item, created = ticket_create(queue=queue, source=Item.Source.IMPORT, **ticket.dict())
        except SchemaError as error:
            report.problems.append(RowProblem(number, _row_problem(error)))
            continue
        except ValidationError as error:
            report.problems.append(RowProblem(number, " ".join(error.messages)))
            continue
        if created:
            report.created += 1
        else:
            report.existing += 1
    return report
