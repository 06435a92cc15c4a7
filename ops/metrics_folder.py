"""The figures of web workers that have exited, folded into one file per kind.

prometheus-client's multiprocess mode keeps a file per process and kind ("counter_<pid>.db",
"histogram_<pid>.db") and adds them all up at every scrape; a worker's files stay after it
exits, or its requests would stop counting. Workers are replaced every WEB_MAX_REQUESTS
requests, so over months the folder grew without bound, and /metrics read every file (r142:
1,124 files, 71 MB, after 562 replacements). When a worker exits, the gunicorn master (one
process, so the only writer of these files) adds its counters and histograms into
"counter_exited.db" and "histogram_exited.db" and removes its own files: the totals are the
same, the folder holds the live workers' files and two more.

Loaded by the gunicorn master before Django (ops/gunicorn_config.py): standard library and
prometheus-client only.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

EXITED = "exited"
KINDS = ("counter", "histogram")  # what adds up across processes; gauges are marked dead instead


def fold_exited_worker(folder: str | os.PathLike, pid: int) -> int:
    """Add the exited worker `pid`'s counters and histograms into the exited workers' files and
    remove its own. Returns how many of its files were folded."""
    folded = 0
    for kind in KINDS:
        own = Path(folder) / f"{kind}_{pid}.db"
        try:
            values = list(MmapedDict.read_all_values_from_file(str(own)))
        except FileNotFoundError:
            continue
        into = MmapedDict(str(Path(folder) / f"{kind}_{EXITED}.db"))
        try:
            for key, value, timestamp, _position in values:
                total, _at = into.read_value(key)
                into.write_value(key, total + value, timestamp)
        finally:
            into.close()
        # A scrape between the two adds this worker's figures twice, once: never fewer
        # (a counter that went down would read as a restart).
        own.unlink()
        folded += 1
    return folded
