from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection
from django_q.models import Schedule
from django_q.tasks import async_task

from lifecycle.enginefs import EngineHome
from retention.models import StorageSnapshot
from retention.schedules import ensure_schedules
from retention.tasks import measure_engine_folder

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    user = f"{db['USER']}:{db['PASSWORD']}" if db.get("PASSWORD") else db["USER"]
    return f"postgres://{user}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


@contextlib.contextmanager
def running_cluster(env: dict) -> Iterator[subprocess.Popen]:
    """A real `qcluster` with this environment, in its own process group; stopped as Ctrl-C
    stops it, and whatever of its group is left after 30 s killed."""
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, process_group=0)
    try:
        yield cluster
    finally:
        cluster.send_signal(signal.SIGINT)
        try:
            cluster.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(cluster.pid, signal.SIGKILL)
            cluster.wait()


@pytest.mark.django_db
def test_it_measures_the_engine_folder_and_is_safe_to_run_twice(engine_home):
    home = EngineHome()
    home.write_atomic(home.events_path("c_" + "1" * 20), b"x" * 100)
    home.write_atomic(home.artifacts_dir("c_" + "1" * 20) / "big.txt", b"y" * 900)
    # two files, their two lock files and the folder's mark (33 bytes; lifecycle.engine_folder)
    assert measure_engine_folder() == {"files": 5, "bytes": 1033}
    first = StorageSnapshot.load()
    assert (first.engine_files, first.engine_bytes) == (5, 1033) and first.measured_at is not None
    measure_engine_folder()
    assert StorageSnapshot.objects.count() == 1
    assert StorageSnapshot.load().engine_bytes == 1033


@pytest.mark.django_db
def test_it_creates_each_schedule_once_by_name():
    ensure_schedules()
    ensure_schedules()
    schedule = Schedule.objects.get(name="measure-engine-folder")
    assert (schedule.func, schedule.minutes, schedule.repeats) == ("retention.tasks.measure_engine_folder", 15, -1)
    assert Schedule.objects.filter(name="measure-engine-folder").count() == 1


@pytest.mark.django_db
def test_it_shows_the_last_measurement_on_the_page(admin_client, engine_home):
    page = admin_client.get("/settings/system/data-storage/", HTTP_HOST="127.0.0.1").content.decode()
    assert "Not measured yet" in page
    EngineHome().write_atomic(EngineHome().events_path("c_" + "9" * 20), b"z" * 2048)
    measure_engine_folder()
    page = admin_client.get("/settings/system/data-storage/", HTTP_HOST="127.0.0.1").content.decode()
    assert "3 files, 2.0\xa0KB" in page and "measured" in page  # with the lock file and the folder's mark


@pytest.mark.django_db(transaction=True)
def test_it_runs_a_queued_job_on_a_real_cluster(engine_home):
    EngineHome().write_atomic(EngineHome().events_path("c_" + "2" * 20), b"q" * 321)
    async_task("retention.tasks.measure_engine_folder")
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1"}
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and StorageSnapshot.objects.filter(measured_at__isnull=False).count() == 0:
            time.sleep(0.5)
        snapshot = StorageSnapshot.load()
        assert (snapshot.engine_files, snapshot.engine_bytes) == (3, 354)  # with the lock file and the mark
    finally:
        cluster.send_signal(signal.SIGINT)
        try:
            cluster.wait(30)
        except subprocess.TimeoutExpired:
            cluster.kill()
