"""The erasure check's fingerprints name their conversation, so the retention registry counts
and lists them per conversation like every other store that outlives a delete."""

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def name_their_conversation(apps, schema_editor):
    fingerprint = apps.get_model("lifecycle", "ErasureFingerprint")
    operation = apps.get_model("lifecycle", "DeleteOperation")
    fingerprint.objects.filter(conversation__isnull=True).update(
        conversation_id=Subquery(operation.objects.filter(pk=OuterRef("operation_id")).values("conversation_id")[:1])
    )


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0018_conversation_view_changed_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='erasurefingerprint',
            name='conversation',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='lifecycle.conversation'),
        ),
        migrations.RunPython(name_their_conversation, migrations.RunPython.noop),
    ]
