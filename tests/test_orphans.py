"""A child of serve whose graceful stop hangs still stops once serve is gone (ops/orphans.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# A child that ignores SIGTERM (a graceful stop that never ends) and has a worker of its own
CHILD = r"""
import os, signal, sys, time
sys.path.insert(0, {root!r})
from ops.orphans import arm_from_environment
signal.signal(signal.SIGTERM, signal.SIG_IGN)
armed = arm_from_environment()
worker = os.fork()
if worker == 0:
    while True:
        time.sleep(1)
print(armed, worker, flush=True)
while True:
    time.sleep(1)
"""

# The parent: starts the child in its own process group, as serve does, then waits to be killed
PARENT = r"""
import os, subprocess, sys, time
env = dict(os.environ, LETHE_STOP_WITH_PARENT=str(os.getpid()), LETHE_STOP_WITH_PARENT_SECONDS={seconds!r})
child = subprocess.Popen([sys.executable, "-c", {child!r}], env=env, process_group=0, stdout=subprocess.PIPE, text=True)
print(child.pid, child.stdout.readline().strip(), flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start(seconds: str, **env: str) -> tuple[subprocess.Popen, int, int, str]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(seconds=seconds, child=CHILD.format(root=str(ROOT)))],
                              env={**os.environ, **env}, stdout=subprocess.PIPE, text=True, start_new_session=True)
    child, armed, worker = parent.stdout.readline().split()
    return parent, int(child), int(worker), armed


def test_once_its_parent_is_killed_a_hung_child_and_its_workers_are_killed_after_the_deadline():
    parent, child, worker, armed = start("1")
    try:
        assert armed == "True" and alive(child) and alive(worker)
        time.sleep(1.5)
        assert alive(child) and alive(worker)  # the parent is alive: nothing happens
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 20
        while (alive(child) or alive(worker)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(child) and not alive(worker)
    finally:
        for pid in (child, worker):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


ARMED = f"import sys; sys.path.insert(0, {str(ROOT)!r})\nfrom ops.orphans import arm_from_environment\nprint(arm_from_environment())"


def test_a_process_that_serve_did_not_start_is_never_armed():
    # The variable names a live process that is not its parent (inherited from elsewhere), or is unset
    for env in ({**os.environ, "LETHE_STOP_WITH_PARENT": "1"},
                {k: v for k, v in os.environ.items() if k != "LETHE_STOP_WITH_PARENT"}):
        done = subprocess.run([sys.executable, "-c", ARMED], env=env, capture_output=True, text=True, timeout=30)
        assert done.stdout.strip() == "False", done.stderr
