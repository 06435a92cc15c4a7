"""Recurring jobs created by name, safely when several processes run `migrate` at once.

Every app declares its schedules as a mapping of name -> spec and calls `ensure_named` from
its post_migrate handler. The check-then-create runs inside one transaction that holds a
database-wide lock first (a transaction-scoped advisory lock on PostgreSQL; on SQLite the
IMMEDIATE transaction mode takes the write lock at BEGIN), so two processes never both see
"missing" and both insert. Duplicates left by an older release are healed: the oldest row
of a name is kept and updated, the others are deleted.

A schedule's next run is never more than one interval away (`pull_in_far_runs`): django-q2
moves a next run only forward from the last one, so a schedule that ran while the server's
clock was ahead (then set back) would wait out the whole difference. Worker start, the
every-minute recovery and the cluster's guard (ops/cluster.py) bring such runs back to one
interval from now.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

log = logging.getLogger(__name__)

# An arbitrary constant naming this lock among the database's advisory locks.
_ADVISORY_KEY = 0x4C455448  # "LETH"


def ensure_named(specs: dict[str, dict[str, Any]]) -> None:
    """Create or update each schedule `name -> {func, minutes?, kwargs?, schedule_type?}`
    (schedule type MINUTES unless given, repeating forever, first run now), one row per name.
    An interval schedule's next run is at most one interval away: when a release shortens an
    interval (daily to hourly), the new one applies from this start, not after the next run
    the old interval had planned."""
    from django_q.models import Schedule

    now = timezone.now()
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
        for name, spec in specs.items():
            wanted = {
                "func": spec["func"],
                "minutes": spec.get("minutes"),
                "kwargs": spec.get("kwargs"),
                "schedule_type": spec.get("schedule_type", Schedule.MINUTES),
            }
            rows = list(Schedule.objects.filter(name=name).order_by("id"))
            if len(rows) > 1:
                Schedule.objects.filter(pk__in=[row.pk for row in rows[1:]]).delete()
            if not rows:
                Schedule.objects.create(name=name, repeats=-1, next_run=now, **wanted)
                continue
            changes = {key: value for key, value in wanted.items() if getattr(rows[0], key) != value}
            every = interval(wanted["schedule_type"], wanted["minutes"])
            if every is not None and rows[0].next_run and rows[0].next_run > now + every:
                changes["next_run"] = now + every
            if changes:
                Schedule.objects.filter(pk=rows[0].pk).update(**changes)


def interval(schedule_type: str, minutes: int | None) -> timedelta | None:
    """The fixed time between two runs of a schedule type; None for calendar or cron ones."""
    from django_q.models import Schedule

    if schedule_type == Schedule.MINUTES:
        return timedelta(minutes=minutes) if minutes else None
    return {Schedule.HOURLY: timedelta(hours=1), Schedule.DAILY: timedelta(days=1),
            Schedule.WEEKLY: timedelta(weeks=1)}.get(schedule_type)


def pull_in_far_runs() -> int:
    """Bring every repeating schedule whose next run is more than one interval away to one
    interval from now; returns how many moved. Each row moves only if its next run is still
    the one read (a scheduler pass that moved it meanwhile wins)."""
    from django_q.models import Schedule

    now = timezone.now()
    moved = 0
    rows = (Schedule.objects.exclude(repeats=0).filter(next_run__gt=now)
            .values_list("pk", "schedule_type", "minutes", "next_run"))
    for pk, schedule_type, minutes, next_run in rows:
        every = interval(schedule_type, minutes)
        if every is not None and next_run > now + every:
            moved += Schedule.objects.filter(pk=pk, next_run=next_run).update(next_run=now + every)
    if moved:
        log.warning("%s schedules' next runs were more than one interval away (was the clock set "
                    "back?): each now runs within one interval", moved)
    return moved
