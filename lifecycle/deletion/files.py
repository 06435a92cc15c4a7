"""Removing a conversation's engine folders, and nothing else.

Before a folder is removed this module checks, itself, that the path as given is its own
resolved form (no symlink anywhere between the engine folder and it), that it lies inside
the resolved ENGINE_HOME, that it is a real folder, and that no other file system (nor another folder,
bound there) is mounted at it or in it. The removal and the count then
reach the folder through its parent's descriptor (`enginefs.opened_folder`, never through a
link), not by path name again: a folder on the way swapped for a symlink after the check
cannot turn the removal onto a folder outside. A symlink inside the folder is removed as a
link, never followed. The parent folder is fsynced after the removal.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from lifecycle.enginefs import (
    EngineHome,
    UnsafeEnginePath,
    mounts_within,
    opened_folder,
    remove_tree,
    sync_folder,
    walk,
)


class UnsafeFolder(Exception):
    """A conversation folder that is a symlink, or leads outside the engine folder."""

    def __init__(self, relative: str) -> None:
        super().__init__(relative)
        self.relative = relative


def _relative(home: EngineHome, path: Path) -> str:
    try:
        return str(Path(path).relative_to(home.root))
    except ValueError:
        return Path(path).name


def checked(home: EngineHome, path: Path) -> Path | None:
    """The folder if it exists and is safe to remove; None if it does not exist."""
    root = home.root  # resolved once, by EngineHome
    relative = _relative(home, path)
    expected = root / relative
    if relative in ("", ".") or ".." in Path(relative).parts:
        raise UnsafeFolder(relative)
    try:
        info = os.lstat(expected)
    except FileNotFoundError:
        # Nothing at the expected place, but a symlink on the way would hide it there.
        if os.path.lexists(path) or os.path.realpath(expected) != str(expected):
            raise UnsafeFolder(relative) from None
        return None
    if not stat.S_ISDIR(info.st_mode) or os.path.realpath(expected) != str(expected):
        raise UnsafeFolder(relative)
    if os.path.commonpath([root, expected]) != str(root):
        raise UnsafeFolder(relative)
    if mounts_within(expected):  # another file system's files, or another folder's, bound there (r143)
        raise UnsafeFolder(relative)
    return expected


def usage(home: EngineHome, path: Path) -> tuple[int, int]:
    """(files, bytes) in a conversation folder, without following symlinks; what cannot be
    read raises its OSError (naming its full path)."""
    folder = checked(home, path)
    count = size = 0
    if folder is None:
        return 0, 0

    def unreadable(error: OSError) -> None:
        """A link on the way to the folder is UnsafeFolder; anything else that cannot be read
        (a permission, no descriptor left in a deep folder) is raised: a figure that left it
        out would say fewer files than there are (a step done with 0 records)."""
        if error.errno == errno.ELOOP:
            raise UnsafeFolder(_relative(home, folder))
        raise error

    # Through descriptors (enginefs.walk): never into a link, never waiting on a FIFO put where
    # a folder was (os.fwalk opens folders without O_NONBLOCK).
    for _path, _fd, entries in walk(folder, unreadable):
        for _name, info in entries:
            count += 1
            if stat.S_ISREG(info.st_mode):
                size += info.st_size
    return count, size


@contextlib.contextmanager
def _parent(home: EngineHome, folder: Path) -> Iterator[int]:
    """A descriptor of the checked folder's parent, reached without following a link."""
    try:
        with opened_folder(folder.parent) as parent:
            yield parent
    except UnsafeEnginePath:
        raise UnsafeFolder(_relative(home, folder)) from None


def remove_folder(home: EngineHome, path: Path) -> bool:
    """Remove the folder and everything in it; False when it was already gone."""
    folder = checked(home, path)
    if folder is None:
        return False
    with _parent(home, folder) as parent:
        # Relative to the parent's descriptor: removes links inside as links, refuses a
        # symlinked top, and cannot be redirected by a folder on the way swapped for a link.
        remove_tree(parent, folder.name, folder)
        sync_folder(parent)
    return True
