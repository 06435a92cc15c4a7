"""The time a conversation's view last changed.

Backwards, removing the indexed column rebuilds the conversation table on SQLite, which
drops its fence triggers: they go back on after it.
"""

from django.db import migrations, models


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0017_delete_op_requester_idx'),
    ]

    operations = [
        migrations.RunPython(migrations.RunPython.noop, install_fence),
        migrations.AddField(
            model_name='conversation',
            name='view_changed_at',
            field=models.DateTimeField(blank=True, db_index=True, null=True),
        ),
    ]
