"""Each database gets a random key of its own, written on its backups' receipts, so a backup folder
shared with another installation lists only this database's backups (retention.backups)."""

import secrets

from django.db import migrations, models

import retention.models


def make_key(apps, schema_editor):
    apps.get_model("retention", "DatabaseIdentity").objects.get_or_create(pk=1, defaults={"key": secrets.token_hex(16)})


class Migration(migrations.Migration):

    dependencies = [
        ('retention', '0010_db_defaults'),
    ]

    operations = [
        migrations.CreateModel(
            name='DatabaseIdentity',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(default=retention.models.new_database_key, max_length=32)),
            ],
        ),
        migrations.RunPython(make_key, migrations.RunPython.noop),
    ]
