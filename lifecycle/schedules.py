"""The lifecycle's recurring jobs, created idempotently by name after every migrate (catch-up
off, as the cluster is configured). The twin of retention/schedules.py."""

from __future__ import annotations

from console.schedules import ensure_named

SCHEDULES = {
    "lifecycle-recover": {"func": "lifecycle.tasks.recover", "minutes": 1},
    # Hourly, so a fact goes within an hour of its period's end. A run with nothing due reads
    # indexes only (lifecycle.actions.expire_facts). Daily before: an existing daily schedule
    # becomes hourly at the next migrate, its next run at most an hour away.
    "lifecycle-expire-facts": {"func": "lifecycle.tasks.expire_facts", "minutes": 60},
}


def ensure_schedules(**kwargs) -> None:
    ensure_named(SCHEDULES)
