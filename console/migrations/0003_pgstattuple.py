"""Install PostgreSQL's `pgstattuple` extension where the role may, so the Data & storage
page measures reusable space (heap and TOAST, dead and free) from the pages. Where it may
not (no privilege, extension not shipped), nothing fails: the page shows an estimate."""

from django.db import DatabaseError, migrations, transaction


def install(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except DatabaseError:
        pass


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0002_token_lifecycle_and_throttle"),
    ]

    operations = [
        migrations.RunPython(install, migrations.RunPython.noop),
    ]
