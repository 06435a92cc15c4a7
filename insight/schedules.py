"""The daily storage measurement, created idempotently by name after every migrate."""

from __future__ import annotations

from django.utils import timezone

NAME = "measure-storage"
FUNC = "insight.tasks.measure_storage"


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    schedule, created = Schedule.objects.get_or_create(
        name=NAME,
        defaults={"func": FUNC, "schedule_type": Schedule.DAILY, "repeats": -1, "next_run": timezone.now()},
    )
    if not created and (schedule.func, schedule.schedule_type) != (FUNC, Schedule.DAILY):
        schedule.func, schedule.schedule_type = FUNC, Schedule.DAILY
        schedule.save(update_fields=["func", "schedule_type"])
