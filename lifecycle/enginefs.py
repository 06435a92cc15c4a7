"""The engine data directory, written the way the engine writes it.

Layout under ENGINE_HOME (<thread> is the conversation's storage key, its public id, since
raw thread ids repeat across owners):

    threads/<thread>/events.jsonl                 per-thread event log
    sessions/<thread>/approval_receipts.jsonl     approval receipts (+ .lock, + torn-tail files)
    artifacts/<thread>/...                        large outputs and tool artifacts
    state/subagents.v1.json (+ subagents.v1.lock) workspace-wide subagent fleet snapshot
    legacy-state/subagents.v1.json                legacy copy, read once for migration

Discipline, for every whole-file write: take the lock file (flock), write a temporary file
in the same folder, fsync it, rename it over the target, fsync the folder. A reader never
sees a half-written file and a writer killed at any line leaves the old file intact (and at
worst a `*.tmp-*` file, removed by `sweep_temporaries`). Appends to a JSONL log take the same
lock, write whole lines with O_APPEND and fsync; a torn last line is set aside by
`recover_torn_tail` into `<name>.torn-<n>`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

FLEET_FILE = "state/subagents.v1.json"
FLEET_LOCK = "state/subagents.v1.lock"
LEGACY_FLEET_FILE = "legacy-state/subagents.v1.json"


def jsonl(records: list[dict[str, Any]]) -> bytes:
    """Whole lines of compact JSON, as the engine logs them."""
    return b"".join(json.dumps(r, separators=(",", ":"), sort_keys=True).encode() + b"\n" for r in records)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class EngineHome:
    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root if root is not None else settings.ENGINE_HOME)

    # Paths -----------------------------------------------------------------

    def thread_dir(self, key: str) -> Path:
        return self.root / "threads" / key

    def events_path(self, key: str) -> Path:
        return self.thread_dir(key) / "events.jsonl"

    def session_dir(self, key: str) -> Path:
        return self.root / "sessions" / key

    def receipts_path(self, key: str) -> Path:
        return self.session_dir(key) / "approval_receipts.jsonl"

    def artifacts_dir(self, key: str) -> Path:
        return self.root / "artifacts" / key

    def conversation_paths(self, key: str) -> list[Path]:
        """Every folder that holds this conversation's own files."""
        return [self.thread_dir(key), self.session_dir(key), self.artifacts_dir(key)]

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
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(lock_path, "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def lock_for(self, path: Path) -> Path:
        """The lock file that guards `path`: the fleet's own, else `<name>.lock` beside it."""
        return self.fleet_lock if path == self.fleet_path else path.with_name(path.name + ".lock")

    def write_atomic(self, path: Path, data: bytes) -> None:
        with self.locked(self.lock_for(path)):
            self._replace(path, data)

    def _replace(self, path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(path.parent)

    def append_jsonl(self, path: Path, records: list[dict[str, Any]]) -> None:
        data = jsonl(records)
        with self.locked(self.lock_for(path)):
            path.parent.mkdir(parents=True, exist_ok=True)
            created = not path.exists()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_dir(path.parent)

    def read_jsonl(self, path: Path) -> list[dict[str, Any]]:
        if not path.exists():
            return []
        rows = []
        for line in path.read_bytes().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
        return rows

    def recover_torn_tail(self, path: Path) -> Path | None:
        """Move an unterminated last line aside, as the engine does after a crash."""
        with self.locked(self.lock_for(path)):
            if not path.exists():
                return None
            data = path.read_bytes()
            if not data or data.endswith(b"\n"):
                return None
            cut = data.rfind(b"\n") + 1
            n = 1
            while (torn := path.with_name(f"{path.name}.torn-{n}")).exists():
                n += 1
            self._replace(torn, data[cut:])
            self._replace(path, data[:cut])
            return torn

    def read_json(self, path: Path, default: Any) -> Any:
        try:
            return json.loads(path.read_bytes())
        except FileNotFoundError:
            return default

    def update_json(self, path: Path, change: Callable[[Any], Any], default: Any) -> Any:
        """Read-modify-write under the path's lock; `change` returns the new document."""
        with self.locked(self.lock_for(path)):
            document = self.read_json(path, default)
            updated = change(document)
            self._replace(path, json.dumps(updated, indent=1, sort_keys=True).encode())
            return updated

    # Fleet ------------------------------------------------------------------

    def read_fleet(self) -> list[dict[str, Any]]:
        return self.read_json(self.fleet_path, {"version": 1, "agents": []}).get("agents", [])

    def update_fleet(self, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        def apply(document: dict[str, Any]) -> dict[str, Any]:
            return {**document, "version": 1, "agents": change(list(document.get("agents", [])))}

        return self.update_json(self.fleet_path, apply, {"version": 1, "agents": []})["agents"]

    # Housekeeping -----------------------------------------------------------

    def sweep_temporaries(self) -> int:
        """Remove `*.tmp-*` files a killed writer left behind; they were never renamed in.

        Each one is removed under its target's lock, so a writer that is alive and
        mid-write (it holds that lock) is never robbed of its temporary file.
        """
        removed = 0
        if self.root.exists():
            for tmp in list(self.root.rglob("*.tmp-*")):
                target = tmp.with_name(tmp.name.split(".tmp-")[0])
                with self.locked(self.lock_for(target)):
                    if tmp.exists():
                        tmp.unlink()
                        removed += 1
        return removed

    def usage(self) -> tuple[int, int]:
        """(files, bytes) under the engine home."""
        count = size = 0
        if self.root.exists():
            for dirpath, _dirs, names in os.walk(self.root):
                for name in names:
                    with contextlib.suppress(FileNotFoundError):
                        size += os.stat(os.path.join(dirpath, name)).st_size
                        count += 1
        return count, size

    def conversation_usage(self, key: str) -> tuple[int, int]:
        count = size = 0
        for folder in self.conversation_paths(key):
            if folder.exists():
                for p in folder.rglob("*"):
                    if p.is_file():
                        count += 1
                        size += p.stat().st_size
        return count, size
