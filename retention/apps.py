from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RetentionConfig(AppConfig):
    name = "retention"
    verbose_name = _("Tool payload retention")

    def ready(self) -> None:
        from django.db.models.signals import post_migrate
        from django_q.signals import post_spawn

        from retention.jobs import on_worker_spawn
        from retention.schedules import ensure_schedules

        post_migrate.connect(ensure_schedules, sender=self, dispatch_uid="retention-schedules")
        post_spawn.connect(on_worker_spawn, dispatch_uid="retention-startup-recovery")
