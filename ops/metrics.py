"""Prometheus metrics at /metrics (prometheus-client), for admins or the METRICS_TOKEN.

Two kinds of figures:

- Counted in the web process: requests by method, view name and status, with their
  latency (`lethe_http_requests_total`, `lethe_http_request_duration_seconds`). With several
  worker processes (the application server), prometheus-client's multiprocess mode adds up
  every worker's figures: `PROMETHEUS_MULTIPROC_DIR` names an empty folder they all write
  to (`manage.py serve` sets one up); without it the figures are this process's own.
- Read from the database when /metrics is scraped, so they are the same from any web
  server however many processes and hosts there are: job runs, failures and durations
  (ops.models, written by every job cluster), the job queue, and the domain figures.

Adding a figure read at scrape time is one function, in this module or in any app's
`metrics.py` (all are imported at start-up):

    @gauge("lethe_operations", "Delete operations by state.", labels=("state",))
    def operations_by_state():
        return dict(Operation.objects.values_list("state").annotate(n=Count("id")))

It returns a number, or a dict from label values (a string, or a tuple for several labels)
to numbers. `counter(...)` is the same for totals that only grow (exposed as `<name>_total`),
and `collector` registers a function that yields whole metric families. A function that fails
is left out of that scrape and `lethe_metrics_reader_up{metric=...}` shows 0.

A metrics folder whose disk is full (or read-only) costs no request its answer and kills no
worker: see "The request figures' files" below.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import values as prometheus_values
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from ops.metrics_folder import reading

logger = logging.getLogger("lethe.metrics")

REQUESTS = Counter("lethe_http_requests", "HTTP requests answered, by method, view name and status.",
                   ["method", "view", "status"])
LATENCY = Histogram(
    "lethe_http_request_duration_seconds", "Time to answer an HTTP request, by method, view name and status.",
    ["method", "view", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


# Methods counted by name; any other (a server accepts made-up ones) is "other", so a client
# cannot add series without end.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def observe_request(method: str, view: str, status: int, seconds: float) -> None:
    if _off is not None:
        return
    labels = (method if method in METHODS else "other", view, str(status))
    try:
        REQUESTS.labels(*labels).inc()
        LATENCY.labels(*labels).observe(seconds)
    except FiguresOff:
        pass  # said once, when it happened


# ---- The request figures' files ---------------------------------------------------------------
#
# In multiprocess mode prometheus-client keeps each process's figures in files it maps into
# memory (prometheus_client/mmap_dict.py, counter_<pid>.db and histogram_<pid>.db), made to
# their size with truncate: sparse files, whose pages get their disk space only when first
# written through the map. On a full disk that write cannot fail as an error the middleware
# catches: the kernel sends SIGBUS, and every worker died on its first request, in a loop,
# leaving its files behind. So every page of a file gets its space (posix_fallocate) before it
# is mapped, when the file is made and when it grows; when it cannot (a full or read-only
# disk), this process counts no more requests, says so once, and goes on answering. (A
# copy-on-write filesystem, btrfs or ZFS, may still need space for a write to an allocated
# page: keep the folder on a tmpfs or an ordinary filesystem.)


class FiguresOff(Exception):
    """This process's request figures are off: its metrics file could not be given room."""


_off: str | None = None  # the file that could not be written, once figures are off
_off_lock = threading.Lock()


def _switch_off(path: str, error: OSError) -> None:
    global _off
    with _off_lock:
        if _off is not None:
            return
        _off = path
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        reason = "its disk is full"
    elif error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        reason = "it cannot be written (a read-only disk or no permission)"
    else:
        reason = error.strerror or type(error).__name__
    folder = os.path.dirname(path)
    logger.error("request figures are off in this process (pid %s): the metrics folder %s "
                 "(PROMETHEUS_MULTIPROC_DIR) cannot take its file %s: %s. It goes on answering; "
                 "a worker started once there is room counts again",
                 os.getpid(), folder, os.path.basename(path), reason,
                 extra={"metrics_folder": folder, "errno": errno.errorcode.get(error.errno or 0, "")})


def _allocate(fd: int, path: str, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        _switch_off(path, error)
        raise FiguresOff(path) from error


class AllocatedMmapedDict(MmapedDict):
    """prometheus-client's mapped file, every page of it given its disk space before it is mapped."""

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        if read_mode:  # only read: nothing is written through its map
            super().__init__(filename, read_mode=True)
            return
        try:
            fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as error:
            _switch_off(filename, error)
            raise FiguresOff(filename) from error
        try:
            size = os.fstat(fd).st_size
            try:
                _allocate(fd, filename, size or _INITIAL_MMAP_SIZE)
            except FiguresOff:
                if size == 0:  # every scrape would stop at a file that is empty or never began
                    with contextlib.suppress(OSError):
                        os.unlink(filename)
                raise
        finally:
            os.close(fd)
        try:
            super().__init__(filename)
        except OSError as error:
            _switch_off(filename, error)
            raise FiguresOff(filename) from error

    def _init_value(self, key: str) -> None:
        # An entry: its length (4 bytes), its key padded to 8 bytes, two doubles. When it does
        # not fit, the file doubles (as MmapedDict._init_value does it), allocated first.
        encoded = len(key.encode("utf-8"))
        needed = self._used + 4 + encoded + (8 - (encoded + 4) % 8) + 16
        capacity = self._capacity
        while needed > capacity:
            capacity *= 2
        if capacity > self._capacity:
            _allocate(self._f.fileno(), self._fname, capacity)
        super()._init_value(key)


# prometheus-client makes each process's files through this name (values.MultiProcessValue).
prometheus_values.MmapedDict = AllocatedMmapedDict


# ---- Figures read at scrape time --------------------------------------------------------------


@dataclass(frozen=True)
class Reader:
    name: str
    documentation: str
    kind: str  # "gauge", "counter" or "collector"
    labels: tuple[str, ...]
    read: Callable[[], Any]


READERS: dict[str, Reader] = {}


def _register(reader: Reader) -> None:
    # Re-registering a name replaces it (a module imported twice); two different names never clash.
    READERS[reader.name] = reader


def gauge(name: str, documentation: str, *, labels: Iterable[str] = ()) -> Callable:
    def register(read: Callable[[], Any]) -> Callable[[], Any]:
        _register(Reader(name, documentation, "gauge", tuple(labels), read))
        return read
    return register


def counter(name: str, documentation: str, *, labels: Iterable[str] = ()) -> Callable:
    def register(read: Callable[[], Any]) -> Callable[[], Any]:
        _register(Reader(name, documentation, "counter", tuple(labels), read))
        return read
    return register


def collector(read: Callable[[], Iterable[Metric]]) -> Callable[[], Iterable[Metric]]:
    _register(Reader(f"{read.__module__}.{read.__qualname__}", "", "collector", (), read))
    return read


def _samples(reader: Reader, value: Any) -> Iterator[tuple[list[str], float]]:
    if not isinstance(value, dict):
        if reader.labels:
            raise TypeError(f"{reader.name} has labels, so it must return a dict")
        yield [], float(value)
        return
    for key, number in value.items():
        key = key if isinstance(key, tuple) else (key,)
        if len(key) != len(reader.labels):
            raise TypeError(f"{reader.name}: {len(key)} label values for labels {reader.labels}")
        yield [str(part) for part in key], float(number or 0)


class DatabaseCollector:
    """Runs every registered reader at scrape time."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("lethe_metrics_reader_up", "1 when the figure could be read at this scrape.",
                               labels=["metric"])
        for reader in list(READERS.values()):
            try:
                if reader.kind == "collector":
                    families = list(reader.read())
                else:
                    family_class = GaugeMetricFamily if reader.kind == "gauge" else CounterMetricFamily
                    family = family_class(reader.name, reader.documentation, labels=list(reader.labels))
                    for labels, number in _samples(reader, reader.read()):
                        family.add_metric(labels, number)
                    families = [family]
            except Exception:
                logger.exception("could not read the figure %s", reader.name)
                up.add_metric([reader.name], 0)
                continue
            up.add_metric([reader.name], 1)
            yield from families
        yield up


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _BegunFiles(MultiProcessCollector):
    """prometheus-client's collector, reading only the files that have begun: a worker's file is
    empty for a moment after it is made, before its space is given (AllocatedMmapedDict), and a
    scrape then failed on it (r148: struct.error, a 500 at every worker replacement). An empty
    file holds no figure yet, so leaving it out changes no total."""

    def collect(self):
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            with contextlib.suppress(FileNotFoundError):
                if os.path.getsize(path) >= 8:  # its header: how much of it is used
                    files.append(path)
        return self.merge(files, accumulate=True)


def exposition() -> bytes:
    """The text every scrape gets: the web processes' own figures, then the database's."""
    read = CollectorRegistry(auto_describe=False)
    read.register(DatabaseCollector())
    if folder := multiprocess_dir():
        counted = CollectorRegistry(auto_describe=False)
        _BegunFiles(counted)
        with reading(folder):  # no exited worker's files folded away while they are read
            figures = generate_latest(counted)
    else:
        figures = generate_latest(REGISTRY)
    return figures + generate_latest(read)


# ---- The figures that exist today -------------------------------------------------------------


@collector
def job_figures() -> Iterator[Metric]:
    from ops.models import DURATION_BUCKETS, JobDurationBucket, JobStat

    runs = CounterMetricFamily("lethe_job_runs", "Finished jobs by task function and outcome.",
                               labels=["func", "outcome"])
    durations = HistogramMetricFamily("lethe_job_duration_seconds", "Running time of finished jobs.",
                                      labels=["func"])
    last = GaugeMetricFamily("lethe_job_last_finished_timestamp_seconds",
                             "When a job of this function last finished (Unix time).", labels=["func"])
    counts: dict[int, dict[float, int]] = {}
    for stat_id, le, count in JobDurationBucket.objects.values_list("stat_id", "le", "count"):
        counts.setdefault(stat_id, {})[le] = count
    for stat in JobStat.objects.all():
        runs.add_metric([stat.func, "success"], stat.runs - stat.failures)
        runs.add_metric([stat.func, "failure"], stat.failures)
        cumulative, buckets = 0, []
        for le in DURATION_BUCKETS:
            cumulative += counts.get(stat.pk, {}).get(le, 0)
            buckets.append((repr(le), cumulative))
        buckets.append(("+Inf", stat.runs))
        durations.add_metric([stat.func], buckets, sum_value=stat.seconds)
        if stat.last_finished_at is not None:
            last.add_metric([stat.func], stat.last_finished_at.timestamp())
    yield from (runs, durations, last)


@gauge("lethe_job_queue", "Jobs in the queue: waiting to be taken, or taken by a worker (locked until done "
                          "or until the retry time).", labels=("state",))
def job_queue() -> dict[str, int]:
    from django.db.models import Count, Q
    from django.utils import timezone
    from django_q.models import OrmQ

    now = timezone.now()
    figures = OrmQ.objects.aggregate(waiting=Count("id", filter=Q(lock__lte=now)),
                                     taken=Count("id", filter=Q(lock__gt=now)))
    return {"waiting": figures["waiting"], "taken": figures["taken"]}


@gauge("lethe_job_queue_oldest_waiting_seconds", "How long the oldest waiting job has waited (0 when none).")
def oldest_waiting() -> float:
    from django.utils import timezone
    from django_q.models import OrmQ

    now = timezone.now()
    oldest = OrmQ.objects.filter(lock__lte=now).order_by("lock").values_list("lock", flat=True).first()
    return 0.0 if oldest is None else (now - oldest).total_seconds()
