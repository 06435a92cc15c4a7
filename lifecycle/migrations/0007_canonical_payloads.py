"""Tool payloads stored in the canonical form, and their figures recomputed.

Until now SQLite stored payloads with `\\uXXXX` escapes (one table held two encodings),
PostgreSQL's jsonb gave back some numbers in another form (1e16 as a 17-digit integer),
empty removed fields were not counted, and the reduction did not include the marker. This
migration stores every live item's payload as the database gives it back, in the canonical
form, and recomputes payload_bytes, removable_bytes and payload_skip, in primary-key
batches. Items of conversations behind a delete fence are left to their erasure (the fence
refuses writes to them).

The field change rebuilds the item table on SQLite, which drops its fence triggers, so the
migration ends by installing the fence again (idempotent).
"""

from django.db import migrations

import lifecycle.models

BATCH = 1000
BATCH_BYTES = 32 * 1024 * 1024  # of stored payload text per batch: each is held several times over


def recompute(apps, schema_editor):
    from lifecycle.item_payload import payload_batch, payload_columns, stored_payload_size
    from retention.reducer import Skip

    Item = apps.get_model("lifecycle", "Item")
    DeletionFence = apps.get_model("lifecycle", "DeletionFence")
    vendor = schema_editor.connection.vendor
    fenced = DeletionFence.objects.values("conversation_id")
    fields = ["payload", "payload_bytes", "removable_bytes", "payload_skip"]
    rows = Item.objects.filter(role="tool").exclude(conversation_id__in=fenced)
    last = 0
    while True:
        ids = payload_batch(rows, last, max_items=BATCH, max_bytes=BATCH_BYTES)
        if not ids:
            return
        last = ids[-1]
        changed, unusable = [], []
        batch = (Item.objects.filter(pk__in=ids).order_by("pk").only("pk", "tool_kind", *fields)
                 .annotate(stored_size=stored_payload_size()))
        for item in batch:
            try:
                columns = payload_columns("tool", item.tool_kind, item.payload, vendor=vendor)
            except (UnicodeEncodeError, RecursionError):
                # Stored before writes refused them: a lone surrogate (SQLite), or nesting
                # deeper than the write path measures. Kept as stored, skipped by cleanup.
                item.payload_bytes = item.stored_size or 0
                item.removable_bytes, item.payload_skip = 0, Skip.MALFORMED
                unusable.append(item)
                continue
            # SQLite: rewrite every payload, so the stored text is the canonical form.
            # Only the columns this model has: payload_columns also gives later migrations' ones.
            if vendor == "sqlite" and item.payload is not None or any(
                getattr(item, name) != columns[name] for name in fields
            ):
                for name in fields:
                    setattr(item, name, columns[name])
                changed.append(item)
        if changed:
            Item.objects.bulk_update(changed, fields)
        if unusable:
            Item.objects.bulk_update(unusable, fields[1:])


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0006_item_cleanup_fields"),
    ]

    operations = [
        # Backwards, last: the AlterField's reverse rebuilds the table on SQLite, dropping
        # the fence triggers; they go back on after it.
        migrations.RunPython(migrations.RunPython.noop, install_fence),
        migrations.AlterField(
            model_name="item",
            name="payload",
            field=lifecycle.models.CanonicalJSONField(blank=True, null=True),
        ),
        migrations.RunPython(recompute, migrations.RunPython.noop),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
