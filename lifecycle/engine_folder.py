"""Which engine folder this database uses: a mark in the folder, its copy in the database.

Why: a missing folder (a disk not mounted, a wrong or relative ENGINE_HOME) looks exactly like
an engine folder with nothing in it. Every file a delete erases is then "already gone", the
residue check finds nothing, and the receipt says Completed and clean while the real folder,
elsewhere, still holds the conversation's files. So the first time this database uses an
engine folder, the folder gets a mark (`.lethe-engine-folder`, a random id) and the database
keeps the same id (`EngineFolderMark`); from then on a folder is this database's only when it
is there and carries that id. What depends on it:

- the erasure executor does nothing while the folder is not the database's: the delete stays
  Pending (`engine_folder_unavailable`) and is retried, never completed against an empty folder;
- a new delete request is not admitted (Unavailable, nothing recorded): the subagent rows it
  must check live in that folder;
- `verify_erasure` refuses to check (it would report clean);
- `/readyz` says `missing`, `unmarked` or `not_this_folder`;
- `serve` creates the folder only while the database has recorded none (a new install).

A database that has recorded no folder yet (a new install, or one from before the mark) takes
the folder it finds only when that folder plausibly is its own: it holds the files of at least
one conversation this database has not deleted, or the database has no such conversation (so
no file of it can be elsewhere) and the folder carries no other database's mark. It creates a
folder only while it holds no conversation at all. Otherwise (a wrong ENGINE_HOME naming an empty or another folder) nothing is recorded:
the folder counts as `unmarked` (`not_this_folder` when it carries another mark), deletes wait
and the operator, after checking, marks it with `manage.py engine_folder --adopt`, as one who
replaced the folder on purpose does. A folder marked as another database's is adopted only
with `--take-from-other-database` too, and then gets a new mark (never two databases in one
folder).

The database also records where it was when it recorded the mark (`database_key`: the SQLite
file's path, or the PostgreSQL server and database). A copy of it elsewhere (a backup restored
into another database, the file copied or moved) carries the same row: for the copy the folder
is another database's (the original's, which may still erase in it) until the copy takes it
over with `--take-from-other-database`, keeping the original's key among its origins (whose
backups hold its content: retention.backups.own_keys).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

from django.db import IntegrityError, transaction

from lifecycle import faults
from lifecycle.enginefs import (
    EngineHome,
    UnsafeEnginePath,
    open_folder,
    opened_folder,
    read_regular,
    sync_folder,
)

MARK_NAME = ".lethe-engine-folder"
# Written (with this database's key) before a database that has recorded no folder marks one, and
# removed once the mark is recorded: a run killed in between (r73) finds the folder marked by
# itself, not by another database.
CLAIM_NAME = MARK_NAME + ".claim"
_ID = re.compile(r"[0-9a-f]{32}")
# How operator commands name each reason (English, as their other output).
WORDS = {"missing": "missing", "unmarked": "not marked as this database's engine folder",
         "not_this_folder": "another database's engine folder"}


def described(root: Path, reason: str) -> str:
    """The reason in words: "missing" for a path that holds a file is "not a folder" (r50)."""
    return "not a folder" if reason == "missing" and os.path.lexists(root) else WORDS[reason]


class EngineFolderUnavailable(Exception):  # noqa: N818 (a state of the folder, not a programming error)
    """ENGINE_HOME is not the engine folder this database uses. `reason`: "missing" (no folder
    there), "unmarked" (a folder without the mark) or "not_this_folder" (another one's mark)."""

    def __init__(self, root: Path, reason: str) -> None:
        super().__init__(f"{root}: {reason}")
        self.root, self.reason = root, reason


def folder_mark(home: EngineHome) -> str | None:
    """The id in the folder's mark; None when there is no folder, no mark or no readable id."""
    try:  # a link or a FIFO there is no mark (never followed nor waited on)
        text = read_regular(home.root / MARK_NAME).decode("ascii").strip()
    except (OSError, UnicodeDecodeError, UnsafeEnginePath):
        return None
    return text if _ID.fullmatch(text) else None


def recorded() -> str | None:
    from lifecycle.models import EngineFolderMark

    return EngineFolderMark.objects.filter(pk=1).values_list("folder_id", flat=True).first()


def _here() -> str:
    from retention.backups import database_key

    return database_key()


def is_copy() -> bool:
    """Whether this database is a copy of the one that recorded its mark: the mark was recorded
    by a database at another location (this one restored from its backup into another database,
    or its file moved or copied). The folder is then the original's, which may still erase in it,
    until this one takes it over (`adopt` with `take_from_other`: a new mark)."""
    from retention.backups import earlier_keys

    found = recorded_keys()
    # (a key of this database's in an earlier release's form is this database's: lifecycle 0029
    # brings it to today's form; a server running before that migration is not taken for a copy)
    return bool(found and found[0]) and found[0] != _here() and found[0] not in earlier_keys()


def lineage_keys(before: tuple[str, list] | None = None) -> list[str]:
    """The keys this database's backups may bear, to keep with its mark: its earlier keys
    (retention.backups.earlier_keys), and those recorded with the mark before (`before`: the
    row's key and origins, a database this one was copied from included). A copy made from a
    backup carries them, so it counts its original's backups as holding its content."""
    from retention.backups import earlier_keys

    here = _here()
    keys = [*((before[1] or []) if before else []), *([before[0]] if before and before[0] else []),
            *sorted(earlier_keys())]
    return list(dict.fromkeys(key for key in keys if isinstance(key, str) and key and key != here))


def recorded_keys() -> tuple[str, list] | None:
    """The key and origins recorded with the mark (None: no mark recorded). Read before the
    folder's mark is changed: a database one migration behind (a restore not migrated yet) fails
    here, with nothing changed (r33: it failed only after the folder's mark was replaced)."""
    from lifecycle.models import EngineFolderMark

    return EngineFolderMark.objects.filter(pk=1).values_list("database_key", "origin_keys").first()


def _record(folder_id: str, before: tuple[str, list] | None) -> None:
    """Record `folder_id` as this database's, made here, with the keys of its lineage (`before`:
    `recorded_keys()` read before the folder was marked)."""
    from lifecycle.models import EngineFolderMark

    EngineFolderMark.objects.update_or_create(pk=1, defaults={
        "folder_id": folder_id, "database_key": _here(), "origin_keys": lineage_keys(before)})


def problem(home: EngineHome | None = None) -> str | None:
    """Why ENGINE_HOME is not this database's engine folder, or None when it is (or when the
    database has recorded none yet and would take this one: see `not_adoptable`)."""
    home = home or EngineHome()
    expected = recorded()
    return not_adoptable(home) if expected is None else _reason(home, expected)


# How many folder names are looked up in the database at once.
_LOOKUP_BATCH = 500


def holds_files_of_known_conversations(home: EngineHome) -> bool:
    """Whether the folder holds a conversation folder (threads/, sessions/ or artifacts/<key>)
    of a conversation this database has not deleted. Stops at the first found."""
    from lifecycle.enginefs import CONVERSATION_AREAS
    from lifecycle.models import Conversation, ConversationState

    undeleted = Conversation.objects.exclude(state=ConversationState.DELETED)
    for area in CONVERSATION_AREAS:
        keys = home.conversation_keys(area)  # never through a link: one there holds none of them
        for start in range(0, len(keys), _LOOKUP_BATCH):
            if undeleted.filter(public_id__in=keys[start:start + _LOOKUP_BATCH]).exists():
                return True
    return False


def holds_conversations() -> bool:
    """Whether this database holds any conversation, deleted ones too (their residue would be
    looked for in its engine folder)."""
    from lifecycle.models import Conversation

    return Conversation.objects.exists()


def holds_undeleted_conversations() -> bool:
    """Whether this database holds a conversation it has not deleted (whose files must be in
    its engine folder)."""
    from lifecycle.models import Conversation, ConversationState

    return Conversation.objects.exclude(state=ConversationState.DELETED).exists()


def not_adoptable(home: EngineHome) -> str | None:
    """For a database that has recorded no folder: why it must not take the folder at
    ENGINE_HOME by itself ("missing", "unmarked", "not_this_folder"), None when it may. A wrong
    ENGINE_HOME taken here would have every file of the real folder counted as already gone."""

    if not home.root.is_dir():
        return "missing" if holds_conversations() else None
    mark = folder_mark(home)
    if mark is None and os.path.lexists(home.root / MARK_NAME):
        return "unmarked"  # a mark file that holds no id: not ours to overwrite unasked
    if not holds_undeleted_conversations():
        # No file of its can be elsewhere, but a folder another database marked holds that
        # one's files and its fleet rows: taken with that mark, both would erase and resolve
        # subagent rows in one folder. One this database marked itself (its claim) is its own.
        return None if mark is None or _claimed_here(home) else "not_this_folder"
    if holds_files_of_known_conversations(home):
        return None
    return "unmarked" if mark is None else "not_this_folder"


def _reason(home: EngineHome, expected: str) -> str | None:
    if not home.root.is_dir():
        return "missing"
    found = folder_mark(home)
    if found is None:
        return "unmarked"
    # A copy of the database that marked it (restored elsewhere, moved) carries the same id:
    # the folder is the original's until the copy takes it over (r30: both erased in it).
    return None if found == expected and not is_copy() else "not_this_folder"


def check(home: EngineHome | None = None) -> EngineHome:
    """Raise EngineFolderUnavailable unless ENGINE_HOME is this database's engine folder; a
    database that has recorded none takes this one (see adopt)."""
    home = home or EngineHome()
    reason = _reason(home, recorded() or adopt(home, force=False))
    if reason:
        raise EngineFolderUnavailable(home.root, reason)
    return home


def adopt(home: EngineHome | None = None, *, force: bool, take_from_other: bool = False) -> str:
    """Make ENGINE_HOME this database's engine folder and return its id.

    Without `force`, only while the database has recorded no folder, and only a folder that
    plausibly is this database's (`not_adoptable`): the folder's own mark is kept if it has one,
    else it gets a new one; a missing folder is created only while the database holds no
    conversation (a new install; with conversations, their files must be somewhere else).
    With `force` (an operator's `engine_folder --adopt`), the folder there
    now becomes the one, marked anew if it has no mark, whatever was recorded; but a folder
    marked as another database's (`problem` says "not_this_folder") is refused
    (EngineFolderUnavailable) unless `take_from_other`, and then gets a new mark: copying the
    other's id would have both databases erase in one folder, while with a new one the other
    counts it as not its own and its deletes wait."""
    from lifecycle.models import EngineFolderMark

    home = home or EngineHome()
    before = recorded_keys() if force else None  # (nothing changed yet if the schema is behind)
    reason = problem(home) if force else None
    if reason == "not_this_folder" and not take_from_other:
        raise EngineFolderUnavailable(home.root, "not_this_folder")
    if force and take_from_other and home.root.is_dir():
        # Always a new mark, even where this database says the folder is its own: a copy made
        # from a backup older than the key (r32) carries the original's mark and, migrated, its
        # own key; a new mark is what makes the original's deletes wait.
        folder_id = _mark(home, replace=True)
        _record(folder_id, before)
        return folder_id
    if not force and recorded() is not None:
        reason = problem(home)
        if reason:
            raise EngineFolderUnavailable(home.root, reason)
        return recorded()
    if not force and (reason := not_adoptable(home)):
        raise EngineFolderUnavailable(home.root, reason)
    if not home.root.is_dir():
        try:  # one folder at a time from /, never through a link put on the way since it was resolved
            os.close(open_folder(home.root, create=True, mode=0o700))
        except UnsafeEnginePath:
            raise EngineFolderUnavailable(home.root, "missing") from None
    # A new mark never replaces one another process wrote first (two adopts at once both
    # wrote theirs and recorded each its own: the folder ended up another database's); only a
    # mark file that holds no id is replaced, and only when asked (force).
    if not force:
        _claim(home)
    folder_id = folder_mark(home) or _mark(home, replace=False) or (_mark(home, replace=True) if force else None)
    if folder_id is None:  # a mark file there that holds no id: not ours to overwrite unasked
        raise EngineFolderUnavailable(home.root, "unmarked")
    if force:
        _record(folder_id, before)
        return folder_id
    faults.kill_point("engine-folder.marked")  # crash tests: the folder marked, the mark not recorded
    try:
        with transaction.atomic():
            EngineFolderMark.objects.create(pk=1, folder_id=folder_id, database_key=_here(),
                                            origin_keys=lineage_keys())
    except IntegrityError:  # another process recorded one first: theirs stands
        pass
    _unclaim(home)
    return recorded()


def _claim(home: EngineHome) -> None:
    """This database's key in the folder before it marks it (a claim there already stands)."""
    with opened_folder(home.root) as folder:
        try:
            fd = os.open(CLAIM_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        except FileExistsError:
            return
        try:
            os.write(fd, (_here() + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        sync_folder(folder)


def _claimed_here(home: EngineHome) -> bool:
    try:
        return read_regular(home.root / CLAIM_NAME).decode("ascii").strip() == _here()
    except (OSError, UnicodeDecodeError, UnsafeEnginePath):
        return False


def _unclaim(home: EngineHome) -> None:
    """The claim removed, once the mark is recorded (only this database's)."""
    if _claimed_here(home):
        with opened_folder(home.root) as folder, contextlib.suppress(FileNotFoundError):
            os.unlink(CLAIM_NAME, dir_fd=folder)


def _mark(home: EngineHome, *, replace: bool) -> str | None:
    """Write a new mark and return its id; without `replace`, a mark another process wrote
    first stands (never two ids) and its id is returned, None if it holds none."""
    folder_id = secrets.token_hex(16)
    temporary = f".{MARK_NAME}.{secrets.token_hex(8)}"
    # Every step in the folder's descriptor: a folder swapped for a link meanwhile takes nothing out.
    with opened_folder(home.root) as folder:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        try:
            os.write(fd, (folder_id + "\n").encode("ascii"))
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            if replace:
                os.replace(temporary, MARK_NAME, src_dir_fd=folder, dst_dir_fd=folder)
            else:  # fails when a mark is there already: the first one stands
                os.link(temporary, MARK_NAME, src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
        except FileExistsError:
            folder_id = folder_mark(home)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary, dir_fd=folder)
        sync_folder(folder)
    return folder_id
