"""`raw_rows`: model instances from hand-written SQL, converted as the ORM converts them."""

from __future__ import annotations

import pytest
from django.db import connection

from sessions_app import sql as raw_rows
from sessions_app.models import Session
from sessions_app.services import session_create

pytestmark = pytest.mark.django_db


def test_it_loads_the_same_instance_as_the_orm(alice):
    made = session_create(
        owner=alice, model="gpt-4o", settings={"autoCompact": False, "compactThreshold": 0.7}
    )
    Session.objects.filter(pk=made.pk).update(client_key="thread-1", gateway_prefix_hash="ab")
    table = connection.ops.quote_name(Session._meta.db_table)
    pk = connection.ops.quote_name("id")
    (loaded,) = raw_rows.instances(
        Session,
        f"SELECT {raw_rows.columns(Session)} FROM {table} WHERE {pk} = %s",  # noqa: S608
        [Session._meta.pk.get_db_prep_value(made.pk, connection)],
    )
    expected = Session.objects.get(pk=made.pk)
    for field in Session._meta.concrete_fields:
        assert getattr(loaded, field.attname) == getattr(expected, field.attname), field.name
    # JSON, UUID and datetimes come back as Python values, not as the backend's text.
    assert loaded.settings["compactThreshold"] == 0.7
    assert loaded.pk == made.pk and loaded.created_at.tzinfo is not None
    assert not loaded._state.adding


def test_it_prefixes_the_columns_with_an_alias():
    assert raw_rows.columns(Session, alias="s").startswith("s.")
    assert raw_rows.columns(Session).count(",") == len(Session._meta.concrete_fields) - 1


def test_it_returns_nothing_for_no_rows():
    table = connection.ops.quote_name(Session._meta.db_table)
    sql = f"SELECT {raw_rows.columns(Session)} FROM {table} WHERE 1 = 0"  # noqa: S608
    assert raw_rows.instances(Session, sql, []) == []
