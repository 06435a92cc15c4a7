"""The daily storage measurement, created idempotently by name after every migrate.

Safe when several processes migrate at once: the check-then-create runs in one transaction
that first takes a database-wide lock (a transaction-scoped advisory lock on PostgreSQL; on
SQLite the IMMEDIATE transaction takes the write lock at BEGIN), and duplicates of the name
are healed (the oldest row is kept).
"""

from __future__ import annotations

from django.db import connection, transaction
from django.utils import timezone

NAME = "measure-storage"
FUNC = "insight.tasks.measure_storage"
_ADVISORY_KEY = 0x4C455448  # the one lock every schedule creator of Lethe takes ("LETH")


def ensure_schedules(**kwargs) -> None:
    from django_q.models import Schedule

    wanted = {"func": FUNC, "schedule_type": Schedule.DAILY}
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_ADVISORY_KEY])
        rows = list(Schedule.objects.filter(name=NAME).order_by("id"))
        if len(rows) > 1:
            Schedule.objects.filter(pk__in=[row.pk for row in rows[1:]]).delete()
        if not rows:
            Schedule.objects.create(name=NAME, repeats=-1, next_run=timezone.now(), **wanted)
        elif any(getattr(rows[0], key) != value for key, value in wanted.items()):
            Schedule.objects.filter(pk=rows[0].pk).update(**wanted)
