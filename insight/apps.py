from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class InsightConfig(AppConfig):
    name = "insight"
    verbose_name = _("Storage insight")

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from insight.schedules import ensure_schedules

        post_migrate.connect(ensure_schedules, sender=self, dispatch_uid="insight-schedules")
