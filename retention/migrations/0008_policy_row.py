from django.db import migrations


def create_policy(apps, schema_editor):
    """The policy's one row, with its defaults, made here so that reading the policy never
    writes (a member's page view, a status poll) and its `updated_at` is the install's time."""
    apps.get_model("retention", "ToolPayloadPolicy").objects.get_or_create(id=1)


class Migration(migrations.Migration):

    dependencies = [
        ("retention", "0007_operation_last_item"),
    ]

    operations = [
        migrations.RunPython(create_policy, migrations.RunPython.noop),
    ]
