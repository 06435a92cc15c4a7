"""The engine problem columns 0002 added get a database default as well as Django's, so a server
still running older code (a rolling upgrade) inserts measurements without naming them."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('insight', '0002_measurement_engine_problems'),
    ]

    operations = [
        migrations.AlterField(
            model_name='measurement',
            name='engine_missing',
            field=models.BooleanField(db_default=False, default=False),
        ),
        migrations.AlterField(
            model_name='measurement',
            name='engine_unreadable',
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
    ]
