"""Users stored with a name in another Unicode form than the sign-in form reads (made before
`manage.py users create` normalised names, r123: a full-width `ｆｕｌｌ`, accents typed as
combining marks) could never sign in: the form reads NFKC `full`, and no user had that name.
Each such name is stored in its normal form, unless that form (or one differing only in case)
is another user's name, or is longer than a name may be: that user keeps theirs, and
`manage.py users` still finds both."""

import unicodedata

from django.conf import settings
from django.db import migrations


def normal_form(apps, schema_editor):
    model = apps.get_model(*settings.AUTH_USER_MODEL.split("."))
    longest = model._meta.get_field("username").max_length
    users = model.objects.using(schema_editor.connection.alias)
    names = dict(users.values_list("pk", "username"))
    taken = {}  # each name's normal form case-folded -> how many users have it
    for name in names.values():
        key = unicodedata.normalize("NFKC", name).casefold()
        taken[key] = taken.get(key, 0) + 1
    for pk, name in sorted(names.items()):
        normal = unicodedata.normalize("NFKC", name)
        # (NFKC can make a name longer: U+FDFA is 18 characters. One that would not fit keeps its
        # name: the sign-in form takes no longer one, so it could not sign in either way; r130)
        if normal != name and taken[normal.casefold()] == 1 and len(normal) <= longest:
            users.filter(pk=pk).update(username=normal)


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0004_api_token_form_number"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(normal_form, migrations.RunPython.noop),
    ]
