"""Jobs the tests queue on a real cluster (importable by the `qcluster` subprocess)."""

from __future__ import annotations

import logging

logger = logging.getLogger("lethe.tests")
SECRET = "do-not-log-this-7c1f"


def work_on(operation_id: int) -> int:
    logger.info("working")
    return operation_id


def explode() -> None:
    raise RuntimeError(f"refused the row holding {SECRET}")


def pause(seconds: float, started: str = "") -> float:
    """Keeps a worker busy (the tests kill it mid-job); writes `started` once it runs (the
    worker's timer is set by then: it counts as busy)."""
    import time
    from pathlib import Path

    if started:
        Path(started).write_text("running")
    time.sleep(seconds)
    return seconds


def leave_children(pid_file: str, seconds: float) -> float:
    """Starts two processes it never waits for (one ends in 2 s, one would run 10 minutes),
    writes their ids to `pid_file`, then keeps its worker busy: as a job whose tool outlives a
    killed worker."""
    import subprocess
    import time
    from pathlib import Path

    short = subprocess.Popen(["sleep", "2"])
    long = subprocess.Popen(["sleep", "600"])
    Path(pid_file).write_text(f"{short.pid} {long.pid}")
    time.sleep(seconds)
    return seconds
