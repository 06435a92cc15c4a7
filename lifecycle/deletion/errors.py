"""What stopped an erasure run, in words. The operation stores only the code."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

ERRORS = {
    "fleet_unreadable": _(
        "The subagent state file cannot be read, so its rows of this conversation cannot be removed. "
        "The delete stays pending and finishes once the file is repaired or restored."),
    "unsafe_path": _(
        "Where a folder of this conversation should be there is a symbolic link, a file or a path leading "
        "outside the engine folder, or another disk or folder is mounted in it, so nothing there was removed. "
        "The delete stays pending until an operator moves it aside or unmounts it."),
    "io_error": _("The engine folder could not be changed. The delete stays pending and is retried."),
    "engine_folder_read_only": _(
        "The engine folder could not be changed: it is on a read-only disk. The delete stays pending and is "
        "retried; it goes on once the folder can be written."),
    "engine_folder_full": _(
        "The engine folder could not be changed: its disk is full. The delete stays pending and is retried; "
        "it goes on once that disk has free space."),
    "backup_folder_unreadable": _(
        "The backup folder %(folder)s cannot be read (something that is not a readable folder is at that "
        "path), so the erasure receipt cannot name the backups that still hold this conversation. The delete "
        "stays pending and is retried; it goes on once that path is a folder Lethe can read, or "
        "LETHE_BACKUP_DIR names another folder."),
    "engine_folder_unavailable": _(
        "The engine folder is missing or is not the one this database uses (a disk not mounted, a wrong "
        "ENGINE_HOME, a folder another database uses, or this database is a copy of the one that uses it), so "
        "nothing in it was erased or counted as gone. The delete stays pending and is retried; it goes on once "
        "the folder is back, or once an operator has made it this database's: manage.py engine_folder says "
        "which it is and what to run."),
    "database_error": _("The database refused a step. The delete stays pending and is retried."),
    "internal_error": _("An unexpected error stopped the erasure. The delete stays pending and is retried."),
    "residue_found": _(
        "Something of this conversation was written again after its store was erased (by a process outside "
        "Lethe), and it was still there after a second erasure. The delete stays pending and is retried; "
        "manage.py verify_erasure names the store."),
    "stalled": _(
        "The erasure stopped several times without progress, so it is no longer retried by itself. "
        "An admin can retry it."),
}


def error_message(code: str | None) -> str:
    if code == "backup_folder_unreadable":  # the folder as configured now: the one to fix
        from retention.backups import configured_backup_dir

        return str(ERRORS[code]) % {"folder": configured_backup_dir()}
    return str(ERRORS[code]) if code in ERRORS else ""
