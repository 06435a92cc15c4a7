"""The lifecycle's recurring jobs, created idempotently by name after every migrate (catch-up
off, as the cluster is configured). The twin of retention/schedules.py."""

from __future__ import annotations

from django.utils import timezone

SCHEDULES = {
    "lifecycle-recover": {"func": "lifecycle.tasks.recover", "minutes": 1},
    "lifecycle-expire-facts": {"func": "lifecycle.tasks.expire_facts", "minutes": 24 * 60},
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
        if not created and (schedule.func, schedule.minutes, schedule.schedule_type) != (
            spec["func"], spec["minutes"], Schedule.MINUTES
        ):
            schedule.func, schedule.minutes, schedule.schedule_type = spec["func"], spec["minutes"], Schedule.MINUTES
            schedule.save(update_fields=["func", "minutes", "schedule_type"])
