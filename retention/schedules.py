"""Recurring jobs, created idempotently by name after every migrate."""

from __future__ import annotations

from django.utils import timezone

SCHEDULES = {
    "measure-engine-folder": {"func": "retention.tasks.measure_engine_folder", "minutes": 15},
}


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    for name, spec in SCHEDULES.items():
        schedule, created = Schedule.objects.get_or_create(
            name=name,
            defaults={
                "func": spec["func"],
                "schedule_type": Schedule.MINUTES,
                "minutes": spec["minutes"],
                "repeats": -1,
                "next_run": timezone.now(),
            },
        )
        if not created and (schedule.func, schedule.minutes) != (spec["func"], spec["minutes"]):
            schedule.func, schedule.minutes, schedule.schedule_type = spec["func"], spec["minutes"], Schedule.MINUTES
            schedule.save(update_fields=["func", "minutes", "schedule_type"])
