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


def recompute(apps, schema_editor):
    from lifecycle.item_payload import payload_columns

    Item = apps.get_model("lifecycle", "Item")
    DeletionFence = apps.get_model("lifecycle", "DeletionFence")
    vendor = schema_editor.connection.vendor
    fenced = DeletionFence.objects.values("conversation_id")
    fields = ["payload", "payload_bytes", "removable_bytes", "payload_skip"]
    last = 0
    while True:
        batch = list(
            Item.objects.filter(pk__gt=last, role="tool")
            .exclude(conversation_id__in=fenced)
            .order_by("pk")
            .only("pk", "tool_kind", *fields)[:BATCH]
        )
        if not batch:
            return
        last = batch[-1].pk
        changed = []
        for item in batch:
            columns = payload_columns("tool", item.tool_kind, item.payload, vendor=vendor)
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


def install_fence(apps, schema_editor):
    from lifecycle.fence import install_fence_triggers

    install_fence_triggers(schema_editor.connection, schema_editor.execute)


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0006_item_cleanup_fields"),
    ]

    operations = [
        migrations.AlterField(
            model_name="item",
            name="payload",
            field=lifecycle.models.CanonicalJSONField(blank=True, null=True),
        ),
        migrations.RunPython(recompute, migrations.RunPython.noop),
        migrations.RunPython(install_fence, migrations.RunPython.noop),
    ]
