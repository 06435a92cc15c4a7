"""An item keeps the Idempotency-Key the runtime appended it with: a retried append answers
with the item instead of adding it twice. The fence's triggers are installed again after the
table changes, as after every change of a fenced table."""

from django.db import migrations, models


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0019_erasure_fingerprint_conversation'),
    ]

    operations = [
        migrations.AddField(
            model_name='item',
            name='client_key',
            field=models.CharField(blank=True, editable=False, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name='item',
            constraint=models.UniqueConstraint(condition=models.Q(('client_key__isnull', False)), fields=('conversation', 'client_key'), name='item_one_per_client_key'),
        ),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
