"""The figures of web workers that have exited, folded into one file per kind.

prometheus-client's multiprocess mode keeps a file per process and kind ("counter_<pid>.db",
"histogram_<pid>.db") and adds them all up at every scrape; a worker's files stay after it
exits, or its requests would stop counting. Workers are replaced every WEB_MAX_REQUESTS
requests, so over months the folder grew without bound, and /metrics read every file (r142:
1,124 files, 71 MB, after 562 replacements). When a worker exits, the gunicorn master (one
process, so the only writer of these files) adds its counters and histograms into
"counter_exited.db" and "histogram_exited.db" and removes its own files: the totals are the
same, the folder holds the live workers' files and two more.

A fold and a scrape never overlap (r145: a scrape met a file removed under it, 500, or counted
a worker twice, once in each file): the fold holds the folder's lock exclusively, a scrape holds
it shared (`reading`). The lock is taken on the folder itself: no file is added to a folder
that a full disk must leave as it is. The exited file is given its disk space before it is mapped (as
ops.metrics does for the workers' files): a write to a page of a sparse mapped file on a full
disk is a SIGBUS that no handler catches, and it stopped the master, and serve with it (r145).

Loaded by the gunicorn master before Django (ops/gunicorn_config.py): standard library and
prometheus-client only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict

EXITED = "exited"
KINDS = ("counter", "histogram")  # what adds up across processes; gauges are marked dead instead


# How long the master waits for the scrapes reading the folder to let it fold (r148: scrapes
# one after another can hold the shared lock for long, and the master reaps and replaces workers
# in the same loop). Past it the worker's files stay as they are, counted as before.
FOLD_WAIT = 2.0


class Busy(Exception):
    """The folder's lock could not be had in FOLD_WAIT seconds."""


@contextlib.contextmanager
def _locked(folder: str | os.PathLike, mode: int, wait: float | None = None) -> Iterator[None]:
    """The folder's lock held in `mode` (fcntl.LOCK_SH or LOCK_EX), waiting at most `wait` seconds
    when given (then Busy); without it when the folder cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        yield
        return
    try:
        if wait is None:
            fcntl.flock(fd, mode)
        else:
            deadline = time.monotonic() + wait
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise Busy(str(folder)) from None
                    time.sleep(0.01)
        yield
    finally:
        os.close(fd)  # releases the lock


def reading(folder: str | os.PathLike):
    """Held by a scrape while it reads the folder's files: no fold removes one meanwhile."""
    return _locked(folder, fcntl.LOCK_SH)


def _entry_size(key: str) -> int:
    """Bytes an entry takes in a mapped file (prometheus_client.mmap_dict._init_value)."""
    encoded = len(key.encode("utf-8"))
    return struct.calcsize("i") + encoded + (8 - (encoded + 4) % 8) + 16


def _allocated(path: Path, new_keys: list[str], used: int) -> None:
    """Give `path` its disk space, enough for `new_keys` beyond the `used` bytes it holds, before
    it is mapped: the map then never grows (a sparse page written on a full disk is a SIGBUS).
    Raises OSError (ENOSPC) when the disk cannot give it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    try:
        capacity = max(os.fstat(fd).st_size, _INITIAL_MMAP_SIZE)
        needed = max(used, 8) + sum(_entry_size(key) for key in new_keys)
        while needed > capacity:
            capacity *= 2
        os.posix_fallocate(fd, 0, capacity)
    except BaseException:
        if os.fstat(fd).st_size == 0:  # never began: a scrape must not meet an empty figures file
            with contextlib.suppress(OSError):
                os.unlink(path)
        raise
    finally:
        os.close(fd)


def fold_exited_worker(folder: str | os.PathLike, pid: int) -> int:
    """Add the exited worker `pid`'s counters and histograms into the exited workers' files and
    remove its own. Returns how many of its files were folded. An OSError (a full or read-only
    folder) leaves that worker's file as it was, counted as before, and so does Busy (the scrapes
    held the folder for FOLD_WAIT seconds)."""
    folded = 0
    with _locked(folder, fcntl.LOCK_EX, wait=FOLD_WAIT):
        for kind in KINDS:
            own = Path(folder) / f"{kind}_{pid}.db"
            try:
                values = list(MmapedDict.read_all_values_from_file(str(own)))
            except FileNotFoundError:
                continue
            into_path = Path(folder) / f"{kind}_{EXITED}.db"
            try:
                held = {key: used for key, _v, _t, used in MmapedDict.read_all_values_from_file(str(into_path))}
                used = max(held.values(), default=0) + 16
            except FileNotFoundError:
                held, used = {}, 0
            _allocated(into_path, [key for key, *_rest in values if key not in held], used)
            into = MmapedDict(str(into_path))
            try:
                for key, value, timestamp, _position in values:
                    total, _at = into.read_value(key)
                    into.write_value(key, total + value, timestamp)
            finally:
                into.close()
            own.unlink()
            folded += 1
    return folded
