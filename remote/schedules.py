"""The remote app's recurring job, created idempotently by name after every migrate."""

from __future__ import annotations

from django.utils import timezone

SCHEDULES = {"remote-deliver": {"func": "remote.tasks.sweep", "minutes": 1}}


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    for name, spec in SCHEDULES.items():
        Schedule.objects.update_or_create(
            name=name,
            defaults={"func": spec["func"], "schedule_type": Schedule.MINUTES, "minutes": spec["minutes"],
                      "repeats": -1},
            create_defaults={"func": spec["func"], "schedule_type": Schedule.MINUTES, "minutes": spec["minutes"],
                             "repeats": -1, "next_run": timezone.now()},
        )
