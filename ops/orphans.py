"""A child of `manage.py serve` that outlives serve stops for good within a deadline.

serve starts each child with PR_SET_PDEATHSIG, so a serve killed outright (SIGKILL, the
kernel's out-of-memory killer) still sends its children SIGTERM, and they stop gracefully.
serve itself bounds a normal stop (its grace period, then SIGKILL to the child's process
group), but nothing is left to do that once serve is gone. The job cluster's graceful stop
waits for the jobs it has taken and queued, for up to the task timeout (minutes); under load
it was seen still running 90 s after serve died. Every Lethe job resumes correctly after a
kill at any line, so after the deadline the child kills its whole process group (itself, its
sentinel, pusher, monitor and workers).

serve names itself in `LETHE_STOP_WITH_PARENT` (its pid) for the children it starts; the
guard is a daemon thread in the process that Django starts in (`ConsoleConfig.ready`), armed
only there and only when the variable names its parent. A cluster started any other way
(a service manager, a shell) is untouched.
"""

from __future__ import annotations

import os
import signal
import threading
import time

ENV = "LETHE_STOP_WITH_PARENT"
DEADLINE_ENV = "LETHE_STOP_WITH_PARENT_SECONDS"
DEADLINE_SECONDS = 30.0  # after the parent is gone: serve's own grace (15 s) and then some


def arm_from_environment() -> bool:
    """Start the guard when this process was started by the serve named in the environment."""
    raw = os.environ.pop(ENV, "")  # the children this process starts are not serve's
    wait = os.environ.pop(DEADLINE_ENV, "")
    if not raw.isdigit():
        return False
    parent = int(raw)
    if parent != os.getppid() and not _gone(parent):
        return False  # named by another process's environment, inherited: not serve's child
    try:
        deadline = max(0.0, float(wait)) if wait else DEADLINE_SECONDS
    except ValueError:
        deadline = DEADLINE_SECONDS
    threading.Thread(target=_watch, args=(parent, deadline), name="lethe-stop-with-parent", daemon=True).start()
    return True


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _watch(parent: int, deadline: float) -> None:
    while os.getppid() == parent:
        time.sleep(0.5)
    time.sleep(deadline)
    # Still here: the graceful stop did not finish. The whole group goes, this process last.
    os.killpg(os.getpgid(0), signal.SIGKILL)
