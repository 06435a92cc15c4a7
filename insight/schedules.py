"""The daily storage measurement, created by name after every migrate, under the database-wide
lock every schedule creator of Lethe takes (console.schedules.ensure_named), duplicates healed."""

from __future__ import annotations

from console.schedules import ensure_named

NAME = "measure-storage"
FUNC = "insight.tasks.measure_storage"


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    ensure_named({NAME: {"func": FUNC, "schedule_type": Schedule.DAILY}})
