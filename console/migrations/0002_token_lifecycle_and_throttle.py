from datetime import timedelta

import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def give_existing_tokens_an_expiry(apps, schema_editor):
    # Tokens made before expiry existed stay valid for API_TOKEN_DAYS from the upgrade.
    expires = django.utils.timezone.now() + timedelta(days=settings.API_TOKEN_DAYS)
    apps.get_model("console", "ApiToken").objects.filter(expires_at__isnull=True).update(expires_at=expires)


class Migration(migrations.Migration):

    dependencies = [
        ("console", "0001_initial"),
    ]

    operations = [
        migrations.AlterModelOptions(name="apitoken", options={"ordering": ["-created_at", "-id"]}),
        migrations.AddField(
            model_name="apitoken", name="expires_at", field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(give_existing_tokens_an_expiry, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="apitoken", name="expires_at", field=models.DateTimeField(),
        ),
        migrations.AddField(
            model_name="apitoken", name="revoked_at", field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.CreateModel(
            name="Throttle",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("key", models.CharField(max_length=100, unique=True)),
                ("failures", models.PositiveIntegerField(default=0)),
                ("first_failure_at", models.DateTimeField(blank=True, null=True)),
                ("blocked_until", models.DateTimeField(blank=True, null=True)),
                ("locked", models.BooleanField(default=False)),
                ("updated_at", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
        ),
    ]
