"""Health for monitors and load balancers: `/healthz` (the process answers) and `/readyz` (it
can do its work). Both are JSON, open without a session, and answered by OpsMiddleware before
anything else runs: no session, no host check (probes often use an address, not a name), no
HTTPS redirect, and `/healthz` never touches the database.

`/readyz` answers 200 when every check passes and 503 otherwise, always with each check:
- database: the default database answers and can take writes, shown without writing
  anything. SQLite: the file is at its configured path (else `missing`), is the very file
  the connection opened and the one this process (or the serve that started it) first opened
  (else `replaced`: deleted or swapped under the running process, or under the job cluster
  beside it, whose writes would go where nobody reads them), and it, its `-wal` and `-shm` and its
  folder (where WAL makes them) are writable (else `read_only`: a read-only mount, no write
  permission bit at all, which counts for root too, or none for this process's user), and
  that folder's disk has NO_SPACE_BYTES free (else `no_space`: SQLite's writes fail with
  "database or disk is full" any moment).
  PostgreSQL: not a standby in recovery (`in_recovery`), and new transactions are not
  read-only (`read_only`: `default_transaction_read_only` on in this connection's session,
  from the server, the database or the user, or stored for the database or the user since
  it started, which a connection opened before does not see);
- engine_folder: a file can be created, written, synced and removed in ENGINE_HOME (an
  unnamed temporary file, so a probe cut short leaves nothing behind; else `read_only` for a
  read-only mount or no permission, `no_space` for a full disk, or the errno's name), its disk
  has NO_SPACE_BYTES free (else `no_space`), and it is the folder this database uses
  (`missing`, `unmarked`, `not_this_folder`: lifecycle.engine_folder);
- job_cluster: a job finished on some job cluster within READYZ_HEARTBEAT_SECONDS (every
  cluster runs the `ops-heartbeat` job each minute, so an idle cluster still beats);
- migrations: none of the project's migrations is unapplied.
A failed check names the kind of error, never its text. When the database check fails, the
checks that read the database do not run (`{"ok": false, "error": "database"}`): on SQLite
they would open the missing file's path and create an empty database there.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from console.sqlite.base import first_identity, first_unwritable

DEFAULT_HEARTBEAT_SECONDS = 300
# Free bytes under which a disk counts as full: twice what SQLite's -wal grows to between
# checkpoints (1,000 pages, some 4 MB), so writes fail any moment. Not LETHE_DISK_RESERVE_BYTES
# (256 MiB), what the jobs that write copies leave free: below that the database still writes,
# and a server taken out of service for it would answer nothing.
NO_SPACE_BYTES = 8 * 1024**2


def _short_of_space(folder: str | os.PathLike) -> bool:
    return shutil.disk_usage(folder).free < NO_SPACE_BYTES


def _write_error(error: OSError) -> str:
    """How readiness names a failed write: the fix, not the system's text."""
    if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "read_only"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    return errno.errorcode.get(error.errno, type(error).__name__) if error.errno else type(error).__name__


def check_database() -> dict[str, Any]:
    if connection.vendor == "sqlite" and not connection.is_in_memory_db():
        error = _sqlite_file_error()
    else:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        error = _postgresql_write_error() if connection.vendor == "postgresql" else None
    return {"ok": False, "error": error} if error else {"ok": True}


def _sqlite_file_error() -> str | None:
    path = os.path.abspath(connection.settings_dict["NAME"])
    if not os.path.exists(path):  # before connecting: a new connection would create it, empty
        return "missing"
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return "missing"
    # The connection's file, and the one this process (or its serve) first opened: a web
    # worker's connection is new each request and always matches the path, while the job
    # cluster's may still hold the file that was there.
    for opened in (getattr(connection, "file_identity", None), first_identity(path)):
        if opened is not None and opened != (found.st_dev, found.st_ino):
            return "replaced"
    if first_unwritable(path):
        return "read_only"
    return "no_space" if _short_of_space(os.path.dirname(path)) else None


# default_transaction_read_only as stored by ALTER DATABASE / ALTER ROLE ... SET for this
# database and the role this connection signed in as, the most specific first, as PostgreSQL
# applies them when a connection starts: database and role, role, database, all roles.
STORED_READ_ONLY = """
    SELECT s.setconfig FROM pg_db_role_setting s
    WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database()))
      AND s.setrole IN (0, (SELECT oid FROM pg_roles WHERE rolname = session_user))
    ORDER BY s.setrole <> 0 DESC, s.setdatabase <> 0 DESC
"""


def _postgresql_write_error() -> str | None:
    """The session's own setting says what this connection can do; the stored ones say what
    the next connections get. A connection keeps the value it started with (CONN_MAX_AGE is
    60 s), so after ALTER DATABASE ... SET default_transaction_read_only = on the session
    alone would pass on some connections and fail on others for up to a minute."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
        in_recovery, read_only = cursor.fetchone()
        if in_recovery:
            return "in_recovery"
        if read_only == "on":
            return "read_only"
        cursor.execute(STORED_READ_ONLY)
        stored = [_stored_value(config or [], "default_transaction_read_only") for (config,) in cursor.fetchall()]
    first = next((value for value in stored if value is not None), None)
    return "read_only" if first is not None and _is_on(first) else None


# What Lethe's database user needs on each of its tables: the console and the jobs read, add,
# change and delete rows of them.
TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")

MISSING_PRIVILEGES = """
    SELECT t.name, array_agg(p.privilege ORDER BY p.n)
    FROM unnest(%s::text[]) AS t(name) CROSS JOIN unnest(%s::text[]) WITH ORDINALITY AS p(privilege, n)
    WHERE to_regclass(quote_ident(t.name)) IS NOT NULL
      AND NOT has_table_privilege(to_regclass(quote_ident(t.name)), p.privilege)
    GROUP BY t.name ORDER BY t.name
"""


def _postgresql_missing_privileges() -> list[tuple[str, list[str]]]:
    """Lethe's tables (its installed models') on which this connection's user lacks one of
    TABLE_PRIVILEGES, each with those it lacks. A table not there is left out: that is for
    migrate to make, and the first read says so."""
    tables = sorted(connection.introspection.django_table_names(include_views=False))
    with connection.cursor() as cursor:
        cursor.execute(MISSING_PRIVILEGES, [tables, list(TABLE_PRIVILEGES)])
        return [(name, list(privileges)) for name, privileges in cursor.fetchall()]


def postgresql_cannot_write_message(database: dict, *, then: str = "start again", done: str = "") -> str | None:
    """One line for an operator when the PostgreSQL database cannot take Lethe's writes: a
    standby, read-only transactions (/readyz's `in_recovery` and `read_only`, as checked there)
    or a user without the privileges on a table; which, and what to do. `done` (a sentence) is
    put before what to do; None when nothing is in the way. (r114: `serve` started on such a
    database, and every write was a 500.)"""
    name = database.get("NAME")
    problem = _postgresql_write_error()
    if problem == "in_recovery":
        return (f"The database {name} is a standby in recovery (a read-only replica): Lethe cannot write to it. "
                f"{done}Set DATABASE_URL to the primary server, then {then}.")
    if problem == "read_only":
        return (f"The database {name} is read-only: its transactions are read-only (default_transaction_read_only "
                "is on, in DATABASE_URL's options or for the server, the database or the user). "
                f"{done}Turn it off, or set DATABASE_URL to a database that takes writes, then {then}.")
    missing = _postgresql_missing_privileges()
    if not missing:
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_user")
        (user,) = cursor.fetchone()
    table, privileges = missing[0]
    verb = ("read" if privileges == ["SELECT"] else "read or write" if "SELECT" in privileges else "write")
    others = f"; it lacks privileges on {len(missing) - 1} more of Lethe's tables too" if len(missing) > 1 else ""
    return (f"The database user {user} cannot {verb} the table {table} of the database {name} (it lacks "
            f"{', '.join(privileges)} on it){others}. {done}Grant it SELECT, INSERT, UPDATE and DELETE on all of "
            f"Lethe's tables (or set DATABASE_URL to the user that ran manage.py migrate), then {then}.")


def _stored_value(config: list[str], name: str) -> str | None:
    """The value of `name` in a setconfig array ("name=value" entries), if it sets it."""
    for entry in config:
        key, _, value = entry.partition("=")
        if key.strip().lower() == name:
            return value
    return None


def _is_on(value: str) -> bool:
    """PostgreSQL's reading of a boolean: on, 1, or a prefix of true or yes."""
    value = value.strip().strip("'\"").lower()
    return value in ("on", "1") or (bool(value) and ("true".startswith(value) or "yes".startswith(value)))


def check_engine_folder(*, database_ok: bool = True) -> dict[str, Any]:
    """The engine folder takes a synced write. A console whose engine is remote (ENGINE_URL)
    keeps no engine folder: nothing to check (`serve` creates the folder of an embedded one)."""
    if settings.ENGINE_URL:
        return {"ok": True, "remote": True}
    root = settings.ENGINE_HOME
    if not os.path.isdir(root):
        return {"ok": False, "error": "missing"}
    try:
        with tempfile.TemporaryFile(dir=root) as probe:
            probe.write(b"ready")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as error:
        return {"ok": False, "error": _write_error(error)}
    if _short_of_space(root):  # the probe's few bytes fit, the engine's next write may not
        return {"ok": False, "error": "no_space"}
    # A writable folder that is not the one this database recorded (lifecycle.engine_folder):
    # an empty mount point, another install's folder. Not asked when the database cannot be read
    # (on SQLite, opening the missing file's path would create an empty database there); then
    # whether it is the folder is not known, and never said to be so (r42: a copy's folder read
    # ok while its disk was full).
    if not database_ok:
        return {"ok": False, "error": "database"}
    try:
        reason = _folder_problem()
    except DatabaseError:  # the database check says why
        return {"ok": False, "error": "database"}
    return {"ok": False, "error": reason} if reason else {"ok": True}


# A database that has recorded no folder decides whether it would take this one by scanning
# the folder's conversation areas against the database (lifecycle.engine_folder.not_adoptable).
# /readyz is open to anyone and polled often, so that answer is kept for FOLDER_SCAN_SECONDS
# while the folder's areas and mark stay as they were (same inode and modification time: a
# conversation folder created or removed changes its area's; not the folder itself, whose
# time the write probe above changes wherever a temporary file is created and then unlinked);
# a recorded folder is checked afresh every time (a query and the mark's read).
FOLDER_SCAN_SECONDS = 30.0
_scanned: dict[str, tuple[tuple, float, str | None]] = {}


def _folder_problem() -> str | None:
    import time

    from lifecycle import engine_folder
    from lifecycle.enginefs import CONVERSATION_AREAS, EngineHome

    home = EngineHome()
    if engine_folder.recorded() is not None:
        return engine_folder.problem(home)
    state = tuple(_stat_key(home.root / area) for area in (engine_folder.MARK_NAME, *CONVERSATION_AREAS))
    key, now = str(home.root), time.monotonic()
    kept = _scanned.get(key)
    if kept is not None and kept[0] == state and now - kept[1] < FOLDER_SCAN_SECONDS:
        return kept[2]
    reason = engine_folder.not_adoptable(home)
    _scanned.clear()  # one folder at a time: the entry never grows
    _scanned[key] = (state, now, reason)
    return reason


def _stat_key(path) -> tuple:
    try:
        found = os.stat(path)
    except OSError:
        return ()
    return (found.st_ino, found.st_mtime_ns, found.st_size)


def check_job_cluster() -> dict[str, Any]:
    from ops.jobs import last_heartbeat

    return job_cluster_state(last_heartbeat(heartbeat_limit()))


def heartbeat_limit() -> int:
    return int(getattr(settings, "READYZ_HEARTBEAT_SECONDS", DEFAULT_HEARTBEAT_SECONDS))


def job_cluster_state(beat) -> dict[str, Any]:
    """The readiness rule for the job cluster, given when a job last finished (None: never)."""
    limit = heartbeat_limit()
    if beat is None:
        return {"ok": False, "error": "never", "limit_seconds": limit}
    from ops.jobs import CLOCK_STEP

    now = timezone.now()
    if beat > now + CLOCK_STEP:
        # Stamped by a clock since set back: no sign that a cluster runs now. A running one
        # stamps its next job with the true time within a minute (ops.jobs._latest), and is ready.
        return {"ok": False, "error": "ahead_of_clock", "seconds_ahead": round((beat - now).total_seconds()),
                "limit_seconds": limit}
    age = max(0, round((now - beat).total_seconds()))
    return {"ok": age <= limit, "seconds_since_last_job": age, "limit_seconds": limit}


def cluster_stopped() -> dict[str, Any] | None:
    """{"since": when a job last finished, or None} when no job cluster has finished a job
    within the readiness limit (every cluster runs a heartbeat job each minute), so queued
    work waits; None while one runs. (The screens that say so: a pending delete, Data &
    storage.)"""
    from ops.jobs import CLOCK_STEP, last_heartbeat

    beat = last_heartbeat(heartbeat_limit())  # read once: the rule and the time shown are of the same job
    if job_cluster_state(beat)["ok"]:
        return None
    # (never a time ahead of the clock: "no job has finished since 4:34 p.m." at 2:34 p.m., r131)
    return {"since": beat if beat is not None and beat <= timezone.now() + CLOCK_STEP else None}


def check_migrations() -> dict[str, Any]:
    from django.db.migrations.executor import MigrationExecutor

    executor = MigrationExecutor(connection)
    unapplied = len(executor.migration_plan(executor.loader.graph.leaf_nodes()))
    return {"ok": unapplied == 0, "unapplied": unapplied}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "engine_folder": check_engine_folder,
    "job_cluster": check_job_cluster,
    "migrations": check_migrations,
}


# The checks that read the database: they run only once the database check passed.
READ_DATABASE = {"job_cluster", "migrations"}


# Database failures that leave it readable: the engine folder's mark is still compared.
READABLE_FAILURES = {"replaced", "read_only", "no_space", "in_recovery"}


def _readable(database: dict[str, Any]) -> bool:
    return database["ok"] or database.get("error") in READABLE_FAILURES


def run_checks() -> dict[str, dict[str, Any]]:
    results = {}
    for name, check in CHECKS.items():
        if name in READ_DATABASE and not results["database"]["ok"]:
            results[name] = {"ok": False, "error": "database"}
            continue
        try:
            if name == "engine_folder":  # its mark is compared with the database's only when that reads
                results[name] = check_engine_folder(database_ok=_readable(results["database"]))
            else:
                results[name] = check()
        except Exception as exc:  # a probe reports, it never raises
            results[name] = {"ok": False, "error": type(exc).__name__}
    return results


def _no_store(response: JsonResponse) -> JsonResponse:
    response["Cache-Control"] = "no-store"
    return response


def healthz(request: HttpRequest) -> JsonResponse:
    return _no_store(JsonResponse({"status": "ok"}))


def readyz(request: HttpRequest) -> JsonResponse:
    checks = run_checks()
    ready = all(result["ok"] for result in checks.values())
    return _no_store(JsonResponse({"status": "ready" if ready else "not_ready", "checks": checks},
                                  status=200 if ready else 503))
