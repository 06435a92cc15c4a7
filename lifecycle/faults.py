"""Fault injection for crash tests, inert unless the test environment asks for it.

`LETHE_TEST_KILL_AT` names points (comma-separated, `*` for all) at which the process
SIGKILLs itself, once per point: a marker file in `LETHE_TEST_KILL_DIR` records that the
point has been killed at, so the restarted worker goes past it. `LETHE_TEST_PAUSE_AT`
(`point=seconds`, comma-separated) makes it wait there instead, as a long step would.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def kill_point(name: str) -> None:
    for pause in filter(None, os.environ.get("LETHE_TEST_PAUSE_AT", "").split(",")):
        point, _, seconds = pause.partition("=")
        if point.strip() == name:
            time.sleep(float(seconds))
    points = os.environ.get("LETHE_TEST_KILL_AT", "")
    folder = os.environ.get("LETHE_TEST_KILL_DIR", "")
    if not points or not folder:
        return
    wanted = {p.strip() for p in points.split(",")}
    if name not in wanted and "*" not in wanted:
        return
    marker = Path(folder) / name.replace("/", "_")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
