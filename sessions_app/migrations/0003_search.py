"""Full-text search over events: FTS5 + triggers on SQLite, a tsvector column + GIN index on
PostgreSQL (see sessions_app/search_schema.py). Neither is a Django field, so the operations
are raw SQL chosen by `schema_editor.connection.vendor`."""

from django.db import migrations

from sessions_app.search_schema import drop_search_schema, ensure_search_schema


def forwards(apps, schema_editor):
    ensure_search_schema(schema_editor.connection)


def backwards(apps, schema_editor):
    drop_search_schema(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [
        ("sessions_app", "0004_exact_counts"),
    ]

    operations = [
        migrations.RunPython(forwards, backwards, elidable=False),
    ]
