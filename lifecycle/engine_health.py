"""What pages say about engine files they could not read (the files are never guessed at)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.utils.translation import gettext_lazy as _

from lifecycle.enginefs import EngineHome, UnreadableEngineFile, written

REASONS = {
    "unreadable": _("cannot be read"),
    "not_json": _("is not valid JSON"),
    "wrong_shape": _("is not in the expected format"),
    "torn_line": _("ends with an incomplete record"),
    "bad_lines": _("has lines that are not records"),
    "unsafe": _("is reached through a symbolic link, so it was not read"),
    "mounted": _("has another disk or folder mounted at it, so it was not read"),
}


@dataclass(frozen=True)
class EngineProblem:
    path: str  # relative to the engine folder
    code: str  # a key of REASONS

    @property
    def reason(self) -> str:
        """In the reader's language."""
        return str(REASONS[self.code])


def shown_path(home: EngineHome, path: Path) -> str:
    """A path of the engine folder as a page or a JSON answer can carry it: relative to the
    folder, written out (`enginefs.written`)."""
    if path.is_relative_to(home.root):
        path = path.relative_to(home.root)
    return written(path)


def describe(home: EngineHome, problem: UnreadableEngineFile) -> EngineProblem:
    return EngineProblem(shown_path(home, problem.path), problem.reason if problem.reason in REASONS else "unreadable")


def fleet_health(home: EngineHome) -> list[EngineProblem]:
    """Problems with the two workspace-wide fleet files (an unchanged file is not parsed again: see
    enginefs._fleet_rows_seen)."""
    reads = (home.try_read_fleet(), home.try_read_fleet(legacy=True))
    return [describe(home, read.problem) for read in reads if read.problem is not None]
