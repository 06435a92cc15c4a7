from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RemoteConfig(AppConfig):
    name = "remote"
    verbose_name = _("Remote engine")

    def ready(self) -> None:
        from django.db.models.signals import post_migrate
        from django_q.signals import post_spawn

        from remote.schedules import ensure_schedules
        from remote.tasks import on_worker_spawn

        post_migrate.connect(ensure_schedules, sender=self, dispatch_uid="remote-schedules")
        post_spawn.connect(on_worker_spawn, dispatch_uid="remote-startup-delivery")
