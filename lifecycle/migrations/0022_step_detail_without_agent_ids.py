"""Delete steps measured before this release kept the erased subagent rows' agent ids in their
detail (`{"agents": [...]}`): text the runtime wrote, kept with the operation for good and read by
nothing. They go; records and bytes stay."""

from django.db import migrations


def forget_agent_ids(apps, schema_editor):
    DeleteStep = apps.get_model("lifecycle", "DeleteStep")
    for step in DeleteStep.objects.filter(detail__has_key="agents").only("pk", "detail").iterator():
        detail = {key: value for key, value in step.detail.items() if key != "agents"}
        DeleteStep.objects.filter(pk=step.pk).update(detail=detail)


class Migration(migrations.Migration):
    dependencies = [("lifecycle", "0021_item_payload_skip_db_default")]
    operations = [migrations.RunPython(forget_agent_ids, migrations.RunPython.noop)]
