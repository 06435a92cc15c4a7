"""A bound delete calls the engine with an operation key of this console's own (engine_key),
not the client's, which the engine may know for another conversation. Existing deletes keep
"" and go on sending their key as before (a retry must send the key a lost request used); the
database default lets a server still running older code insert without the column."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('remote', '0005_bound_delete_physical_db_default'),
    ]

    operations = [
        migrations.AddField(
            model_name='bounddelete',
            name='engine_key',
            field=models.CharField(blank=True, db_default='', default='', max_length=200),
        ),
    ]
