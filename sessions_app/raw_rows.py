"""Model instances from hand-written SQL, for the few statements on the hot path.

`Model.objects.raw()` works out, on every query, which column is which field and how each
value converts (it reads the cursor's description and matches every name against the
model's fields). For a Session (40-odd columns) that cost more than the statement itself,
three times per gateway call. Here the query selects the model's concrete columns in their
declared order, so that work is done once per connection and reused.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Model

M = TypeVar("M", bound=Model)

Converter = Callable[[Any, Any, Any], Any]

# Per connection wrapper: a backend's converters are its own bound methods.
_converters: weakref.WeakKeyDictionary[
    BaseDatabaseWrapper, dict[type[Model], list[tuple[int, Any, list[Converter]]]]
] = weakref.WeakKeyDictionary()


@lru_cache(maxsize=64)
def _column_list(model: type[Model], vendor: str, alias: str) -> str:
    quote = connections[DEFAULT_DB_ALIAS].ops.quote_name
    prefix = f"{alias}." if alias else ""
    return ", ".join(f"{prefix}{quote(field.column)}" for field in model._meta.concrete_fields)


def columns(model: type[Model], *, alias: str = "") -> str:
    """The model's concrete columns, quoted, in declared order (optionally `alias.`-prefixed):
    what a query read by `instances` must select."""
    return _column_list(model, connections[DEFAULT_DB_ALIAS].vendor, alias)


def _converters_for(
    connection: BaseDatabaseWrapper, model: type[Model]
) -> list[tuple[int, Any, list[Converter]]]:
    per_model = _converters.setdefault(connection, {})
    found = per_model.get(model)
    if found is None:
        found = []
        table = model._meta.db_table
        for index, field in enumerate(model._meta.concrete_fields):
            column = field.get_col(table)
            chain = [
                *connection.ops.get_db_converters(column),
                *column.get_db_converters(connection),
            ]
            if chain:
                found.append((index, column, chain))
        per_model[model] = found
    return found


def instances(model: type[M], sql: str, params: Sequence[Any]) -> list[M]:
    """Run `sql` (selecting `columns(model)`) and return its rows as `model` instances, as
    loaded from the database (values converted as the ORM converts them)."""
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return []
    converters = _converters_for(connection, model)
    names = [field.attname for field in model._meta.concrete_fields]
    found: list[M] = []
    for row in rows:
        values = list(row)
        for index, column, chain in converters:
            value = values[index]
            for convert in chain:
                value = convert(value, column, connection)
            values[index] = value
        found.append(model.from_db(connection.alias, names, values))
    return found
