"""The fence also refuses inserting a fenced conversation's id again (a delete and re-insert,
or SQLite's REPLACE, would otherwise bring the tombstone back live): the fence triggers are
installed again, now with that one."""

from django.db import migrations


def install(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


def drop_reinsert(apps, schema_editor):
    quote = schema_editor.connection.ops.quote_name
    on = " ON lifecycle_conversation" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {quote('lethe_fence_lifecycle_conversation_reinsert')}{on}")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS lethe_fence_reinsert()")


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0012_delete_operation_requested_index"),
    ]

    operations = [
        migrations.RunPython(install, drop_reinsert),
    ]
