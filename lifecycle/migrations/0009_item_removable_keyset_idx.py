"""The removable-items index also orders by item id within a conversation, so cleanup reads
the next items after its cursor as a range of the index (a conversation of a million items
no longer means sorting what is left of it for every batch), and analysis still sums
removable bytes from the index alone. Indexes only: no table rebuild on SQLite."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0008_item_removal_plan"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="item",
            index=models.Index(
                condition=models.Q(("removable_bytes__gt", 0)),
                fields=["conversation", "id", "removable_bytes"],
                name="item_removable_keyset_idx",
            ),
        ),
        migrations.RemoveIndex(
            model_name="item",
            name="item_removable_idx",
        ),
    ]
