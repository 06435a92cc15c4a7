"""The tool payload cleanup jobs: analysis, backup preparation, cleanup batches, compaction.

Every operation is one `ToolPayloadOperation` row run by `run_operation(id)`, a django-q2
task that is safe to deliver more than once:

- A run first claims the row's lease (a token and a heartbeat, compare-and-swap). A second
  delivery while the lease is fresh exits; a lease whose heartbeat is older than
  `LEASE_SECONDS` belongs to a dead worker and is taken over.
- A run works for at most `STEP_SECONDS`, then releases the lease and queues itself again in
  the same transaction, so no task outlives the cluster's `retry` (a longer task would be
  delivered again while still running).
- Cleanup works in bounded keyset batches by (conversation id, item id). Each batch is its
  own short transaction that re-reads the policy (enabled, revision) and locks and rechecks
  its conversation (activity, running work, delete intent) before writing; items are written
  with a compare-and-swap on (id, revision) so a concurrent write wins; the cursor and the
  counters commit with the batch. A worker killed at any line resumes from the last commit
  without double counting. On SQLite the job pauses between batches so waiting writers get in.
- A busy database (locked, lock timeout) backs off and retries; it is not a failure.
"""

from __future__ import annotations

import calendar
import contextlib
import functools
import json
import logging
import math
import threading
import time
import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import OperationalError, connection, transaction
from django.db.models import Count, Exists, F, Max, OuterRef, Q, Sum
from django.utils import timezone
from django.utils.translation import gettext_noop

from console.busy import is_database_busy
from lifecycle import faults
from retention.errors import Message, stored
from retention.models import (
    OPEN_STATES,
    BackupChoice,
    OperationKind,
    OperationState,
    PreparationState,
    ToolPayloadOperation,
    ToolPayloadPolicy,
)
from retention.reducer import MARKER_KEY, REMOVED_FIELDS

log = logging.getLogger(__name__)

TASK = "retention.jobs.run_operation"


# Tunables (environment, read and checked with the other settings: console/settings.py).
LEASE_SECONDS = settings.TOOL_JOB_LEASE_SECONDS
STEP_SECONDS = settings.TOOL_JOB_STEP_SECONDS
# Items per cleanup batch, at most, unless set: SQLite's batches are sized by their time
# (BATCH_SECONDS, about 10 ms) well below it; PostgreSQL's aim at POSTGRES_BATCH_SECONDS and
# reach it at about 5,000 items (each batch costs a few milliseconds of its own, so fewer
# batches: 200,000 messages took 3.3-3.5 s in batches of up to 5,000, 4.0-4.2 s of up to 1,000).
BATCH_ITEMS = settings.TOOL_CLEANUP_BATCH or (5000 if connection.vendor == "postgresql" else 1000)
# Payload bytes per cleanup batch: a hard cap; within it each batch's size follows the rate
# measured on the batches before, so a batch's write transaction takes about BATCH_SECONDS.
BATCH_BYTES = settings.TOOL_CLEANUP_BATCH_BYTES
# The first batch's payload bytes, before the pace has measured any: small on SQLite (its
# write lock); on PostgreSQL a few batches fewer to reach its batch time.
FIRST_BATCH_BYTES = 16_000_000 if connection.vendor == "postgresql" else 1_000_000
MIN_BATCH_BYTES = 64_000
CONVERSATIONS_PER_BATCH = settings.TOOL_CLEANUP_CONVERSATIONS
# SQLite has one write lock: a batch holds it for about 10 ms, then the job leaves it free for
# a short while. A writer that finds the lock taken tries again every half millisecond
# (console/sqlite), so it takes the lock early in the gap and waits at most about one batch.
# PostgreSQL's row locks do not stop writers of other conversations: longer batches, no pause.
BATCH_SECONDS_SET = settings.TOOL_CLEANUP_BATCH_SECONDS is not None
BATCH_SECONDS = settings.TOOL_CLEANUP_BATCH_SECONDS if BATCH_SECONDS_SET else 0.010
POSTGRES_BATCH_SECONDS = 0.25
# Seconds between cleanup batches: SQLITE_DEFAULT_PAUSE on SQLite, none on PostgreSQL, unless
# set, then on both. The next batch's reading counts toward it.
SQLITE_DEFAULT_PAUSE = 0.003
PAUSE_SET = settings.TOOL_CLEANUP_PAUSE is not None
SQLITE_PAUSE = settings.TOOL_CLEANUP_PAUSE if PAUSE_SET else SQLITE_DEFAULT_PAUSE
ANALYSIS_BATCH = settings.TOOL_ANALYSIS_BATCH


# SQLite: a batch checks its time after every WRITE_CHUNK items it writes.
WRITE_CHUNK = 64
MAX_TAKEOVERS = 5  # takeovers of a dead run's lease in a row, with no batch committed between them
BUSY_RETRIES = 6
LOST_CONNECTION_PAUSE = 1.0  # seconds before a run whose database connection ended goes on
NO_CURSOR = 0


class LeaseLost(Exception):
    """Another run took the operation over (ours was presumed dead): stop writing."""


# ---- Cutoff and eligibility -----------------------------------------------------------------


def cutoff_for(now: datetime, value: int, unit: str) -> datetime:
    """`now` minus the period, in UTC: weeks exactly, months by the calendar (day clamped to
    the shorter month's end, so 31 May minus 3 months is 28/29 February)."""
    now = now.astimezone(timezone.UTC) if timezone.is_aware(now) else timezone.make_aware(now, timezone.UTC)
    if unit == "weeks":
        return now - timedelta(weeks=value)
    if unit != "months":
        raise ValueError(unit)
    months = now.year * 12 + (now.month - 1) - value
    year, month = divmod(months, 12)
    month += 1
    day = min(now.day, calendar.monthrange(year, month)[1])
    return now.replace(year=year, month=month, day=day)


@functools.cache
def period_days(value: int, unit: str) -> tuple[int, int]:
    """The fewest and the most days the period spans, whatever day it is counted back from
    (`cutoff_for`): weeks exactly, months by the calendar (1 month is 28 to 31 days). Eight
    years of days hold every case of month lengths and leap years."""
    if unit == "weeks":
        return 7 * value, 7 * value
    first = datetime(2024, 1, 1, tzinfo=timezone.UTC)
    spans = [((now := first + timedelta(days=n)) - cutoff_for(now, value, unit)).days for n in range(8 * 366)]
    return min(spans), max(spans)


def may_be_shorter(value: int, unit: str, than_value: int, than_unit: str) -> bool:
    """Whether the period counts back fewer days than the other on some day: in one unit, a
    smaller number; across units, when its fewest days are fewer than the other's most (4 weeks
    against 1 month: shorter from 29 to 31 days into a month, never 1 month against 4 weeks)."""
    if unit == than_unit:
        return value < than_value
    return period_days(value, unit)[0] < period_days(than_value, than_unit)[1]


def eligible_conversations(cutoff: datetime, *, as_of: datetime | None = None):
    """Live conversations last active strictly before the cutoff, with no queued or running
    work and no delete intent (AC-TPR-001.3), in id order. Work is a queued or running turn,
    and any open runtime claim: a pending approval, user input or dynamic tool, a live shell
    job, a task's or an automation's ownership (r150: a shell job started long ago that wrote
    nothing since had its output removed while it ran; what the delete's admission refuses on
    is what cleanup leaves alone).

    `as_of`: also none that had queued or running work at that time (a run's count): a
    cleanup run takes only conversations it counted when it started, so its figures add up
    (one whose work was interrupted since waits for the next run)."""
    from lifecycle.models import (
        ACTIVE_TURN_STATES,
        INTENT_STATES,
        Conversation,
        ConversationState,
        DeleteOperation,
        RuntimeClaim,
        Turn,
    )

    active = Turn.objects.filter(conversation=OuterRef("pk"), state__in=ACTIVE_TURN_STATES)
    claimed = RuntimeClaim.objects.filter(conversation=OuterRef("pk"), resolved_at__isnull=True)
    intent = DeleteOperation.objects.filter(conversation=OuterRef("pk"), state__in=INTENT_STATES)
    eligible = (
        Conversation.objects.filter(state=ConversationState.LIVE, last_activity_at__lt=cutoff)
        .exclude(Exists(active))
        .exclude(Exists(claimed))
        .exclude(Exists(intent))
    )
    if as_of is not None:  # work ends only by being marked finished (set_closed), with its time
        # Work that ended after that time, whenever it began: work begun just after it and
        # running when the count read (its snapshot is a moment later) kept the conversation out
        # of the count too (r154: the run then took it, done 9 of 6). Work begun later still
        # left it out of nothing the run counted: leaving it out now changes no figure.
        was_active = Turn.objects.filter(conversation=OuterRef("pk"), finished_at__gt=as_of)
        was_claimed = RuntimeClaim.objects.filter(conversation=OuterRef("pk"), resolved_at__gt=as_of)
        eligible = eligible.exclude(Exists(was_active)).exclude(Exists(was_claimed))
    return eligible.order_by("id")


# ---- Queueing -------------------------------------------------------------------------------


def enqueue(operation_id: int, *, wait_for_lease: bool = False) -> None:
    """Queue a run of the operation (inside the caller's transaction: both commit or neither).
    A run that does its work in one piece (a backup, a compaction, a cleanup's first step,
    which checks the backup) gets TOOL_JOB_LONG_TIMEOUT_SECONDS, not the cluster's limit."""
    from django_q.tasks import async_task

    options = {"task_name": f"tool-payloads-{operation_id}-{uuid.uuid4().hex[:8]}", "ack_failure": True}
    if one_piece(operation_id):
        options["timeout"] = settings.TOOL_JOB_LONG_TIMEOUT_SECONDS
    async_task(TASK, operation_id, wait_for_lease, q_options=options)


def one_piece(operation_id: int) -> bool:
    """Whether the operation's next run may take long in one piece (see enqueue)."""
    row = ToolPayloadOperation.objects.filter(pk=operation_id).values_list("kind", "cutoff", "removed_messages").first()
    if row is None:
        return False
    kind, cutoff, removed = row
    return kind in (OperationKind.BACKUP, OperationKind.COMPACT) or (
        kind == OperationKind.CLEANUP and cutoff is None and not removed)


def enqueue_soon(operation_id: int) -> None:
    """Make sure a queued operation whose run is lost gets one (e.g. after cancel)."""
    op = ToolPayloadOperation.objects.filter(pk=operation_id, lease="", slot__isnull=False).first()
    if op is not None and op.state == OperationState.QUEUED and quiet_since(op) > LEASE_SECONDS:
        enqueue(operation_id)


def quiet_since(op: ToolPayloadOperation) -> float:
    """Seconds since the operation last showed progress (a batch, a heartbeat), or was queued;
    endless for a sign later than a lease from now (`_from_the_future`)."""
    last = op.heartbeat_at or op.created_at
    now = timezone.now()
    return math.inf if _from_the_future(last, now) else (now - last).total_seconds()


def _from_the_future(moment: datetime | None, now: datetime) -> bool:
    """A heartbeat more than a lease ahead of this clock was written before the clock was set
    back (a host that came back with its time corrected): no holder is renewing it, so it is no
    sign of life (r103: a cleanup killed that way stayed "running" for the length of the jump, and
    every other operation was refused as busy). Within a lease, two hosts' clocks may differ."""
    return moment is not None and moment > now + timedelta(seconds=LEASE_SECONDS)


# ---- Schedule -------------------------------------------------------------------------------

DAILY = "tool-payloads-daily-check"


def wake_schedule(*, now_due: bool = False) -> None:
    """Make sure the daily check exists and runs within a day (after save, analyze or run). A
    check that is due stays due: the cluster runs it once at its next pass (no catch-up).
    `now_due`: due now, at the cluster's next pass (a save that turned cleanup on or shortened
    its period: its first run, after the backup chosen, starts then, not up to a day later)."""
    from django_q.models import Schedule

    now = timezone.now()
    schedule = Schedule.objects.filter(name=DAILY).first()
    if schedule is None:
        from retention.schedules import ensure_schedules

        ensure_schedules()
        schedule = Schedule.objects.filter(name=DAILY).first()
        if schedule is None or not now_due:
            return
    latest = now if now_due else now + timedelta(days=1)
    if schedule.next_run is None:
        Schedule.objects.filter(pk=schedule.pk, next_run__isnull=True).update(next_run=now)
    elif schedule.next_run > latest:
        Schedule.objects.filter(pk=schedule.pk, next_run=schedule.next_run).update(next_run=latest)


def next_check_at() -> datetime | None:
    from django_q.models import Schedule

    return Schedule.objects.filter(name=DAILY).values_list("next_run", flat=True).first()


def check_is_due(at: datetime | None) -> bool:
    """The daily check is past its time by more than a minute: the job cluster has not run it
    (stopped, or busy), so it is shown as due rather than as a time to come."""
    return at is not None and at < timezone.now() - timedelta(minutes=1)


BUSY_RETRY = timedelta(minutes=2)  # a daily check that found an analysis or a compaction running


def daily_check() -> str:
    """The enabled policy's daily cleanup (started by "schedule"); never a catch-up storm.

    One operation runs at a time. A check that finds an analysis, a compaction or a backup of its
    own (a Retry) running comes back BUSY_RETRY later, until it can start its run: it let the
    schedule go on a day (r127: the first cleanup after turning cleanup on waited a day, the
    card saying only the next day's check). One that finds a cleanup running, or the backup a
    cleanup follows, has its run under way."""
    from retention import service

    policy = ToolPayloadPolicy.load()
    if not policy.enabled:
        return "disabled"
    # A check a save made due at once starts that save's first run: credited to its admin.
    woken = policy.woken_by
    try:
        service._load_checked_policy()
        op = service._start_cleanup_or_preparation(user=woken, user_name=policy.woken_by_name, policy=policy)
    except service.CleanupError as exc:
        if exc.code == "busy" and not _cleanup_under_way():
            _check_again(timezone.now() + BUSY_RETRY)
            return "busy: checked again in two minutes"
        _woken_done(policy)
        return exc.code
    _woken_done(policy)
    return f"started {op.pk}"


def _woken_done(policy: ToolPayloadPolicy) -> None:
    """The check a save made due has run: later ones are the schedule's own."""
    if policy.woken_by_name:
        ToolPayloadPolicy.objects.filter(id=1, revision=policy.revision).update(woken_by=None, woken_by_name="")


def _cleanup_under_way() -> bool:
    return ToolPayloadOperation.objects.filter(slot__isnull=False).filter(
        Q(kind=OperationKind.CLEANUP) | Q(kind=OperationKind.BACKUP, then_cleanup=True)).exists()


def _check_again(at: datetime) -> None:
    """The daily check's next run at `at`, if it was later (the scheduler moved it a day on when
    it queued this check; a save or an analysis may have made it due sooner meanwhile)."""
    from django_q.models import Schedule

    Schedule.objects.filter(name=DAILY, next_run__gt=at).update(next_run=at)


def recover(*, at_start: bool = False) -> int:
    """Queue a run for every open operation whose run is lost (no live lease).

    At cluster start every open operation is queued (its run waits out a fresh lease once);
    afterwards only those quiet for longer than the lease. Never raises: start-up must go on.
    """
    count = 0
    try:
        for op in ToolPayloadOperation.objects.filter(slot__isnull=False):
            if at_start or quiet_since(op) > LEASE_SECONDS:
                with transaction.atomic():
                    enqueue(op.pk, wait_for_lease=at_start)
                count += 1
    except Exception:
        log.exception("tool payload recovery could not queue its runs")
    return count


def startup() -> int:
    return recover(at_start=True)


def tick() -> int:
    return recover()


def on_worker_spawn(sender=None, proc_name: str = "", **kwargs) -> None:
    """django-q2's post_spawn: queue recovery of interrupted preparations and runs."""
    from django_q.tasks import async_task

    try:
        async_task("retention.jobs.startup", q_options={"ack_failure": True, "task_name": "tool-payloads-startup"})
    except Exception:  # never keep a worker from starting
        log.exception("could not queue the tool payload startup recovery")


# ---- The run --------------------------------------------------------------------------------


def _claim(operation_id: int, token: str) -> ToolPayloadOperation | None:
    """Take the lease if it is free or expired; count takeovers of a dead run's lease."""
    now = timezone.now()
    expired = now - timedelta(seconds=LEASE_SECONDS)
    with transaction.atomic():
        op = ToolPayloadOperation.objects.select_for_update().filter(pk=operation_id).first()
        if op is None or op.slot is None:
            return None
        if op.lease and op.heartbeat_at and op.heartbeat_at >= expired and not _from_the_future(op.heartbeat_at, now):
            return None
        if op.lease:
            op.attempts += 1  # the previous run died holding the lease
        op.lease = token
        op.heartbeat_at = now
        if op.state == OperationState.QUEUED:
            op.state = OperationState.RUNNING
            op.started_at = now
        op.save(update_fields=["lease", "heartbeat_at", "attempts", "state", "started_at"])
    return op


def _await_lease(operation_id: int, token: str) -> ToolPayloadOperation | None:
    """At start-up: is the lease's holder alive (its heartbeat moves) or dead (the lease
    expires)? Exit at once in the first case, take over in the second."""
    first = ToolPayloadOperation.objects.filter(pk=operation_id).values_list("heartbeat_at", flat=True).first()
    deadline = time.monotonic() + LEASE_SECONDS + 2
    while time.monotonic() < deadline:
        time.sleep(min(0.5, LEASE_SECONDS / 4))
        row = ToolPayloadOperation.objects.filter(pk=operation_id).values_list("slot", "heartbeat_at").first()
        if row is None or row[0] is None or row[1] != first:
            return None  # finished, or its holder is alive
        op = _claim(operation_id, token)
        if op is not None:
            return op
    return None


def run_operation(operation_id: int, wait_for_lease: bool = False) -> str:
    """Run (a step of) one operation. Returns "done", "more", "busy" or "gone"."""
    from retention.service import StateUnreadable, _check_operation, _check_policy, _skipped

    token = uuid.uuid4().hex
    op = _with_busy_retries(lambda: _claim(operation_id, token))
    if op is None and wait_for_lease:
        op = _await_lease(operation_id, token)
    if op is None:
        return "busy" if ToolPayloadOperation.objects.filter(pk=operation_id, slot__isnull=False).exists() else "gone"
    try:
        _with_busy_retries(lambda: (_check_operation(op), _check_policy(ToolPayloadPolicy.load())))
    except StateUnreadable:
        log.exception("tool payload operation %s: stored state unreadable", operation_id)
        _fail(op, token, "state_unreadable",
              Message(gettext_noop("The stored cleanup state could not be read, so nothing ran.")))
        try:
            _skipped(op)
        except StateUnreadable:  # the counts it could not read: none, so the failed row reads
            ToolPayloadOperation.objects.filter(pk=op.pk).update(skipped_json="{}")
        return "done"
    if op.attempts > MAX_TAKEOVERS:
        _fail(op, token, "interrupted",
              Message(gettext_noop("The job was interrupted too many times; it stopped. Start it again.")))
        return "done"
    body = {
        OperationKind.ANALYSIS: _analysis_step,
        OperationKind.CLEANUP: _cleanup_step,
        OperationKind.BACKUP: _backup_run,
        OperationKind.COMPACT: _compact_run,
    }[op.kind]
    try:
        outcome = body(op, token)
    except LeaseLost:
        return "busy"
    except Exception as exc:
        from console.busy import is_database_full, is_database_unavailable

        if is_database_busy(exc):
            outcome = "more"
        elif is_database_unavailable(exc):
            # The connection ended (the server restarted or failed over, an operator ended the
            # session): nothing of the batch it was in was committed, and the run goes on from
            # its committed cursor once the database answers again (r94: it failed as
            # "unexpected"). A backup stops instead: its copy if it published one, else Retry.
            log.warning("tool payload operation %s: the database connection was lost; it goes on once the "
                        "database answers", operation_id)
            _after_lost_connection()
            if op.kind == OperationKind.BACKUP:
                from retention.backups import UNREACHABLE

                return _backup_cut_short(op, token, "database_unavailable", Message(UNREACHABLE))
            outcome = "more"
        elif is_database_full(exc):  # said as it is; the run can be started again once there is room
            log.warning("tool payload operation %s stopped: the database's disk is full", operation_id)
            _fail(op, token, "no_space", Message(gettext_noop(
                "The database's disk is full, so the job stopped. Free space on that disk, then start it "
                "again.")))
            return "done"
        else:
            log.exception("tool payload operation %s failed", operation_id)
            _fail(op, token, "internal",
                  Message(gettext_noop("The job stopped on an unexpected error. Details are in the server log.")))
            return "done"
    if outcome == "more":
        _release(op.pk, token)
    return outcome


def _after_lost_connection() -> None:
    """Drop the dead connection (the next query opens a new one) and wait a moment."""
    connection.close()
    time.sleep(LOST_CONNECTION_PAUSE)


def _release(op_id: int, token: str) -> None:
    """Free the lease and queue the next step. While the database cannot be reached, try again
    for up to half a lease; after that the lease runs out and the recovery sweep takes the run
    over from its committed cursor."""
    from console.busy import is_database_unavailable

    deadline = time.monotonic() + LEASE_SECONDS / 2
    while True:
        try:
            with transaction.atomic():
                released = ToolPayloadOperation.objects.filter(pk=op_id, lease=token).update(
                    lease="", heartbeat_at=timezone.now()
                )
                if released:
                    enqueue(op_id)
            return
        except OperationalError as exc:
            if not is_database_unavailable(exc) or time.monotonic() > deadline:
                raise
            _after_lost_connection()


def _fail(op: ToolPayloadOperation, token: str, code: str, message: Message) -> None:
    """Fail the operation; a backup's failure also fails the preparation waiting on it (else
    it would show a backup being made that no job makes, with no Retry or Cancel offered).
    A cleanup that had removed details before it failed stopped part-way: partial (what its
    batches removed stays), as a cancel after some batches is."""
    state = OperationState.FAILED
    if op.kind == OperationKind.CLEANUP and ToolPayloadOperation.objects.filter(
            pk=op.pk, removed_messages__gt=0).exists():
        state = OperationState.PARTIAL
    with transaction.atomic():
        if _finish(op, token, state, code, message) and op.kind == OperationKind.BACKUP:
            _policy_preparation(PreparationState.FAILED, error=message)


def _finish(op: ToolPayloadOperation, token: str, state: str, code: str = "", message: Message | str = "",
            **fields: Any) -> bool:
    """Close the operation (frees the slot) if we still hold its lease."""
    with transaction.atomic():
        done = ToolPayloadOperation.objects.filter(pk=op.pk, lease=token).update(
            state=state, slot=None, lease="", finished_at=timezone.now(), heartbeat_at=timezone.now(),
            error_code=code, error_message=stored(message), **fields,
        )
    return bool(done)


def _locked(op: ToolPayloadOperation, token: str) -> ToolPayloadOperation:
    fresh = ToolPayloadOperation.objects.select_for_update().get(pk=op.pk)
    if fresh.lease != token:
        raise LeaseLost
    return fresh


def _merge(skipped_json: str, counts: Counter) -> str:
    current = Counter(json.loads(skipped_json or "{}"))
    current.update({k: v for k, v in counts.items() if v})
    return json.dumps(dict(sorted(current.items())))


def _with_busy_retries(fn):
    """Run one batch (or the run's claim), backing off while the database is busy or its
    connection ended (a new one is opened; r97: a claim on an ended session failed the task and
    left the run still for a lease's time); re-raise after BUSY_RETRIES."""
    from console.busy import is_database_unavailable

    delay = 0.05
    for attempt in range(BUSY_RETRIES + 1):
        try:
            return fn()
        except OperationalError as exc:
            lost = is_database_unavailable(exc)
            if not (lost or is_database_busy(exc)) or attempt == BUSY_RETRIES:
                raise
            if lost:
                _after_lost_connection()
            else:
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
    return None


# ---- Analysis -------------------------------------------------------------------------------


def _skip_counts(items) -> Counter:
    """How many of these items the reducer skips, by the reason stored at write time."""
    return Counter(dict(items.exclude(payload_skip="").values_list("payload_skip").annotate(n=Count("id")).order_by()))


def _analysis_step(op: ToolPayloadOperation, token: str) -> str:
    """Sum removable bytes and count skipped items over the indexes, by conversation batch.
    Reads no payload and changes no row but its own operation's."""
    from lifecycle.models import Item

    deadline = time.monotonic() + STEP_SECONDS
    if op.cutoff is None:
        now = timezone.now()
        cutoff = cutoff_for(now, op.age_value, op.age_unit)
        total = eligible_conversations(cutoff).count()
        with transaction.atomic():
            _locked(op, token)
            ToolPayloadOperation.objects.filter(pk=op.pk).update(cutoff=cutoff, counted_at=now, progress_total=total)
        op.cutoff, op.counted_at, op.progress_total = cutoff, now, total
    while time.monotonic() < deadline:
        def batch() -> str:
            fresh_cursor = ToolPayloadOperation.objects.get(pk=op.pk)
            if fresh_cursor.cancel_requested:
                return "cancel"
            # Only conversations idle when it counted (r154: one whose work ended meanwhile was
            # analysed besides, 7 of 6)
            ids = list(
                eligible_conversations(op.cutoff, as_of=fresh_cursor.counted_at)
                .filter(id__gt=fresh_cursor.cursor_conversation)
                .values_list("id", flat=True)[:ANALYSIS_BATCH]
            )
            if not ids:
                return "end"
            removable = Item.objects.filter(conversation_id__in=ids, removable_bytes__gt=0)
            per_conversation = list(
                removable.values("conversation_id").annotate(n=Count("id"), b=Sum("removable_bytes"))
                .order_by()
            )
            skipped = _skip_counts(Item.objects.filter(conversation_id__in=ids))
            with transaction.atomic():
                fresh = _locked(op, token)
                ToolPayloadOperation.objects.filter(pk=op.pk).update(
                    scanned=F("scanned") + len(ids),
                    eligible_conversations=F("eligible_conversations") + len(per_conversation),
                    eligible_messages=F("eligible_messages") + sum(r["n"] for r in per_conversation),
                    payload_bytes=F("payload_bytes") + sum(r["b"] for r in per_conversation),
                    skipped_json=_merge(fresh.skipped_json, skipped),
                    cursor_conversation=ids[-1],
                    progress_done=F("progress_done") + len(ids),
                    heartbeat_at=timezone.now(),
                    attempts=0,  # progress: takeovers count again from here (see _commit_cursor)
                )
            return "next"

        result = _with_busy_retries(batch)
        if result == "cancel":
            _finish(op, token, OperationState.CANCELLED)
            return "done"
        if result == "end":
            # Every conversation it counted was analysed or left out as no longer idle since its
            # count (r156: "done 1 of 2" for a succeeded analysis): the count is done.
            _finish(op, token, OperationState.SUCCEEDED, progress_done=F("progress_total"))
            return "done"
    return "more"


# ---- Cleanup --------------------------------------------------------------------------------


def _reduce_item_row(item, *, removed_at: datetime):
    from retention.reducer import reduce_item_row

    return reduce_item_row(item, removed_at=removed_at)


class _Row:
    """The columns a batch reads of an item; no payload unless the item is reduced in Python.
    On SQLite the batch first reads only (id, conversation_id, payload_bytes) from the
    removable-items index, and the rest of the row once it took the item (see _complete_rows):
    a column after a payload that overflows its page is reached only through the payload's
    overflow pages, so the removal plan is read there with the payload reduced."""

    __slots__ = ("id", "conversation_id", "role", "tool_kind", "payload_bytes", "removable_bytes",
                 "revision", "payload")

    def __init__(self, id: int, conversation_id: int, role: str | None = None,  # noqa: A002 (the column)
                 tool_kind: str | None = None, payload_bytes: int = 0, removable_bytes: int | None = None,
                 revision: int | None = None) -> None:
        # plain assignments: a batch makes several hundred of these, in the gap writers use
        self.id, self.conversation_id, self.role, self.tool_kind = id, conversation_id, role, tool_kind
        self.payload_bytes, self.removable_bytes, self.revision = payload_bytes, removable_bytes, revision
        self.payload = None

    @property
    def pk(self) -> int:
        return self.id


class _Pace:
    """How many payload bytes the next batch takes, and how many rows to read for it (a little
    more than the bytes need, at most BATCH_ITEMS).

    A batch's write transaction is a fixed part (its checks and the cursor's update) plus its
    items' writes and its commit, which grow with the items. The pace measures both on the
    batches before and sizes the items so that the whole takes about the engine's batch time,
    within [MIN_BATCH_BYTES, BATCH_BYTES]; but the items always get at least half of that time,
    so where the fixed part is slow (a slow core) batches grow instead of shrinking until the
    fixed part is all they do."""

    def __init__(self, pause: float = 0.0) -> None:
        if BATCH_SECONDS_SET or connection.vendor != "postgresql":
            self.seconds = BATCH_SECONDS
        else:
            self.seconds = POSTGRES_BATCH_SECONDS
        self.budget = min(FIRST_BATCH_BYTES, BATCH_BYTES)
        self.item_bytes = 0.0  # mean payload bytes of the items taken so far
        self.fixed = 0.0  # seconds of a write transaction that are not item writes (smoothed)
        self.commit_share = 0.0  # a commit's time over its batch's item writes' time (smoothed)
        self.pause = pause
        self.committed_at = 0.0  # monotonic time of the last batch's commit
        # the cursor and cutoff the last batch committed: the next batch reads from there without
        # reading the operation row first (its write transaction checks the cursor again)
        self.next_read: tuple[tuple[int, int], datetime, datetime | None, int] | None = None
        # the eligible conversations read last, in id order, and the id they were read from: all
        # the eligible ones in [from, last] (one tuple: both are replaced at once)
        self.window: tuple[int, list[int]] = (0, [])
        self.eligible: _EligibleAmong | None = None
        self.marked_stale = False
        self.checkpointer: _Checkpointer | None = None  # SQLite: folds the WAL back in beside the batches

    def wait_for_gap(self) -> None:
        """Between two write transactions at least `pause` passes (SQLite: waiting writers
        take the lock then); the next batch's reading and planning count toward it."""
        if self.pause and self.committed_at:
            left = self.committed_at + self.pause - time.monotonic()
            if left > 0:
                time.sleep(left)

    def candidates_from(self, first: int) -> list[int] | None:
        """The conversations read before from `first` on, or None when a new read is due: past
        the list, or before where it was read from (a batch that committed another cursor than
        the one read expected, or stopped early: the list would skip the conversations in
        between). Each is rechecked inside its batch's transaction, so a list read before is
        never trusted for eligibility."""
        start, candidates = self.window
        if first < start:
            return None
        ahead = [c for c in candidates if c >= first]
        return ahead or None

    def eligible_among(self, cutoff: datetime, as_of: datetime | None) -> _EligibleAmong:
        if self.eligible is None or (self.eligible.cutoff, self.eligible.as_of) != (cutoff, as_of):
            self.eligible = _EligibleAmong(cutoff, as_of)
        return self.eligible

    def item_limit(self) -> int:
        if not self.item_bytes:
            return BATCH_ITEMS
        return max(1, min(BATCH_ITEMS, int(self.budget / self.item_bytes * 1.5) + 16))

    def taken(self, items: int, payload_bytes: int) -> None:
        if items:
            self.item_bytes = payload_bytes / items

    def write_limit(self) -> float:
        """SQLite: the seconds a batch's write transaction may last, its commit included."""
        return max(self.seconds, self.fixed + self.seconds / 2)

    def record(self, payload_bytes: int, seconds: float, item_seconds: float, share: float = 0.0) -> None:
        """A batch wrote `payload_bytes` in a transaction of `seconds`, `item_seconds` of it
        writing and committing items (the rest is its fixed part); its commit took `share` of
        the time its item writes took."""
        if payload_bytes <= 0 or seconds <= 0:
            return
        self.commit_share = share if not self.commit_share else (self.commit_share + share) / 2
        fixed = max(0.0, seconds - item_seconds)
        self.fixed = fixed if not self.fixed else (self.fixed + fixed) / 2
        for_items = max(self.seconds - self.fixed, self.seconds / 2)
        aimed = payload_bytes / max(item_seconds, 1e-4) * for_items
        # halfway there each batch (one slow commit does not halve the next batch), at most doubling
        budget = min(self.budget * 2, (self.budget + aimed) / 2)
        self.budget = int(min(BATCH_BYTES, max(min(MIN_BATCH_BYTES, BATCH_BYTES), budget)))


def _cleanup_step(op: ToolPayloadOperation, token: str, *, after_batch=None) -> str:
    """Bounded keyset batches by (conversation id, item id), each its own transaction."""
    deadline = time.monotonic() + STEP_SECONDS
    if op.cutoff is None and op.removed_messages == 0:
        # Cancel, disable and a policy change end a run that has not started as they end one
        # between batches, before the backup is checked (a check that fails would mark a
        # preparation failed that this run no longer needs).
        with transaction.atomic():
            ended = _run_ended(op, _RunState.lock(op.pk, token))
        if ended:
            return "done"
        with _Heartbeat(op.pk, token):  # reading the whole backup can outlast the lease
            refused = _verify_preparation()  # (only until a run under this preparation removed anything)
        if refused:
            with transaction.atomic():
                if _finish(op, token, OperationState.FAILED, "preparation_required", refused):
                    ToolPayloadPolicy.objects.filter(id=1, backup_choice=BackupChoice.CREATE).update(
                        preparation_state=PreparationState.FAILED, preparation_error=stored(refused)
                    )
            return "done"
    pace = _Pace(pause=SQLITE_PAUSE if connection.vendor == "sqlite" or PAUSE_SET else 0.0)
    with _checkpoints_beside(pace):
        while time.monotonic() < deadline:
            result = _with_busy_retries(lambda: _cleanup_batch(op, token, pace=pace))
            if after_batch is not None:
                after_batch(result)
            if result in ("succeeded", "cancelled", "disabled", "policy_changed"):
                return "done"
    return "more"


class _Checkpointer:
    """SQLite: folds the WAL back into the database file while the batches go on, on its own
    connection in a thread, woken by each batch's commit. The cleanup connection runs with
    `wal_autocheckpoint = 0` meanwhile: the automatic checkpoint runs inside commit, after the
    lock is released, and so delayed the gap that follows (the time writers get the lock);
    run beside the batches, a PASSIVE checkpoint takes no write lock and the copying (with
    `secure_delete` the zeroed overflow pages of every removed output) uses the other core.
    The connection's setting is restored after, and a last checkpoint runs then.

    The WAL file starts again from its beginning only when a write transaction begins with
    every frame copied back, and this checkpoint always runs just behind the next batch: so
    once the WAL holds RESTART_FRAMES, the next batch waits for the checkpoint to finish (the
    wait is what it takes beyond the batch's reading, a few milliseconds). That keeps the WAL
    a few batches long: its size on disk bounded (it grew to 160 MB in a 200,000-message
    benchmark without this), and below the console's own connections' automatic checkpoint
    (settings: `wal_autocheckpoint`), so a request that commits meanwhile does not copy the
    cleanup's pages itself (that took its appends from 2 to 8 ms at the median)."""

    RESTART_FRAMES = 8000

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.changed = threading.Condition()
        self.commits = 0  # batches committed (the cleanup's thread)
        self.covered = 0  # of those, how many a finished checkpoint started after
        self.frames = 0  # the WAL's length the last checkpoint found
        self.thread = threading.Thread(target=self._run, name="lethe-wal-checkpoint", daemon=True)

    def committed(self) -> None:
        with self.changed:
            self.commits += 1
            self.changed.notify_all()

    def before_batch(self) -> None:
        """Once the WAL is RESTART_FRAMES long: wait (at most 0.25 s) for the checkpoint of
        everything committed so far, so this batch's write transaction starts the WAL again."""
        if self.frames < self.RESTART_FRAMES:
            return
        with self.changed:
            self.changed.wait_for(lambda: self.covered >= self.commits or not self.thread.is_alive(), timeout=0.25)
            self.frames = 0  # started again now, as a rule; the next checkpoint says how long it is

    def _checkpoint(self, frames: int) -> int:
        """A PASSIVE checkpoint; the WAL's length in frames: -1 when another connection was
        checkpointing (then this round does not make the next batch wait), `frames` when the
        statement failed."""
        with contextlib.suppress(OperationalError), connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
            _busy, frames, _copied = cursor.fetchone()
        return frames

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                with self.changed:
                    if not self.changed.wait_for(lambda: self.commits > self.covered or self.stop.is_set(),
                                                 timeout=0.25):
                        continue
                    asked = self.commits
                frames = self._checkpoint(self.frames)
                with self.changed:
                    self.frames = frames  # from here the next batch waits, if it is that long
                if frames >= self.RESTART_FRAMES:
                    # Also copy back what others committed while it ran (the console's own
                    # writes come in the gap after each batch), so that batch finds every
                    # frame copied and starts the WAL again.
                    for _ in range(3):
                        again, frames = frames, self._checkpoint(frames)
                        if frames == again:
                            break
                with self.changed:
                    self.covered = asked
                    self.changed.notify_all()
        except Exception:  # the batches go on without it; the step's last checkpoint still runs
            log.exception("The WAL checkpoint beside the cleanup stopped")
        finally:
            connection.close()  # this thread's own connection

    def __enter__(self) -> _Checkpointer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        with self.changed:
            self.changed.notify_all()
        self.thread.join()


@contextlib.contextmanager
def _checkpoints_beside(pace: _Pace):
    """SQLite with a pause between batches: a `_Checkpointer` for the step (see there)."""
    if connection.vendor != "sqlite" or not pace.pause:
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA wal_autocheckpoint")
        own = cursor.fetchone()[0]
        cursor.execute("PRAGMA wal_autocheckpoint = 0")
    try:
        with _Checkpointer() as checkpointer:
            pace.checkpointer = checkpointer
            yield
    finally:
        pace.checkpointer = None
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA wal_autocheckpoint = {int(own)}")
        with contextlib.suppress(OperationalError), connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")


def _verify_preparation() -> Message | None:
    """Before the first mutating batch: with "create" chosen, the backup must be ready and,
    until a cleanup under this preparation has removed anything, its receipt must verify
    again now (file present, checksum, integrity). None when fine.

    The backup is what the first cleanup after enabling, re-enabling or shortening the period
    waits for (AC-TPR-002.1/002.2; those saves ask for the choice again and start a new
    preparation). Once a run under it committed removals, later runs under the same
    preparation neither need the file nor read it again: an operator may remove an old
    backup, as docs/operations.md advises, without blocking every later cleanup."""
    policy = ToolPayloadPolicy.load()
    if policy.backup_choice == BackupChoice.SKIP and policy.preparation_state == PreparationState.READY:
        return None
    if policy.backup_choice != BackupChoice.CREATE or policy.preparation_state != PreparationState.READY:
        return Message(gettext_noop("Cleanup waits for the backup. Retry the backup, or change the backup choice."))
    if preparation_used(policy.backup_receipt_name):
        return None
    from retention.backups import BackupError, verify_backup

    try:
        verify_backup(policy.backup_receipt_name)
    except BackupError as exc:
        return Message(gettext_noop("The backup made for this cleanup does not verify: %(reason)s"),
                       {"reason": exc.text})
    return None


def preparation_used(receipt_name: str) -> bool:
    """Whether a cleanup has committed removals under the preparation whose backup is
    `receipt_name`: one started after the backup operation that made it (one operation runs
    at a time, so it ran after that backup; a new preparation needs a new backup, whose
    name, unique, replaces this one on the policy). A database restored from that backup
    holds no such cleanup, so its next run verifies the backup again."""
    if not receipt_name:
        return False
    made = ToolPayloadOperation.objects.filter(
        kind=OperationKind.BACKUP, state=OperationState.SUCCEEDED, backup_name=receipt_name
    ).order_by("pk").values_list("pk", flat=True).first()
    return made is not None and ToolPayloadOperation.objects.filter(
        kind=OperationKind.CLEANUP, pk__gt=made, removed_messages__gt=0).exists()


class _Planned:
    """SQLite: one item of a batch, reduced from its stored plan (`marker` set, the plan
    checked, `text` the payload reduced before the write transaction with the marker added),
    or in Python from its payload (`values` set; None when the reducer now skips it)."""

    __slots__ = ("item", "removed_at", "marker", "text", "values")

    def __init__(self, item, removed_at: datetime) -> None:
        self.item, self.removed_at = item, removed_at
        self.marker: str | None = None
        self.text: str | None = None
        self.values: dict[str, Any] | None = None

    @property
    def skipped(self) -> bool:
        return self.marker is None and self.values is None

    @property
    def removed_bytes(self) -> int:
        if self.marker is not None:
            return self.item.removable_bytes  # stored with this revision: exact
        return self.item.payload_bytes - self.values["payload_bytes"]


def _next_items(cursor_conversation: int, cursor_item: int, candidates: list[int], limit: int,
                last_item: int) -> list[_Row]:
    """SQLite: the next removable items (up to the run's last item) of the candidate
    conversations after the cursor, in (conversation, item) order, each part a range of
    item_removable_keyset_idx: the rest of the conversation the cursor is in (from the cursor
    on, however large it is), then the following conversations from their first item."""
    from lifecycle.models import Item

    # SQLite: the index's columns only (the rest is read for the items taken, _complete_rows)
    select = (f"SELECT id, conversation_id, payload_bytes FROM {connection.ops.quote_name(Item._meta.db_table)} "
              "WHERE removable_bytes > 0 AND id <= %s AND ")
    rows: list = []
    following = candidates
    with connection.cursor() as cursor:
        if cursor_item != NO_CURSOR and candidates[0] == cursor_conversation:
            cursor.execute(select + "conversation_id = %s AND id > %s ORDER BY id LIMIT %s",
                           [last_item, cursor_conversation, cursor_item, limit])
            rows = cursor.fetchall()
            following = candidates[1:]
        if following and len(rows) < limit:
            marks = ", ".join(["%s"] * len(following))
            cursor.execute(select + f"conversation_id IN ({marks}) ORDER BY conversation_id, id LIMIT %s",
                           [last_item, *following, limit - len(rows)])
            rows += cursor.fetchall()
    return [_Row(pk, conversation_id, None, None, size) for pk, conversation_id, size in rows]


_ALLOWED_FIELDS = {kind: frozenset(fields) for kind, fields in REMOVED_FIELDS.items()}  # what a plan may name


def _plan_items(items: list, removed_at: datetime) -> list[_Planned]:
    """SQLite: each item's rewrite, computed before the write transaction. Items of a kind whose
    details are top-level fields are reduced in the database with their stored plan (their
    payloads never reach Python); the others (edit_file, rows without a readable plan) are
    read and reduced in Python. An item whose row changed since the batch read it gets
    neither and is counted as changed (its compare-and-swap would fail anyway)."""
    from lifecycle.models import Item
    from retention.reducer import SQL_KINDS, marker_from_plan, removed_at_text

    planned = [_Planned(item, removed_at=removed_at) for item in items]
    # the rows are read in full only now (an item no longer removable keeps no revision)
    reduced = _complete_rows(items)
    in_sql = [entry for entry in planned if entry.item.role == "tool" and entry.item.tool_kind in SQL_KINDS]
    sql_ids = {entry.item.pk for entry in in_sql}
    at_text = removed_at_text(removed_at)
    in_python = []
    for entry in planned:
        item = entry.item
        if item.pk in sql_ids:
            if item.pk not in reduced:
                continue  # changed since the batch read it
            stored_plan, text = reduced[item.pk]
            if stored_plan and text is not None:
                try:
                    marker, fields = marker_from_plan(stored_plan, at_text)
                except (ValueError, KeyError, TypeError):
                    marker, fields = None, []
                if marker is not None and fields and _ALLOWED_FIELDS[item.tool_kind].issuperset(fields):
                    entry.marker, entry.text = marker, _with_marker(text, marker) if text else text
                    continue
        if item.revision is None:
            continue  # SQLite: no longer removable since the batch read the index (changed)
        in_python.append(entry)
    if in_python:
        payloads = dict(Item.objects.filter(pk__in=[e.item.pk for e in in_python]).values_list("id", "payload"))
        for entry in in_python:
            entry.item.payload = payloads.get(entry.item.pk)
            entry.values = _reduce_item_row(entry.item, removed_at=removed_at)
    return planned


def _with_marker(reduced: str, marker: str) -> str:
    """SQLite: the stored payload text, the reduced object (minified, as SQLite's json_remove
    writes it) with the marker added as its last key, as json_set would add it, without the
    write transaction parsing either. The reduced object has no marker key: a payload that has
    one has no plan (the reducer skips it: already_removed, or reserved_field for a field of
    the tool's own by that name)."""
    return f'{reduced[:-1]}{"," if reduced != "{}" else ""}"{MARKER_KEY}":{marker}}}'


class _Read:
    """What a batch read before its write transaction: the cursor it read from, the run's
    cutoff, the candidate conversations, the planned rewrites (SQLite) or the span of items
    (PostgreSQL), their payload bytes, and the cursor the batch commits."""

    __slots__ = ("cursor", "cutoff", "as_of", "last_item", "candidates", "planned", "batch_bytes", "next_cursor",
                 "span")

    def __init__(self, cursor, cutoff, as_of, last_item, candidates, planned, batch_bytes, next_cursor,
                 span=None) -> None:
        self.cursor, self.cutoff, self.as_of, self.candidates = cursor, cutoff, as_of, candidates
        self.last_item = last_item
        self.planned, self.batch_bytes, self.next_cursor = planned, batch_bytes, next_cursor
        self.span: _Span | None = span

    @property
    def conversations(self) -> list[int]:
        """The conversations whose items the batch took, in id order."""
        if self.span is not None:
            return self.span.conversations
        return sorted({entry.item.conversation_id for entry in self.planned})


class _Span:
    """PostgreSQL: the items a batch took, as a range of item_removable_keyset_idx: after the
    batch's cursor up to `end` (the last item taken), in `conversations`, with how many items
    it took of each (`counts`, what the batch accounts for) and in all (`items`, with
    `payload_bytes`); `read` is how many rows the read looked at (more than taken: the byte
    budget stopped it)."""

    __slots__ = ("conversations", "counts", "end", "items", "payload_bytes", "read")

    def __init__(self, rows: list[tuple[int, int, int, int, int]]) -> None:
        self.conversations = [row[0] for row in rows]
        self.counts = [row[1] for row in rows]
        self.items = sum(self.counts)
        self.payload_bytes = sum(row[2] for row in rows)
        self.end = (rows[-1][0], rows[-1][3]) if rows else (0, 0)
        self.read = rows[0][4] if rows else 0


def _read_batch(op: ToolPayloadOperation, token: str, pace: _Pace | None,
                after: tuple[tuple[int, int], datetime, datetime | None, int] | None = None) -> _Read:
    """Read and plan a batch: from the committed cursor, or from `after`, the cursor, cutoff,
    count time and last item the batch before committed (known without reading the operation
    row). Only items up to the run's last item are taken: an item written after the run
    counted is not the run's (neither removed nor skipped by it). Reads only; every
    read is rechecked by the write transaction (the cursor, the conversations, each row's
    revision). On PostgreSQL the batch's items are only delimited here (`_Span`): its one
    write statement reads and reduces them (see _span_sql)."""
    from lifecycle.models import Item

    budget = pace.budget if pace is not None else min(FIRST_BATCH_BYTES, BATCH_BYTES)
    if after is None:
        seen = ToolPayloadOperation.objects.get(pk=op.pk)
        if seen.lease != token:
            raise LeaseLost
        if seen.cutoff is None:
            with _Heartbeat(op.pk, token):  # counts over the whole database
                _fix_cutoff(seen, token)
        (cursor_conversation, cursor_item), cutoff = (seen.cursor_conversation, seen.cursor_item), seen.cutoff
        as_of, last_item = seen.counted_at, _last_item(seen)
    else:
        (cursor_conversation, cursor_item), cutoff, as_of, last_item = after
    first = cursor_conversation if cursor_item != NO_CURSOR else cursor_conversation + 1
    candidates = pace.candidates_from(first) if pace is not None else None
    if candidates is None:
        candidates = list(
            eligible_conversations(cutoff, as_of=as_of)
            .filter(id__gte=first)
            .filter(Exists(Item.objects.filter(conversation=OuterRef("pk"), removable_bytes__gt=0,
                                               id__lte=last_item)))
            .values_list("id", flat=True)[:CONVERSATIONS_PER_BATCH]
        )
        if pace is not None:
            pace.window = (first, candidates)
    planned: list[_Planned] = []
    batch_bytes = 0
    next_cursor = None
    limit = pace.item_limit() if pace is not None else BATCH_ITEMS
    if candidates and connection.vendor == "postgresql":
        span = _read_span((cursor_conversation, cursor_item), candidates, limit, budget, last_item)
        if pace is not None:
            pace.taken(span.items, span.payload_bytes)
        full = span.items < span.read or span.read == limit
        next_cursor = span.end if full and span.items else (candidates[-1], NO_CURSOR)
        return _Read((cursor_conversation, cursor_item), cutoff, as_of, last_item, candidates, [], span.payload_bytes,
                     next_cursor, span)
    if candidates:
        items = _next_items(cursor_conversation, cursor_item, candidates, limit, last_item)
        taken = []
        for item in items:
            if taken and batch_bytes + item.payload_bytes > budget:
                break
            batch_bytes += item.payload_bytes
            taken.append(item)
        if pace is not None:
            pace.taken(len(taken), batch_bytes)
        full = len(taken) < len(items) or len(items) == limit
        if full:
            next_cursor = (taken[-1].conversation_id, taken[-1].id)
        else:  # every candidate conversation is done
            next_cursor = (candidates[-1], NO_CURSOR)
        planned = _plan_items(taken, timezone.now().replace(microsecond=0))  # the marker's whole seconds
    return _Read((cursor_conversation, cursor_item), cutoff, as_of, last_item, candidates, planned, batch_bytes,
                 next_cursor)


def _cleanup_batch(op: ToolPayloadOperation, token: str, *, pace: _Pace | None = None) -> str:
    """One committed batch: "next" while work remains, else how the run ended.

    A batch takes the next items in (conversation id, item id) order after the cursor, up to
    BATCH_ITEMS items and the pace's payload bytes, from up to CONVERSATIONS_PER_BATCH
    eligible conversations. Reading and planning happen before the write transaction (no
    write lock held while Python works); the transaction then locks those conversations,
    rechecks them and writes with compare-and-swap, so the lock covers only the checks and
    the UPDATEs. On PostgreSQL the read only delimits the batch's items, and one statement
    under the lock rechecks the conversations, reads the items and reduces them (_span_sql);
    the items it leaves to Python (edit_file, plans that fail the check) are read and reduced
    under the lock too: it holds only the batch's idle conversations, for the batch's time
    (the pace counts that work in it).
    Items of a conversation that is no longer eligible are counted as skipped
    (`recent_activity`) and left alone. The statements under the lock that run once a batch
    are plain SQL (see _RunState, _EligibleAmong, _commit_cursor): compiling them through the
    ORM took most of a small SQLite batch's time on a slow core.
    """
    from lifecycle.models import Item

    # 1. Read: the cursor, the next conversations and items (SQLite: their plans; PostgreSQL: the span).
    read = _read_batch(op, token, pace, pace.next_read if pace is not None else None)
    (cursor_conversation, cursor_item), candidates = read.cursor, read.candidates
    planned, batch_bytes, next_cursor = read.planned, read.batch_bytes, read.next_cursor

    # 2. Write: one short transaction that rechecks before it writes.
    if pace is not None:
        pace.wait_for_gap()
        if pace.checkpointer is not None:
            pace.checkpointer.before_batch()
    with transaction.atomic():
        started = time.perf_counter()  # the write lock is held from here (SQLite: BEGIN IMMEDIATE)
        if connection.vendor == "postgresql":
            # The commit does not wait for the WAL flush: a batch lost in a crash loses its
            # removals and its cursor together (one transaction), so the run does it again.
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        fresh = _RunState.lock(op.pk, token)
        ended = _run_ended(op, fresh)
        if ended:
            return ended
        if fresh.cursor != (cursor_conversation, cursor_item):
            if pace is not None:
                pace.next_read = None
            return "next"  # moved on meanwhile: read again
        if not candidates:
            left = 0
            if cursor_item != NO_CURSOR:  # the last conversation became active mid-way
                left = Item.objects.filter(conversation_id=cursor_conversation, removable_bytes__gt=0,
                                           id__gt=cursor_item, id__lte=read.last_item).count()
            # The items counted at the start in conversations that were no longer eligible when
            # the run came to them (active again) are skipped for that reason too, so a finished
            # run has nothing left over and every item counted at the start is accounted for.
            done, total = ToolPayloadOperation.objects.filter(pk=op.pk).values_list(
                "progress_done", "progress_total").get()
            unreached = max(0, total - done - left)
            if left or unreached:
                ToolPayloadOperation.objects.filter(pk=op.pk).update(
                    skipped_json=_merge(fresh.skipped_json, Counter(recent_activity=left + unreached)),
                    progress_done=F("progress_done") + left + unreached,
                )
            # Every conversation counted at the start is gone through: cleaned, or left alone
            # as active again (the batches count only those they finished cleaning; r34: a run
            # said it had scanned 0 of 7 conversations when it succeeded)
            ToolPayloadOperation.objects.filter(pk=op.pk).update(scanned=F("eligible_conversations"))
            _close_locked(op, OperationState.SUCCEEDED)
            return "succeeded"
        touched = read.conversations
        # Lock the conversations (a foreground write waits for this batch, or this batch
        # sees its activity) and recheck their eligibility inside the batch's transaction
        # (PostgreSQL: in the statement that writes the span, which starts once they are locked).
        _lock_conversations(touched)
        eligible = (pace.eligible_among(read.cutoff, read.as_of) if pace is not None
                    else _EligibleAmong(read.cutoff, read.as_of))
        still = eligible.between(touched[0], touched[-1]) if touched and read.span is None else set()
        skipped: Counter = Counter()
        if cursor_item != NO_CURSOR and cursor_conversation not in candidates:
            # the conversation this run was in the middle of became active: the rest of it stays
            skipped["recent_activity"] += Item.objects.filter(
                conversation_id=cursor_conversation, removable_bytes__gt=0, id__gt=cursor_item, id__lte=read.last_item
            ).count()
        loop_start = time.perf_counter()
        fixed_seconds = loop_start - started  # the checks; the item writes and the commit grow with the items
        if read.span is not None:  # PostgreSQL
            removed, removed_bytes, span_skipped = _write_span(read, eligible) if touched else (0, 0, Counter())
            skipped.update(span_skipped)
        else:
            written, stopped_at = _write_in_time(planned, still, skipped, pace, started, loop_start)
            if stopped_at is not None:
                next_cursor, batch_bytes = stopped_at
            removed = len(written)
            removed_bytes = sum(entry.removed_bytes for entry in written)
        writes_end = time.perf_counter()
        finished = sum(1 for c in candidates if c < next_cursor[0] or next_cursor[1] == NO_CURSOR)
        if removed and not (pace is not None and pace.marked_stale):
            # The figures of earlier analyses no longer describe the data.
            ToolPayloadOperation.objects.filter(kind=OperationKind.ANALYSIS, stale=False).exclude(
                state__in=OPEN_STATES).update(stale=True)
            stale_marked = True
        else:
            stale_marked = False
        faults.kill_point("tool-cleanup-mid-batch")  # crash tests: items written, cursor not yet
        _commit_cursor(op.pk, next_cursor, removed=removed, removed_bytes=removed_bytes,
                       skipped_json=_merge(fresh.skipped_json, skipped),
                       done=removed + sum(skipped.values()), scanned=finished)
        fixed_seconds += time.perf_counter() - writes_end  # the counting and the cursor's update
        committing = time.perf_counter()
    if pace is not None:
        pace.committed_at = time.monotonic()
        pace.next_read = (next_cursor, read.cutoff, read.as_of, read.last_item)
        if pace.checkpointer is not None:
            pace.checkpointer.committed()
        pace.marked_stale = pace.marked_stale or stale_marked
        now = time.perf_counter()
        pace.record(batch_bytes, now - started, now - started - fixed_seconds,
                    share=(now - committing) / max(writes_end - loop_start, 1e-4))
    faults.kill_point("tool-cleanup-after-batch")  # crash tests: batch committed
    return "next"


def _write_in_time(planned: list[_Planned], still: set[int], skipped: Counter, pace: _Pace | None,
                   started: float, loop_start: float) -> tuple[list[_Planned], tuple[tuple[int, int], int] | None]:
    """SQLite: write a batch's planned items (those of conversations still eligible; the rest
    counted in `skipped`); the ones written, and where the batch stopped early, if it did.

    A batch sized for the pace's time stops writing if a slower moment has it hold the lock
    that long already (checked every WRITE_CHUNK items), so waiting writers are not held out
    much longer than planned; the cursor then moves only over the items handled (the
    (cursor, payload bytes) returned), and the rest of the plan is read again by the next
    batch. Its commit is part of that time: the stop counts the commit the items written so
    far will need (the commit's share of the write time, measured on the batches before)."""
    limit = pace.write_limit() if pace is not None and pace.pause else None
    chunk = WRITE_CHUNK if limit is not None else max(1, len(planned))
    written: list[_Planned] = []
    sent = 0
    stopped_at = None
    for start in range(0, len(planned), chunk):
        part = planned[start:start + chunk]
        writes = []
        for entry in part:
            if entry.item.conversation_id not in still:
                skipped["recent_activity"] += 1
            elif entry.skipped:
                skipped["changed"] += 1
            else:
                writes.append(entry)
        written += _write_planned(writes) if writes else []
        sent += len(writes)
        if limit is not None and start + chunk < len(planned):
            now = time.perf_counter()
            if now - started + (now - loop_start) * pace.commit_share >= limit:
                last = part[-1].item
                stopped_at = ((last.conversation_id, last.id),
                              sum(entry.item.payload_bytes for entry in planned[:start + chunk]))
                break
    skipped["changed"] += sent - len(written)
    return written, stopped_at


class _RunState:
    """What a batch's write transaction rechecks, read in one statement: the operation's
    lease, cancel flag, cursor, counters, and the policy's switch and revision. PostgreSQL
    locks the operation's row (FOR UPDATE) and the policy's (FOR SHARE) until the batch
    commits."""

    __slots__ = ("cancel_requested", "cursor", "policy_revision", "removed_messages", "skipped_json",
                 "enabled", "revision")

    @classmethod
    def lock(cls, op_id: int, token: str) -> _RunState:
        key = (connection.vendor, "run-state")
        sql = _STATEMENTS.get(key)
        if sql is None:
            operations = connection.ops.quote_name(ToolPayloadOperation._meta.db_table)
            policies = connection.ops.quote_name(ToolPayloadPolicy._meta.db_table)
            # PostgreSQL also holds the policy row (FOR SHARE) until the batch commits: a save
            # (which locks it FOR UPDATE) waits for the batch, so a disable or a new revision
            # returns only once no batch checked against the old policy can still commit.
            # (The policy row always exists once a run was started; SQLite's one writer at a
            # time gives the same order.)
            postgres = connection.vendor == "postgresql"
            sql = _STATEMENTS[key] = (
                "SELECT o.lease, o.cancel_requested, o.cursor_conversation, o.cursor_item, o.policy_revision, "
                f"o.removed_messages, o.skipped_json, p.enabled, p.revision FROM {operations} o "
                f"{'JOIN' if postgres else 'LEFT JOIN'} {policies} p ON p.id = 1 WHERE o.id = %s"
                + (" FOR UPDATE OF o FOR SHARE OF p" if postgres else "")
            )
        with connection.cursor() as cursor:
            cursor.execute(sql, [op_id])
            row = cursor.fetchone()
        if row is None or row[0] != token:
            raise LeaseLost
        state = cls()
        state.cancel_requested = bool(row[1])
        state.cursor = (row[2], row[3])
        state.policy_revision, state.removed_messages, state.skipped_json = row[4], row[5], row[6]
        state.enabled, state.revision = bool(row[7]), row[8]
        return state


class _EligibleAmong:
    """The recheck of a batch's conversations inside its transaction: the ids between two ids
    that `eligible_conversations(cutoff)` selects now. The ORM compiles that query once per
    run step (the same definition as everywhere else); each batch only runs it."""

    LOW, HIGH = -7_340_001, -7_340_002  # stand-ins for the bounds while compiling

    def __init__(self, cutoff: datetime, as_of: datetime | None = None) -> None:
        self.cutoff, self.as_of = cutoff, as_of
        query = eligible_conversations(cutoff, as_of=as_of).filter(id__gte=self.LOW, id__lte=self.HIGH).values_list("id")
        self.sql, params = query.query.sql_with_params()
        self.params = list(params)
        if self.params.count(self.LOW) != 1 or self.params.count(self.HIGH) != 1:
            raise RuntimeError("eligible_conversations: the id bounds are not plain parameters")
        self.low, self.high = self.params.index(self.LOW), self.params.index(self.HIGH)

    def params_between(self, low: int, high: int) -> list:
        params = list(self.params)
        params[self.low], params[self.high] = low, high
        return params

    def between(self, low: int, high: int) -> set[int]:
        with connection.cursor() as cursor:
            cursor.execute(self.sql, self.params_between(low, high))
            return {row[0] for row in cursor.fetchall()}


def _commit_cursor(op_id: int, cursor: tuple[int, int], *, removed: int, removed_bytes: int,
                   skipped_json: str, done: int, scanned: int) -> None:
    """The batch's cursor and counters, added in the batch's transaction (plain SQL). A batch
    committed is progress: the takeovers counted so far (MAX_TAKEOVERS) start again, as a
    delete's stall count does when a step finishes, so only a run that dies again and again
    without moving on ends as interrupted."""
    key = (connection.vendor, "commit-cursor")
    sql = _STATEMENTS.get(key)
    if sql is None:
        sql = _STATEMENTS[key] = (
            f"UPDATE {connection.ops.quote_name(ToolPayloadOperation._meta.db_table)} SET "
            "cursor_conversation = %s, cursor_item = %s, removed_messages = removed_messages + %s, "
            "payload_bytes = payload_bytes + %s, skipped_json = %s, progress_done = progress_done + %s, "
            "scanned = scanned + %s, heartbeat_at = %s, attempts = 0 WHERE id = %s"
        )
    at = ToolPayloadOperation._meta.get_field("heartbeat_at").get_db_prep_save(timezone.now(), connection)
    with connection.cursor() as db:
        db.execute(sql, [cursor[0], cursor[1], removed, removed_bytes, skipped_json, done, scanned, at, op_id])


def _fix_cutoff(op: ToolPayloadOperation, token: str) -> None:
    """The run's first batch fixes its cutoff and totals, in one transaction in which no work
    can end (a Close), so the conversations it counts are exactly those idle at its time
    (lifecycle/work_order.py)."""
    from lifecycle import work_order
    from lifecycle.models import Item
    from retention.reducer import Skip

    with transaction.atomic():
        work_order.no_work_ending()
        now = timezone.now()  # the run takes the conversations eligible now (see eligible_conversations)
        cutoff = cutoff_for(now, op.age_value, op.age_unit)
        # and their items written before it counts (read first: what it counts is all at most this)
        last_item = Item.objects.aggregate(m=Max("id"))["m"] or 0
        in_scope = Item.objects.filter(conversation__in=eligible_conversations(cutoff).values("id"),
                                       id__lte=last_item)
        removable = in_scope.filter(removable_bytes__gt=0).aggregate(
            n=Count("id"), c=Count("conversation_id", distinct=True))
        # What the run leaves alone for its kind or its data (protected, unsupported, unreadable,
        # too small...), as the analysis counts it; details removed before are done, not skipped.
        left_alone = _skip_counts(in_scope.exclude(payload_skip=Skip.ALREADY_REMOVED))
        _locked(op, token)
        ToolPayloadOperation.objects.filter(pk=op.pk, cutoff__isnull=True).update(
            cutoff=cutoff, counted_at=now, last_item=last_item, progress_total=removable["n"],
            eligible_messages=removable["n"],
            eligible_conversations=removable["c"], skipped_json=_merge("{}", left_alone),
        )
    op.refresh_from_db()


def _last_item(op: ToolPayloadOperation) -> int:
    """The newest item a run takes: the last one written when it counted (a run counted before
    this bound was kept takes every item)."""
    return op.last_item if op.last_item is not None else 2**63 - 1


# Words operations stored before they changed: kept in the catalogue, so a stored one is still
# shown in the reader's language ("Cancelled. ..." repeated the state beside it, r147).
EARLIER_WORDS = (gettext_noop("Cancelled. Removals committed before the cancel stay."),)


def _run_ended(op: ToolPayloadOperation, fresh: _RunState) -> str:
    """Cancel, disable and policy change end the run before the next batch writes."""
    ended = OperationState.PARTIAL if fresh.removed_messages else OperationState.CANCELLED
    if fresh.cancel_requested:
        _close_locked(op, ended, "cancelled",
                      Message(gettext_noop("Removals committed before the cancel stay.")))
        return "cancelled"
    if not fresh.enabled:
        _close_locked(op, ended, "disabled",
                      Message(gettext_noop("Cleanup was turned off; later batches did not run.")))
        return "disabled"
    if fresh.revision != fresh.policy_revision:
        _close_locked(op, ended, "policy_changed",
                      Message(gettext_noop("The policy changed during the run; later batches did not run.")))
        return "policy_changed"
    return ""


def _lock_conversations(ids: list[int]) -> None:
    """PostgreSQL: row locks on the batch's conversations. SQLite: nothing to do, the batch's
    IMMEDIATE transaction already holds the database's one write lock."""
    from lifecycle.models import Conversation

    if connection.vendor == "sqlite" or not ids:
        return
    key = (connection.vendor, "lock-conversations")
    sql = _STATEMENTS.get(key)
    if sql is None:
        sql = _STATEMENTS[key] = (f"SELECT id FROM {connection.ops.quote_name(Conversation._meta.db_table)} "
                                  "WHERE id = ANY(%s::bigint[]) ORDER BY id FOR UPDATE")
    with connection.cursor() as cursor:
        cursor.execute(sql, [ids])


_STATEMENTS: dict[tuple[str, ...], str] = {}  # SQL built once per engine and shape
# What every cleanup UPDATE sets besides the payload ({p}: the table's alias and a dot, or
# nothing); its parameters: the skip reason, details_removed_at, updated_at. The digest of the
# append's request goes too: it was taken over the payload removed now.
_REDUCED_SETS = ("payload_bytes = {p}payload_bytes - {p}removable_bytes, removable_bytes = 0, removal_plan = NULL, "
                 "payload_skip = %s, details_removed_at = %s, revision = {p}revision + 1, updated_at = %s, "
                 "client_key_digest = ''")


# ---- PostgreSQL: a batch's span, read and written by SQL ------------------------------------


def _read_span(cursor: tuple[int, int], candidates: list[int], limit: int, budget: int, last_item: int) -> _Span:
    """PostgreSQL: the items a batch takes, from item_removable_keyset_idx alone: the removable
    items (up to the run's last item) of the candidate conversations after the cursor, in
    (conversation, item) order, at
    most `limit` of them and, after the first, as long as their payload bytes stay within
    `budget` (a running sum). One row per conversation comes back, not one per item."""
    from lifecycle.models import Item

    key = (connection.vendor, "span")
    sql = _STATEMENTS.get(key)
    if sql is None:
        sql = _STATEMENTS[key] = (
            "WITH p AS (SELECT conversation_id, id, payload_bytes, sum(payload_bytes) OVER w AS run, "
            f"row_number() OVER w AS n FROM {connection.ops.quote_name(Item._meta.db_table)} "
            "WHERE removable_bytes > 0 AND id <= %s AND conversation_id = ANY(%s::bigint[]) "
            "AND (conversation_id, id) > (%s, %s) WINDOW w AS (ORDER BY conversation_id, id) ORDER BY conversation_id, id LIMIT %s) "
            "SELECT conversation_id, count(*), sum(payload_bytes), max(id), (SELECT count(*) FROM p) "
            "FROM p WHERE run <= %s OR n = 1 GROUP BY conversation_id ORDER BY conversation_id"
        )
    with connection.cursor() as db:
        db.execute(sql, [last_item, candidates, cursor[0], cursor[1], limit, budget])
        return _Span(db.fetchall())


def _plan_check_sql() -> str:
    """PostgreSQL: whether a row's stored plan is one the span's statement may turn into a
    marker: exactly the text `plan_text` writes for the row's kind, that is
    `{"removed_bytes":N,"removed_fields":[...]}` with N a whole number of at most ten digits
    (no sign, no leading zero) and the field list one of the kind's, sorted as the reducer
    lists them. `at` is where `,"removed_fields":` starts (the span's statement finds it once
    a row). Plain string functions: a regular expression and a JSON parse per row made the
    batches 15-20% slower in the benchmark. Stricter than SQLite's check (`_PLAN`, any order
    of the kind's fields): a plan it refuses is reduced in Python from the payload."""
    from itertools import combinations

    from retention.reducer import SQL_KINDS

    head, fields = '{"removed_bytes":', ',"removed_fields":'
    first = len(head) + 1  # where the number starts
    # (never a negative length, whichever order the terms are evaluated in)
    number = f"substr(i.removal_plan, {first}, greatest(plan.at - {first}, 0))"
    lists = []
    for kind in sorted(SQL_KINDS):
        names = sorted(REMOVED_FIELDS[kind])
        shapes = [fields + json.dumps(list(chosen), separators=(",", ":")) + "}"
                  for size in range(1, len(names) + 1) for chosen in combinations(names, size)]
        quoted = ", ".join("'" + shape.replace("'", "''") + "'" for shape in shapes)
        lists.append(f"WHEN '{kind}' THEN ARRAY[{quoted}]")
    return (f"(starts_with(i.removal_plan, '{head}') AND plan.at BETWEEN {first + 1} AND {first + 10} "
            f"AND btrim({number}, '0123456789') = '' "
            f"AND (plan.at = {first + 1} OR substr(i.removal_plan, {first}, 1) <> '0') "
            f"AND substr(i.removal_plan, plan.at) = ANY(CASE i.tool_kind {' '.join(lists)} END))")


def _span_sql(eligible_sql: str) -> str:
    """PostgreSQL: the one statement that writes a batch's span, run with its conversations
    locked (so it starts after any write to them that committed first, and none can follow
    before the batch commits):

    - `live`: which of the span's conversations are eligible now (the recheck);
    - `pre`: the span's removable items in those conversations, each marked whether SQL
      reduces it: a tool item of a kind whose details are top-level fields, with a stored plan
      in canonical form that names only fields of its kind (as `marker_from_plan` and
      `_ALLOWED_FIELDS` check it on SQLite); the rest are reduced in Python (_write_span);
    - `u`: the UPDATE of those rows, compare-and-swap on what `pre` read (the revision, the
      removable bytes and the very plan text it checked: a write that changed any of them
      since wins), that removes the kind's fields and adds the marker built from the row's
      stored plan and the batch's time, and returns each written row's conversation and
      stored removable bytes (exact: that version's);
    - then: the live conversations, the rows written per conversation, their bytes, and the
      ids left to Python.

    Reading the rows in the statement that writes them does what reading them in Python
    before did (one batch's items, their plans checked), without sending a thousand rows and
    plans to Python and back: per batch that was 8 ms of reading and planning, and the
    UPDATE's join over arrays of ids and revisions."""
    from lifecycle.models import Item
    from retention.reducer import MARKER_VERSION, SQL_KINDS

    key = (connection.vendor, "span-write", eligible_sql)
    sql = _STATEMENTS.get(key)
    if sql is None:
        table = connection.ops.quote_name(Item._meta.db_table)
        kinds = ", ".join(f"'{kind}'" for kind in sorted(SQL_KINDS))
        removal = " ".join(f"WHEN '{kind}' THEN i.payload - '{{{','.join(REMOVED_FIELDS[kind])}}}'::text[]"
                           for kind in sorted(SQL_KINDS))
        marker = (f"jsonb_build_object('removed_at', %s::text, 'version', {int(MARKER_VERSION)}) "
                  "|| i.removal_plan::jsonb")
        sql = _STATEMENTS[key] = (
            f"WITH live AS (SELECT e.id FROM ({eligible_sql}) AS e WHERE e.id = ANY(%s::bigint[])), "
            "pre AS MATERIALIZED (SELECT i.id, i.conversation_id, i.revision, i.removable_bytes, "
            "i.removal_plan AS checked_plan, "
            f"(i.role = 'tool' AND i.tool_kind IN ({kinds}) AND i.removal_plan IS NOT NULL AND "
            f"{_plan_check_sql()}) AS in_sql FROM {table} AS i "
            "CROSS JOIN LATERAL (SELECT strpos(i.removal_plan, ',\"removed_fields\":') AS at) AS plan "
            "WHERE i.conversation_id = ANY(%s::bigint[]) AND (i.conversation_id, i.id) > (%s, %s) "
            "AND (i.conversation_id, i.id) <= (%s, %s) AND i.id <= %s AND i.removable_bytes > 0 "
            "AND i.conversation_id IN (SELECT id FROM live)), "
            f"u AS (UPDATE {table} AS i SET payload = (CASE i.tool_kind {removal} END) "
            f"|| jsonb_build_object('{MARKER_KEY}', {marker}), {_REDUCED_SETS.format(p='i.')} "
            "FROM pre WHERE pre.in_sql AND i.id = pre.id AND i.revision = pre.revision "
            "AND i.removable_bytes = pre.removable_bytes AND i.removal_plan = pre.checked_plan "
            "RETURNING pre.conversation_id, pre.removable_bytes), "
            "w AS (SELECT conversation_id, count(*) AS n FROM u GROUP BY conversation_id) "
            "SELECT (SELECT array_agg(id) FROM live), "
            "(SELECT array_agg(conversation_id ORDER BY conversation_id) FROM w), "
            "(SELECT array_agg(n ORDER BY conversation_id) FROM w), "
            "(SELECT coalesce(sum(removable_bytes), 0) FROM u), (SELECT array_agg(id) FROM pre WHERE NOT in_sql)"
        )
    return sql


def _write_span(read: _Read, eligible: _EligibleAmong) -> tuple[int, int, Counter]:
    """PostgreSQL: write a batch's span (its conversations locked); (items written, their
    removed bytes, skipped counts). Every item the read took is accounted for once: written,
    skipped as `recent_activity` (its conversation is no longer eligible) or as `changed` (no
    longer removable as it was, or a compare-and-swap lost)."""
    from lifecycle.models import Item
    from retention.reducer import Skip, removed_at_text

    span = read.span
    touched = span.conversations
    removed_at = timezone.now().replace(microsecond=0)  # the marker's whole seconds
    at_db = Item._meta.get_field("details_removed_at").get_db_prep_save(removed_at, connection)
    (after_conversation, after_item), (end_conversation, end_item) = read.cursor, span.end
    with connection.cursor() as cursor:
        cursor.execute(_span_sql(eligible.sql), [
            *eligible.params_between(touched[0], touched[-1]), touched,
            touched, after_conversation, after_item, end_conversation, end_item, read.last_item,
            removed_at_text(removed_at), Skip.ALREADY_REMOVED, at_db, at_db,
        ])
        live, wrote_in, wrote, removed_bytes, in_python = cursor.fetchone()
    live = set(live or ())
    written = Counter(dict(zip(wrote_in or (), wrote or (), strict=True)))
    if in_python:  # other kinds (edit_file) and rows without a plan SQL can use: read and reduce them now
        rows = Item.objects.filter(pk__in=in_python, removable_bytes__gt=0).values_list(
            "id", "conversation_id", "role", "tool_kind", "payload_bytes", "removable_bytes", "revision", "payload")
        writes = []
        for *columns, payload in rows:
            item = _Row(*columns)
            item.payload = payload
            values = _reduce_item_row(item, removed_at=removed_at)
            if values is not None:
                writes.append((item, values))
        for item, values in _write_items(writes):
            written[item.conversation_id] += 1
            removed_bytes += item.payload_bytes - values["payload_bytes"]
    skipped: Counter = Counter()
    for conversation_id, count in zip(touched, span.counts, strict=True):
        if conversation_id not in live:
            skipped["recent_activity"] += count
        elif count > written[conversation_id]:
            skipped["changed"] += count - written[conversation_id]
        elif count < written[conversation_id]:
            # A removable row the read did not see, in a conversation still eligible: a write
            # that bypassed the conversation's lock and activity (the console's never do).
            # Its removal happened and is counted; the run's total only said fewer.
            log.warning("Cleanup batch: conversation %s had %s removable items more than its read counted",
                        conversation_id, written[conversation_id] - count)
    return sum(written.values()), removed_bytes, skipped


def _write_planned(entries: list[_Planned]) -> list[_Planned]:
    """Write a batch's rewrites with compare-and-swap on (id, revision); the ones written."""
    in_sql = [entry for entry in entries if entry.marker is not None]
    in_python = [entry for entry in entries if entry.marker is None]
    written = []
    if in_sql:
        written += _write_from_plans(in_sql)
    if in_python:
        done = {item.pk for item, _values in _write_items([(e.item, e.values) for e in in_python])}
        written += [entry for entry in in_python if entry.item.pk in done]
    return written


def _reduce_sql() -> str:
    """SQLite: the SELECT that reads the rest of a batch's rows (their kind, sizes and revision),
    their stored plans and their payloads reduced without their marker (the kind's fields
    removed: the plan lists every field of the kind that the payload has, same revision, so
    that is exactly the plan's), in one statement, before the write transaction, so the
    transaction, which holds the database's one write lock, only stores values. A row that is
    no longer removable is not returned. (PostgreSQL reads, checks and reduces them in the
    statement that writes them, _span_sql: reducing them in a read before was slower there.)"""
    from lifecycle.models import Item
    from retention.reducer import REMOVED_FIELDS, SQL_KINDS

    key = (connection.vendor, "reduce")
    sql = _STATEMENTS.get(key)
    if sql is None:
        table = connection.ops.quote_name(Item._meta.db_table)
        paths = {kind: ", ".join(f"""'$."{name}"'""" for name in REMOVED_FIELDS[kind]) for kind in SQL_KINDS}
        removal = " ".join(f"WHEN '{kind}' THEN json_remove(i.payload, {paths[kind]})" for kind in sorted(SQL_KINDS))
        sql = (f"SELECT i.id, i.role, i.tool_kind, i.payload_bytes, i.removable_bytes, i.revision, "
               f"i.removal_plan, CASE WHEN i.role = 'tool' AND i.removal_plan IS NOT NULL "
               f"THEN CASE i.tool_kind {removal} END END "
               f"FROM json_each(%s) AS v JOIN {table} AS i ON i.id = v.value WHERE i.removable_bytes > 0")
        _STATEMENTS[key] = sql
    return sql


def _complete_rows(items: list[_Row]) -> dict[int, tuple[str | None, str | None]]:
    """SQLite: fill in the rest of the batch's rows as they are now (see _reduce_sql), and
    return {id: (stored plan, payload reduced without its marker)}. A row no longer removable
    keeps revision None. Its payload bytes are read again with its revision: what the
    compare-and-swap writes and counts is the row as this statement read it, whatever the
    index said a moment before."""
    by_id = {item.id: item for item in items}
    reduced = {}
    with connection.cursor() as cursor:
        cursor.execute(_reduce_sql(), [json.dumps(list(by_id))])
        for pk, role, kind, size, removable, revision, stored_plan, text in cursor.fetchall():
            item = by_id[pk]
            item.role, item.tool_kind, item.payload_bytes = role, kind, size
            item.removable_bytes, item.revision = removable, revision
            reduced[pk] = (stored_plan, text)
    return reduced


def _write_sql() -> str:
    """SQLite: the UPDATE that stores a batch's reductions with their markers, compare-and-swap
    on (id, revision), sizes from the stored figures: one prepared statement per row
    (executemany, a loop in the driver) with the small reduced payload read before.
    (PostgreSQL writes a batch in one statement: _span_sql.)"""
    from lifecycle.models import Item

    key = (connection.vendor, "write")
    sql = _STATEMENTS.get(key)
    if sql is None:
        sql = _STATEMENTS[key] = (
            f"UPDATE {connection.ops.quote_name(Item._meta.db_table)} SET payload = %s, "
            f"{_REDUCED_SETS.format(p='')} WHERE id = %s AND revision = %s AND removal_plan IS NOT NULL"
        )
    return sql


def _write_from_plans(entries: list[_Planned]) -> list[_Planned]:
    """Write the reductions planned before the transaction with their markers, compare-and-swap
    on (id, revision); the ones written."""
    from lifecycle.models import Item
    from retention.reducer import Skip

    at_field = Item._meta.get_field("details_removed_at")
    at_db = at_field.get_db_prep_save(entries[0].removed_at, connection)  # one time per batch
    with connection.cursor() as cursor:
        cursor.executemany(_write_sql(), [
            [e.text, Skip.ALREADY_REMOVED, at_db, at_db, e.item.pk, e.item.revision] for e in entries
        ])
        changed = cursor.rowcount
    if changed == len(entries):
        return entries
    ours = set(
        Item.objects.filter(pk__in=[entry.item.pk for entry in entries], payload_skip=Skip.ALREADY_REMOVED)
        .values_list("id", "revision", "details_removed_at")
    )
    return [entry for entry in entries
            if (entry.item.pk, entry.item.revision + 1, entry.removed_at) in ours]


def _write_items(writes: list[tuple[Any, dict[str, Any]]]) -> list[tuple[Any, dict[str, Any]]]:
    """UPDATE each item with compare-and-swap on (id, revision); the ones written.

    One executemany per batch. When fewer rows changed than were sent (a concurrent write
    won somewhere), the rows that carry this batch's removal are the ones written.
    """
    from lifecycle.models import Item

    if not writes:
        return []
    names = tuple(sorted(writes[0][1]))
    sql = _STATEMENTS.get((connection.vendor, *names))
    if sql is None:
        columns = ", ".join(f"{connection.ops.quote_name(Item._meta.get_field(n).column)} = %s" for n in names)
        sql = _STATEMENTS[(connection.vendor, *names)] = (
            f"UPDATE {connection.ops.quote_name(Item._meta.db_table)} SET {columns} WHERE id = %s AND revision = %s"
        )
    fields = [Item._meta.get_field(n) for n in names]
    rows = [[*(f.get_db_prep_save(values[f.name], connection) for f in fields), item.pk, item.revision]
            for item, values in writes]
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)
        changed = cursor.rowcount
    if changed == len(writes):
        return writes
    ours = set(
        Item.objects.filter(pk__in=[item.pk for item, _v in writes], payload_skip="already_removed")
        .values_list("id", "revision", "details_removed_at")
    )
    return [(item, values) for item, values in writes
            if (item.pk, values["revision"], values["details_removed_at"]) in ours]


def _close_locked(op: ToolPayloadOperation, state: str, code: str = "", message: Message | str = "") -> None:
    ToolPayloadOperation.objects.filter(pk=op.pk).update(
        state=state, slot=None, lease="", finished_at=timezone.now(), heartbeat_at=timezone.now(),
        error_code=code if state != OperationState.SUCCEEDED else "", error_message=stored(message),
    )


# ---- Backup preparation ---------------------------------------------------------------------


class _Heartbeat:
    """Keeps the lease fresh from a thread (own connection) during one long call."""

    def __init__(self, op_id: int, token: str) -> None:
        self.op_id, self.token = op_id, token
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        try:
            while not self.stop.wait(max(LEASE_SECONDS / 4, 0.5)):
                try:
                    ToolPayloadOperation.objects.filter(pk=self.op_id, lease=self.token).update(
                        heartbeat_at=timezone.now()
                    )
                except OperationalError:
                    continue
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        return False


def _policy_preparation(state: str, *, error: Message | str = "", receipt: str = "") -> None:
    ToolPayloadPolicy.objects.filter(
        id=1, backup_choice=BackupChoice.CREATE, preparation_state=PreparationState.PREPARING
    ).update(preparation_state=state, preparation_error=stored(error), backup_receipt_name=receipt)


def _backup_run(op: ToolPayloadOperation, token: str) -> str:
    """Create and verify the backup; on success hand over to the cleanup that waits for it.

    A run that finds it took over a dead run's lease does not make a backup on its own. If the
    dead run had published its backup (its receipt names this operation) and the copy checks
    out, the backup is done: it succeeds and the preparation is ready, without the cleanup
    that was to follow (the run cannot tell a run killed after publishing from a database
    restored from that very copy, which shows this backup running: after a restore nothing
    removes anything before an admin asks, or the daily check does). Otherwise the
    preparation was interrupted, so it fails and the admin chooses Retry or Cancel.
    """
    from retention.backups import BackupError, create_backup

    if op.attempts:
        return _backup_cut_short(op, token, "interrupted", Message(gettext_noop(
            "The backup was interrupted (the job restarted, or the database was restored from a copy "
            "taken while it ran). Retry it or change the backup choice.")))

    def should_cancel() -> bool:
        return ToolPayloadOperation.objects.filter(pk=op.pk, cancel_requested=True).exists()

    try:
        with _Heartbeat(op.pk, token):
            receipt = create_backup(should_cancel=should_cancel, operation=op.pk)
    except Exception as exc:
        from console.busy import is_database_unavailable

        if is_database_unavailable(exc):  # said as it is by run_operation
            raise
        if isinstance(exc, BackupError):
            code, message = exc.code, exc.text
        else:
            log.exception("tool payload backup %s failed", op.pk)
            code, message = "internal", Message(gettext_noop(
                "The backup stopped on an unexpected error. Details are in the server log."))
        cancelled = code == "cancelled"
        state = OperationState.CANCELLED if cancelled else OperationState.FAILED
        with transaction.atomic():
            if _finish(op, token, state, code, message):
                _policy_preparation(PreparationState.CANCELLED if cancelled else PreparationState.FAILED, error=message)
        return "done"
    with transaction.atomic():
        if _cancelled_anyway(op, token, receipt):
            return "done"
        if not _finish(op, token, OperationState.SUCCEEDED, backup_name=receipt.name,
                       backup_sha256=receipt.sha256, backup_size=receipt.size):
            return "done"
        _policy_preparation(PreparationState.READY, receipt=receipt.name)
        policy = ToolPayloadPolicy.objects.get(id=1)
        if (op.then_cleanup and policy.enabled and policy.revision == op.policy_revision
                and policy.preparation_state == PreparationState.READY):
            # The starter as stored now: a user deleted while the backup ran is no longer there
            # (its name is kept).
            starter = ToolPayloadOperation.objects.filter(pk=op.pk).values_list("started_by_id", flat=True).get()
            follow = ToolPayloadOperation.objects.create(
                kind=OperationKind.CLEANUP, started_by_id=starter, started_by_name=op.started_by_name,
                policy_revision=policy.revision, age_value=policy.age_value, age_unit=policy.age_unit,
            )
            enqueue(follow.pk)
    return "done"


def _cancelled_anyway(op: ToolPayloadOperation, token: str, published, *, copy_left: bool = False) -> bool:
    """A backup whose Cancel was accepted while it ran ends cancelled, even when its copy was
    made meanwhile (r146: after a restore that showed it running, the run that took it over
    recorded the copy as the backup, the preparation ready, and the daily check's cleanup then
    removed the details the admin had stopped it for). The copy stays, listed with the backups;
    the preparation is cancelled, so cleanup waits for a new backup choice. Inside the caller's
    transaction; True when it ended the operation so. `copy_left`: a copy that does not verify
    stays in the folder too (Lethe removes no backup; r148: said "nothing was kept")."""
    if not ToolPayloadOperation.objects.select_for_update().filter(pk=op.pk, cancel_requested=True).exists():
        return False
    message = Message(gettext_noop("The backup was cancelled; nothing was kept.")) if (
        published is None and not copy_left) else Message(
        gettext_noop("The backup was cancelled after its copy was made; the copy stays in the backup folder, "
                     "and cleanup waits for a new backup choice."))
    fields = {} if published is None else {"backup_name": published.name, "backup_sha256": published.sha256,
                                           "backup_size": published.size}
    if _finish(op, token, OperationState.CANCELLED, "cancelled", message, **fields):
        _policy_preparation(PreparationState.CANCELLED, error=message)
    return True


def _backup_cut_short(op: ToolPayloadOperation, token: str, code: str, message: Message) -> str:
    """A backup run that ended before it was told how its copy went (its worker died, its
    database connection ended): the copy it published, if it checks out, is the backup;
    otherwise what it left is removed and the preparation fails with `message` (Retry or Cancel
    are offered), or with why the copy does not verify (r146: a changed checksum was said as
    "interrupted"). A Cancel accepted meanwhile ends it cancelled either way."""
    from retention.backups import BackupError, clear_leftovers, made_by, verify_backup

    try:  # a run killed mid-copy left a whole copy of the database behind, not listed
        clear_leftovers()
    except BackupError:
        log.warning("tool payload backup %s: what an interrupted run left could not be removed", op.pk)
    published = made_by(op.pk)
    unverified = False
    if published is not None:
        try:
            with _Heartbeat(op.pk, token):
                verify_backup(published.name)
        except BackupError as exc:
            published, unverified = None, True
            code, message = "backup_unverified", Message(gettext_noop(
                "The backup made for this cleanup does not verify: %(reason)s"), {"reason": exc.text})
    with transaction.atomic():
        if _cancelled_anyway(op, token, published, copy_left=unverified):
            return "done"
        if published is not None:
            if _finish(op, token, OperationState.SUCCEEDED, backup_name=published.name,
                       backup_sha256=published.sha256, backup_size=published.size):
                _policy_preparation(PreparationState.READY, receipt=published.name)
            return "done"
        if _finish(op, token, OperationState.FAILED, code, message):
            _policy_preparation(PreparationState.FAILED, error=message)
    return "done"


# ---- Compaction -----------------------------------------------------------------------------


def _compact_run(op: ToolPayloadOperation, token: str) -> str:
    from retention.compact import CompactError, compact_database

    if ToolPayloadOperation.objects.filter(pk=op.pk, cancel_requested=True).exists():
        # VACUUM cannot stop half-way; a cancel asked before it starts is honoured
        _finish(op, token, OperationState.CANCELLED, "cancelled",
                Message(gettext_noop("Cancelled before the database was compacted.")))
        return "done"
    def record(before) -> None:
        # The sizes before the first VACUUM this operation started: a run killed during it
        # (the server may finish that VACUUM anyway) leaves them, and the run that takes over
        # reports from them, not from a file the interrupted run already shrank.
        ToolPayloadOperation.objects.filter(pk=op.pk, lease=token, before_bytes__isnull=True).update(
            before_bytes=before.file_bytes, before_reusable_bytes=before.reusable_bytes)

    try:
        with _Heartbeat(op.pk, token):
            result = compact_database(on_measured=record)
    except CompactError as exc:
        _finish(op, token, OperationState.FAILED, exc.code, exc.text)
        return "done"
    first_bytes, first_reusable = ToolPayloadOperation.objects.filter(pk=op.pk).values_list(
        "before_bytes", "before_reusable_bytes").get()
    _finish(
        op, token, OperationState.SUCCEEDED,
        before_bytes=result.before_file_bytes if first_bytes is None else first_bytes,
        after_bytes=result.after_file_bytes,
        before_reusable_bytes=result.before_reusable_bytes if first_reusable is None else first_reusable,
        after_reusable_bytes=result.after_reusable_bytes,
    )
    return "done"


def open_operation() -> ToolPayloadOperation | None:
    return ToolPayloadOperation.objects.filter(slot__isnull=False, state__in=OPEN_STATES).first()

