"""The engine folder's mark records where the database that made it is (its key), so a copy of
the database elsewhere (restored into another database, the file moved) does not take the
folder for its own; an existing mark gets this database's key now."""

from django.db import migrations, models


def record_key(apps, schema_editor):
    from retention.backups import database_key, earlier_keys

    here = database_key(schema_editor.connection)
    apps.get_model("lifecycle", "EngineFolderMark").objects.using(schema_editor.connection.alias).filter(
        database_key="").update(database_key=here, origin_keys=sorted(
            earlier_keys(schema_editor.connection) - {here}))


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0024_subagent_resolution"),
    ]

    operations = [
        migrations.AddField(
            model_name="enginefoldermark",
            name="database_key",
            field=models.CharField(blank=True, default="", max_length=32),
        ),
        migrations.AddField(
            model_name="enginefoldermark",
            name="origin_keys",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(record_key, migrations.RunPython.noop),
    ]
