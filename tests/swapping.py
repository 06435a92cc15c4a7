"""Races against the engine folder's code: another process keeps swapping a real folder and a
symlink to a folder outside (renameat2 with RENAME_EXCHANGE, one atomic step), so a path
checked and then used by name may lead outside at any moment."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# A fresh single-threaded server forks the children: other tests may leave threads running here.
FORK = multiprocessing.get_context("forkserver")


def exchange(a: Path, b: Path) -> None:
    """renameat2(RENAME_EXCHANGE): one atomic swap of a folder and a symlink."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, bytes(a), -100, bytes(b), 2) != 0:
        raise OSError(ctypes.get_errno(), "renameat2")


def swap_until(stop, started, real: str, link: str) -> None:
    while not stop.is_set():
        exchange(Path(real), Path(link))
        started.set()


@contextlib.contextmanager
def swapping(real: Path, link: Path) -> Iterator[None]:
    """`real` (a folder) and `link` (a symlink beside it, or a FIFO) swapped over and over by
    another process while the block runs; afterwards `real` is the folder again."""
    stop, started = FORK.Event(), FORK.Event()
    swapper = FORK.Process(target=swap_until, args=(stop, started, str(real), str(link)), daemon=True)
    swapper.start()
    try:
        assert started.wait(60)
        yield
    finally:
        stop.set()
        swapper.join(10)
        if real.is_symlink() or not real.is_dir():
            exchange(real, link)


def attempts_until(leaked: Callable[[], bool], seconds: float = 5) -> tuple[int, bool]:
    """Call `leaked` until it answers True or `seconds` pass: (how many calls, whether it did)."""
    deadline = time.monotonic() + seconds
    attempts = 0
    while time.monotonic() < deadline:
        attempts += 1
        if leaked():
            return attempts, True
    return attempts, False
