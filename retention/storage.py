"""Database size and reusable space, read from the engine's own statistics."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.db import connection


@dataclass(frozen=True)
class DatabaseSize:
    engine: str
    file_bytes: int
    reusable_bytes: int
    reusable_is_estimate: bool


def database_size() -> DatabaseSize:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA page_size")
            page_size = cursor.fetchone()[0]
            cursor.execute("PRAGMA page_count")
            pages = cursor.fetchone()[0]
            cursor.execute("PRAGMA freelist_count")
            free = cursor.fetchone()[0]
            name = str(connection.settings_dict["NAME"])
            wal = Path(name + "-wal")
            wal_bytes = wal.stat().st_size if wal.exists() else 0
            return DatabaseSize("sqlite", pages * page_size + wal_bytes, free * page_size, False)
        cursor.execute("SELECT pg_database_size(current_database())")
        total = cursor.fetchone()[0]
        # Dead tuples are space VACUUM makes reusable; their size is estimated from each
        # table's average row size.
        cursor.execute(
            """
            SELECT COALESCE(SUM(
                pg_relation_size(relid)::numeric * n_dead_tup
                / GREATEST(n_live_tup + n_dead_tup, 1)
            ), 0)::bigint
            FROM pg_stat_user_tables
            """
        )
        dead = cursor.fetchone()[0]
        return DatabaseSize("postgresql", total, dead, True)
