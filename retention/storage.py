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
        if connection.pg_version >= 150000:
            # This connection's row counts reach the statistics views at most once a second
            # (and at the end of a transaction); flush them so rows it just deleted count.
            cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_database_size(current_database())")
        total = cursor.fetchone()[0]
        # Dead tuples are space VACUUM makes reusable; their size is estimated from each
        # table's average row size, for the tables and their TOAST tables (where large text
        # and JSON values live).
        cursor.execute(
            """
            WITH rels AS (
                SELECT relid FROM pg_stat_user_tables
                UNION
                SELECT c.reltoastrelid FROM pg_class c
                JOIN pg_stat_user_tables u ON u.relid = c.oid
                WHERE c.reltoastrelid <> 0
            )
            SELECT COALESCE(SUM(
                pg_relation_size(s.relid)::numeric * s.n_dead_tup
                / GREATEST(s.n_live_tup + s.n_dead_tup, 1)
            ), 0)::bigint
            FROM pg_stat_all_tables s JOIN rels ON rels.relid = s.relid
            """
        )
        dead = cursor.fetchone()[0]
        return DatabaseSize("postgresql", total, dead, True)
