"""Items lose their index on conversation alone: item_unique_seq (conversation, seq) already
serves every lookup by conversation. With both, PostgreSQL planned the next seq of a
conversation grown since its last statistics as a scan of all its items through the
one-column index (20 ms at 100,000 items, for every append), where reading the (conversation,
seq) key backwards takes one entry. One index fewer for every item written or rewritten, too.
Drops the index by its name (the same on both engines): no table rebuild on SQLite, so the
fence triggers stay."""

from django.db import migrations, models

INDEX = "lifecycle_item_conversation_id_48b7d164"


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0009_item_removable_keyset_idx"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="item",
                    name="conversation",
                    field=models.ForeignKey(
                        db_index=False, on_delete=models.deletion.CASCADE, related_name="items",
                        to="lifecycle.conversation",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{INDEX}"',
                    reverse_sql=f'CREATE INDEX IF NOT EXISTS "{INDEX}" ON "lifecycle_item" ("conversation_id")',
                ),
            ],
        ),
    ]
