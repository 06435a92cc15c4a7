"""What the benchmarks share."""

from __future__ import annotations

from django.db import connection


def settle() -> None:
    """Leave what was just written as data written some time ago is: in the table files, with
    a checkpoint since. A change then logs each page it touches in full the first time
    (PostgreSQL's full-page writes), as every real change to older rows does. Without this,
    whether a checkpoint happened to start between writing the data and timing a change to it
    decided which side of a comparison paid that (a 100,000-item delete: 120 to 200 ms
    without, 390 to 460 ms with). Needs the superuser or `pg_checkpoint` on PostgreSQL, as a
    scratch database allows."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("CHECKPOINT")
        else:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
