"""The job cluster (`manage.py qcluster`), restarted with fresh queues when one of its processes
is killed outright.

django-q2's processes share two multiprocessing queues and a lock per worker. A process killed
by a signal (SIGKILL, the out-of-memory killer) while it holds one of them never releases it:
an idle worker waits in `task_queue.get()` holding the queue's reader lock, so once it is
killed there the other workers and its replacement wait for that lock forever, every
process still alive. django-q2 replaces the dead worker and goes on with the same queues.
Which lock a dead process held cannot be known (POSIX semaphores have no owner), and taking
one back is not safe, so any cluster process that ends by a signal counts as having poisoned
the queues, and the whole set of processes is replaced (a worker killed while it ran a job held
none of them: it is replaced alone, as django-q2 does):

1. The sentinel (its guard notices the death within a cycle, 0.5 s) kills the pusher, so no
   more jobs go into the old queue.
2. It lets busy workers finish their job, and the monitor save their results, for up to
   GRACE_SECONDS, then kills every worker and the monitor.
3. Jobs still sitting in the old queue (taken from the database, never started) are read
   from its pipe, now that no process is left to read or write it, and handed back to the
   database queue at once; without this they would wait for Q_CLUSTER "retry" (11 min).
   A job whose run was cut short comes back after "retry", as always: every Lethe job is
   leased and resumable.
4. The sentinel exits with RESTART_EXIT, and the cluster's main process starts a new
   sentinel with new queues and processes.

The main process inherits the processes a killed sentinel leaves behind (it is their
subreaper), so none of them outlives its generation. It also restarts the processes when the sentinel stops showing signs of life
for Q_STALL_SECONDS (a worker killed while it held its own timer lock stops the guard itself),
or when the sentinel is killed (its workers, left behind, are killed first). Restarts come
back to back at first, then each one waits twice as long as the last (up to 5 minutes) while
they keep coming within 10 minutes of each other, so a job that kills its worker every time
cannot make the cluster spin. A recycled worker, a timed-out one and a job that raises are
handled by django-q2 as before.

The Sentinel and Cluster here override django-q2's own (their start, reincarnation and the
shared values they hold), written against django-q2 1.11.1, the locked version; recheck them
when the lock moves it (tests/test_cluster_recovery.py kills real processes of each kind).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import struct
import time
import uuid
from multiprocessing import Event, Value

from django import db
from django.conf import settings
from django.utils import timezone
from django_q import cluster as q_cluster
from django_q.conf import Conf

logger = logging.getLogger("lethe.cluster")

RESTART_EXIT = 75  # EX_TEMPFAIL: the sentinel gave up its processes, start new ones
GRACE_SECONDS = 30.0
BACKOFF_FIRST, BACKOFF_MAX, BACKOFF_WINDOW = 5.0, 300.0, 600.0
SCHEDULE_CHECK_SECONDS = 30.0


def _raw(value) -> float:
    """A shared value read without its lock, which a killed process may hold."""
    return value.get_obj().value


class Sentinel(q_cluster.Sentinel):
    def __init__(self, *args, tick=None, **kwargs):
        self.tick = tick
        self.schedules_checked = time.monotonic()
        super().__init__(*args, **kwargs)  # runs the guard until the cluster stops

    def beat(self) -> None:
        if self.tick is not None:
            self.tick.get_obj().value = time.monotonic()

    def status(self) -> str:
        self.beat()  # the guard saves the status every cycle
        self.keep_schedules_near()
        return super().status()

    def keep_schedules_near(self) -> None:
        """Every SCHEDULE_CHECK_SECONDS (monotonic), as often as the guard's scheduler pass:
        bring next runs more than one interval away to one interval from now. A clock set back
        while the cluster runs leaves every schedule ahead, the every-minute recovery that
        would bring them in too (console.schedules.pull_in_far_runs)."""
        if time.monotonic() - self.schedules_checked < SCHEDULE_CHECK_SECONDS:
            return
        self.schedules_checked = time.monotonic()
        from django_q.utils import close_old_django_connections

        from console.schedules import pull_in_far_runs

        try:
            close_old_django_connections()
            pull_in_far_runs()
        except Exception as error:  # noqa: BLE001 (the scheduler's pass logs the database's state)
            logger.warning("Could not check the schedules' next runs: %s", type(error).__name__)

    def reincarnate(self, process):
        if process.exitcode is not None and process.exitcode < 0 and self.may_hold_a_queue(process):
            self.give_up(process)
        super().reincarnate(process)

    def may_hold_a_queue(self, process) -> bool:
        """Whether a process killed by a signal may have held a lock of the shared queues: the
        pusher and the monitor may, and so may a worker that was not running a job (waiting in
        the task queue's `get()` holding its reader lock, or putting a result). A worker killed
        while running a job (its timer counting down) held none: django-q2 replaces it as
        before, and its job comes back after Q_CLUSTER "retry" (every Lethe job is leased and
        resumable), without restarting the others. A worker killed between taking a job and
        starting it (its timer is set only then) counts as idle: every process restarts, which is
        safe, only heavier."""
        if process is self.monitor or process is self.pusher:
            return True
        return _raw(process.timer) <= 0

    def give_up(self, dead) -> None:
        role = "monitor" if dead is self.monitor else "pusher" if dead is self.pusher else "worker"
        logger.critical("The job cluster's %s %s was killed (signal %s); it may hold the cluster's queues: "
                        "restarting its processes", role, dead.pid, -dead.exitcode)
        if self.pusher.is_alive():
            self.pusher.kill()
            self.pusher.join()
        deadline = time.monotonic() + GRACE_SECONDS
        while time.monotonic() < deadline and (
                any(p.is_alive() and _raw(p.timer) > 0 for p in self.pool)
                or (self.monitor.is_alive() and _raw(self.result_queue.size.count) > 0)):
            self.beat()
            time.sleep(0.2)
        for process in [*self.pool, self.monitor]:
            if process.is_alive():
                process.kill()
            process.join()
        released = self.hand_back(queued_jobs(self.task_queue))
        if released:
            logger.warning("Handed %s queued jobs back to the database queue", released)
        os._exit(RESTART_EXIT)

    def hand_back(self, ack_ids: list) -> int:
        from django_q.models import OrmQ

        if not ack_ids:
            return 0
        try:
            return OrmQ.objects.using(Conf.ORM).filter(pk__in=ack_ids, key=self.broker.list_key).update(
                lock=timezone.now())
        except Exception:  # they come back after Q_CLUSTER "retry" instead
            logger.exception("Could not hand the queued jobs back; they run again after the retry period")
            return 0


def queued_jobs(queue) -> list:
    """The broker ids of the jobs left in a queue's pipe once nothing else reads or writes it.
    Reads without blocking; stops at the first frame that is not a whole job (a reader or
    writer killed mid-message), whose jobs then come back after Q_CLUSTER "retry"."""
    fd = queue._reader.fileno()
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    except OSError:
        return []
    ids, at = [], 0
    while at + 4 <= len(data):
        (size,) = struct.unpack("!i", data[at:at + 4])
        if size < 0 or at + 4 + size > len(data):
            break
        try:
            job = pickle.loads(data[at + 4:at + 4 + size])  # noqa: S301 (the cluster's own queue)
        except Exception:  # noqa: BLE001
            break
        if not isinstance(job, dict) or "ack_id" not in job:
            break
        ids.append(job["ack_id"])
        at += 4 + size
    return ids


class Cluster(q_cluster.Cluster):
    """django-q2's cluster whose main process restarts the sentinel (see the module's comment)."""

    def __init__(self, broker=None):
        super().__init__(broker)
        self.stopping = False
        self.tick = Value("d", time.monotonic())
        self.restarts: list[float] = []
        self.generation: list[tuple[int, str]] = []

    def start(self) -> int:
        # Starts this module's Sentinel (with its tick) the way django-q2's Cluster starts its own.
        db.connections.close_all()  # a forked connection must not be shared with the sentinel
        self.tick.get_obj().value = time.monotonic()
        self.stop_event = Event()
        self.start_event = Event()
        self.sentinel = q_cluster.get_mp_context().Process(
            target=Sentinel, name=f"Process-{uuid.uuid4().hex}",
            args=(self.stop_event, self.start_event, self.cluster_id, self.broker, self.timeout),
            kwargs={"tick": self.tick})
        self.sentinel.start()
        q_cluster.logger.info("Q Cluster %s starting.", self.name)
        while self.start_event and not self.start_event.is_set():
            if not self.sentinel.is_alive():
                if self.sentinel.exitcode == 0:
                    break
                raise RuntimeError(f"Q Cluster {self.name} failed to start: sentinel exited with code "
                                   f"{self.sentinel.exitcode}")
            time.sleep(0.1)
        return self.pid

    def sig_handler(self, signum, frame):
        self.stopping = True
        super().sig_handler(signum, frame)

    def run(self) -> None:
        """Start, then restart as needed until asked to stop or the sentinel ends by itself."""
        become_subreaper()
        self.start()
        while not self.stopping:
            time.sleep(1)
            if self.stopping:
                break
            sentinel = self.sentinel
            reap_zombies(keep=sentinel.pid)  # a killed worker's tool, inherited as their subreaper
            if sentinel.is_alive():
                self.generation = descendants(sentinel.pid) or self.generation
                # (monotonic on both sides: a step of the wall clock is no stall)
                if time.monotonic() - self.tick.get_obj().value < settings.Q_STALL_SECONDS:
                    continue
                logger.critical("The job cluster's guard has not moved for %s s: restarting its processes",
                                int(settings.Q_STALL_SECONDS))
                kill_all([(sentinel.pid, start_time(sentinel.pid)), *self.generation])
                sentinel.join()
            elif sentinel.exitcode != RESTART_EXIT:
                if sentinel.exitcode is None or sentinel.exitcode >= 0:
                    return  # it stopped by itself: so does this process, as django-q2's does
                logger.critical("The job cluster's sentinel was killed (signal %s): restarting its processes",
                                -sentinel.exitcode)
                kill_all(self.generation)
            # Whatever the old generation left behind is this process's now (its subreaper): its
            # processes a killed sentinel had not been seen to start, a job's tool whose worker
            # was killed. None outlives its generation.
            kill_all(descendants(os.getpid()))
            reap_orphans()
            self.generation = []
            self.wait_before_restart()
            if not self.stopping:
                self.start()

    def wait_before_restart(self) -> None:
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < BACKOFF_WINDOW][-10:] + [now]
        if len(self.restarts) > 1:
            delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (len(self.restarts) - 2))
            logger.warning("The job cluster restarted %s times within %s s: waiting %s s first",
                           len(self.restarts) - 1, int(BACKOFF_WINDOW), int(delay))
            deadline = time.monotonic() + delay
            while not self.stopping and time.monotonic() < deadline:
                time.sleep(0.5)
        self.restarts[-1] = time.monotonic()


def become_subreaper() -> None:
    """Make this process the one that inherits the processes its sentinel leaves behind (Linux's
    PR_SET_CHILD_SUBREAPER): workers, pusher and monitor of a sentinel killed before this process
    listed them (in the second after a start) become its children, to be found and killed
    before new ones start. Elsewhere only the processes listed each second are killed."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER


def reap_orphans() -> None:
    """Collect the exit status of processes inherited as their subreaper (killed just before),
    so none stays a zombie; the sentinel's own Process object has collected its own."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no child left
        if pid == 0:
            if not descendants(os.getpid()):
                return
            time.sleep(0.05)


def reap_zombies(keep: int) -> None:
    """Collect the exit status of this process's children that have ended, but `keep` (the
    sentinel, whose Process object collects its own)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == keep:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state, ppid = stat.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue
        if state == "Z" and int(ppid) == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(entry), os.WNOHANG)


def start_time(pid: int) -> str:
    """The process's start time (field 22 of /proc/<pid>/stat), to tell it from a later process
    given the same id; '' once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def descendants(pid: int) -> list[tuple[int, str]]:
    """The processes under `pid` (Linux /proc), with their start times."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append((child, start_time(child)))
        todo.extend(children.get(child, []))
    return found


def kill_all(processes: list[tuple[int, str]]) -> None:
    for pid, started in processes:
        if started and start_time(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
