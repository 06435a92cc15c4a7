from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = _("Operations")

    def ready(self) -> None:
        from django.core.signals import request_finished
        from django.db.models.signals import post_migrate
        from django.utils.module_loading import autodiscover_modules
        from django_q.signals import post_execute, post_execute_in_worker, pre_enqueue, pre_execute

        import ops.checks  # noqa: F401  (registers the system checks)
        from ops import jobs
        from ops.middleware import clear_request_context
        from ops.schedules import ensure_schedules

        pre_enqueue.connect(jobs.on_pre_enqueue, dispatch_uid="ops-pre-enqueue")
        pre_execute.connect(jobs.on_pre_execute, dispatch_uid="ops-pre-execute")
        post_execute_in_worker.connect(jobs.on_post_execute_in_worker, dispatch_uid="ops-post-execute-worker")
        post_execute.connect(jobs.on_post_execute, dispatch_uid="ops-post-execute")
        request_finished.connect(clear_request_context, dispatch_uid="ops-request-finished")
        post_migrate.connect(ensure_schedules, sender=self, dispatch_uid="ops-schedules")
        # Every app's `metrics.py` registers the figures /metrics reads at scrape time.
        autodiscover_modules("metrics")
