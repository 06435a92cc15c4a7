"""Database fence triggers on every erase and compact table of the retention registry.

The statements are chosen by database vendor in lifecycle.fence. A later migration that
rebuilds a fenced table (SQLite drops a table's triggers when it does) ends with the same
RunPython, so the fence comes back.
"""

from django.db import migrations


def install(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


def remove(apps, schema_editor):
    from lifecycle.fence import remove_fence_triggers

    remove_fence_triggers(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0004_delete_operations"),
    ]

    operations = [
        migrations.RunPython(install, remove),
    ]
