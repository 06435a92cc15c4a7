"""A migrated SQLite database for tests that start Lethe's commands as real processes.

Applying every migration takes about 5 s of CPU (Django renders the model state of each of
them), and many such tests only need a database as `manage.py migrate` leaves it, not the
migrating: they get a copy of one database migrated once per test run, by the same
`manage.py migrate` of this checkout. Tests about migrating itself (a database behind, a
migration run back, the files migrate makes and their modes) still run it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_template: Path | None = None


def _migrated_once() -> Path:
    global _template
    if _template is None:
        folder = Path(tempfile.mkdtemp(prefix="lethe-migrated-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        database = folder / "lethe.sqlite3"
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
        env.update(DJANGO_SETTINGS_MODULE="console.settings_test", DATABASE_URL=f"sqlite:///{database}",
                   LETHE_VAR_DIR=str(folder / "var"), ENGINE_HOME=str(folder / "engine"))
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True, timeout=300)
        # Closed by its last connection: no -wal or -shm beside it, all of it in the one file.
        assert not Path(f"{database}-wal").exists(), "the migrated database was left with a write-ahead log"
        _template = database
    return _template


def database_of(env: dict[str, str]) -> Path:
    """The SQLite file `env` names: DATABASE_URL (sqlite:///<absolute path>), else the default
    under LETHE_VAR_DIR."""
    url = env.get("DATABASE_URL")
    if url is None:
        return Path(env["LETHE_VAR_DIR"]) / "lethe.sqlite3"
    assert url.startswith("sqlite:////"), f"not a SQLite file at an absolute path: {url}"
    return Path(url.removeprefix("sqlite:///"))


def migrate(env: dict[str, str]) -> Path:
    """The database `env` names, made as `manage.py migrate` with `env` makes a new one: every
    migration applied, a private file (0600) in a private var folder. Returns its path."""
    database = database_of(env)
    assert not database.exists(), f"{database} exists already"
    if "LETHE_VAR_DIR" in env:
        Path(env["LETHE_VAR_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_migrated_once(), database)
    database.chmod(0o600)
    return database


def run_data_migration(app: str, name: str, function: str) -> None:
    """One data migration's function, run on the test database as `migrate` runs it: with the
    models as that migration sees them, on this connection."""
    import importlib

    from django.db import connection
    from django.db.migrations.loader import MigrationLoader

    state = MigrationLoader(connection).project_state((app, name)).apps
    getattr(importlib.import_module(f"{app}.migrations.{name}"), function)(
        state, type("Editor", (), {"connection": connection})())
