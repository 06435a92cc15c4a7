"""Item columns for tool payload cleanup: the stored skip reason and the removal time.

Adding a NOT NULL column rebuilds the item table on SQLite, which drops its fence
triggers, so the migration ends by installing the fence again (idempotent).
"""

from django.db import migrations, models


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0005_fence_triggers"),
    ]

    operations = [
        # Backwards, last: removing payload_skip rebuilds the table on SQLite, dropping the
        # fence triggers; they go back on after it.
        migrations.RunPython(migrations.RunPython.noop, install_fence),
        migrations.AddField(
            model_name="item",
            name="details_removed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="item",
            name="payload_skip",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                condition=models.Q(("payload_skip", ""), _negated=True),
                fields=["conversation", "payload_skip"],
                name="item_payload_skip_idx",
            ),
        ),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
