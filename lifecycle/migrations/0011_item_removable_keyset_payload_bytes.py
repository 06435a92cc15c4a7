"""The removable-items index also carries each item's payload bytes, so cleanup on SQLite
picks a batch's items (by the cursor, within its byte budget) from the index alone, without
reading the rows it will not take. Indexes only: no table rebuild on SQLite."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0010_item_conversation_index"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="item",
            name="item_removable_keyset_idx",
        ),
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                condition=models.Q(("removable_bytes__gt", 0)),
                fields=["conversation", "id", "removable_bytes", "payload_bytes"],
                name="item_removable_keyset_idx",
            ),
        ),
    ]
