"""Recurring jobs, created idempotently by name after every migrate (catch-up off, as the
cluster is configured: after downtime a missed slot runs once, not once per missed day)."""

from __future__ import annotations

from django.utils import timezone

SCHEDULES = {
    "measure-engine-folder": {"func": "retention.tasks.measure_engine_folder", "minutes": 15},
    # Runs whose worker died (lease expired) are queued again; cheap when there are none.
    "tool-payloads-recover": {"func": "retention.jobs.tick", "minutes": 1},
    # The enabled policy's daily check (AC-TPR-003.1); does nothing while cleanup is off.
    "tool-payloads-daily-check": {"func": "retention.jobs.daily_check", "minutes": 24 * 60},
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
