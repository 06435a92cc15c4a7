"""Migrations that have landed do not change, and the repairs of those that did, work.

A migration a database has applied is never read again, so a column or an index added to it
afterwards is missing from that database while `migrate` says there is nothing to do (r141).
Each migration file's digest is recorded in tests/migration_digests.json when it lands; a new
migration adds its line, a changed one fails here: what it would change goes in a new one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

ROOT = Path(__file__).resolve().parent.parent
DIGESTS = Path(__file__).with_name("migration_digests.json")


def _digests() -> dict[str, str]:
    return {str(path.relative_to(ROOT)): hashlib.sha256(path.read_bytes()).hexdigest()
            for app in ("console", "lifecycle", "remote", "retention", "insight", "ops")
            for path in sorted((ROOT / app / "migrations").glob("[0-9]*.py"))}


def test_no_landed_migration_has_changed():
    recorded = json.loads(DIGESTS.read_text())
    now = _digests()
    changed = sorted(name for name in recorded if name in now and now[name] != recorded[name])
    assert changed == [], (f"{changed} changed after landing: databases that applied them never see the change. "
                           "Put it in a new migration (a repair: console/schema_repair.py), and restore these.")
    assert sorted(set(recorded) - set(now)) == [], "a landed migration was removed"
    new = {name: digest for name, digest in now.items() if name not in recorded}
    assert new == {}, f"new migrations: add their lines to {DIGESTS.name}: {json.dumps(new, indent=1)}"


def _columns(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return {c.name for c in connection.introspection.get_table_description(cursor, table)}


def _indexes(table: str) -> set[str]:
    with connection.cursor() as cursor:
        return set(connection.introspection.get_constraints(cursor, table))


def _back_to(app: str, name: str) -> None:
    call_command("migrate", app, name, verbosity=0)


def _drop(app: str, migration: str, model: str, *, field: str | None = None, index: str | None = None) -> None:
    """Make the table as a database that applied the earlier form of `migration` has it."""
    state = MigrationExecutor(connection).loader.project_state((app, migration))
    historical = state.apps.get_model(app, model)
    with connection.schema_editor() as editor:
        if field:
            editor.remove_field(historical, historical._meta.get_field(field))
        if index:
            editor.remove_index(historical, next(i for i in historical._meta.indexes if i.name == index))


@pytest.mark.django_db(transaction=True)
def test_the_repairs_add_what_an_earlier_form_of_a_migration_left_out_and_nothing_twice():
    from remote.models import BoundDelete, EngineRead
    from retention.models import ToolPayloadPolicy

    _back_to("retention", "0011_toolpayloadpolicy_woken_by")
    _back_to("remote", "0012_engine_read_left_out")
    _drop("retention", "0011_toolpayloadpolicy_woken_by", "ToolPayloadPolicy", field="woken_by_name")
    _drop("remote", "0012_engine_read_left_out", "EngineRead", field="active_at")
    _drop("remote", "0012_engine_read_left_out", "EngineRead", field="started_at")  # r145: at bc5c7db
    _drop("remote", "0012_engine_read_left_out", "BoundDelete", index="bound_delete_requester_idx")
    assert "woken_by_name" not in _columns("retention_toolpayloadpolicy")
    assert not {"active_at", "started_at"} & _columns("remote_engineread")
    assert "bound_delete_requester_idx" not in _indexes("remote_bounddelete")

    call_command("migrate", verbosity=0)
    assert "woken_by_name" in _columns("retention_toolpayloadpolicy")
    assert {"active_at", "started_at"} <= _columns("remote_engineread")
    assert "bound_delete_requester_idx" in _indexes("remote_bounddelete")
    # What failed on such a database: the cleanup's settings row and the engine reads.
    ToolPayloadPolicy.objects.update_or_create(id=1, defaults={"woken_by_name": "alice"})
    assert ToolPayloadPolicy.objects.get(id=1).woken_by_name == "alice"
    EngineRead.objects.create(engine_url="http://engine.test")
    assert EngineRead.objects.filter(active_at__isnull=True).count() == 1
    assert BoundDelete.objects.count() == 0

    # A database migrated from the later form has them all: the repairs find nothing to add.
    _back_to("retention", "0011_toolpayloadpolicy_woken_by")
    _back_to("remote", "0012_engine_read_left_out")
    call_command("migrate", verbosity=0)
    assert ToolPayloadPolicy.objects.get(id=1).woken_by_name == "alice"
