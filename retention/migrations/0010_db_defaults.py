"""Columns added after the first release get a database default as well as Django's, so a
server still running older code (a rolling upgrade) inserts rows without naming them: its
INSERT failed on NOT NULL, and an operation's start said the cleanup was busy."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('retention', '0009_storage_snapshot_reusable'),
    ]

    operations = [
        migrations.AlterField(
            model_name='toolpayloadoperation',
            name='error_message',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AlterField(
            model_name='toolpayloadoperation',
            name='started_by_name',
            field=models.CharField(blank=True, db_default='', default='', max_length=150),
        ),
        migrations.AlterField(
            model_name='toolpayloadpolicy',
            name='backup_choice',
            field=models.CharField(blank=True, db_default='', default='', max_length=8),
        ),
        migrations.AlterField(
            model_name='toolpayloadpolicy',
            name='backup_receipt_name',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
        migrations.AlterField(
            model_name='toolpayloadpolicy',
            name='preparation_error',
            field=models.TextField(blank=True, db_default='', default=''),
        ),
        migrations.AlterField(
            model_name='toolpayloadpolicy',
            name='preparation_state',
            field=models.CharField(db_default='none', default='none', max_length=12),
        ),
    ]
