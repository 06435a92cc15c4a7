"""The item's payload_skip gets a database default, so a server still running the code from
before 0006 (a rolling upgrade) can insert items without naming the column.

Changing a column's default rebuilds the item table on SQLite, which drops its fence
triggers: they go back on at the end, both ways.
"""

from django.db import migrations, models


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0020_item_client_key'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, install_fence),
        migrations.AlterField(
            model_name='item',
            name='payload_skip',
            field=models.CharField(blank=True, db_default='', default='', max_length=16),
        ),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
