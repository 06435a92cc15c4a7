"""Hooks around every job the cluster runs, connected to django-q2's signals in OpsConfig.ready.

- pre_enqueue (the process that queues the job): the current request id travels with the task.
- pre_execute (the worker, before the job): binds the job id, the task function, the queuing
  request's id and the operation id (a task argument named `operation_id`) to the log
  context, and stamps the start time on the task.
- post_execute_in_worker (the worker, after the job, succeeded or failed): logs one line with
  the outcome and duration, and clears the context for the worker's next job.
- post_execute (the cluster's monitor, once the result is saved): adds the run to the job
  figures in the database (ops.models), which also serves as the cluster's heartbeat.

A worker killed mid-job sends none of the after-signals: its run is not counted, and the
job's redelivery counts when it finishes. Recording never fails a job.
"""

from __future__ import annotations

import inspect
import logging
import time
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Case, F, Max, Value, When
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from ops import context
from ops.models import DURATION_BUCKETS, JobDurationBucket, JobStat

logger = logging.getLogger("lethe.jobs")

REQUEST_KEY = "lethe_request_id"
STARTED_KEY = "lethe_started"


def func_name(func) -> str:
    from django_q.utils import get_func_repr

    return str(get_func_repr(func))[:200]


def _operation_id(func, task: dict) -> str | None:
    if not callable(func):
        return None
    try:
        bound = inspect.signature(func).bind_partial(*task.get("args", ()), **task.get("kwargs", {}))
    except (TypeError, ValueError):
        return None
    value = bound.arguments.get("operation_id")
    return None if value is None else str(value)


def on_pre_enqueue(sender, task: dict, **kwargs) -> None:
    request_id = context.current().get("request_id")
    if request_id:
        task[REQUEST_KEY] = request_id


# Context tokens of the running job by task id, to restore what was bound before it (nothing
# in a worker; the request, for a job run synchronously inside one).
_bound: dict[str, dict] = {}


def on_pre_execute(sender, func, task: dict, **kwargs) -> None:
    task[STARTED_KEY] = time.time()
    _bound[task.get("id")] = context.set_fields(
        job_id=task.get("id"), job=func_name(task.get("func")),
        request_id=task.get(REQUEST_KEY) or context.current().get("request_id"),
        operation_id=_operation_id(func, task))


def on_post_execute_in_worker(sender, func, task: dict, **kwargs) -> None:
    try:
        seconds = time.time() - task.get(STARTED_KEY, time.time())
        logger.info("job %s", "succeeded" if task.get("success") else "failed",
                    extra={"outcome": "success" if task.get("success") else "failure",
                           "duration_ms": round(seconds * 1000, 1)})
    finally:
        tokens = _bound.pop(task.get("id"), None)
        if tokens is not None:
            context.reset(tokens)
        else:
            context.clear("job_id", "job", "operation_id")


def on_post_execute(sender, task: dict, **kwargs) -> None:
    stopped = task.get("stopped")
    started = task.get(STARTED_KEY)
    if not isinstance(stopped, datetime) or started is None:
        return
    try:
        record_run(func_name(task.get("func")), success=bool(task.get("success")),
                   seconds=max(0.0, stopped.timestamp() - started), finished_at=stopped)
    except Exception:
        logger.exception("could not record the job figures")


def record_run(func: str, *, success: bool, seconds: float, finished_at: datetime | None = None) -> None:
    """Add one finished run to `func`'s figures: single-statement increments in one
    transaction, so the count, the time and the histogram move together or not at all."""
    finished_at = finished_at or timezone.now()
    with transaction.atomic():
        _record(func, success=success, seconds=seconds, finished_at=finished_at)


# A stored finish time further ahead of this clock than this was stamped by a clock since set
# back: the finish being recorded replaces it (kept as the latest, it read as a job finished "now"
# for the whole step, and readiness said a cluster ran while none did; r129). Less is clock skew.
CLOCK_STEP = timedelta(minutes=5)


def _latest(field: str, finished_at: datetime):
    """The later of the stored time and `finished_at` (an older finish never moves it back),
    unless the stored one is ahead of this clock by more than a step."""
    return Case(When(**{f"{field}__gt": timezone.now() + CLOCK_STEP}, then=Value(finished_at)),
                default=Greatest(Coalesce(field, Value(finished_at)), Value(finished_at)))


def _record(func: str, *, success: bool, seconds: float, finished_at: datetime) -> None:
    stat, _created = JobStat.objects.get_or_create(func=func)
    latest = {"last_finished_at": _latest("last_finished_at", finished_at)}
    if not success:
        latest["last_failed_at"] = _latest("last_failed_at", finished_at)
    JobStat.objects.filter(pk=stat.pk).update(
        runs=F("runs") + 1, failures=F("failures") + (0 if success else 1), seconds=F("seconds") + seconds, **latest
    )
    bound = next((le for le in DURATION_BUCKETS if seconds <= le), None)
    if bound is not None:
        bucket, _created = JobDurationBucket.objects.get_or_create(stat=stat, le=bound)
        JobDurationBucket.objects.filter(pk=bucket.pk).update(count=F("count") + 1)


def last_heartbeat(recent_seconds: int) -> datetime | None:
    """When a job last finished on any cluster (the heartbeat job runs every minute). A time
    ahead of this clock by more than CLOCK_STEP (a job of one that runs rarely, stamped before
    the clock was set back) is not taken while another job's time is not (r131: a cluster
    running on the true clock read as not ready for the whole step); the latest of them when
    all are (ops.health: no sign of a running cluster). `recent_seconds`: readiness's limit."""
    now = timezone.now()
    times = JobStat.objects.filter(last_finished_at__isnull=False)
    latest = times.filter(last_finished_at__lte=now + CLOCK_STEP).aggregate(at=Max("last_finished_at"))["at"]
    if latest is not None and (now - latest).total_seconds() <= recent_seconds:
        return latest
    # None recent on this clock: a time ahead of it is the better sign of what ran last (r132: a
    # rarely run job's old time was taken, "none since two days ago", while the rest ran a minute ago)
    return times.aggregate(at=Max("last_finished_at"))["at"]
