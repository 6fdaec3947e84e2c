"""SQLite's search index in bounded pieces: an event may have several FTS rows (the map's
event id is no longer unique) and the state keeps how much of a partly indexed event is done
(see sessions_app/search_index.py). The SQLite index is rebuilt empty; the background task and
searches fill it again in bounded batches. PostgreSQL is unchanged."""

from django.db import migrations

from sessions_app.search_schema import drop_search_schema, ensure_search_schema


def rebuild_sqlite_index(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    drop_search_schema(schema_editor.connection)
    ensure_search_schema(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0006_cache_usage"),
    ]

    operations = [
        migrations.RunPython(rebuild_sqlite_index, migrations.RunPython.noop, elidable=False),
    ]
