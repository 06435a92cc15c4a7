"""The item keeps a digest of the append its Idempotency-Key came with, so a retry with the
key and another request is refused instead of answered with the first item.

Adding a column with a default rebuilds the item table on SQLite, which drops its fence
triggers: they go back on at the end, both ways (as in 0021).
"""

from django.db import migrations, models


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0025_engine_folder_database_key'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, install_fence),
        migrations.AddField(
            model_name='item',
            name='client_key_digest',
            field=models.CharField(blank=True, db_default='', default='', editable=False, max_length=64),
        ),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
