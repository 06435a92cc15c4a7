"""What `manage.py serve` removes from its metrics folder (PROMETHEUS_MULTIPROC_DIR) at start:
prometheus-client's figures files of an earlier run, nothing else. r114: it removed every `*.db`
there, so a SQLite database named lethe.db in the metrics folder was deleted at start (serve
then stopped saying the database was missing), and PROMETHEUS_MULTIPROC_DIR=/ ended in a
traceback. A folder that is or holds the database, ENGINE_HOME, LETHE_VAR_DIR or the backup
folder, or holds a `*.db` that is not a figures file, stops serve in one line (exit 2) having
removed nothing. Real processes; every test kills whatever it started."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.migrated import migrate
from tests.test_serve import ROOT, Tree, children_of, free_port, wait_until
from tests.test_serve_lock import answers

# As prometheus-client names them: "<type>_<pid>.db", a gauge's type being "gauge_<mode>".
FIGURES = ("counter_4242.db", "histogram_4242.db", "summary_17.db", "gauge_livesum_4242.db", "gauge_all_9.db")


def environment(tmp_path: Path, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LETHE_BACKUP_DIR", "ENGINE_URL")}
    base.update(LETHE_VAR_DIR=str(tmp_path / "var"), ENGINE_HOME=str(tmp_path / "engine"),
                DJANGO_SETTINGS_MODULE="console.settings_test", LOG_FORMAT="text", WEB_CONCURRENCY="1",
                WEB_THREADS="2")
    base.update(env)
    return base


def refused(env: dict[str, str]) -> str:
    """serve's one line (exit 2) on a metrics folder it must not use. A serve that starts instead
    is stopped, its whole process group, and the test fails."""
    serve = subprocess.Popen([sys.executable, "manage.py", "serve", "--only", "web", f"127.0.0.1:{free_port()}"],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        _out, stderr = serve.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(serve.pid, signal.SIGTERM)
        _out, stderr = serve.communicate(timeout=30)
        pytest.fail(f"serve started on that metrics folder: {stderr[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(serve.pid, signal.SIGKILL)
    assert serve.returncode == 2, stderr[-3000:]
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert stderr.startswith("Lethe configuration error: PROMETHEUS_MULTIPROC_DIR names "), stderr
    return stderr


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_database_in_the_metrics_folder_is_not_deleted_and_serve_refuses_in_one_line(tmp_path):
    """The reviewer's repro: DATABASE_URL=sqlite:///$D/lethe.db and PROMETHEUS_MULTIPROC_DIR=$D."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    database = data / "lethe.db"
    env = environment(tmp_path, DATABASE_URL=f"sqlite:///{database}", PROMETHEUS_MULTIPROC_DIR=str(data))
    migrate(env)
    before = digest(database)
    (data / "counter_4242.db").write_bytes(b"figures of an earlier run")

    line = refused(env)
    assert f"names {data}, which holds the SQLite database file ({database})." in line
    assert database.is_file() and digest(database) == before
    assert (data / "counter_4242.db").read_bytes() == b"figures of an earlier run"  # nothing removed at all
    assert not (tmp_path / "data.lock").exists()  # refused before the folder was claimed


@pytest.mark.parametrize("holds", ["ENGINE_HOME", "LETHE_VAR_DIR", "LETHE_BACKUP_DIR"])
def test_a_metrics_folder_that_holds_a_folder_of_lethe_data_is_refused(tmp_path, holds):
    env = environment(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'db' / 'lethe.sqlite3'}",
                      PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    migrate(env)
    inner = tmp_path / "metrics" / "data"
    env[holds] = str(inner)
    inner.mkdir(parents=True)
    what = {"ENGINE_HOME": "ENGINE_HOME", "LETHE_VAR_DIR": "LETHE_VAR_DIR", "LETHE_BACKUP_DIR": "the backup folder"}
    assert f"which holds {what[holds]} ({inner})." in refused(env)
    env["PROMETHEUS_MULTIPROC_DIR"] = str(inner)  # the folder itself
    assert f"which is {what[holds]} ({inner})." in refused(env)


def test_the_root_folder_is_refused_in_one_line(tmp_path):
    """r114: PROMETHEUS_MULTIPROC_DIR=/ ended serve in a traceback (ValueError: PosixPath('/') has
    an empty name)."""
    env = environment(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'db' / 'lethe.sqlite3'}",
                      PROMETHEUS_MULTIPROC_DIR="/")
    migrate(env)
    assert refused(env) == ("Lethe configuration error: PROMETHEUS_MULTIPROC_DIR names /, the root folder. Set "
                            "PROMETHEUS_MULTIPROC_DIR to a folder of its own (unset: $LETHE_VAR_DIR/prometheus): serve "
                            "removes the request figures files of an earlier run from it at every start.\n")


def test_a_foreign_db_file_is_never_deleted_and_only_figures_files_are_removed(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    env = environment(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'db' / 'lethe.sqlite3'}",
                      PROMETHEUS_MULTIPROC_DIR=str(metrics))
    migrate(env)
    for name in FIGURES:
        (metrics / name).write_bytes(b"figures of an earlier run")
    (metrics / "other.db").write_bytes(b"someone's data")
    (metrics / "README").write_text("the metrics folder\n")
    (metrics / "counter_notapid.db.bak").write_bytes(b"a copy")

    # A *.db that is not a figures file: every /metrics answer would read it as figures and fail.
    line = refused(env)
    assert "which holds other.db, not request figures files: every /metrics answer would read it" in line
    assert (metrics / "other.db").read_bytes() == b"someone's data"
    assert sorted(p.name for p in metrics.iterdir()) == sorted(
        [*FIGURES, "other.db", "README", "counter_notapid.db.bak"])

    # Moved away by its owner: serve starts, removes the figures files of the earlier run and
    # nothing else.
    (metrics / "other.db").rename(tmp_path / "other.db")
    port = free_port()
    tree = Tree()
    try:
        serve = subprocess.Popen([sys.executable, "manage.py", "serve", f"127.0.0.1:{port}", "--only", "web"],
                                 cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        tree.pids.add(serve.pid)
        tree.groups.add(serve.pid)
        assert wait_until(lambda: answers(port), 60), "serve did not answer /healthz"
        for kid in children_of(serve.pid):
            tree.pids.add(kid)
            tree.groups.add(os.getpgid(kid))
        left = {p.name for p in metrics.iterdir()}
        assert not left & set(FIGURES)
        assert {"README", "counter_notapid.db.bak"} <= left
        assert (metrics / "README").read_text() == "the metrics folder\n"
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(30) == 0
    finally:
        tree.cleanup()
    assert (tmp_path / "other.db").read_bytes() == b"someone's data"
