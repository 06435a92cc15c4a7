# The search folding now drops the default-ignorable code points (zero-width spaces and
# joiners, the soft hyphen, the byte order mark, direction marks, variation selectors:
# lifecycle.search, r123): the folded columns stored before are folded again, so a title
# "Pro<U+200B>ject" is found by "project". Only the rows whose fold changes are written.
#
# A conversation behind the delete fence keeps its folded title: the fence refuses a new
# content value there (lifecycle.fence), and its title is not searched anyway (it is content
# being erased). Its folded thread id, identity, is folded again like any other.

from django.db import migrations
from django.db.models import Exists, OuterRef

from lifecycle.search import fold

BATCH = 1000


def refold(apps, schema_editor):
    db = schema_editor.connection.alias
    Conversation = apps.get_model("lifecycle", "Conversation")
    DeletionFence = apps.get_model("lifecycle", "DeletionFence")
    fenced = Exists(DeletionFence.objects.using(db).filter(conversation_id=OuterRef("pk")))
    last = 0
    while True:
        rows = list(Conversation.objects.using(db).filter(pk__gt=last).order_by("pk").annotate(fenced=fenced)
                    .only("pk", "title", "thread_id", "search_title", "search_thread")[:BATCH])
        if not rows:
            break
        changed = []
        for row in rows:
            title, thread = row.search_title, fold(row.thread_id)
            if not row.fenced:
                title = fold(row.title)
            if (title, thread) != (row.search_title, row.search_thread):
                row.search_title, row.search_thread = title, thread
                changed.append(row)
        Conversation.objects.using(db).bulk_update(changed, ["search_title", "search_thread"])
        last = rows[-1].pk
    for name in ("Account", "Computer"):
        model = apps.get_model("lifecycle", name)
        last = 0
        while True:
            rows = list(model.objects.using(db).filter(pk__gt=last).order_by("pk")
                        .only("pk", "name", "search_name")[:BATCH])
            if not rows:
                break
            changed = []
            for row in rows:
                if fold(row.name) != row.search_name:
                    row.search_name = fold(row.name)
                    changed.append(row)
            model.objects.using(db).bulk_update(changed, ["search_name"])
            last = rows[-1].pk


class Migration(migrations.Migration):

    dependencies = [
        ('lifecycle', '0027_owner_search_name'),
    ]

    operations = [
        migrations.RunPython(refold, migrations.RunPython.noop, elidable=True),
    ]
