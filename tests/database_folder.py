"""Each test process's SQLite database and backup folder in a folder of its own.

The test database used to sit in var/ beside every other test process's (the SQLite suite,
the browser suite and the PostgreSQL suite run side by side under `make test`), and all made
their backups in var/backups. A test that takes the write bits off its database's folder
(tests/test_health.py: a folder nobody may write makes /readyz say read_only) took them off
everyone's: a connection another suite opened in that moment was opened read-only, as Lethe
opens a database whose folder grants nobody writing (console/sqlite/base.py), and every later
write of that suite failed with "attempt to write a readonly database". And one backup at a
time per folder: a backup of one suite made another's, in the same moment, `busy`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

PREFIX = "test-run-"


@contextlib.contextmanager
def own_test_folder(settings_dict: dict, var: Path) -> Iterator[Path]:
    """var/test-run-<pid>/, made (owner-only) for this process and removed after, holding a
    SQLite database's test database (in db/, which holds nothing else) and the backup folder
    (backups/, LETHE_BACKUP_DIR for the processes the tests start too, unless the environment
    names one). Folders of earlier runs whose process is gone (killed) are removed first."""
    var.mkdir(parents=True, exist_ok=True)
    for earlier in var.glob(PREFIX + "*"):
        pid = earlier.name.removeprefix(PREFIX)
        if earlier.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(earlier, ignore_errors=True)
    folder = var / f"{PREFIX}{os.getpid()}"
    (folder / "db").mkdir(mode=0o700, parents=True, exist_ok=True)
    if settings_dict["ENGINE"] != "django.db.backends.postgresql":
        settings_dict.setdefault("TEST", {})["NAME"] = str(folder / "db" / f"test-db-{os.getpid()}.sqlite3")
    named = os.environ.get("LETHE_BACKUP_DIR")
    if not named:
        os.environ["LETHE_BACKUP_DIR"] = str(folder / "backups")
    try:
        yield folder
    finally:
        if not named:
            os.environ.pop("LETHE_BACKUP_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)
