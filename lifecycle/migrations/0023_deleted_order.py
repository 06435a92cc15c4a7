"""The Deleted tab lists tombstones newest deletion first (lifecycle.paging.listing), by
COALESCE(view_changed_at, last_activity_at): an index for that order, so a page does not sort
every tombstone; and the moment of deletion for tombstones made before 0018 added
view_changed_at (their delete's completion; the last activity when no completed delete is
recorded), which the completion of a delete has set since."""

from django.db import migrations, models
from django.db.models import F, OuterRef, Subquery
from django.db.models.functions import Coalesce


def deletion_moments(apps, schema_editor):
    Conversation = apps.get_model("lifecycle", "Conversation")
    DeleteOperation = apps.get_model("lifecycle", "DeleteOperation")
    completed = (DeleteOperation.objects.filter(conversation=OuterRef("pk"), state="completed")
                 .exclude(completed_at=None).order_by("-completed_at").values("completed_at")[:1])
    Conversation.objects.filter(state="deleted", view_changed_at=None).update(
        view_changed_at=Coalesce(Subquery(completed), F("last_activity_at")))


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0022_step_detail_without_agent_ids'),
    ]

    operations = [
        migrations.RunPython(deletion_moments, migrations.RunPython.noop),
        migrations.AddIndex(
            model_name='conversation',
            index=models.Index(Coalesce('view_changed_at', 'last_activity_at').desc(), F('id').desc(),
                               condition=models.Q(('state', 'deleted')), name='conv_deleted_order_idx'),
        ),
    ]
