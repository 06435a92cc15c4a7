# The folded search columns (lifecycle.search): added nullable so SQLite adds them with ALTER
# TABLE instead of rebuilding the table (a rebuild drops the table's triggers), then filled
# for the rows that exist.

from django.db import migrations, models

from lifecycle.search import fold


def fill(apps, schema_editor):
    Conversation = apps.get_model("lifecycle", "Conversation")
    db = schema_editor.connection.alias
    last = 0
    while True:
        rows = list(
            Conversation.objects.using(db).filter(pk__gt=last).order_by("pk").only("pk", "title", "thread_id")[:1000]
        )
        if not rows:
            return
        for row in rows:
            row.search_title, row.search_thread = fold(row.title), fold(row.thread_id)
        Conversation.objects.using(db).bulk_update(rows, ["search_title", "search_thread"])
        last = rows[-1].pk


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0002_turn_active_index'),
    ]

    operations = [
        migrations.AddField(
            model_name='conversation',
            name='search_title',
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name='conversation',
            name='search_thread',
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(fill, migrations.RunPython.noop, elidable=True),
    ]
