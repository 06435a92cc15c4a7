"""Recurring jobs created by name, safely when several processes run `migrate` at once.

Every app declares its schedules as a mapping of name -> spec and calls `ensure_named` from
its post_migrate handler. The check-then-create runs inside one transaction that holds a
database-wide lock first (a transaction-scoped advisory lock on PostgreSQL; on SQLite the
IMMEDIATE transaction mode takes the write lock at BEGIN), so two processes never both see
"missing" and both insert. Duplicates left by an older release are healed: the oldest row
of a name is kept and updated, the others are deleted.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

# An arbitrary constant naming this lock among the database's advisory locks.
_ADVISORY_KEY = 0x4C455448  # "LETH"


def ensure_named(specs: dict[str, dict[str, Any]]) -> None:
    """Create or update each schedule `name -> {func, minutes?, kwargs?, schedule_type?}`
    (schedule type MINUTES unless given, repeating forever, first run now), one row per name.
    A MINUTES schedule's next run is at most one interval away: when a release shortens an
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
            if wanted["schedule_type"] == Schedule.MINUTES and wanted["minutes"] and rows[0].next_run:
                latest = now + timedelta(minutes=wanted["minutes"])
                if rows[0].next_run > latest:
                    changes["next_run"] = latest
            if changes:
                Schedule.objects.filter(pk=rows[0].pk).update(**changes)
