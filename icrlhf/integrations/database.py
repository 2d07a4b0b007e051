"""The relational database, beyond what Django's ORM says: how the pipeline commits, one
statement for many rows' updates, and rows that other processes may keep in memory."""

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Field, Model, QuerySet

from icrlhf.integrations import counters

logger = logging.getLogger(__name__)


@contextmanager
def asynchronous_commits() -> Iterator[None]:
    """Commit without waiting for the write-ahead log to reach the disk, on PostgreSQL, while
    the block runs (`PIPELINE_ASYNCHRONOUS_COMMIT`).

    For work that is redone when it is lost: a generation's steps are claimed with leases and
    swept again, so a server crash that drops their last fraction of a second of commits
    delays a generation and loses nothing. Each step is a few single-row commits, and on
    PostgreSQL each commit otherwise waits for a disk flush (0.2–0.7 ms here). SQLite already
    commits so (WAL with synchronous=NORMAL, settings.py). Never for a person's work: a
    decision, an edit, an import commits synchronously.
    """
    if connection.vendor != "postgresql" or not settings.PIPELINE_ASYNCHRONOUS_COMMIT:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("RESET synchronous_commit")
        except DatabaseError:
            # The connection broke with the work: a new one starts with the server's default.
            logger.warning("Could not reset synchronous_commit; closing the connection")
            connection.close()


def rows_update(
    model: type[Model],
    values_by_pk: Mapping[Any, Mapping[str, Any]],
    *,
    where: Mapping[str, Any],
) -> int:
    """One UPDATE for many rows, each with values of its own (the same fields for all), on the
    rows that also match `where` (equalities). Returns how many rows it updated.

    `UPDATE … FROM (SELECT … UNION ALL VALUES …) AS v`: on PostgreSQL one round trip instead
    of one per row (each ~0.4 ms there). Django's `bulk_update` writes a CASE per field and
    row instead, which measured 4× slower than a statement per row. (Not `WITH v AS (VALUES
    …)`: SQLite's driver reports no row count for a statement that starts with WITH.)"""
    if not values_by_pk:
        return 0
    names = list(next(iter(values_by_pk.values())))
    pk = _column_field(model, model._meta.pk.name)
    fields = [_column_field(model, name) for name in names]
    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    params: list[Any] = []
    for key, values in values_by_pk.items():
        assert list(values) == names, "every row sets the same fields"
        params.append(pk.get_db_prep_value(key, connection))
        params.extend(
            field.get_db_prep_save(values[name], connection)
            for name, field in zip(names, fields, strict=True)
        )
    # The first row names the columns; VALUES for the others keeps the text short.
    rows = "SELECT " + ", ".join(f"%s AS {quote(_column(field))}" for field in [pk, *fields])
    if len(values_by_pk) > 1:
        row = "(" + ", ".join(["%s"] * (1 + len(fields))) + ")"
        rows += " UNION ALL VALUES " + ", ".join([row] * (len(values_by_pk) - 1))

    def source(field: Field[Any, Any]) -> str:
        # A parameter is untyped on PostgreSQL (text, or NULL): cast it to its column's type.
        value = f"v.{quote(_column(field))}"
        if connection.vendor == "postgresql":
            return f"CAST({value} AS {field.cast_db_type(connection)})"
        return value

    conditions = [f"{table}.{quote(_column(pk))} = v.{quote(_column(pk))}"]
    for name, expected in where.items():
        field = _column_field(model, name)
        conditions.append(f"{table}.{quote(_column(field))} = %s")
        params.append(field.get_db_prep_value(expected, connection))
    sql = (
        f"UPDATE {table} SET "
        + ", ".join(f"{quote(_column(field))} = {source(field)}" for field in fields)
        + f" FROM ({rows}) AS v WHERE {' AND '.join(conditions)}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        updated = int(cursor.rowcount)
    if issubclass(model, StampedModel):  # rows other processes keep: tell them
        stamp_renew_on_commit(model.rows_stamp)
    return updated


def _column_field(model: type[Model], name: str) -> "Field[Any, Any]":
    field = model._meta.get_field(name)
    assert isinstance(field, Field), f"{name} is not a column of {model.__name__}"
    return field


def _column(field: "Field[Any, Any]") -> str:
    assert field.column is not None
    return field.column


def stamp_renew_on_commit(stamp: str) -> None:
    """Renews `stamp` once the write is committed (at once outside a transaction) and, inside
    one, now as well: a process that reads the rows before the commit keeps them under the
    first stamp, so the second makes it read the committed rows. A renewal that fails is
    logged, never the write's failure: what processes keep expires by itself (see its
    reader)."""

    def renew() -> None:
        try:
            counters.stamp_renew(stamp)
        except Exception:
            logger.exception("The stamp %s could not be renewed", stamp)

    if transaction.get_connection().in_atomic_block:
        renew()
    transaction.on_commit(renew)


class StampedQuerySet[RowT: "StampedModel"](QuerySet[RowT]):
    """Every update and delete renews the model's stamp (`StampedModel`)."""

    def update(self, **kwargs: Any) -> int:
        changed = super().update(**kwargs)
        stamp_renew_on_commit(self.model.rows_stamp)
        return changed

    def delete(self) -> tuple[int, dict[str, int]]:
        deleted = super().delete()
        stamp_renew_on_commit(self.model.rows_stamp)
        return deleted


class StampedModel(Model):
    """A model whose rows other processes keep in memory, checked against `rows_stamp`
    (`counters.stamps`): every write through the model or its manager renews it. Rows deleted
    with another model's row (a cascade) renew only that model's stamp: whoever keeps a row
    checks the stamps of the rows it hangs on too."""

    rows_stamp: ClassVar[str]
    # Each model declares `objects = StampedQuerySet["Model"].as_manager()` (typed).

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        super().save(*args, **kwargs)
        stamp_renew_on_commit(self.rows_stamp)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        deleted = super().delete(*args, **kwargs)
        stamp_renew_on_commit(self.rows_stamp)
        return deleted
