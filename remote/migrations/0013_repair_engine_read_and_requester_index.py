"""What two migrations gained after some databases had applied them (r141, r145): `started_at`
and `active_at` of 0008's engine read, and 0003's `bound_delete_requester_idx`."""

from django.db import migrations

from console.schema_repair import add_missing


class Migration(migrations.Migration):

    dependencies = [
        ("remote", "0012_engine_read_left_out"),
    ]

    operations = [
        migrations.RunPython(add_missing("remote", "EngineRead", fields=("started_at", "active_at")), migrations.RunPython.noop),
        migrations.RunPython(add_missing("remote", "BoundDelete", indexes=("bound_delete_requester_idx",)),
                             migrations.RunPython.noop),
    ]
