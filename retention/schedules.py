"""Recurring jobs, created idempotently by name after every migrate (catch-up off, as the
cluster is configured: after downtime a missed slot runs once, not once per missed day)."""

from __future__ import annotations

from console.schedules import ensure_named

SCHEDULES = {
    "measure-engine-folder": {"func": "retention.tasks.measure_engine_folder", "minutes": 15},
    # PostgreSQL's reusable space, read from the pages: too slow for every page view.
    "measure-database": {"func": "retention.storage.measure_database", "minutes": 15},
    # Runs whose worker died (lease expired) are queued again; cheap when there are none.
    "tool-payloads-recover": {"func": "retention.jobs.tick", "minutes": 1},
    # The enabled policy's daily check (AC-TPR-003.1); does nothing while cleanup is off.
    "tool-payloads-daily-check": {"func": "retention.jobs.daily_check", "minutes": 24 * 60},
}


def ensure_schedules(**kwargs) -> None:
    ensure_named(SCHEDULES)
