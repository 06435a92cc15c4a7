"""A bound delete's physical_state gets a database default, so a server still running the code
from before 0004 (a rolling upgrade: migrate first, older servers keep running) can insert
bound deletes without naming the column. A delete such a server completes keeps "" and is
physically pending all the same (remote.physical.waiting)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('remote', '0004_bound_delete_physical'),
    ]

    operations = [
        migrations.AlterField(
            model_name='bounddelete',
            name='physical_state',
            field=models.CharField(blank=True, choices=[('', 'Not applicable'), ('pending', 'Physically pending'), ('erased', 'Physically erased')], db_default='', default='', max_length=8),
        ),
    ]
