"""The stored removal plan of each tool item (what cleanup writes into the marker besides its
time), so cleanup rewrites most items in SQL without reading their payloads.

The column is nullable, so SQLite adds it without rebuilding the table (the fence triggers
stay; the migration installs them again anyway, idempotently). Existing items that cleanup
could reduce get their plan in primary-key batches; items of conversations behind a delete
fence are left to their erasure. An item without a plan is still reduced, in Python.
"""

from django.db import migrations, models

BATCH = 1000
BATCH_BYTES = 32 * 1024 * 1024  # of stored payload text per batch (see 0007)


def fill_plans(apps, schema_editor):
    from lifecycle.item_payload import payload_batch
    from retention.reducer import SQL_KINDS, item_figures

    Item = apps.get_model("lifecycle", "Item")
    DeletionFence = apps.get_model("lifecycle", "DeletionFence")
    fenced = DeletionFence.objects.values("conversation_id")
    rows = Item.objects.filter(role="tool", removable_bytes__gt=0, tool_kind__in=SQL_KINDS,
                               removal_plan__isnull=True).exclude(conversation_id__in=fenced)
    last = 0
    while True:
        ids = payload_batch(rows, last, max_items=BATCH, max_bytes=BATCH_BYTES)
        if not ids:
            return
        last = ids[-1]
        changed = []
        for item in Item.objects.filter(pk__in=ids).order_by("pk").only("pk", "tool_kind", "payload",
                                                                          "removable_bytes"):
            _size, removable, _skip, plan = item_figures(item.tool_kind, item.payload)
            if plan is not None and removable == item.removable_bytes:
                item.removal_plan = plan
                changed.append(item)
        if changed:
            Item.objects.bulk_update(changed, ["removal_plan"])


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0007_canonical_payloads"),
    ]

    operations = [
        migrations.AddField(
            model_name="item",
            name="removal_plan",
            field=models.TextField(blank=True, null=True),
        ),
        migrations.RunPython(fill_plans, migrations.RunPython.noop),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
