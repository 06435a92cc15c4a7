"""The engine data directory, written the way the engine writes it.

Layout under ENGINE_HOME (<thread> is the conversation's storage key, its public id, since
raw thread ids repeat across owners):

    threads/<thread>/events.jsonl                 per-thread event log
    sessions/<thread>/approval_receipts.jsonl     approval receipts (+ .lock, + torn-tail files)
    artifacts/<thread>/...                        large outputs and tool artifacts
    state/subagents.v1.json (+ subagents.v1.lock) workspace-wide subagent fleet snapshot
    legacy-state/subagents.v1.json                legacy copy, read once for migration

What this module guarantees, because the erasure executor deletes what it returns and a
person trusts what it reports:

- One root: ENGINE_HOME resolved once (`EngineHome.root`), so every path handed out or
  compared here (fleet files, locks, temporaries, conversation folders) has the same form.
- Per-conversation paths exist only for well-formed public ids (`c_` + 20 lowercase hex) and
  are their own resolved form under the resolved ENGINE_HOME: a symlink anywhere between the
  engine folder and a conversation folder raises `UnsafeEnginePath` instead of being followed.
- Whole-file writes: take the lock file (flock), write `.<name>.lethe-tmp-<16 hex>` in the
  same folder, fsync it, rename it over the target, fsync the folder. A reader never sees
  half a file; a writer that fails removes its temporary, and one killed at any line leaves
  the old file intact and at worst a temporary that `sweep_temporaries` removes under the
  same lock. New folders are fsynced into their parents.
- JSONL appends take the same lock, set aside a torn last line first (so a new record is
  never merged into it), write whole lines with O_APPEND and fsync; a failed append cuts
  the file back to where it started, so it leaves no torn line of its own.
- A torn last line goes to `<name>.torn-<n>` in three steps (save it as
  `.<name>.torn-pending`, cut the log, rename the pending file); a run that finds a pending
  file finishes the interrupted one first, so a crash at any point leaves exactly one torn
  file and a clean log.
- Every file here is opened by `open_regular`: never through a symlink (not at its own name,
  not in a folder on its way), never waiting on a FIFO, and only if it is a regular file;
  anything else raises `UnsafeEnginePath`, so a link planted at a log, a lock or the fleet
  file cannot make a write land (or a cut happen) outside the engine folder.
- Folders are reached by descriptor, never by path name: `open_folder` walks from / one name
  at a time (O_NOFOLLOW each), and every open, mkdir, rename and unlink of an operation is
  made relative to that one folder descriptor (`dir_fd`). A check that is then followed by a
  use of the path would leave a window: a folder swapped for a symlink in between (a
  rename exchange) would take the write outside; a descriptor cannot be redirected so.
- Walks and listings (`walk`, `stale_temporaries`, `conversation_keys`) list each folder through
  a descriptor of its own, opened in its parent's (O_NOFOLLOW, O_NONBLOCK), never by path
  name: a folder swapped for a symlink mid-walk is not entered, so nothing outside the engine
  folder is counted, listed or read. They skip files and folders that vanish under them.
- Reads that decide anything are strict: `read_fleet` raises UnreadableEngineFile for a
  fleet file that exists but cannot be understood (the erasure executor must never take it
  for an empty fleet), and `update_fleet` never overwrites one. Pages use the tolerant
  forms (`try_read_fleet`, `inspect_jsonl`) and say what they could not read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from lifecycle import faults

FLEET_FILE = "state/subagents.v1.json"
FLEET_LOCK = "state/subagents.v1.lock"
LEGACY_FLEET_FILE = "legacy-state/subagents.v1.json"
CONVERSATION_AREAS = ("threads", "sessions", "artifacts")

STORAGE_KEY = re.compile(r"c_[0-9a-f]{20}")
# The temporary name every writer here creates: hidden, and unmistakable for anything else.
TEMPORARY = re.compile(r"\.(?P<target>.+)\.lethe-tmp-[0-9a-f]{16}")
# What earlier releases created (`<name>.tmp-<8 hex>`), swept only beside the fixed-name files
# those releases wrote (see `_legacy_temporary_target`).
LEGACY_TEMPORARY = re.compile(r"(?P<target>.+)\.tmp-[0-9a-f]{8}")
TORN = re.compile(r"(?P<log>.+)\.torn-[0-9]+")
TORN_PENDING = re.compile(r"\.(?P<log>.+)\.torn-pending")


class EnginePathError(ValueError):
    """A path the engine folder must not hand out or write."""


class InvalidStorageKey(EnginePathError):
    """Not a conversation storage key (`c_` followed by 20 lowercase hex characters)."""


class UnsafeEnginePath(EnginePathError):
    """A path that leaves the engine folder or passes through a symlink, or a file that is not a
    regular file (a FIFO, a socket, a device)."""


class UnreadableEngineFile(Exception):  # noqa: N818 (a state of a file, not a programming error)
    """An engine file that exists but cannot be understood. Never to be taken as empty.

    `reason` is one of "unreadable" (cannot be opened or read, or is not a regular file),
    "not_json", "wrong_shape", "torn_line" (ends without a newline) and "bad_lines" (holds
    lines that are not JSON records).
    """

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True)
class FleetRead:
    rows: list[dict[str, Any]]
    problem: UnreadableEngineFile | None = None


EMPTY_FLEET: dict[str, Any] = {"version": 1, "agents": []}
JSONL_CHECK_BYTES = 4 << 20

# Never through a link at the name, never waiting for a FIFO's other end, never a controlling tty.
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


# Folders are opened only to reach what is in them (O_PATH: no read permission is needed on the
# folders above the engine folder), and never through a link at their name.
_FOLDER_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)


def _names(folder: Path) -> tuple[str, ...]:
    """The names from / down to `folder`; every path here is absolute and resolved."""
    if not folder.is_absolute() or ".." in folder.parts:
        raise UnsafeEnginePath(f"{folder} is not a resolved path")
    return folder.parts[1:]


def _is_link_at(folder: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _enter(folder: int, name: str, shown: Path) -> int:
    try:
        return os.open(name, _FOLDER_FLAGS, dir_fd=folder)
    except OSError as error:
        # A link where a folder should be: ENOTDIR (with O_PATH) or ELOOP. Anything else that
        # is not a folder (a file) passes through as NotADirectoryError, as a path open would.
        if error.errno in (errno.ENOTDIR, errno.ELOOP) and _is_link_at(folder, name):
            raise UnsafeEnginePath(f"{shown} passes through a symlink") from error
        raise


def sync_folder(folder: int) -> None:
    fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_folder(folder: Path, create: bool = False, mode: int = 0o777) -> int:
    """A descriptor of `folder`, reached from / one name at a time and never through a symlink
    (UnsafeEnginePath): what is opened, made, renamed or removed relative to it (`dir_fd`)
    stays in that folder even if its path is swapped for a link meanwhile. A missing folder
    raises FileNotFoundError, or with `create` is made (each new one fsynced into its parent;
    `folder` itself with `mode`, the ones above it with the default, as `mkdir -p` does).
    """
    names = _names(folder)
    fd = os.open("/", _FOLDER_FLAGS)
    try:
        for depth, name in enumerate(names, 1):
            try:
                child = _enter(fd, name, folder)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, mode if depth == len(names) else 0o777, dir_fd=fd)
                except FileExistsError:  # another writer made it (and syncs it)
                    pass
                else:
                    sync_folder(fd)
                child = _enter(fd, name, folder)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def opened_folder(folder: Path, create: bool = False) -> Iterator[int]:
    fd = open_folder(folder, create)
    try:
        yield fd
    finally:
        os.close(fd)


def _exists_at(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _is_regular_at(folder: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def open_regular(path: Path, flags: int = os.O_RDONLY, mode: int = 0o600, *, folder: int | None = None) -> int:
    """Open a file of the engine folder: a file descriptor, for a regular file only. With
    `folder` (a descriptor of `path`'s folder, as `walk` gives), the name is opened in it.

    A symlink (at the name or on the way), a FIFO, a socket or a device raises UnsafeEnginePath
    instead of being followed, waited on or written; FileNotFoundError and other OSErrors
    (permissions) pass through as they are.
    """
    if folder is not None:
        return _open_at(folder, path, flags, mode)
    with opened_folder(path.parent) as opened:
        return _open_at(opened, path, flags, mode)


def _resolved(path: Path) -> str:
    """os.path.realpath(path); a link on the way swapped for a folder while it is read (readlink's
    EINVAL, which realpath lets through) is UnsafeEnginePath: no lock or name is chosen from it."""
    try:
        return os.path.realpath(path)
    except OSError as error:
        raise UnsafeEnginePath(f"{path} changed while it was resolved") from error


def _open_at(folder: int, path: Path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """`open_regular` for `path`'s name in the folder `folder` (a descriptor of `path.parent`)."""
    try:
        fd = os.open(path.name, flags | _OPEN_FLAGS, mode, dir_fd=folder)
    except OSError as error:
        # ELOOP: a symlink at the name; ENXIO: a FIFO without a reader or a socket (for writing).
        if error.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafeEnginePath(f"{path} is not a regular file") from error
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeEnginePath(f"{path} is not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: Path) -> bytes:
    """The whole of a regular file of the engine folder (see `open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as handle:
        return handle.read()


def _read_at(folder: int, path: Path) -> bytes:
    with os.fdopen(_open_at(folder, path), "rb") as handle:
        return handle.read()


def remove_regular(path: Path) -> bool:
    """Remove a regular file of the engine folder, through its folder's descriptor (never a
    link, a folder or a file outside); False when there is no regular file there."""
    try:
        with opened_folder(path.parent) as folder:
            if not _is_regular_at(folder, path.name):
                return False
            os.unlink(path.name, dir_fd=folder)
    except FileNotFoundError:
        return False
    return True


def _read_fleet_file(path: Path) -> tuple[bytes, os.stat_result, bool] | None:
    """The fleet file's bytes, its status after the read and whether the read saw it unchanged
    (same status before and after); None when it does not exist."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    except (OSError, UnsafeEnginePath) as error:
        raise UnreadableEngineFile(path, "unreadable") from error
    try:
        with os.fdopen(fd, "rb") as handle:
            before = os.fstat(handle.fileno())
            data = handle.read()
            after = os.fstat(handle.fileno())
            return data, after, _identity(before) == _identity(after)
    except OSError as error:
        raise UnreadableEngineFile(path, "unreadable") from error


def _parse_fleet(path: Path, data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except (ValueError, RecursionError) as error:
        raise UnreadableEngineFile(path, "not_json") from error
    if not isinstance(document, dict):
        raise UnreadableEngineFile(path, "wrong_shape")
    agents = document.setdefault("agents", [])
    if not isinstance(agents, list) or not all(isinstance(row, dict) for row in agents):
        raise UnreadableEngineFile(path, "wrong_shape")
    return document


def _fleet_document(path: Path) -> dict[str, Any]:
    """The fleet document at `path`, checked for shape; the empty fleet when absent."""
    read = _read_fleet_file(path)
    return dict(EMPTY_FLEET) if read is None else _parse_fleet(path, read[0])


def _fleet_rows(path: Path) -> list[dict[str, Any]]:
    return _fleet_document(path)["agents"]


# Pages, operation lists and verification read the fleet files often, and a large fleet takes
# a noticeable time to parse. The last parse of each file is kept with the file's identity and
# bytes. An entry whose change time is older than SETTLED_NS is reused on its identity alone:
# a later write would give the file a change time of its own, after that (a write in the same
# clock tick as the parse could keep size and times, so a younger entry is not trusted on them).
# Otherwise the bytes are read again and compared, and parsed again only if they differ.
SETTLED_NS = 2_000_000_000
_parsed: dict[str, tuple[tuple[int, ...], bool, bytes, dict[str, Any]]] = {}


def _identity(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _settled(info: os.stat_result) -> bool:
    return time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > SETTLED_NS


def _fleet_rows_seen(path: Path) -> list[dict[str, Any]]:
    """`_fleet_rows` for reads that change nothing: a file unchanged since its last parse in
    this process is not parsed again. The rows are shared: the caller must not change them."""
    return list(_fleet_document_seen(path)["agents"])


def _fleet_document_seen(path: Path) -> dict[str, Any]:
    """The fleet document, as `_fleet_rows_seen` reads it (the empty fleet when the file does not
    exist). Shared: the caller must not change it."""
    key = str(path)
    entry = _parsed.get(key)
    if entry is not None and entry[1]:
        try:
            info = os.stat(path, follow_symlinks=False)
        except OSError:
            info = None
        if info is not None and stat.S_ISREG(info.st_mode) and _identity(info) == entry[0]:
            return entry[3]
    read = _read_fleet_file(path)
    if read is None:
        _parsed.pop(key, None)
        return EMPTY_FLEET
    data, info, steady = read
    document = entry[3] if entry is not None and entry[2] == data else _parse_fleet(path, data)
    _parsed[key] = (_identity(info), steady and _settled(info), data, document)
    return document


def jsonl(records: list[dict[str, Any]]) -> bytes:
    """Whole lines of compact JSON, as the engine logs them."""
    return b"".join(json.dumps(r, separators=(",", ":"), sort_keys=True).encode() + b"\n" for r in records)


def is_storage_key(key: object) -> bool:
    return isinstance(key, str) and STORAGE_KEY.fullmatch(key) is not None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _tail_offset(folder: int, path: Path) -> int | None:
    """Where an unterminated last line starts; None when the log ends cleanly or is absent."""
    try:
        fd = _open_at(folder, path)
    except FileNotFoundError:
        return None
    try:
        end = os.fstat(fd).st_size
        if end == 0 or os.pread(fd, 1, end - 1) == b"\n":
            return None
        while end > 0:
            start = max(0, end - 65536)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                return start + newline + 1
            end = start
        return 0
    finally:
        os.close(fd)


def _read_from(folder: int, path: Path, offset: int) -> bytes:
    with os.fdopen(_open_at(folder, path), "rb") as handle:
        handle.seek(offset)
        return handle.read()


def _truncate(folder: int, path: Path, size: int) -> None:
    fd = _open_at(folder, path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


# Folders are listed through a descriptor of their own, opened for reading in their parent's:
# never through a link at their name (ELOOP), never waiting on a FIFO put where a folder was
# (O_NONBLOCK; O_DIRECTORY then refuses it).
_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC

# What is in a listed folder besides folders: each name with its own status (never followed).
Entries = Iterable[tuple[str, os.stat_result]]


def _at(error: OSError, path: Path) -> OSError:
    """`error` naming `path` in full: an error met through a descriptor names only the last name
    (or none), and what cannot be read is shown by its place in the engine folder."""
    return OSError(error.errno, error.strerror, str(path))


def _list(parent: int, name: str, path: Path,
          onerror: Callable[[OSError], None]) -> tuple[int, list[str], list[str]] | None:
    """The folder `name` in the folder `parent` (a descriptor; "." for itself), whose path is
    `path`, opened for listing: its descriptor (the caller closes it), the names in it that are
    not folders and the names of its folders, both sorted. Names only: their status is read as
    they are used (`_entries`), so a folder of 200,000 files costs its names, no more. None when
    it is gone or no longer a folder (a link, a file now); what cannot be opened or listed goes
    to `onerror`."""
    try:
        fd = os.open(name, _LIST_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
            onerror(_at(error, path))
        return None
    names: list[str] = []
    folders: list[str] = []
    try:
        with os.scandir(fd) as listing:
            for entry in listing:
                try:
                    (folders if entry.is_dir(follow_symlinks=False) else names).append(entry.name)
                except FileNotFoundError:
                    continue
                except OSError as error:
                    onerror(_at(error, path / entry.name))
    except OSError as error:
        os.close(fd)
        onerror(_at(error, path))
        return None
    except BaseException:
        os.close(fd)
        raise
    names.sort()
    folders.sort()
    return fd, names, folders


def _entries(fd: int, path: Path, names: list[str], onerror: Callable[[OSError], None]) -> Iterator[
        tuple[str, os.stat_result]]:
    """Each name of the folder `fd` (at `path`) with its own status, read now (never followed);
    vanished names skipped, what cannot be looked at goes to `onerror`."""
    for name in names:
        try:
            yield name, os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as error:
            onerror(_at(error, path / name))


def _contents(folder: Path, onerror: Callable[[OSError], None]) -> tuple[list[tuple[str, os.stat_result]], list[str]]:
    """What is in `folder` (as `_list` and `_entries` give it), the folder reached from /
    (`open_folder`: a link on the way raises UnsafeEnginePath, a missing folder FileNotFoundError)."""
    with opened_folder(folder) as opened:
        listed = _list(opened, ".", folder, onerror)
    if listed is None:
        return [], []
    fd, names, folders = listed
    try:
        return list(_entries(fd, folder, names, onerror)), folders
    finally:
        os.close(fd)


def _ignore(error: OSError) -> None:
    pass


# The kernel's table of this process's mounts (Linux): a bind mount of another folder keeps the
# device number of the file system both are on, so only this table tells it from a folder.
MOUNT_TABLE = Path("/proc/self/mountinfo")


def written(path: str | os.PathLike) -> str:
    """A path as text a page, a JSON answer or a terminal line can carry: a name's bytes that are
    not UTF-8 written as escapes (\\xff), never as the lone surrogates Python reads them as (r143,
    r145: a page failed on one, the API and `verify_erasure --json` sent invalid text)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _unescaped(field: bytes) -> bytes:
    """A mount point as the table writes it: space, tab, newline and backslash as octal escapes."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)


def mounts_within(folder: Path) -> list[Path]:
    """The mount points at `folder` (its resolved form) or anywhere below it: what is there is
    another file system's (or another folder's, bound there), never the engine folder's own.
    Empty where the table cannot be read (no /proc); the device numbers still tell a mount of
    another file system (`remove_tree`)."""
    try:
        table = MOUNT_TABLE.read_bytes()
    except OSError:
        return []
    try:
        real = os.fsencode(os.path.realpath(folder))
    except OSError:  # a folder on the way swapped for a link while it was resolved (EINVAL)
        real = os.fsencode(os.path.abspath(folder))
    below = real.rstrip(b"/") + b"/"
    found = []
    for line in table.split(b"\n"):  # a carriage return in a mount point is not escaped (r145)
        fields = line.split(b" ")
        if len(fields) > 4:
            point = _unescaped(fields[4])
            if point == real or point.startswith(below):
                found.append(Path(os.fsdecode(point)))
    return found


def _raise(error: OSError) -> None:
    raise error


# How many folders of a walk's (or a removal's) path stay open at once: the ones nearer the top
# are closed past this and opened again on the way back up, so a folder nested thousands of
# levels deep needs no more descriptors than a shallow one.
OPEN_LEVELS = 16
# The kill point crash tests stop a removal at: each folder's files removed, its folders not yet.
REMOVAL_KILL_POINT = "engine-folder-removal"


def _identity_of(fd: int) -> tuple[int, int]:
    info = os.fstat(fd)
    return info.st_dev, info.st_ino


def _back_up(child: int, identity: tuple[int, int], path: Path) -> int:
    """A descriptor of the folder `child` (a descriptor) is in, opened through its "..", when
    that folder is still the one that was left (`identity`): a folder moved elsewhere meanwhile
    raises UnsafeEnginePath (nothing is listed or removed outside the place it was reached from)."""
    fd = os.open("..", _LIST_FLAGS, dir_fd=child)
    try:
        if _identity_of(fd) != identity:
            raise UnsafeEnginePath(f"{path} was moved while it was read")
    except BaseException:
        os.close(fd)
        raise
    return fd


class _Level:
    """One folder on a walk's path: its descriptor (None while closed to spare descriptors),
    its identity (to open it again safely), its path and the names of its folders still to do."""

    __slots__ = ("fd", "identity", "path", "pending")

    def __init__(self, fd: int, path: Path, pending: Iterator[str]) -> None:
        self.fd: int | None = fd
        self.identity = _identity_of(fd)
        self.path, self.pending = path, pending


def _spare(stack: list[_Level]) -> None:
    """Close the descriptor nearest the top once more than OPEN_LEVELS levels are open."""
    open_levels = [level for level in stack if level.fd is not None]
    if len(open_levels) > OPEN_LEVELS:
        level = open_levels[0]
        os.close(level.fd)
        level.fd = None


def _leave(stack: list[_Level]) -> None:
    """Pop the deepest level and close it; the level above is opened again if it was spared."""
    done = stack.pop()
    try:
        if stack and stack[-1].fd is None:
            stack[-1].fd = _back_up(done.fd, stack[-1].identity, stack[-1].path)
    finally:
        os.close(done.fd)


def walk(top: Path, onerror: Callable[[OSError], None] | None = None) -> Iterator[tuple[Path, int, Entries]]:
    """Every folder from `top` down, each before the folders in it, by name: its path, a
    descriptor of it (open until the next step) and what is in it besides folders, each name
    with its own status (a link's own, never its target's), read as it is used (before the next
    step). Errors name the full path of what could not be read.

    Only through descriptors: `top` is reached from / (`open_folder`), every folder below from
    its parent's descriptor and never through a link, so a folder swapped for a link while the
    walk goes on is not entered and nothing outside `top` is listed. A missing `top` (or one that
    is not a folder) has nothing in it; one behind a link goes to `onerror` as ELOOP. Folders
    and entries that vanish meanwhile are skipped; what cannot be read goes to `onerror`
    (ignored when None), and the walk goes on. At most OPEN_LEVELS folders of the path are
    open at a time (however deep the folders go); a folder moved away while the walk is below
    it ends the walk, through `onerror`. A file system mounted below `top` is read as the
    rest (a disk mounted for a part of the engine folder is the engine folder's); what removes
    or measures a conversation's folder refuses one mounted in it first (`mounts_within`).
    """
    onerror = onerror or _ignore
    try:
        start = open_folder(top)
    except UnsafeEnginePath:
        onerror(OSError(errno.ELOOP, "passes through a symlink", str(top)))
        return
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError as error:
        onerror(_at(error, top))
        return
    stack: list[_Level] = []
    try:
        listed = _list(start, ".", top, onerror)
        if listed is None:
            return
        fd, names, folders = listed
        stack.append(_Level(fd, top, iter(folders)))
        yield top, fd, _entries(fd, top, names, onerror)
        while stack:
            level = stack[-1]
            name = next(level.pending, None)
            if name is None:
                try:
                    _leave(stack)
                except UnsafeEnginePath as error:
                    onerror(OSError(errno.ESTALE, str(error), str(level.path)))
                    return
                except OSError as error:
                    onerror(_at(error, level.path))
                    return
                continue
            listed = _list(level.fd, name, level.path / name, onerror)
            if listed is not None:
                child, names, folders = listed
                stack.append(_Level(child, level.path / name, iter(folders)))
                _spare(stack)
                yield level.path / name, child, _entries(child, level.path / name, names, onerror)
    finally:
        for level in stack:
            if level.fd is not None:
                os.close(level.fd)
        os.close(start)


def remove_tree(parent: int, name: str, path: Path) -> None:
    """Remove the folder `name` in the folder `parent` (a descriptor) and everything in it; `path`
    is where it is, for errors. What is in it is removed as it is: a link as a link (never
    followed), a folder swapped for a link meanwhile removed as a link. No recursion and at most
    OPEN_LEVELS descriptors of its folders at once, however deep they go; a folder moved away
    while its contents are removed raises UnsafeEnginePath. A file system mounted in it (or a
    folder bound there) raises UnsafeEnginePath before anything is removed (r143: a delete
    emptied the folder bound in a conversation's folder); one mounted meanwhile, when the
    removal reaches it. Errors are raised (OSError)."""

    def enter(at: int, child: str, shown: Path) -> int | None:
        """The folder `child` in `at`, opened without following a link; None when it is gone or
        is not a folder (any more): then it is removed as what it is."""
        try:
            fd = os.open(child, _LIST_FLAGS, dir_fd=at)
        except FileNotFoundError:
            return None
        except OSError as error:
            if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise _at(error, shown) from error
        else:
            if os.fstat(fd).st_dev != device:
                os.close(fd)
                raise UnsafeEnginePath(f"{shown} has another file system mounted at it")
            return fd
        with contextlib.suppress(FileNotFoundError):
            os.unlink(child, dir_fd=at)
        return None

    def clear(level: _Level) -> None:
        """Remove what is in the folder besides folders; its folders become its pending names."""
        folders: list[str] = []
        others: list[str] = []
        try:
            with os.scandir(level.fd) as listing:
                for entry in listing:
                    try:
                        (folders if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
                    except FileNotFoundError:
                        continue
        except OSError as error:
            raise _at(error, level.path) from error
        for other in others:
            try:
                os.unlink(other, dir_fd=level.fd)
            except FileNotFoundError:
                pass
            except OSError as error:
                raise _at(error, level.path / other) from error
        level.pending = iter(folders)
        faults.kill_point(REMOVAL_KILL_POINT)  # crash tests: a folder half removed

    try:
        top = os.open(name, _LIST_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        return
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):  # a link (or no folder) where the folder was
            raise UnsafeEnginePath(f"{path} is not a folder") from error
        raise _at(error, path) from error
    device = os.fstat(parent).st_dev
    if os.fstat(top).st_dev != device or mounts_within(path):
        os.close(top)
        raise UnsafeEnginePath(f"{path} has another file system mounted in it")
    stack = [_Level(top, path, iter(()))]
    try:
        clear(stack[-1])
        while stack:
            level = stack[-1]
            child = next(level.pending, None)
            if child is not None:
                fd = enter(level.fd, child, level.path / child)
                if fd is not None:
                    stack.append(_Level(fd, level.path / child, iter(())))
                    _spare(stack)
                    clear(stack[-1])
                continue
            done_name = level.path.name
            if len(stack) == 1:
                os.close(level.fd)
                stack.pop()
                os.rmdir(name, dir_fd=parent)
                return
            _leave(stack)
            try:
                os.rmdir(done_name, dir_fd=stack[-1].fd)
            except FileNotFoundError:
                pass
            except OSError as error:
                raise _at(error, level.path) from error
    finally:
        for level in stack:
            if level.fd is not None:
                os.close(level.fd)


def _walk_files(top: Path, problems: list[OSError] | None = None) -> Iterator[os.stat_result]:
    """The regular files under `top` (see `walk`); vanished entries skipped. A folder or file
    that exists but cannot be read is skipped too, and added to `problems` when given (a
    measurement then says it is incomplete, never that it found nothing)."""
    for _folder, _fd, entries in walk(top, None if problems is None else problems.append):
        for _name, info in entries:
            if stat.S_ISREG(info.st_mode):
                yield info


class EngineHome:
    def __init__(self, root: Path | str | None = None) -> None:
        # Resolved once (a symlink to the engine folder, a relative ENGINE_HOME): every path this
        # class hands out, and every path it or its callers compare, starts with this one root.
        self.root = Path(os.path.realpath(root if root is not None else settings.ENGINE_HOME))

    # Paths -----------------------------------------------------------------

    def _conversation_dir(self, area: str, key: str) -> Path:
        if not is_storage_key(key):
            raise InvalidStorageKey(f"not a conversation storage key: {key!r}")
        path = self.root / area / key
        # Its own resolved form: no symlink between the engine folder and the conversation.
        if Path(_resolved(path)) != path:
            raise UnsafeEnginePath(f"{area}/{key} passes through a symlink")
        return path

    def thread_dir(self, key: str) -> Path:
        return self._conversation_dir("threads", key)

    def events_path(self, key: str) -> Path:
        return self.thread_dir(key) / "events.jsonl"

    def session_dir(self, key: str) -> Path:
        return self._conversation_dir("sessions", key)

    def receipts_path(self, key: str) -> Path:
        return self.session_dir(key) / "approval_receipts.jsonl"

    def artifacts_dir(self, key: str) -> Path:
        return self._conversation_dir("artifacts", key)

    def conversation_paths(self, key: str) -> list[Path]:
        """Every folder that holds this conversation's own files (resolved, inside the engine folder).

        Raises InvalidStorageKey for anything but a public id, and UnsafeEnginePath when a
        symlink stands anywhere on the way: whoever deletes these folders never follows one.
        """
        return [self._conversation_dir(area, key) for area in CONVERSATION_AREAS]

    @property
    def fleet_path(self) -> Path:
        return self.root / FLEET_FILE

    @property
    def fleet_lock(self) -> Path:
        return self.root / FLEET_LOCK

    @property
    def legacy_fleet_path(self) -> Path:
        return self.root / LEGACY_FLEET_FILE

    # Primitives -------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self, lock_path: Path) -> Iterator[None]:
        with opened_folder(lock_path.parent, create=True) as folder, self._lock(folder, lock_path):
            yield

    def check_lock_writable(self, lock_path: Path) -> None:
        """Raise the OSError that taking `lock_path` (`locked`) would meet on a read-only disk,
        without writing anything (a preview's question): the lock file opened for writing when
        it is there (on a full disk that succeeds, as taking it does), else the read-only flag
        of the disk its nearest existing folder is on. Whether a full disk has room for a lock
        file not made yet is not known without making it (free-block figures do not say: btrfs
        reports no free inodes, tmpfs makes an empty file with no block free): the request says."""
        try:
            with opened_folder(lock_path.parent) as folder:
                os.close(_open_at(folder, lock_path, os.O_RDWR))
                return
        except FileNotFoundError:
            pass
        folder = lock_path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(lock_path))

    @contextlib.contextmanager
    def guarded(self, path: Path) -> Iterator[int]:
        """`path`'s folder (made if missing), opened once for the whole operation, with the
        lock that guards `path` held in it (`lock_for` always names a file of that folder)."""
        with opened_folder(path.parent, create=True) as folder, self._lock(folder, self.lock_for(path)):
            yield folder

    @contextlib.contextmanager
    def _lock(self, folder: int, lock_path: Path) -> Iterator[None]:
        """Hold the lock file `lock_path`, in the folder `folder` (a descriptor of its parent)."""
        fd = _open_at(folder, lock_path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def lock_for(self, path: Path) -> Path:
        """The lock file that guards `path`.

        The fleet's own lock for the fleet file; the log's lock for its torn-tail files (they
        are written while the log's lock is held); else `<name>.lock` beside the file.
        """
        if path.name == self.fleet_path.name and _resolved(path.parent) == str(self.root / "state"):
            return self.fleet_lock
        for pattern in (TORN, TORN_PENDING):
            if match := pattern.fullmatch(path.name):
                return self.lock_for(path.with_name(match["log"]))
        return path.with_name(path.name + ".lock")

    def write_atomic(self, path: Path, data: bytes) -> None:
        with self.guarded(path) as folder:
            self._replace(folder, path, data)

    def _replace(self, folder: int, path: Path, data: bytes) -> None:
        """Write `path` whole; `folder` is the descriptor of its folder."""
        if TEMPORARY.fullmatch(path.name):
            raise UnsafeEnginePath(f"a temporary file's name cannot be written: {path.name}")
        tmp = f".{path.name}.lethe-tmp-{secrets.token_hex(8)}"
        fd = _open_at(folder, path.with_name(tmp), os.O_WRONLY | os.O_CREAT | os.O_EXCL)  # a new file
        try:
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=folder)
            raise
        sync_folder(folder)

    def append_jsonl(self, path: Path, records: list[dict[str, Any]]) -> None:
        data = jsonl(records)
        with self.guarded(path) as folder:
            self._isolate_torn_tail(folder, path)  # a new record must never be merged into a torn one
            created = not _exists_at(folder, path.name)
            fd = _open_at(folder, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                start = os.fstat(fd).st_size
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                except BaseException:
                    # Cut back what was written (a full disk, a size limit): no torn line stays.
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, start)
                        os.fsync(fd)
                    raise
            finally:
                os.close(fd)
            if created:
                sync_folder(folder)

    def read_jsonl(self, path: Path) -> list[dict[str, Any]]:
        try:
            data = read_regular(path)
        except FileNotFoundError:
            return []
        rows = []
        for line in data.splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
        return rows

    def recover_torn_tail(self, path: Path) -> Path | None:
        """Move an unterminated last line aside, as the engine does after a crash.

        Returns the torn file written (or finished) by this call, else None. Safe to run
        again after being killed at any point.
        """
        with self.guarded(path) as folder:
            return self._isolate_torn_tail(folder, path)

    def _isolate_torn_tail(self, folder: int, path: Path) -> Path | None:
        """The recovery itself; the caller holds the log's lock and gives its folder's descriptor.

        1. Save the torn bytes as `.<name>.torn-pending` (atomically, fsynced).
        2. Cut the log back to its last whole line (fsynced).
        3. Rename the pending file to the next free `<name>.torn-<n>` and fsync the folder.
        A pending file found at the start is an earlier run that died after step 1: it is
        finished first (step 2 only if the log still ends with exactly those bytes).
        """
        pending = path.with_name(f".{path.name}.torn-pending")
        finished = None
        if _exists_at(folder, pending.name):
            saved = _read_at(folder, pending)
            cut = _tail_offset(folder, path)
            if cut is not None and _read_from(folder, path, cut) == saved:
                _truncate(folder, path, cut)
            finished = self._promote(folder, path, pending)
        cut = _tail_offset(folder, path)
        if cut is None:
            return finished
        self._replace(folder, pending, _read_from(folder, path, cut))
        _truncate(folder, path, cut)
        return self._promote(folder, path, pending)

    def _promote(self, folder: int, log: Path, pending: Path) -> Path:
        n = 1
        while _exists_at(folder, (torn := log.with_name(f"{log.name}.torn-{n}")).name):
            n += 1
        os.rename(pending.name, torn.name, src_dir_fd=folder, dst_dir_fd=folder)
        sync_folder(folder)
        return torn

    def read_json(self, path: Path, default: Any) -> Any:
        """The parsed document, or `default` when the file is absent (ValueError when not JSON)."""
        try:
            return json.loads(read_regular(path))
        except FileNotFoundError:
            return default

    def update_json(self, path: Path, change: Callable[[Any], Any], default: Any) -> Any:
        """Read-modify-write under the path's lock; `change` returns the new document."""
        with self.guarded(path) as folder:
            try:
                document = json.loads(_read_at(folder, path))
            except FileNotFoundError:
                document = default
            updated = change(document)
            self._replace(folder, path, json.dumps(updated, indent=1, sort_keys=True).encode())
            return updated

    # Fleet ------------------------------------------------------------------

    def read_fleet(self) -> list[dict[str, Any]]:
        """The fleet rows; [] when there is no fleet file.

        Strict: a file that exists but cannot be read, is not JSON or is not shaped like a
        fleet raises UnreadableEngineFile, so no caller mistakes it for a file without rows.
        """
        return _fleet_rows(self.fleet_path)

    def read_legacy_fleet(self) -> list[dict[str, Any]]:
        """The legacy copy's rows, as strictly as `read_fleet`."""
        return _fleet_rows(self.legacy_fleet_path)

    def try_read_fleet(self, legacy: bool = False) -> FleetRead:
        """The tolerant form for pages: the rows, or none and the reason the file is unreadable."""
        try:
            return FleetRead(_fleet_rows_seen(self.legacy_fleet_path if legacy else self.fleet_path))
        except UnreadableEngineFile as problem:
            return FleetRead([], problem)

    def update_fleet(self, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """Read-modify-write of the fleet under its lock; an unreadable fleet file is never overwritten."""
        with self.guarded(self.fleet_path) as folder:
            document = _fleet_document(self.fleet_path)
            rows = change(list(document["agents"]))
            self._replace(folder, self.fleet_path, json.dumps({**document, "version": 1, "agents": rows},
                                                              indent=1, sort_keys=True).encode())
            return rows

    def inspect_jsonl(self, path: Path) -> UnreadableEngineFile | None:
        """Why a JSONL log cannot be fully trusted (None when it reads cleanly or is absent).

        Logs over JSONL_CHECK_BYTES are checked in their last JSONL_CHECK_BYTES only.
        """
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            return None
        except (OSError, UnsafeEnginePath):
            return UnreadableEngineFile(path, "unreadable")
        try:
            info = os.fstat(fd)
            start = max(0, info.st_size - JSONL_CHECK_BYTES)
            data = os.pread(fd, info.st_size - start, start)
        except OSError:
            return UnreadableEngineFile(path, "unreadable")
        finally:
            os.close(fd)
        if data and not data.endswith(b"\n"):
            return UnreadableEngineFile(path, "torn_line")
        lines = data.splitlines()
        if start:
            lines = lines[1:]  # the window starts mid-line
        for line in lines:
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                record = None
            if not isinstance(record, dict):
                return UnreadableEngineFile(path, "bad_lines")
        return None

    # Housekeeping -----------------------------------------------------------

    def _temporary_target(self, folder: Path, name: str) -> Path | None:
        """The file a leftover temporary was meant to become, if this module's writers made it."""
        if match := TEMPORARY.fullmatch(name):
            return folder / match["target"]
        if (match := LEGACY_TEMPORARY.fullmatch(name)) and self._legacy_temporary_target(folder, match["target"]):
            return folder / match["target"]
        return None

    def _legacy_temporary_target(self, folder: Path, target: str) -> bool:
        """Earlier releases wrote `<name>.tmp-<8 hex>` beside these fixed-name files only."""
        try:
            area, *rest = Path(_resolved(folder)).relative_to(self.root).parts
        except (ValueError, UnsafeEnginePath):
            return False
        if (area, *rest) in (("state",), ("legacy-state",)):
            return target == "subagents.v1.json"
        if len(rest) != 1 or not is_storage_key(rest[0]):
            return False
        if area == "threads":
            return target == "events.jsonl"
        if area == "sessions":
            return target == "approval_receipts.jsonl" or bool(
                (torn := TORN.fullmatch(target)) and torn["log"] == "approval_receipts.jsonl")
        return False

    def stale_temporaries(self, target: Path) -> list[Path]:
        """The temporaries beside `target` that this module's writers made for it (regular
        files only). Called with the target's lock held, when no writer of it is mid-write:
        every one found was left by a writer that died before its rename."""
        folder = target.parent
        try:  # through the folder's descriptor: a link there (or on the way) holds none of them
            entries, _folders = _contents(folder, _raise)
        except (FileNotFoundError, NotADirectoryError, UnsafeEnginePath):
            return []
        return [folder / name for name, info in entries
                if stat.S_ISREG(info.st_mode) and self._temporary_target(folder, name) == target]

    def sweep_temporaries(self) -> int:
        """Remove the temporaries that killed writers left behind; they were never renamed in.

        Only names this module's writers create are touched, only regular files (never a
        folder, a symlink or a lock file), and each one under the lock its writer holds, so
        a writer that is alive and mid-write is never robbed of its temporary file. Several
        sweeps may run at once: each file is removed by exactly one of them.
        """
        removed = 0
        found = []
        for folder, _fd, entries in walk(self.root):
            for name, info in entries:
                target = self._temporary_target(folder, name)
                if target is not None and stat.S_ISREG(info.st_mode):
                    found.append((folder / name, target))
        for tmp, target in found:
            # Never recreate a folder that was deleted meanwhile (an erased conversation's); a
            # lock that is not a regular file (a link, a FIFO) is not taken, its temporary left.
            with (contextlib.suppress(FileNotFoundError, UnsafeEnginePath), opened_folder(tmp.parent) as folder,
                  self._lock(folder, self.lock_for(target))):
                if _is_regular_at(folder, tmp.name):
                    os.unlink(tmp.name, dir_fd=folder)
                    removed += 1
        return removed

    def conversation_keys(self, area: str, problems: list[OSError] | None = None) -> list[str]:
        """The storage keys that have a folder (never a link) in the area `area`, listed through
        the area's descriptor, by name; none when the area is missing. An area behind a link is
        not followed and holds none (ELOOP goes to `problems`); one that cannot be listed goes to
        `problems`, or is raised when `problems` is None."""
        unreadable = _raise if problems is None else problems.append
        try:
            _entries, folders = _contents(self.root / area, unreadable)
        except UnsafeEnginePath:
            if problems is not None:
                problems.append(OSError(errno.ELOOP, "passes through a symlink", str(self.root / area)))
            return []
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as error:
            unreadable(error)
            return []
        return [name for name in folders if is_storage_key(name)]

    def usage(self, problems: list[OSError] | None = None) -> tuple[int, int]:
        """(files, bytes) under the engine home; what could not be read goes to `problems`."""
        count = size = 0
        for info in _walk_files(self.root, problems):
            count += 1
            size += info.st_size
        return count, size

    def conversation_usage(self, key: str, problems: list[OSError] | None = None) -> tuple[int, int]:
        """(files, bytes) in this conversation's folders; what could not be read goes to
        `problems`, and so does a folder behind a symlink (ELOOP): it is not followed and counts
        nothing, so a figure without it is not complete. So does a folder with another disk or
        folder mounted at it or in it (EXDEV, each mount point): what is there is not the
        conversation's (r145: a folder bound there was counted as its files)."""
        count = size = 0
        for area in CONVERSATION_AREAS:
            try:
                folder = self._conversation_dir(area, key)
            except UnsafeEnginePath:
                if problems is not None:
                    problems.append(OSError(errno.ELOOP, "passes through a symlink", str(self.root / area / key)))
                continue
            if mounted := mounts_within(folder):
                if problems is not None:
                    problems += [OSError(errno.EXDEV, "another file system is mounted here", str(point))
                                 for point in mounted]
                continue
            for info in _walk_files(folder, problems):
                count += 1
                size += info.st_size
        return count, size
