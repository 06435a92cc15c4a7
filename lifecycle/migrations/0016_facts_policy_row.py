from django.db import migrations


def create_policy(apps, schema_editor):
    """The retained facts policy's one row, with its defaults, made here so that reading it
    never writes (a member's page view) and its `updated_at` is the install's time."""
    apps.get_model("lifecycle", "RetainedFactsPolicy").objects.get_or_create(id=1)


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0015_engine_folder_mark"),
    ]

    operations = [
        migrations.RunPython(create_policy, migrations.RunPython.noop),
    ]
