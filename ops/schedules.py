"""The ops app's recurring jobs, created idempotently by name after every migrate."""

from __future__ import annotations

from django.utils import timezone

SCHEDULES = {
    # Its Task rows are not kept (one a minute would push real results out of the history).
    "ops-heartbeat": {"func": "ops.tasks.heartbeat", "minutes": 1, "kwargs": "{'q_options': {'save': False}}"},
}


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    for name, spec in SCHEDULES.items():
        wanted = {"func": spec["func"], "minutes": spec["minutes"], "kwargs": spec.get("kwargs"),
                  "schedule_type": Schedule.MINUTES}
        rows = list(Schedule.objects.filter(name=name).order_by("id"))
        for duplicate in rows[1:]:
            duplicate.delete()
        if not rows:
            Schedule.objects.create(name=name, repeats=-1, next_run=timezone.now(), **wanted)
        elif any(getattr(rows[0], key) != value for key, value in wanted.items()):
            Schedule.objects.filter(pk=rows[0].pk).update(**wanted)
