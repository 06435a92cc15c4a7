"""`manage.py serve`: the web server and the job cluster as one command.

Both children stop together, however serve ends:
- SIGINT (Ctrl-C) and SIGTERM: serve handles both itself, even when it was started in the
  background by a non-interactive shell (which starts it with SIGINT ignored). It asks each
  child to stop, and after a grace period kills each child's whole process group, the
  cluster's workers included.
- serve killed outright (SIGKILL): every child asked the kernel to send it SIGTERM when its
  parent dies (Linux PR_SET_PDEATHSIG), so none is left behind.
- one child exits: the console is not whole, so serve stops the other and exits non-zero.

The children are listed in `commands()`; swapping runserver for another application
server is a change to that one function.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand

from lifecycle.enginefs import EngineHome

PR_SET_PDEATHSIG = 1
GRACE_SECONDS = 15


def commands(address: str) -> dict[str, list[str]]:
    manage = str(settings.BASE_DIR / "manage.py")
    return {
        "job cluster": [sys.executable, manage, "qcluster"],
        "web server": [sys.executable, manage, "runserver", address, "--noreload"],
    }


def _child_setup(parent: int):
    """Runs in each child between fork and exec."""
    def setup() -> None:
        # A background start leaves SIGINT ignored, and exec keeps that: give it back.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            os._exit(70)
        if os.getppid() != parent:  # serve died before the request took hold
            os._exit(70)
    return setup


class Stop(Exception):
    pass


class Command(BaseCommand):
    help = "Run the web server and the job cluster together; Ctrl-C or SIGTERM stops both."

    def add_arguments(self, parser):
        parser.add_argument("address", nargs="?", default="127.0.0.1:8000")

    def handle(self, *args, address: str, **options):
        # Clear what a killed writer left behind (lock-safe, so a live writer is untouched).
        EngineHome().sweep_temporaries()

        def stop(signum, frame):
            raise Stop

        # Handled before any child starts, and whatever this process inherited.
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        children: dict[str, subprocess.Popen] = {}
        failed = None
        try:
            for name, argv in commands(address).items():
                # Each child leads its own process group, so stopping it reaches its workers.
                children[name] = subprocess.Popen(argv, process_group=0, preexec_fn=_child_setup(os.getpid()))
            while failed is None:
                failed = next((name for name, child in children.items() if child.poll() is not None), None)
                time.sleep(0.5)
        except (Stop, KeyboardInterrupt):
            pass
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stop_all(children)
        if failed:
            self.stderr.write(f"The {failed} exited; stopped the other.")
            sys.exit(1)
        self.stdout.write("Stopped the web server and the job cluster.")

    def stop_all(self, children: dict[str, subprocess.Popen]) -> None:
        for child in children.values():
            # The leader stops its own workers in order (signalling the workers directly
            # makes the cluster wait for them); the group is only for what outlives it.
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGINT)
        deadline = time.monotonic() + GRACE_SECONDS
        for child in children.values():
            while not self.exited(child) and time.monotonic() < deadline:
                time.sleep(0.1)
            # Whatever is left in its group (a worker that did not stop) goes now. The
            # leader is not reaped yet, so its group id cannot belong to anyone else.
            self.signal_group(child, signal.SIGKILL)
            child.wait()

    @staticmethod
    def exited(child: subprocess.Popen) -> bool:
        """Exited, without reaping it (WNOWAIT)."""
        if child.returncode is not None:
            return True
        try:
            found = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return found is not None

    @staticmethod
    def signal_group(child: subprocess.Popen, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signum)
