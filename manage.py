#!/usr/bin/env python
from __future__ import annotations

import os
import sys
import time


def unreachable(database: dict, error: Exception) -> str | None:
    """One line for a database server that could not be reached (the connection never opened);
    None for any other error. The driver's first line says why; it never holds the password."""
    from django.db import OperationalError, connection

    if not isinstance(error, OperationalError) or connection.connection is not None:
        return None
    where = f"{database.get('HOST') or 'localhost'}:{database.get('PORT') or 5432}"
    why = (str(error).strip().splitlines() or ["no reason given"])[0]
    if "FATAL:" in why:
        # The server answered and refused (r149: "cannot be reached ... Start it" for a database
        # not yet created on a running server). What to do depends on why (r154: a setting it
        # refused, too many clients, a server starting up were told to create the database).
        said = why.split("FATAL:", 1)[1].strip()
        if " does not exist" in said and ("database " in said or "role " in said):
            advice = "Create the database or its role (docs/deploy.md), or correct DATABASE_URL"
        else:
            advice = "Correct DATABASE_URL or the server's settings, or wait for the server if it is starting or full"
        return (f"The database server {where} refused the connection to database {database.get('NAME')}: "
                f"{said}. {advice}, then start again.")
    return (f"The database server {where} (database {database.get('NAME')}) cannot be reached: {why}. Start it, or "
            "correct DATABASE_URL, then start again.")


def not_migrated(database: dict, error: Exception) -> str | None:
    """One line for a database that holds no Lethe tables (never migrated, or DATABASE_URL names
    another database); None for any other error."""
    cause = getattr(error, "__cause__", None)
    text = str(error)
    missing = text.startswith("no such table:") or getattr(cause, "sqlstate", None) == "42P01"
    if text.startswith("no such column:") or getattr(cause, "sqlstate", None) == "42703":
        # A column this release added: the database is one migrate behind (a backup restored
        # from before an upgrade, r32), if any migration is unapplied; else not this one's words.
        try:
            from django.db import connection
            from django.db.migrations.executor import MigrationExecutor

            executor = MigrationExecutor(connection)
            behind = bool(executor.migration_plan(executor.loader.graph.leaf_nodes()))
        except Exception:  # noqa: BLE001 (only whether to explain depends on it)
            behind = False
        if behind:
            return (f"The database {database.get('NAME')} lacks a column this release uses ({text.splitlines()[0]}): "
                    "its migrations are not all applied. Run manage.py migrate.")
        return None
    if not missing:
        return None
    try:
        from django.db import connection

        migrated = "django_migrations" in connection.introspection.table_names()
    except Exception:  # noqa: BLE001 (only the wording depends on it)
        migrated = False
    if migrated:  # Lethe's tables, one missing: an upgrade whose migrate has not run
        return (f"The database {database.get('NAME')} lacks a table this release uses ({text.splitlines()[0]}): "
                "its migrations are not all applied. Run manage.py migrate.")
    return (f"The database {database.get('NAME')} has no Lethe tables ({text.splitlines()[0]}): it was never "
            "migrated, or DATABASE_URL names another database. Run manage.py migrate, or correct DATABASE_URL.")


def locked(database: dict, error: Exception) -> str | None:
    """One line for a SQLite database whose write lock another process held for longer than
    this command waits (a compaction, a backup, an operator's sqlite3 shell); None for any other
    error."""
    cause = getattr(error, "__cause__", None) or error
    code = getattr(cause, "sqlite_errorcode", None)
    if not ((code is not None and code & 0xFF == 5) or str(error).startswith("database is locked")):
        return None
    waited = database.get("OPTIONS", {}).get("timeout", 5)
    return (f"The database {database.get('NAME')} is busy: another process held its write lock for the {waited:g} s "
            "this command waited (a compaction, a backup or an open sqlite3 shell can). The step it was taking was "
            "not written; what it finished before stays. Run it again once the other process is done.")


def full(database: dict, error: Exception) -> str | None:
    """One line for a database whose disk is full (SQLite's "database or disk is full", PostgreSQL's
    disk_full); None for any other error."""
    from console.busy import is_database_full

    if not is_database_full(error):
        return None
    why = (str(error).strip().splitlines() or ["no reason given"])[0]
    return (f"The database {database.get('NAME')} is full: the disk it is on has no room left ({why}). The step the "
            "command was taking was not written; what it finished before stays. Free space on that disk, then run "
            "it again.")


def refused(database: dict, error: Exception) -> str | None:
    """One line for a PostgreSQL database that refused the command a write (SQLSTATE 25006: a
    standby, or read-only transactions) or refused its user a table (42501); None for any other
    error. (r114: a traceback.)"""
    from console.busy import database_refuses

    kind = database_refuses(error)
    if kind is None:
        return None
    done = "The step the command was taking was not written; what it finished before stays. "
    why = (str(error).strip().splitlines() or ["no reason given"])[0]
    if kind == "read_only":
        try:  # a standby, or read-only transactions, as serve says them
            from ops.health import postgresql_cannot_write_message

            explained = postgresql_cannot_write_message(database, then="run the command again", done=done)
        except Exception:  # noqa: BLE001 (only the wording depends on it)
            explained = None
        return explained or (
            f"The database {database.get('NAME')} takes no writes ({why}): it is a standby, or its transactions "
            f"are read-only. {done}Set DATABASE_URL to a database that takes writes, then run the command again.")
    return (f"The database {database.get('NAME')} did not allow its user what the command needed ({why}). {done}"
            "Grant that user SELECT, INSERT, UPDATE and DELETE on all of Lethe's tables (or set DATABASE_URL to the "
            "user that ran manage.py migrate), then run the command again.")


def missing_file(error: Exception) -> str | None:
    """The words of a SQLite database file missing from its path (console/sqlite/base.py says
    why and what to do); None for any other error."""
    from console.sqlite.base import MissingDatabaseFile

    cause = getattr(error, "__cause__", None) or error
    return " ".join(str(cause).split()) if isinstance(cause, MissingDatabaseFile) else None


def damaged_file(database: dict, error: Exception) -> str | None:
    """The words of a SQLite database file that is damaged or is no SQLite database (a truncated
    or changed copy restored in its place, another engine's dump copied there; r146: a traceback
    of 90 lines); None for any other error."""
    cause = getattr(error, "__cause__", None) or error
    said = str(cause)
    if "database disk image is malformed" not in said and "file is not a database" not in said:
        return None
    path = os.path.abspath(str(database["NAME"]))
    what = "is damaged" if "malformed" in said else "is not a SQLite database"
    return (f"The database file {path} {what} ({said}). Nothing was done. Restore it from a backup that verifies "
            "(docs/operations.md, Backups and restore), or set DATABASE_URL to the right file.")


def watch_database_file(connection):
    """For the job cluster on SQLite: a watch on the database file it opened (None otherwise)."""
    if connection.vendor != "sqlite" or connection.is_in_memory_db():
        return None
    from console.sqlite.base import watch_file

    path = os.path.abspath(connection.settings_dict["NAME"])
    watched = watch_file(path)
    watched.path = path
    return watched


def file_changed_line(path: str, reason: str) -> str:
    """One line for a job cluster stopped because its database file was moved, deleted or replaced."""
    if reason == "missing":
        return (f"The database file {path} was moved or deleted while the job cluster ran: it stopped rather than "
                "write into a file no longer at its path. Put the file back, then start it again.")
    return (f"The database file {path} was replaced while the job cluster ran (another file is at its path now): it "
            "stopped rather than write into the one it had open, which nobody reads any more. Start it again (and "
            "the web server, whose /readyz says replaced) to use the file now at the path.")


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db import DatabaseError

    for argument in sys.argv[1:]:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 (surrogate-escaped by Python)
            shown = argument.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
            print(f"Lethe: an argument is not UTF-8 text ({shown}); nothing was done.", file=sys.stderr)
            sys.exit(2)
    watched = None
    try:
        # Read the settings first: a bad environment value stops here, with its own message
        # (Django would otherwise hold it back, or show another error in its place).
        settings.INSTALLED_APPS  # noqa: B018
        if sys.argv[1:2] == ["qcluster"]:
            # The job cluster starts its processes before any of them reads the database, and each
            # prints its own traceback when the server cannot be reached: reach it here first.
            import django
            from django.db import connection

            django.setup()
            connection.ensure_connection()
            from console.management.commands.serve import database_problem_at_start

            # As serve: not on a database it cannot write (r114: a PostgreSQL standby, read-only
            # transactions or a user without the privileges; each job's write failed in turn).
            if problem := database_problem_at_start():
                print(f"Lethe database error: {problem}", file=sys.stderr)
                sys.exit(2)
            watched = watch_database_file(connection)
        try:
            execute_from_command_line(sys.argv)
            if watched is not None:
                # qcluster returns once its processes started; they run until stopped. Wait
                # here, so a stop by the watch ends with its line and exit status.
                import multiprocessing

                while multiprocessing.active_children():
                    time.sleep(0.5)
        finally:  # the cluster stopped by the watch ends with its line and status 2, however it ended
            if watched is not None and watched.is_set():
                print(f"Lethe database error: {file_changed_line(watched.path, watched.reason)}", file=sys.stderr)
                sys.exit(2)
    except ImproperlyConfigured as error:
        if "--traceback" in sys.argv:
            raise
        # One line, no traceback: the message names the variable, the value and what is accepted.
        message = " ".join(str(error).split())
        print(f"Lethe configuration error: {message}", file=sys.stderr)
        sys.exit(2)
    except DatabaseError as error:
        # A SQLite database Lethe cannot write (a read-only disk or folder, a file of another
        # user): one line naming the file or folder and what to do, instead of the traceback.
        from console.sqlite.base import cannot_write_explained

        database = settings.DATABASES["default"]
        if database["ENGINE"] == "console.sqlite":
            explained = (cannot_write_explained(database, error) or locked(database, error) or full(database, error)
                         or missing_file(error) or damaged_file(database, error))
        else:
            explained = unreachable(database, error) or full(database, error) or refused(database, error)
        explained = explained or not_migrated(database, error)
        if explained is None or "--traceback" in sys.argv:
            raise
        print(f"Lethe database error: {explained}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        # Ctrl-C: one line, not a traceback (each command commits its work in steps; what it
        # committed before stays, and running it again goes on from there).
        if "--traceback" in sys.argv:
            raise
        print("\nInterrupted.", file=sys.stderr)
        sys.exit(130)


def quiet_broken_pipe() -> None:
    """The reader of the output went away (`manage.py ... | head -1`): status 1, no traceback,
    and what is still buffered goes nowhere, so the exit does not fail on it again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)


if __name__ == "__main__":
    try:
        try:
            main()
        finally:  # output a command left buffered, written while the reader may still be there
            sys.stdout.flush()
    except BrokenPipeError:
        quiet_broken_pipe()
