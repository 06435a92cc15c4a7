"""A copy of the database (restored from its backup into another database, or its file copied
or moved) and the original, pointed at one engine folder: only one of them erases in it. Real
processes on real files (r30: after the documented restore both said "is this database's engine
folder", and a delete through the set-aside original erased a live conversation's files in the
restored one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.migrated import migrate

ROOT = Path(__file__).resolve().parent.parent
CLEAR = ("DATABASE_URL", "LETHE_VAR_DIR", "ENGINE_HOME", "PROMETHEUS_MULTIPROC_DIR", "SECRET_KEY", "SECRET_KEY_FILE",
         "ENGINE_URL", "STATIC_ROOT")

sqlite_suite_only = pytest.mark.skipif(os.environ.get("DATABASE_URL", "").startswith("postgres"),
                                       reason="its own SQLite installs either way: run once, in the SQLite suite")


def manage(database: Path, engine: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", SECRET_KEY="lethe-copy-tests-" + "k" * 40,
               LETHE_VAR_DIR=str(database.parent), DATABASE_URL=f"sqlite:///{database}", ENGINE_HOME=str(engine))
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


KEYS = ("from lifecycle.models import EngineFolderMark as M; from retention.backups import database_key, own_keys; "
        "m = M.objects.get(); print(m.folder_id, m.database_key, database_key(), ','.join(sorted(own_keys())))")


@sqlite_suite_only
def test_a_copy_of_the_database_waits_until_it_takes_the_folder_and_then_the_original_waits(tmp_path):
    engine = tmp_path / "engine"
    original = tmp_path / "var" / "lethe.sqlite3"
    migrate({"DATABASE_URL": f"sqlite:///{original}"})
    adopted = manage(original, engine, "engine_folder", "--adopt")
    assert adopted.returncode == 0, adopted.stderr[-2000:]
    mark, recorded_key, original_key, _ = manage(original, engine, "shell", "-v0", "-c", KEYS).stdout.split()
    assert recorded_key == original_key

    copy = tmp_path / "restored" / "lethe.sqlite3"  # the restore of a backup, somewhere else
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    said = manage(copy, engine, "engine_folder")
    assert said.returncode == 1
    assert said.stdout.startswith(f"{engine}: another database's engine folder. This database is a copy of the one "
                                  f"that marked it (mark {mark})")
    refused = manage(copy, engine, "engine_folder", "--adopt")  # never two databases in one folder unasked
    assert refused.returncode == 2 and "--take-from-other-database" in refused.stderr
    assert manage(original, engine, "engine_folder").returncode == 0  # still the original's

    taken = manage(copy, engine, "engine_folder", "--adopt", "--take-from-other-database")
    assert taken.returncode == 0, taken.stderr[-2000:]
    new_mark, copy_recorded, copy_key, owned = manage(copy, engine, "shell", "-v0", "-c", KEYS).stdout.split()
    assert new_mark != mark and copy_recorded == copy_key != original_key
    assert (engine / ".lethe-engine-folder").read_text().strip() == new_mark
    # the original's backups hold the copy's content: still its own
    assert set(owned.split(",")) == {copy_key, original_key}
    assert manage(copy, engine, "engine_folder").returncode == 0
    now_other = manage(original, engine, "engine_folder")
    assert now_other.returncode == 1 and "another database's engine folder" in now_other.stdout


KEY = "from retention.backups import database_key, location_key; print(database_key(), location_key())"


@pytest.mark.django_db
def test_a_postgresql_database_has_one_key_however_its_server_is_reached():
    """The key the engine folder's mark records, compared on every delete: hosts that reach
    one PostgreSQL server under different names (an address, localhost) must agree, or the
    deletes of some would wait as a copy's do. Another database on that server is another."""
    from django.db import connection

    url = os.environ.get("DATABASE_URL", "")
    if connection.vendor != "postgresql" or not url:
        pytest.skip("a PostgreSQL server's identifier")
    name = connection.settings_dict["NAME"]
    env = {k: v for k, v in os.environ.items() if k not in CLEAR}
    env.update(DJANGO_SETTINGS_MODULE="console.settings", SECRET_KEY="lethe-copy-tests-" + "k" * 40)
    port = connection.settings_dict.get("PORT") or 5432
    keys = {}
    for host, database in (("127.0.0.1", name), ("localhost", name), ("127.0.0.1", "postgres")):
        shown = subprocess.run([sys.executable, str(ROOT / "manage.py"), "shell", "-v0", "-c", KEY], cwd=ROOT,
                               env={**env, "DATABASE_URL": f"postgres://postgres@{host}:{port}/{database}"},
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr[-2000:]
        keys[host, database] = shown.stdout.split()
    assert keys["127.0.0.1", name][0] == keys["localhost", name][0]
    assert keys["127.0.0.1", name][1] != keys["localhost", name][1]  # (where it is reached: not the same)
    assert keys["127.0.0.1", "postgres"][0] != keys["127.0.0.1", name][0]


@sqlite_suite_only
def test_the_take_over_gives_a_new_mark_even_where_the_copy_cannot_be_told(tmp_path):
    """r32: a copy made from a backup older than the key, migrated, recorded its own key and so
    took the folder for its own; the restore steps' take-over then kept the mark, and both
    databases erased in the folder. The take-over always writes a new mark."""
    engine = tmp_path / "engine"
    original = tmp_path / "var" / "lethe.sqlite3"
    migrate({"DATABASE_URL": f"sqlite:///{original}"})
    assert manage(original, engine, "engine_folder", "--adopt").returncode == 0
    mark = manage(original, engine, "shell", "-v0", "-c", KEYS).stdout.split()[0]
    copy = tmp_path / "restored" / "lethe.sqlite3"
    copy.parent.mkdir()
    shutil.copyfile(original, copy)
    stamped = ("from lifecycle.models import EngineFolderMark as M; from retention.backups import database_key; "
               "M.objects.update(database_key=database_key(), origin_keys=[])")  # as migrate stamps a pre-key row
    assert manage(copy, engine, "shell", "-v0", "-c", stamped).returncode == 0
    assert manage(copy, engine, "engine_folder").returncode == 0  # cannot be told: the restore steps take over
    assert manage(copy, engine, "engine_folder", "--adopt", "--take-from-other-database").returncode == 0
    assert (engine / ".lethe-engine-folder").read_text().strip() != mark
    assert manage(copy, engine, "engine_folder").returncode == 0
    assert manage(original, engine, "engine_folder").returncode == 1  # its deletes wait


@sqlite_suite_only
def test_a_database_file_reached_through_a_link_restored_as_the_steps_say(tmp_path):
    """r32: with var/lethe.sqlite3 a link to the real file, the restore steps' move took the
    link, and with it the key (the link's target), to the set-aside name: the restored file
    counted as a copy and the set-aside one erased in the folder. The key is the path as named."""
    engine = tmp_path / "engine"
    (tmp_path / "data").mkdir()
    (tmp_path / "var").mkdir()
    real = tmp_path / "data" / "real.sqlite3"
    named = tmp_path / "var" / "lethe.sqlite3"
    real.touch()
    named.symlink_to(real)
    assert manage(named, engine, "migrate", "-v0").returncode == 0
    assert manage(named, engine, "engine_folder", "--adopt").returncode == 0
    backup = tmp_path / "backup.sqlite3"
    shutil.copyfile(real, backup)
    aside = tmp_path / "var" / "aside.sqlite3"
    named.rename(aside)  # "move the current database file aside", as the steps say
    shutil.copyfile(backup, named)  # "copy the backup in its place"
    assert manage(named, engine, "migrate", "-v0").returncode == 0
    restored = manage(named, engine, "engine_folder")
    assert restored.returncode == 0 and "is this database's engine folder" in restored.stdout
    set_aside = manage(aside, engine, "engine_folder")
    assert set_aside.returncode == 1 and "This database is a copy" in set_aside.stdout
