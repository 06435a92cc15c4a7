"""The lifecycle's recurring jobs, created idempotently by name after every migrate (catch-up
off, as the cluster is configured). The twin of retention/schedules.py."""

from __future__ import annotations

from console.schedules import ensure_named

SCHEDULES = {
    "lifecycle-recover": {"func": "lifecycle.tasks.recover", "minutes": 1},
    "lifecycle-expire-facts": {"func": "lifecycle.tasks.expire_facts", "minutes": 24 * 60},
}


def ensure_schedules(**kwargs) -> None:
    ensure_named(SCHEDULES)
