"""The engine folder's mark recorded by a release whose database key had an earlier form (0025
on 2026-12-05, before the key became the PostgreSQL server's own identifier and, for a SQLite
file reached through a link, the link's path) gets this database's key in today's form, the old
one kept with its origins: the same database upgraded in place read as a copy of itself (r125:
deletes waited and /readyz said not ready until an operator took the folder over). A mark
recorded by another database (this one a copy) keeps its key: that is still another's."""

from django.db import migrations


def current_form(apps, schema_editor):
    from retention.backups import database_key, earlier_keys

    here = database_key(schema_editor.connection)
    marks = apps.get_model("lifecycle", "EngineFolderMark").objects.using(schema_editor.connection.alias)
    mark = marks.filter(pk=1).first()
    if mark is None or mark.database_key == here or mark.database_key not in earlier_keys(schema_editor.connection):
        return
    origins = [key for key in (mark.origin_keys if isinstance(mark.origin_keys, list) else []) if key != here]
    marks.filter(pk=1).update(database_key=here, origin_keys=list(dict.fromkeys([*origins, mark.database_key])))


class Migration(migrations.Migration):

    dependencies = [
        ("lifecycle", "0028_refold_ignorable_characters"),
    ]

    operations = [
        migrations.RunPython(current_form, migrations.RunPython.noop),
    ]
