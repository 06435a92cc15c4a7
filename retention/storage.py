"""Database size and reusable space, read from the engine's own statistics.

Reusable space is what the database can use again for new rows without growing its files:
on SQLite the free-list pages (exactly what `VACUUM` returns to the file system); on
PostgreSQL dead row versions plus free space, in every table of the installation and in
its TOAST table (where large payloads live). With the `pgstattuple` extension installed
(migration console 0003 installs it where the role may) the figure is measured from the
pages themselves; without it, it is estimated from the statistics collector's dead-row
counts, which cannot see space a VACUUM already freed, and the page says "estimated".

Measuring reads pages of every table (over a second on a large database that autovacuum has
not caught up with), so on PostgreSQL pages and status reads never measure: they show the last
measurement with its time (`StorageSnapshot`, by the `measure-database` job every 15 minutes,
by each compaction and by `finish_erasure` after its rewrite), or the statistics' estimate
until there is one. A kept measurement larger than the database (made before a rewrite this
process did not see) is never shown: the estimate stands in until the next measurement.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone


@dataclass(frozen=True)
class DatabaseSize:
    engine: str
    file_bytes: int
    reusable_bytes: int
    reusable_is_estimate: bool
    reusable_measured_at: datetime | None = None  # None: measured now (or estimated now)


# The installation's tables (the connection's schema) and their TOAST tables.
_PG_RELATIONS = """
    SELECT c.oid FROM pg_class c
    WHERE c.relkind IN ('r', 'm') AND c.relnamespace = to_regnamespace(current_schema())::oid
    UNION ALL
    SELECT c.reltoastrelid FROM pg_class c
    WHERE c.relkind IN ('r', 'm') AND c.relnamespace = to_regnamespace(current_schema())::oid
      AND c.reltoastrelid <> 0
"""


def sqlite_pages(cursor) -> tuple[int, int, int]:
    """SQLite: (page size, pages in the file, free-list pages)."""
    figures = []
    for pragma in ("page_size", "page_count", "freelist_count"):
        cursor.execute(f"PRAGMA {pragma}")
        figures.append(cursor.fetchone()[0])
    return figures[0], figures[1], figures[2]


def short_of_room(folder: Path, needed: int) -> tuple[int, int] | None:
    """(free bytes, reserve) when the folder's disk cannot take `needed` more bytes and still
    keep DISK_RESERVE_BYTES free (what a backup and SQLite's Compact database leave for the
    database's own writes); None when it can."""
    free, reserve = shutil.disk_usage(folder).free, settings.DISK_RESERVE_BYTES
    return (free, reserve) if free < needed + reserve else None


def database_size(*, measure: bool = False) -> DatabaseSize:
    """The database's size and reusable space. On PostgreSQL with pgstattuple, `measure` reads
    the pages now and keeps the figure; without it the last kept measurement is given."""
    from retention.models import StorageSnapshot

    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            page_size, pages, free = sqlite_pages(cursor)
            # The files as they are on disk: page_count already counts the pages that are in
            # the -wal file only, so it and the -wal's size counted them twice (r53).
            name = str(connection.settings_dict["NAME"])
            on_disk = sum(os.stat(name + suffix).st_size for suffix in ("", "-wal") if os.path.exists(name + suffix))
            return DatabaseSize("sqlite", on_disk, min(free * page_size, on_disk), False)
        if connection.pg_version >= 150000:
            # This connection's row counts reach the statistics views at most once a second
            # (and at the end of a transaction); flush them so rows it just deleted count.
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_database_size(current_database())")
        total = cursor.fetchone()[0]
        if pgstattuple_installed(cursor):
            if not measure:
                kept = StorageSnapshot.load()
                # A kept figure larger than the database is from before a rewrite that gave the
                # space back (VACUUM FULL run by hand, say; Lethe's own rewrites measure again):
                # never shown beside a smaller file size, the statistics' estimate stands in.
                if (kept.reusable_measured_at is not None and kept.reusable_bytes is not None
                        and kept.reusable_bytes <= total):
                    return DatabaseSize("postgresql", total, kept.reusable_bytes, False, kept.reusable_measured_at)
            else:
                try:
                    # A role without pg_stat_scan_tables may not call it: fall back, in a savepoint
                    # so the caller's transaction stays usable.
                    with transaction.atomic():
                        reusable = measured_reusable(cursor)
                except DatabaseError:
                    pass
                else:
                    StorageSnapshot.objects.update_or_create(
                        id=1, defaults={"reusable_bytes": reusable, "reusable_measured_at": timezone.now()})
                    return DatabaseSize("postgresql", total, reusable, False)
        return DatabaseSize("postgresql", total, min(estimated_reusable(cursor), total), True)


def measure_database() -> int | None:
    """The `measure-database` job: reusable space measured and kept (PostgreSQL with
    pgstattuple; elsewhere nothing to keep, as reads are cheap)."""
    size = database_size(measure=True)
    return None if size.reusable_is_estimate else size.reusable_bytes


def pgstattuple_installed(cursor) -> bool:
    cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pgstattuple'")
    return cursor.fetchone() is not None


def measured_reusable(cursor) -> int:
    """Dead row versions and free space of every heap and TOAST table, from the pages
    (`pgstattuple_approx` skips pages the visibility map marks all-visible)."""
    cursor.execute(
        f"""
        SELECT COALESCE(SUM(s.dead_tuple_len + s.approx_free_space), 0)::bigint
        FROM ({_PG_RELATIONS}) AS r(oid), LATERAL pgstattuple_approx(r.oid::regclass) AS s
        """
    )
    return cursor.fetchone()[0]


def estimated_reusable(cursor) -> int:
    """Each heap and TOAST table's size times its share of dead rows, from the statistics
    collector (which lags by up to its reporting interval and does not count free space)."""
    cursor.execute(
        f"""
        SELECT COALESCE(SUM(
            pg_relation_size(s.relid)::numeric * s.n_dead_tup / GREATEST(s.n_live_tup + s.n_dead_tup, 1)
        ), 0)::bigint
        FROM pg_stat_all_tables s WHERE s.relid IN ({_PG_RELATIONS})
        """
    )
    return cursor.fetchone()[0]
