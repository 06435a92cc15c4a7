"""Each test process's SQLite database in a folder of its own.

The test database used to sit in var/ beside every other test process's (the SQLite suite,
the browser suite, the PostgreSQL suite's SQLite subprocesses, all run side by side by `make
test`). A test that takes the write bits off its database's folder (tests/test_health.py: a
folder nobody may write makes /readyz say read_only) took them off everyone's: a connection
another suite opened in that moment was opened read-only, as Lethe opens a database whose folder
grants nobody writing (console/sqlite/base.py), and every later write of that suite failed
with "attempt to write a readonly database". Now the folder is the process's own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

PREFIX = "test-db-"


@contextlib.contextmanager
def own_test_database(settings_dict: dict, var: Path) -> Iterator[None]:
    """A SQLite database's test database at var/test-db-<pid>/db.sqlite3, in a folder made
    (owner-only) for this process and removed after; folders of earlier runs whose process is
    gone (killed) are removed first."""
    var.mkdir(parents=True, exist_ok=True)
    for earlier in var.glob(PREFIX + "*"):
        pid = earlier.name.removeprefix(PREFIX)
        if earlier.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(earlier, ignore_errors=True)
    folder = var / f"{PREFIX}{os.getpid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    settings_dict.setdefault("TEST", {})["NAME"] = str(folder / "db.sqlite3")
    try:
        yield
    finally:
        shutil.rmtree(folder, ignore_errors=True)
