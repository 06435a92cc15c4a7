"""A job cluster whose worker is killed outright (SIGKILL, the out-of-memory killer) goes on
taking jobs: an idle worker killed in django-q2's `task_queue.get()` leaves the queue's reader
lock held for good, so the cluster restarts its processes with fresh queues (ops/cluster.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django_q.models import Task
from django_q.tasks import async_task

from tests.test_jobs import ROOT, database_url


def wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def wait_for(condition, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.2)
    return condition()


@pytest.fixture
def cluster(engine_home, tmp_path, request):
    log = tmp_path / "cluster.log"
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home), "LOG_FORMAT": "text",
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "2"}
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                                   stdout=subprocess.DEVNULL, stderr=sink, process_group=0)
    process.log = log
    request.node.cluster_log = log
    try:
        yield process
    finally:
        stop(process)


def stop(process: subprocess.Popen) -> None:
    """Stop a cluster as Ctrl-C does, then kill whatever of its group is left (a failed test's
    processes would hold the test database)."""
    process.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def worker_pids(cluster) -> list[int]:
    return [int(pid) for pid in re.findall(r"ready for work at (\d+)", cluster.log.read_text())]


def busy_worker(cluster, func: str) -> int | None:
    """The process id of the worker running `func` (from the cluster's log), once one is."""
    log = cluster.log.read_text()
    pids = dict(re.findall(r"(Process-\w+) ready for work at (\d+)", log))
    names = re.findall(rf"(Process-\w+) processing [\w-]+ '{re.escape(func)}'", log)
    return int(pids[names[0]]) if names and names[0] in pids else None


def live(pid: int) -> bool:
    return wchan(pid) != "" and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def completes(task_id: str, seconds: float = 60) -> bool:
    return bool(wait_for(lambda: Task.objects.filter(id=task_id, success=True).exists(), seconds))


@pytest.mark.django_db(transaction=True)
def test_it_takes_jobs_again_after_an_idle_worker_is_killed(cluster):
    # One worker waits in the queue's pipe holding its reader lock, the other waits for that lock.
    idle = wait_for(lambda: next((pid for pid in worker_pids(cluster) if wchan(pid) == "anon_pipe_read"), None))
    assert idle, cluster.log.read_text()
    os.kill(idle, signal.SIGKILL)
    # (a job the old pusher took in the half second before the restart comes back only after
    # Q_CLUSTER "retry": the job asked for here is asked for once the new processes run)
    assert wait_for(lambda: "restarting its processes" in cluster.log.read_text()
                    and len(worker_pids(cluster)) >= 4), cluster.log.read_text()

    task_id = async_task("tests.jobs.work_on", 7)
    assert completes(task_id), cluster.log.read_text()
    assert Task.objects.get(id=task_id).result == 7
    assert "restarting its processes" in cluster.log.read_text()
    # The old generation is gone (no worker of it left behind) and the new one works on.
    assert wait_for(lambda: not any(live(pid) for pid in worker_pids(cluster)[:2]), 10)
    second = async_task("tests.jobs.work_on", 8)
    assert completes(second)


@pytest.mark.django_db(transaction=True)
def test_it_takes_jobs_again_after_a_busy_worker_is_killed(cluster, tmp_path):
    started = tmp_path / "started"
    async_task("tests.jobs.pause", 30, str(started))
    # (killed once its job runs: between taking a job and starting it a worker reads as idle,
    # and an idle worker's death restarts every process)
    assert wait_for(started.exists), cluster.log.read_text()
    pid = busy_worker(cluster, "tests.jobs.pause")
    assert pid, cluster.log.read_text()
    os.kill(pid, signal.SIGKILL)

    task_id = async_task("tests.jobs.work_on", 9)
    assert completes(task_id), cluster.log.read_text()
    # A worker killed while it ran a job held no queue lock: it is replaced alone, the others
    # go on, and jobs keep running (no restart of the whole cluster).
    assert wait_for(lambda: "reincarnated worker" in cluster.log.read_text(), 10), cluster.log.read_text()
    second = async_task("tests.jobs.work_on", 10)
    assert completes(second), cluster.log.read_text()
    assert "restarting its processes" not in cluster.log.read_text()


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def sentinel_of(cluster) -> int | None:
    """The cluster's sentinel: the main process's one child that has workers under it."""
    return next((pid for pid in children(cluster.pid) if children(pid)), None)


def restarted_with_new_workers(cluster, before: int, seconds: float = 60) -> bool:
    return bool(wait_for(lambda: len(worker_pids(cluster)) >= before + 2, seconds))


@pytest.mark.django_db(transaction=True)
def test_it_restarts_its_processes_when_the_sentinel_is_killed_and_waits_before_a_second_restart(cluster):
    assert wait_for(lambda: len(worker_pids(cluster)) >= 2 and sentinel_of(cluster)), cluster.log.read_text()
    first_workers = worker_pids(cluster)[:2]
    os.kill(sentinel_of(cluster), signal.SIGKILL)

    assert restarted_with_new_workers(cluster, 2), cluster.log.read_text()
    log = cluster.log.read_text()
    assert "sentinel was killed (signal 9)" in log
    assert "waiting" not in log  # the first restart comes at once
    # The killed sentinel's workers were killed with it, and the new processes take jobs.
    assert wait_for(lambda: not any(live(pid) for pid in first_workers), 10), log
    task_id = async_task("tests.jobs.work_on", 11)
    assert completes(task_id), cluster.log.read_text()

    # A second restart within the window waits first (a job that kills its processes every
    # time cannot make the cluster spin).
    assert wait_for(lambda: sentinel_of(cluster)), cluster.log.read_text()
    os.kill(sentinel_of(cluster), signal.SIGKILL)
    assert wait_for(lambda: "restarted 1 times within 600 s: waiting 5 s first" in cluster.log.read_text(), 30), \
        cluster.log.read_text()
    assert restarted_with_new_workers(cluster, 4), cluster.log.read_text()
    second = async_task("tests.jobs.work_on", 12)
    assert completes(second), cluster.log.read_text()


@pytest.fixture
def stall_seconds(monkeypatch):
    monkeypatch.setenv("Q_STALL_SECONDS", "8")


@pytest.mark.django_db(transaction=True)
def test_it_restarts_its_processes_when_their_guard_stops_moving(stall_seconds, cluster):
    assert wait_for(lambda: len(worker_pids(cluster)) >= 2 and sentinel_of(cluster)), cluster.log.read_text()
    first_workers = worker_pids(cluster)[:2]
    sentinel = sentinel_of(cluster)
    os.kill(sentinel, signal.SIGSTOP)  # alive, never ticking: as a guard stuck on a dead worker's lock
    try:
        assert wait_for(lambda: "has not moved for 8 s: restarting its processes" in cluster.log.read_text(), 60), \
            cluster.log.read_text()
        assert restarted_with_new_workers(cluster, 2), cluster.log.read_text()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(sentinel, signal.SIGCONT)
    # The stuck sentinel and its workers were killed; the new processes take jobs.
    assert wait_for(lambda: not live(sentinel) and not any(live(pid) for pid in first_workers), 10), \
        cluster.log.read_text()
    task_id = async_task("tests.jobs.work_on", 13)
    assert completes(task_id), cluster.log.read_text()


def gone(pid: int) -> bool:
    """Ended and collected: no /proc entry at all (a zombie still has one)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.mark.django_db(transaction=True)
def test_a_killed_workers_tools_are_collected_and_none_outlives_its_generation(cluster, tmp_path):
    pid_file = tmp_path / "children"
    async_task("tests.jobs.leave_children", str(pid_file), 60)
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text()), cluster.log.read_text()
    short, long = (int(pid) for pid in pid_file.read_text().split())

    worker = wait_for(lambda: busy_worker(cluster, "tests.jobs.leave_children"))
    os.kill(worker, signal.SIGKILL)  # replaced alone; its two children are the main process's now
    # The one that ends is collected (not left a zombie); the other runs on, for now.
    assert wait_for(lambda: gone(short), 20), Path(f"/proc/{short}/stat").read_text()
    assert live(long)
    # When the generation goes (here its sentinel is killed), what it left behind goes with it.
    assert wait_for(lambda: sentinel_of(cluster)), cluster.log.read_text()
    os.kill(sentinel_of(cluster), signal.SIGKILL)
    assert wait_for(lambda: gone(long), 30), cluster.log.read_text()
    assert completes(async_task("tests.jobs.work_on", 14)), cluster.log.read_text()


@pytest.mark.django_db(transaction=True)
def test_a_step_of_the_wall_clock_is_not_a_stalled_guard(engine_home, tmp_path):
    """NTP stepping the clock, a virtual machine resumed: time.time() jumps (here by 5 minutes,
    again and again, in every process of the cluster); the guard still ticks and nothing is
    restarted."""
    clock = tmp_path / "offset"
    clock.write_text("0")
    boot = ("import os, sys, time\n"
            "real = time.time\n"
            "def fake():\n"
            "    try:\n"
            f"        return real() + float(open({str(clock)!r}).read() or 0)\n"
            "    except (OSError, ValueError):\n"
            "        return real()\n"
            "time.time = fake\n"
            "sys.argv = ['manage.py', 'qcluster']\n"
            "from django.core.management import execute_from_command_line\n"
            "execute_from_command_line(sys.argv)\n")
    log = tmp_path / "cluster.log"
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home), "LOG_FORMAT": "text",
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1"}
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-c", boot], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                   stderr=sink, process_group=0)
    try:
        assert wait_for(lambda: "running." in log.read_text()), log.read_text()
        offset = 0
        for _step in range(25):
            offset += 300
            clock.write_text(str(offset))
            time.sleep(0.3)
        time.sleep(2)
        assert "has not moved" not in log.read_text() and "restarting its processes" not in log.read_text()
        assert completes(async_task("tests.jobs.work_on", 15)), log.read_text()
    finally:
        stop(process)
