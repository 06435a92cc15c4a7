"""`manage.py serve`: the web server and the job cluster as one command.

The web server is gunicorn with threaded workers (ops/gunicorn_config.py: WEB_CONCURRENCY
processes of WEB_THREADS threads), serving static files through whitenoise; `serve --dev`
runs Django's development server instead, for development only.

Both children stop together, however serve ends:
- SIGINT (Ctrl-C) and SIGTERM: serve handles both itself, even when it was started in the
  background by a non-interactive shell (which starts it with SIGINT ignored). It asks each
  child to stop the graceful way (gunicorn: SIGTERM, so requests in flight finish; the job
  cluster and the development server: SIGINT), and after a grace period kills each child's
  whole process group, the cluster's and gunicorn's workers included.
- serve killed outright (SIGKILL): every child asked the kernel to send it SIGTERM when its
  parent dies (Linux PR_SET_PDEATHSIG), so none is left behind; gunicorn's workers leave
  when their master does.
- one child exits: the console is not whole, so serve stops the other and exits non-zero.

The web server's request figures live in PROMETHEUS_MULTIPROC_DIR, from which serve removes
the figures files of an earlier run at start (prometheus-client's own names, nothing else).
Before that it takes an exclusive lock beside the folder (`<folder>.lock`) and keeps it
for its whole life, so a second serve given the same folder exits 2 and empties nothing
instead of wiping the running server's figures. A folder that is or holds the database, the
engine folder, LETHE_VAR_DIR or the backup folder, or that holds another `*.db` file, stops
serve in one line (exit 2) before anything is removed.

The children are listed in `commands()`; swapping the application server is a change to
that one function.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from prometheus_client.metrics import Gauge

from console.management.cli import require_lethe_tables
from console.sqlite.base import first_file_env
from lifecycle.enginefs import EngineHome
from ops.metrics_folder import EXITED, KINDS
from ops.orphans import ENV as ORPHAN_ENV
from ops.static import ensure_static_files

PR_SET_PDEATHSIG = 1
GRACE_SECONDS = 15

log = logging.getLogger("lethe.serve")


@dataclass(frozen=True)
class Child:
    argv: list[str]
    stop_signal: signal.Signals
    env: dict[str, str] | None = None


_ADDRESS = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(?P<port>[0-9]{1,5})")


def listen_address(value: str) -> str:
    """HOST:PORT with a port from 1 to 65535, or an argparse error (one line, exit 2) before
    anything starts: gunicorn and the development server would stop with tracebacks."""
    matched = _ADDRESS.fullmatch(value)
    if not matched or not 1 <= int(matched["port"]) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not HOST:PORT with a port from 1 to 65535 (for example 127.0.0.1:8000)")
    return value


def commands(address: str, *, dev: bool = False) -> dict[str, Child]:
    manage = str(settings.BASE_DIR / "manage.py")
    if dev:
        web = Child([sys.executable, manage, "runserver", address, "--noreload"], signal.SIGINT)
    else:
        config = str(settings.BASE_DIR / "ops" / "gunicorn_config.py")
        # gunicorn's configuration reads LOG_FORMAT, LOG_LEVEL and WEB_* before Django: it gets
        # them as the settings accepted them (a blank value is the default there, for one).
        web = Child([sys.executable, "-m", "gunicorn", "-c", config, "--bind", address], signal.SIGTERM,
                    env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir()),
                         "LOG_FORMAT": settings.LOG_FORMAT, "LOG_LEVEL": getattr(settings, "LOG_LEVEL", "INFO"),
                         **{name: str(value) for name, value in settings.WEB_SERVER.items()}})
    return {
        "job cluster": Child([sys.executable, manage, "qcluster"], signal.SIGINT),
        "web server": web,
    }


def metrics_dir() -> Path:
    """Where gunicorn's workers add up their request figures; emptied at every start. A relative
    PROMETHEUS_MULTIPROC_DIR is taken from the project folder (settings.METRICS_DIR)."""
    return Path(settings.METRICS_DIR)


# The names prometheus-client gives its multiprocess files (prometheus_client/values.py:
# "<type>_<pid>.db", a gauge's type being "gauge_<mode>"; ops/metrics.py makes them through the
# same names): the only files serve removes from the metrics folder (r114: it removed every
# "*.db", a SQLite database named lethe.db in that folder included).
_GAUGE_MODES = "|".join(sorted(Gauge._MULTIPROC_MODES))
FIGURES_FILE = re.compile(rf"(?:counter|histogram|summary|gauge_(?:{_GAUGE_MODES}))_[0-9]+\.db"
                          rf"|(?:{'|'.join(KINDS)})_{EXITED}\.db")  # the exited workers' (ops/metrics_folder.py)


def is_figures_file(path: Path) -> bool:
    return FIGURES_FILE.fullmatch(path.name) is not None and path.is_file()


def metrics_dir_refusal(folder: Path) -> str | None:
    """Why the metrics folder must not be used; None when it may. Each reason is a folder whose
    files serve would remove or prometheus-client read: the root folder, one that is or holds
    the SQLite database, ENGINE_HOME, LETHE_VAR_DIR or the backup folder (r114: the database in
    it was removed at start), or one holding a `*.db` file that is not a figures file (every
    /metrics scrape reads each `*.db` there as figures and fails on any other file; serve leaves
    it where it is). Files of other names (a README) are left alone and stop nothing."""
    from retention.backups import configured_backup_dir

    named = f"PROMETHEUS_MULTIPROC_DIR names {folder}"
    advice = ("Set PROMETHEUS_MULTIPROC_DIR to a folder of its own (unset: $LETHE_VAR_DIR/prometheus): serve "
              "removes the request figures files of an earlier run from it at every start.")
    real = Path(os.path.realpath(folder))
    if real == real.parent:
        return f"{named}, the root folder. {advice}"
    kept = []
    if database := database_path():  # where the file is, not what a symbolic link of that name points to
        kept.append(("the SQLite database file",
                     Path(os.path.realpath(os.path.dirname(database))) / os.path.basename(database)))
    kept += [(what, Path(os.path.realpath(path))) for what, path in (
        ("ENGINE_HOME", settings.ENGINE_HOME), ("LETHE_VAR_DIR", settings.VAR_DIR),
        ("the backup folder", configured_backup_dir()))]
    for what, path in kept:
        if path == real or real in path.parents:
            return f"{named}, which {'is' if path == real else 'holds'} {what} ({path}). {advice}"
    try:  # as prometheus-client's glob("*.db"), which passes over hidden files
        foreign = sorted(entry.name for entry in real.iterdir()
                         if entry.name.endswith(".db") and not entry.name.startswith(".")
                         and not is_figures_file(entry))
    except FileNotFoundError:
        return None  # made, empty, at start
    except OSError:
        return None  # not a readable folder: empty_metrics_dir says so
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        it = "it" if len(foreign) == 1 else "them"
        return (f"{named}, which holds {shown}, not request figures files: every /metrics answer would read {it} "
                f"as figures and fail. Move {it} out of the folder, or set PROMETHEUS_MULTIPROC_DIR to a folder of "
                "its own (serve leaves other files there as they are).")
    return None


# The open lock file of the metrics folder this process claimed; held until it exits. Open
# files are not inherited by the children (close-on-exec), so the lock ends with this process.
_metrics_lock = None


def claim_metrics_dir() -> Path:
    """Take the metrics folder for this process: an exclusive lock on `<folder>.lock`, beside
    the folder (which is emptied), held for the life of the process. CommandError (exit 2)
    when another process holds it."""
    global _metrics_lock
    folder = metrics_dir()
    if not folder.name:  # "/" (r114: with_name raised ValueError, a traceback)
        raise ImproperlyConfigured(metrics_dir_refusal(folder))
    lock_path = folder.with_name(folder.name + ".lock")
    if _metrics_lock is not None and _metrics_lock.name == str(lock_path):
        return folder
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(lock_path, "a")  # noqa: SIM115 -- kept open for the life of the process
    except OSError as error:
        raise _metrics_dir_unwritable(folder, error) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise CommandError(
            f"Another serve is using the metrics folder {folder} (it holds {lock_path}); give each serve its "
            f"own PROMETHEUS_MULTIPROC_DIR.", returncode=2) from None
    _metrics_lock = lock
    return folder


def empty_metrics_dir() -> None:
    """Before gunicorn starts: the folder may be used (metrics_dir_refusal; a setting to fix, as
    any other: exit 2), is this process's (claim_metrics_dir), exists and holds no figures of an
    earlier run. Only figures files are removed."""
    if refusal := metrics_dir_refusal(metrics_dir()):
        raise ImproperlyConfigured(refusal)
    folder = claim_metrics_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.iterdir():
            if is_figures_file(stale):
                stale.unlink()
    except OSError as error:
        raise _metrics_dir_unwritable(folder, error) from None


def _metrics_dir_unwritable(folder: Path, error: OSError) -> CommandError:
    where = f"{error.filename}: " if error.filename and str(error.filename) != str(folder) else ""
    return CommandError(
        f"The metrics folder {folder} cannot be written ({where}{error.strerror}). Make it writable by the user "
        "Lethe runs as, or set PROMETHEUS_MULTIPROC_DIR to a folder that is.", returncode=2)


def database_path() -> str | None:
    """The SQLite database file's absolute path; None for PostgreSQL or an in-memory one."""
    from django.db import connection

    if connection.vendor != "sqlite" or connection.is_in_memory_db():
        return None
    return os.path.abspath(connection.settings_dict["NAME"])


def database_cannot_be_written() -> str | None:
    """Why serve must not start on this database: a SQLite file (or its folder, where SQLite
    makes the -wal and -shm) that cannot be written; a PostgreSQL standby, a database whose
    transactions are read-only or a user without the privileges on a table (r114: serve
    started, and every write answered 500). Every write of the console and the jobs would fail,
    one traceback each; None when it can."""
    from django.db import connection

    from console.sqlite.base import cannot_write_message
    from ops.health import postgresql_cannot_write_message

    database = settings.DATABASES["default"]
    if connection.vendor == "postgresql":
        return postgresql_cannot_write_message(database)
    if database["ENGINE"] != "console.sqlite" or str(database["NAME"]) == ":memory:":
        return None
    return cannot_write_message(os.path.abspath(str(database["NAME"])))


def database_problem_at_start() -> str | None:
    """Why serve (or the job cluster) must not start on the database it is connected to
    (database_cannot_be_written); None when nothing is in the way. A database never migrated
    raises at the read of Lethe's first table, for manage.py to say so in one line.
    PostgreSQL's check reads none of Lethe's tables, so it comes before that read: a user
    without the privileges is told which table it lacks, not only that a read was refused
    (r114). SQLite's looks at the file that read has opened."""
    from django.db import connection

    postgresql = connection.vendor == "postgresql"
    if not postgresql:
        require_lethe_tables()
    if problem := database_cannot_be_written():
        return problem
    if postgresql:
        require_lethe_tables()
    return None


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
    help = ("Run the web server (gunicorn; --dev for Django's development server) and the job cluster "
            "together; Ctrl-C or SIGTERM stops both.")

    def add_arguments(self, parser):
        parser.add_argument("address", nargs="?", default="127.0.0.1:8000", type=listen_address,
                            help="HOST:PORT to listen on (default 127.0.0.1:8000; [::1]:8000 for IPv6).")
        parser.add_argument("--dev", action="store_true",
                            help="Django's development server instead of gunicorn (development only).")
        parser.add_argument("--only", choices=("web", "jobs"),
                            help="Run only the web server or only the job cluster (hosts of a larger install).")

    def prepare_engine_folder(self) -> None:
        """Create the embedded engine's folder for a new install, never in place of the folder
        the database uses (an unmounted disk would get an empty one: lifecycle.engine_folder).
        Not there: serve runs on, deletes wait and /readyz says why, until it is back."""
        from django.db import DatabaseError

        from lifecycle import engine_folder

        root = Path(settings.ENGINE_HOME)
        if root.exists() and not root.is_dir():
            # A setting to fix, as any other: exit 2 (exit 1 is a child that died, which a
            # supervisor restarts; r50: it looped on this)
            raise ImproperlyConfigured(f"ENGINE_HOME ({root}) is not a folder. Set ENGINE_HOME to a folder, or to a "
                                       "path where one can be made.")
        try:
            engine_folder.adopt(force=False)
        except engine_folder.EngineFolderUnavailable as exc:
            if exc.reason == "not_this_folder":  # (r18: --adopt alone refuses such a folder)
                self.say(
                    f"The engine folder {exc.root} is {engine_folder.described(exc.root, exc.reason)}: deletes wait and /readyz says "
                    "not ready. Set ENGINE_HOME to this database's folder; if no other database uses this one any "
                    "more, mark it with manage.py engine_folder --adopt --take-from-other-database.", error=True)
            else:
                self.say(
                    f"The engine folder {exc.root} is {engine_folder.described(exc.root, exc.reason)}: deletes wait and /readyz says "
                    "not ready until it is back. Mount it or set ENGINE_HOME"
                    + ("." if exc.reason == "missing" else "; if the folder there is the right one, mark it with "
                       "manage.py engine_folder --adopt."), error=True)
        except DatabaseError:  # no tables yet (migrate comes first): a new install
            root.mkdir(parents=True, exist_ok=True)

    def handle(self, *args, address: str, dev: bool, only: str | None, **options):
        children_to_start = commands(address, dev=dev)
        if only is not None:
            keep = "web server" if only == "web" else "job cluster"
            children_to_start = {keep: children_to_start[keep]}
        # A database server that cannot be reached, or one never migrated, stops serve here, in
        # one line (manage.py), before its children each print their own traceback.
        from django.db import connection

        connection.ensure_connection()
        if problem := database_problem_at_start():
            # As manage.py reports a database it cannot write (one line, exit status 2).
            self.stderr.write(f"Lethe database error: {problem}")
            sys.exit(2)
        if "web server" in children_to_start and not dev:
            # First of all: a second serve on the same folder stops here, having changed nothing.
            empty_metrics_dir()
        if not settings.ENGINE_URL:
            # The embedded engine's folder, before anything is written to it: /readyz checks it.
            self.prepare_engine_folder()
        # Clear what a killed writer left behind (lock-safe, so a live writer is untouched).
        EngineHome().sweep_temporaries()
        if ensure_static_files():
            self.say("Collected the static files.")

        def stop(signum, frame):
            raise Stop

        # Handled before any child starts, and whatever this process inherited.
        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        children: dict[str, subprocess.Popen] = {}
        failed = None
        try:
            for name, spec in children_to_start.items():
                # Each child leads its own process group, so stopping it reaches its workers.
                # From the project folder: gunicorn finds its configuration's and the app's modules
                # there, whatever folder serve was started from.
                # LETHE_STOP_WITH_PARENT: once serve is gone the child stops within a deadline
                # even if its graceful stop hangs (ops/orphans.py).
                # The database file serve opened: the children's /readyz and the job cluster
                # compare the file at the path with it, so a file swapped before a child's first
                # connection is still seen as replaced.
                # The secret key as serve read it: a key file replaced while serve runs is taken
                # by every process at the next start of serve, not by each worker as it is
                # replaced (r114: gunicorn's recycled workers took the new key, the others and the
                # job cluster kept the old one; sessions came and went, queued jobs were dropped).
                env = {**(spec.env or os.environ), ORPHAN_ENV: str(os.getpid()), **first_file_env(database_path()),
                       "SECRET_KEY": settings.SECRET_KEY}
                children[name] = subprocess.Popen(spec.argv, env=env, cwd=settings.BASE_DIR, process_group=0,
                                                  preexec_fn=_child_setup(os.getpid()))
            while failed is None:
                failed = next((name for name, child in children.items() if child.poll() is not None), None)
                time.sleep(0.5)
        except (Stop, KeyboardInterrupt):
            pass
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the stop short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.stop_all(children, children_to_start)
        if failed:
            self.say(f"The {failed} exited; stopped the other." if len(children_to_start) > 1
                     else f"The {failed} exited.", error=True)
            sys.exit(1)
        self.say("Stopped the web server and the job cluster." if len(children_to_start) > 1
                 else f"Stopped the {next(iter(children_to_start))}.")

    def say(self, text: str, *, error: bool = False) -> None:
        """serve's own lines while it runs: under LOG_FORMAT=json a log record on standard error,
        as every other line there, so a log collector reads them as well; else plain text."""
        if settings.LOG_FORMAT == "json":
            log.log(logging.WARNING if error else logging.INFO, text)
        else:
            (self.stderr if error else self.stdout).write(text)

    def stop_all(self, children: dict[str, subprocess.Popen], specs: dict[str, Child]) -> None:
        for name, child in children.items():
            # The leader stops its own workers in order (signalling the workers directly
            # makes the cluster wait for them); the group is only for what outlives it.
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(specs[name].stop_signal)
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
