"""`woken_by_name` for databases that applied 0011 before the column was added to it (r141)."""

from django.db import migrations

from console.schema_repair import add_missing


class Migration(migrations.Migration):

    dependencies = [
        ("retention", "0011_toolpayloadpolicy_woken_by"),
    ]

    operations = [
        migrations.RunPython(add_missing("retention", "ToolPayloadPolicy", fields=("woken_by", "woken_by_name")),
                             migrations.RunPython.noop),
    ]
