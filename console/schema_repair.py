"""Repairs for databases migrated while a migration still had an earlier form.

A migration once applied is never read again: a column or an index added to it afterwards
(r141, r145: retention 0011's `woken_by_name`, remote 0008's `started_at` and `active_at`,
remote 0003's `bound_delete_requester_idx`) is missing from every database that applied the
earlier form, and `migrate` says there is nothing to do. (Remote 0001's `binding_ref`, added
four minutes after the file, within one session, cannot be repaired this way: 0011, applied
since, needs it before any later migration runs.) A repair migration adds what is missing where it is
missing and does nothing where it is there (a database migrated from the later form).
tests/test_migration_history.py keeps a migration's file from changing once it has landed.
"""

from __future__ import annotations

from collections.abc import Callable


def add_missing(app_label: str, model_name: str, *, fields: tuple[str, ...] = (),
                indexes: tuple[str, ...] = ()) -> Callable:
    """A RunPython function adding `fields` (by name) and `indexes` (by name) of the model as the
    migration state has them, each only where the table lacks it."""

    def repair(apps, schema_editor) -> None:
        model = apps.get_model(app_label, model_name)
        table = model._meta.db_table
        connection = schema_editor.connection
        with connection.cursor() as cursor:
            columns = {c.name for c in connection.introspection.get_table_description(cursor, table)}
            constraints = set(connection.introspection.get_constraints(cursor, table))
        for name in fields:
            field = model._meta.get_field(name)
            if field.column not in columns:
                schema_editor.add_field(model, field)
        for name in indexes:
            if name not in constraints:
                schema_editor.add_index(model, next(i for i in model._meta.indexes if i.name == name))

    return repair
