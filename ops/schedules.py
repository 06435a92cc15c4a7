"""The ops app's recurring jobs, created idempotently by name after every migrate."""

from __future__ import annotations

from console.schedules import ensure_named

SCHEDULES = {
    # Its Task rows are not kept (one a minute would push real results out of the history).
    "ops-heartbeat": {"func": "ops.tasks.heartbeat", "minutes": 1, "kwargs": "{'q_options': {'save': False}}"},
}


def ensure_schedules(**kwargs) -> None:
    ensure_named(SCHEDULES)
