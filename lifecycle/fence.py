"""The write fence: once a delete intent exists, nothing writes the conversation's content.

(Nor reads it: `check_readable` refuses the content reads, items and tool outputs, with the
same code and 410, from the intent on; the title is not shown either, `Conversation.shown_title`.)

Two layers, one rule:

- In the application, every write path (items, import, resume, archive and close, engine
  file writes, torn-tail recovery, fleet writes) locks the conversation row and calls
  `check_writable`, which refuses with `conversation_deletion_pending` unless the
  conversation is live. The intent takes the same row lock, so a write either finishes
  before the intent commits or sees it.
- In the database, triggers on every table the registry fences (erase and compact tables)
  refuse an INSERT or UPDATE of a row whose conversation has a `DeletionFence` row, on
  SQLite and PostgreSQL alike, so a late callback or a raw SQL write cannot recreate
  content. DELETE is allowed (it is how erasure works). On compact tables the one UPDATE
  allowed is clearing the content columns with nothing else changed. The conversation row
  itself may not go back to live, change its id or get a title again, nor be inserted
  again under its id (a delete and re-insert, or SQLite's REPLACE, fires no UPDATE trigger).

Both engines raise IntegrityError for a fence refusal: SQLite from RAISE(ABORT), PostgreSQL
from SQLSTATE 23L01 (class 23, integrity constraint violation). `is_fence_error` tells it
from a unique violation; catch it inside its own savepoint (`fenced_write`).

SQLite drops a table's triggers silently when a migration rebuilds the table (AlterField and
some AddField operations do). A migration that changes a fenced table calls
`install_fence_triggers` again at its end; tests list the triggers after all migrations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from lifecycle.errors import ActionRefused
from lifecycle.models import Conversation, ConversationState

CODE = "conversation_deletion_pending"
SQLSTATE = "23L01"
FENCE_TABLE = "lifecycle_deletionfence"


def refusal(state: str = ConversationState.PENDING_DELETE) -> ActionRefused:
    """The fence's refusal; one code whether the delete is under way or done, and words that
    say which."""
    if state == ConversationState.DELETED:
        return ActionRefused(CODE, _("This conversation was deleted; it accepts no more writes."))
    return ActionRefused(CODE, _("This conversation is being deleted; it accepts no more writes."))


def read_refusal(state: str = ConversationState.PENDING_DELETE) -> ActionRefused:
    """The refusal of a read of the conversation's content (its items, a tool's full output)
    once its delete intent exists: the fence's code, with 410 (the content is going or gone for
    good, as a tool output cleanup removed is), whether the delete is under way or done."""
    if state == ConversationState.DELETED:
        return ActionRefused(CODE, _("This conversation was deleted; its content is erased."), status=410)
    return ActionRefused(CODE, _("This conversation is being deleted; its content is being erased and can no "
                                 "longer be read."), status=410)


def check_readable(conversation: Conversation) -> None:
    """Refuse a read of the conversation's content unless it is live. A Pending delete can stay
    Pending for long (no worker, the engine offline, residue found) with its rows still
    there: they are not served meanwhile, as the screens say."""
    if conversation.state != ConversationState.LIVE:
        raise read_refusal(conversation.state)


def check_writable(conversation: Conversation) -> None:
    if conversation.state != ConversationState.LIVE:
        raise refusal(conversation.state)


def lock_writable(conversation: Conversation | int) -> Conversation:
    """Lock the conversation row and check the fence. Call inside `transaction.atomic()`."""
    pk = conversation if isinstance(conversation, int) else conversation.pk
    locked = Conversation.objects.select_for_update().get(pk=pk)
    check_writable(locked)
    return locked


def is_fence_error(exc: BaseException) -> bool:
    if not isinstance(exc, IntegrityError):
        return False
    cause = exc.__cause__
    if getattr(cause, "sqlstate", None) == SQLSTATE:
        return True
    return getattr(cause, "sqlite_errorname", "") == "SQLITE_CONSTRAINT_TRIGGER" and str(cause) == CODE


@contextlib.contextmanager
def fenced_write() -> Iterator[None]:
    """A savepoint whose fence refusal from the database becomes a clean ActionRefused."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as exc:
        if is_fence_error(exc):
            raise refusal() from exc
        raise


# ---- Database triggers ---------------------------------------------------------------------


def _fenced(connection) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """(table, conversation column, columns a compaction clears, every column) for each
    fenced table that exists in this database."""
    from lifecycle.registry import RetentionClass, fenced_tables

    with connection.cursor() as cursor:
        existing = set(connection.introspection.table_names(cursor))
        out = []
        for s in fenced_tables():
            table = s.db_table
            if table not in existing:
                continue
            columns = tuple(c.name for c in connection.introspection.get_table_description(cursor, table))
            cleared = s.content_columns() if s.retention == RetentionClass.COMPACT else ()
            out.append((table, s.lookup, tuple(c for c in cleared if c in columns), columns))
    return out


def _tombstone(connection) -> tuple[str, tuple[str, ...]] | None:
    from lifecycle.registry import STORES

    with connection.cursor() as cursor:
        existing = set(connection.introspection.table_names(cursor))
    for s in STORES:
        if s.tombstone and s.db_table in existing:
            return s.db_table, s.content_columns()
    return None


def trigger_names(connection) -> set[tuple[str, str]]:
    """(trigger, table) pairs that `install_fence_triggers` creates in this database."""
    names = set()
    tables = [t for t, *_rest in _fenced(connection)]
    tomb = _tombstone(connection)
    if connection.vendor == "sqlite":
        for t in tables:
            names |= {(f"lethe_fence_{t}_insert", t), (f"lethe_fence_{t}_update", t)}
        if tomb:
            names |= {(f"lethe_fence_{tomb[0]}_update", tomb[0]), (f"lethe_fence_{tomb[0]}_reinsert", tomb[0])}
    else:
        for t in tables:
            names |= {(f"lethe_fence_{t}_insert", t), (f"lethe_fence_{t}_update", t)}
        if tomb:
            names |= {(f"lethe_fence_{tomb[0]}", tomb[0]), (f"lethe_fence_{tomb[0]}_reinsert", tomb[0])}
    return names


def installed_triggers(connection) -> set[tuple[str, str]]:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'lethe_fence_%'")
        else:
            cursor.execute(
                "SELECT tgname, relname FROM pg_trigger JOIN pg_class ON pg_class.oid = tgrelid "
                "WHERE NOT tgisinternal AND tgname LIKE 'lethe_fence_%%'"
            )
        return {(name, table) for name, table in cursor.fetchall()}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_statements(connection) -> list[str]:
    fenced_new = f"EXISTS (SELECT 1 FROM {FENCE_TABLE} WHERE conversation_id = NEW.%s)"
    fenced_old = f"EXISTS (SELECT 1 FROM {FENCE_TABLE} WHERE conversation_id = OLD.%s)"
    raise_it = f"BEGIN SELECT RAISE(ABORT, '{CODE}'); END"
    out = []
    for table, column, cleared, columns in _fenced(connection):
        col = _q(column)
        out += [
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_insert",
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_update",
            f"CREATE TRIGGER lethe_fence_{table}_insert BEFORE INSERT ON {_q(table)} "
            f"WHEN {fenced_new % col} {raise_it}",
        ]
        when = f"({fenced_new % col} OR {fenced_old % col})"
        if cleared:
            only_cleared = " AND ".join(
                [f"NEW.{_q(c)} IS NULL" for c in cleared]
                + [f"NEW.{_q(c)} IS OLD.{_q(c)}" for c in columns if c not in cleared]
            )
            when += f" AND NOT ({only_cleared})"
        out.append(f"CREATE TRIGGER lethe_fence_{table}_update BEFORE UPDATE ON {_q(table)} WHEN {when} {raise_it}")
    tomb = _tombstone(connection)
    if tomb:
        table, content = tomb
        restored = " OR ".join(f"(COALESCE(NEW.{_q(c)}, '') <> '' AND NEW.{_q(c)} IS NOT OLD.{_q(c)})" for c in content)
        out += [
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_update",
            f"CREATE TRIGGER lethe_fence_{table}_update BEFORE UPDATE OF {', '.join(_q(c) for c in ('state', 'id', *content))} "
            f"ON {_q(table)} WHEN EXISTS (SELECT 1 FROM {FENCE_TABLE} WHERE conversation_id = OLD.id) "
            f"AND (NEW.state = 'live' OR NEW.id IS NOT OLD.id OR {restored}) {raise_it}",
            # A fenced row deleted and inserted again (REPLACE does both, firing no UPDATE
            # trigger) would come back live: its id may not be inserted while fenced.
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_reinsert",
            f"CREATE TRIGGER lethe_fence_{table}_reinsert BEFORE INSERT ON {_q(table)} "
            f"WHEN EXISTS (SELECT 1 FROM {FENCE_TABLE} WHERE conversation_id = NEW.id) {raise_it}",
        ]
    return out


_PG_RAISE = f"RAISE EXCEPTION USING ERRCODE = '{SQLSTATE}', MESSAGE = '{CODE}';"


def _postgresql_statements(connection) -> list[str]:
    out = [
        # INSERT: one index probe of the fence table (PERFORM/FOUND is plpgsql's cheapest test).
        f"""CREATE OR REPLACE FUNCTION lethe_fence_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM {FENCE_TABLE} f WHERE f.conversation_id = NEW.conversation_id;
  IF FOUND THEN
    {_PG_RAISE}
  END IF;
  RETURN NEW;
END $$""",
        # UPDATE: the row before and after; the trigger's arguments name the columns a
        # compaction may clear (none on erase tables).
        f"""CREATE OR REPLACE FUNCTION lethe_fence_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM {FENCE_TABLE} f WHERE f.conversation_id IN (NEW.conversation_id, OLD.conversation_id);
  IF NOT FOUND THEN
    RETURN NEW;
  END IF;
  IF TG_NARGS > 0
     AND (to_jsonb(NEW) - TG_ARGV) = (to_jsonb(OLD) - TG_ARGV)
     AND NOT EXISTS (SELECT 1 FROM unnest(TG_ARGV) AS c WHERE to_jsonb(NEW) -> c <> 'null'::jsonb) THEN
    RETURN NEW;
  END IF;
  {_PG_RAISE}
END $$""",
    ]
    for table, column, cleared, _columns in _fenced(connection):
        if column != "conversation_id":
            raise ValueError(f"fenced table {table} must point at the conversation through conversation_id")
        args = ", ".join("'" + c.replace("'", "''") + "'" for c in cleared)
        out += [
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_insert ON {_q(table)}",
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_update ON {_q(table)}",
            f"CREATE TRIGGER lethe_fence_{table}_insert BEFORE INSERT ON {_q(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION lethe_fence_insert()",
            f"CREATE TRIGGER lethe_fence_{table}_update BEFORE UPDATE ON {_q(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION lethe_fence_update({args})",
        ]
    tomb = _tombstone(connection)
    if tomb:
        table, content = tomb
        restored = " OR ".join(
            f"(COALESCE(NEW.{_q(c)}::text, '') <> '' AND NEW.{_q(c)} IS DISTINCT FROM OLD.{_q(c)})" for c in content
        )
        watched = " OR ".join(f"NEW.{_q(c)} IS DISTINCT FROM OLD.{_q(c)}" for c in ("state", "id", *content))
        out += [
            f"""CREATE OR REPLACE FUNCTION lethe_fence_tombstone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM {FENCE_TABLE} f WHERE f.conversation_id = OLD.id)
     AND (NEW.state = 'live' OR NEW.id <> OLD.id OR {restored}) THEN
    {_PG_RAISE}
  END IF;
  RETURN NEW;
END $$""",
            f"DROP TRIGGER IF EXISTS lethe_fence_{table} ON {_q(table)}",
            # Only updates that touch the state, the id or the content call the function:
            # the append path's `last_activity_at` update does not.
            f"CREATE TRIGGER lethe_fence_{table} BEFORE UPDATE ON {_q(table)} "
            f"FOR EACH ROW WHEN ({watched}) EXECUTE FUNCTION lethe_fence_tombstone()",
            # A fenced row deleted and inserted again in one transaction (the fence's foreign
            # key is checked at commit) would come back live: its id may not be inserted.
            f"""CREATE OR REPLACE FUNCTION lethe_fence_reinsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM 1 FROM {FENCE_TABLE} f WHERE f.conversation_id = NEW.id;
  IF FOUND THEN
    {_PG_RAISE}
  END IF;
  RETURN NEW;
END $$""",
            f"DROP TRIGGER IF EXISTS lethe_fence_{table}_reinsert ON {_q(table)}",
            f"CREATE TRIGGER lethe_fence_{table}_reinsert BEFORE INSERT ON {_q(table)} "
            f"FOR EACH ROW EXECUTE FUNCTION lethe_fence_reinsert()",
        ]
    return out


def install_fence_triggers(connection, execute=None) -> None:
    """Create (or recreate) the fence triggers on every fenced table that exists. Idempotent;
    a migration that rebuilds a fenced table calls it again (pass `schema_editor.connection`
    and `schema_editor.execute`)."""
    statements = _sqlite_statements(connection) if connection.vendor == "sqlite" else _postgresql_statements(connection)
    if execute is not None:
        for sql in statements:
            execute(sql, params=None)
        return
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)


def remove_fence_triggers(connection) -> None:
    with connection.cursor() as cursor:
        for name, table in installed_triggers(connection):
            if connection.vendor == "sqlite":
                cursor.execute(f"DROP TRIGGER IF EXISTS {_q(name)}")
            else:
                cursor.execute(f"DROP TRIGGER IF EXISTS {_q(name)} ON {_q(table)}")
        if connection.vendor == "postgresql":
            for function in ("lethe_fence_insert", "lethe_fence_update", "lethe_fence_tombstone",
                             "lethe_fence_reinsert"):
                cursor.execute(f"DROP FUNCTION IF EXISTS {function}()")
