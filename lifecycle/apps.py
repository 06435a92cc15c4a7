from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class LifecycleConfig(AppConfig):
    name = "lifecycle"
    verbose_name = _("Conversation lifecycle")

    def ready(self) -> None:
        from django.db.models.signals import post_migrate
        from django_q.signals import post_spawn

        from lifecycle import checks  # noqa: F401  (registers the system check)
        from lifecycle.schedules import ensure_schedules
        from lifecycle.tasks import on_worker_spawn

        post_migrate.connect(ensure_schedules, sender=self, dispatch_uid="lifecycle-schedules")
        post_spawn.connect(on_worker_spawn, dispatch_uid="lifecycle-startup-recovery")
