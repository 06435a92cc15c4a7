"""Keep the starter's username beside `started_by`, which a user's deletion empties.

Existing rows get the name of their user where it still exists. A row whose user was deleted
before this migration cannot be told apart from one the daily schedule started, so it keeps
reading as the schedule, as it did.
"""

from django.conf import settings
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def fill_names(apps, schema_editor):
    from django.contrib.auth import get_user_model

    operation = apps.get_model("retention", "ToolPayloadOperation")
    user = apps.get_model(settings.AUTH_USER_MODEL)
    username = get_user_model().USERNAME_FIELD
    operation.objects.filter(started_by__isnull=False).update(
        started_by_name=Subquery(user.objects.filter(pk=OuterRef("started_by_id")).values(username)[:1])
    )


class Migration(migrations.Migration):

    dependencies = [
        ('retention', '0004_operation_counted_at'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='toolpayloadoperation',
            name='started_by_name',
            field=models.CharField(blank=True, default='', max_length=150),
        ),
        migrations.RunPython(fill_names, migrations.RunPython.noop, elidable=True),
    ]
