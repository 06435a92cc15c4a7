"""The erasure executor: runs an admitted delete's steps to completion, resumably.

`run_erasure(operation_id)` is the job. It is safe to run twice, concurrently, or after a
SIGKILL at any line:

1. Take the lease (one transaction): nobody else holds it, or its holder's lease ran out,
   or its holder is a dead process on this host. Count the attempt (`attempts`, and
   `stalled_attempts` since the last step that finished); past MAX_STALLED the operation
   is left Pending for an admin to retry instead of looping on a step that kills its worker
   (a run that ends on an error it caught gives its attempt back and is retried, every
   BACKOFF_SECONDS[-1] while the same error lasts, unless its way out is an operator's act
   first: OPERATOR_FIRST).
2. After the fingerprints, the table stores holding nothing of the conversation are marked
   done together (one query finds them, one transaction marks them). For each other step
   not done, in order: measure and commit the figures (once), erase what is still there
   (idempotent, batched, the lease renewed between batches), mark it done; a table of at
   most `stores.one_transaction_rows()` rows does all three in one transaction.
3. Complete (one transaction): the conversation becomes `deleted`, the operation
   `completed` with its receipt.
4. Physical: checkpoint SQLite's write-ahead log (retried), else leave it pending.

A run stops itself after RUN_BUDGET seconds (well under the queue's `retry`), releases the
lease and queues the rest, so no run overlaps a redelivery of itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from lifecycle import audit, engine_folder, faults, fleet
from lifecycle.deletion import files, fingerprints, physical, plan, stores
from lifecycle.engine_folder import EngineFolderUnavailable
from lifecycle.enginefs import EngineHome
from lifecycle.errors import ENGINE_FOLDER_NOT_WRITABLE, engine_folder_code
from lifecycle.models import (
    DELETE_TRANSITIONS,
    Conversation,
    ConversationState,
    DeleteOperation,
    DeleteState,
    DeleteStep,
    PhysicalState,
    RetainedFactsPolicy,
    StepState,
)
from lifecycle.registry import STORES, RetentionClass, content_tables
from lifecycle.serializers import iso
from retention.errors import BackupFolderUnreadable

log = logging.getLogger(__name__)

MAX_STALLED = 5
# Errors whose way out is an operator's act first (moving aside what is at a folder's place):
# after MAX_STALLED runs they wait for an admin's retry like a run that kept dying.
OPERATOR_FIRST = frozenset({"unsafe_path"})
BACKOFF_SECONDS = (0, 5, 30, 120, 600)
RUN_BUDGET = 240


def lease_seconds() -> int:
    return int(getattr(settings, "LIFECYCLE_LEASE_SECONDS", 120))


class LeaseLost(Exception):
    """Another worker took the operation over (this one was presumed dead)."""


def check_transition(current: str, new: str) -> None:
    if new not in DELETE_TRANSITIONS[current]:
        raise ValueError(f"a delete operation cannot go from {current} to {new}")


def holder_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def holder_alive(holder: str) -> bool:
    """False only when the holder is provably gone: a process of this host that has exited."""
    host, _sep, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited child not yet reaped is a zombie: dead too
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _backoff(stalled: int) -> timedelta:
    return timedelta(seconds=BACKOFF_SECONDS[min(stalled, len(BACKOFF_SECONDS)) - 1] if stalled else 0)


def _held(op: DeleteOperation, now) -> bool:
    return bool(op.lease_holder and op.lease_expires_at and op.lease_expires_at > now and holder_alive(op.lease_holder))


def stalled(op: DeleteOperation, now=None) -> bool:
    """Pending and no longer retried by itself: MAX_STALLED runs in a row ended without a step
    done (on an error, or killed), and none runs now. `last_error` keeps what stopped the last
    one; an admin's retry starts it again (r48: the flag was set only when something tried to
    take the lease, which nothing did, so no page offered Retry)."""
    return (op.state == DeleteState.PENDING and op.stalled_attempts >= MAX_STALLED
            and not _held(op, now or timezone.now()))


def eligible(op: DeleteOperation, now=None, *, force: bool = False) -> bool:
    now = now or timezone.now()
    if op.state != DeleteState.PENDING:
        return False
    if _held(op, now):
        return False
    if force:
        return True
    if op.stalled_attempts >= MAX_STALLED:
        return False
    return op.next_attempt_at is None or op.next_attempt_at <= now


def take_lease(operation_id: int, *, force: bool = False) -> DeleteOperation | None:
    with transaction.atomic():
        op = DeleteOperation.objects.select_for_update().filter(pk=operation_id).first()
        now = timezone.now()
        if op is None or not eligible(op, now, force=force):
            return None
        op.attempts += 1
        op.stalled_attempts = 1 if force else op.stalled_attempts + 1
        op.lease_holder = holder_id()
        op.lease_expires_at = now + timedelta(seconds=lease_seconds())
        op.next_attempt_at = now + _backoff(op.stalled_attempts)
        op.save(update_fields=["attempts", "stalled_attempts", "lease_holder", "lease_expires_at", "next_attempt_at"])
    return op


_renewed: dict[int, float] = {}


def renew(op: DeleteOperation, *, every: float | None = None, step: str | None = None) -> None:
    """Extend the lease (and record the current step); with `every`, only when that many seconds
    have passed since the last renewal."""
    now = time.monotonic()
    if every is not None and now - _renewed.get(op.pk, 0.0) < every:
        return
    fields: dict = {"lease_expires_at": timezone.now() + timedelta(seconds=lease_seconds())}
    if step is not None:
        fields["step"] = step
    # Inside a transaction of the step, it commits with it (no savepoint of its own).
    with contextlib.nullcontext() if connection.in_atomic_block else stores.erasure_transaction():
        moved = DeleteOperation.objects.filter(
            pk=op.pk, lease_holder=op.lease_holder, state=DeleteState.PENDING
        ).update(**fields)
    if not moved:
        raise LeaseLost(op.public_id)
    _renewed[op.pk] = now


def release(op: DeleteOperation) -> None:
    DeleteOperation.objects.filter(pk=op.pk, lease_holder=op.lease_holder).update(
        lease_holder="", lease_expires_at=None
    )


class ResidueFound(Exception):
    """A store still held something of the conversation after its erasure, twice."""


def _error_code(exc: BaseException) -> str:
    """A content-free name for what stopped the run (shown in words on the operation page)."""
    if isinstance(exc, ResidueFound):
        return "residue_found"
    if isinstance(exc, EngineFolderUnavailable):
        return "engine_folder_unavailable"
    if isinstance(exc, fleet.FleetUnreadable):
        return "fleet_unreadable"
    if isinstance(exc, files.UnsafeFolder | ValueError):
        return "unsafe_path"
    if isinstance(exc, BackupFolderUnreadable):
        return "backup_folder_unreadable"
    if isinstance(exc, OSError):  # a read-only or full engine folder says so (what to fix differs)
        code = engine_folder_code(exc)
        return "io_error" if code == ENGINE_FOLDER_NOT_WRITABLE else code
    if isinstance(exc, DatabaseError):
        return "database_error"
    return "internal_error"


Progress = Callable[[DeleteOperation, DeleteStep, int, int], None]


def run_erasure(operation_id: int, *, force: bool = False, progress: Progress | None = None,
                budget: float = RUN_BUDGET) -> str:
    """Run the erasure as far as it goes; returns the operation's state afterwards
    ("busy" when another worker holds it)."""
    op = take_lease(operation_id, force=force)
    if op is None:
        state = DeleteOperation.objects.filter(pk=operation_id).values_list("state", flat=True).first()
        return "busy" if state == DeleteState.PENDING else (state or "missing")
    started = time.monotonic()
    with stores.relaxed_commits():
        return _run(op, started, progress, budget)


def _run(op: DeleteOperation, started: float, progress: Progress | None, budget: float) -> str:
    current = ""
    try:
        conversation = Conversation.objects.get(pk=op.conversation_id)
        # Nothing is erased, nor found already gone, in a folder that is not this database's
        # (a disk not mounted, a wrong ENGINE_HOME): the delete waits for its folder.
        home = engine_folder.check(EngineHome())
        steps = list(op.steps.order_by("position"))
        by_key = plan.stores_by_key()
        settled = False
        for n, step in enumerate(steps):
            if step.state == StepState.DONE:
                continue
            if not settled and step.key != plan.FINGERPRINTS:
                settled = True
                _settle_empty(op, steps, by_key, conversation)
                if step.state == StepState.DONE:
                    continue
            if time.monotonic() - started > budget:
                release(op)
                from django_q.tasks import async_task

                with stores.durable_transaction():
                    async_task("lifecycle.tasks.erase", op.pk, q_options={"ack_failure": True})
                return DeleteState.PENDING
            if progress:
                progress(op, step, n, len(steps))
            current = step.key
            _run_step(op, step, by_key.get(step.key), conversation, home)
        current = ""
        checked_at = _clear_residue(op, conversation, home, by_key)
        _complete(op, checked_at)
        try:  # completed: what follows only tidies the receipt
            physical.forget_vanished_backups(op.pk)
        except Exception as exc:
            log.warning("backups of %s not rechecked: %s", op.public_id, type(exc).__name__)
        faults.kill_point("checkpoint")
        finish_physical(op.pk)
        if progress:
            progress(op, steps[-1], len(steps), len(steps))
        return DeleteState.COMPLETED
    except LeaseLost:
        return "busy"
    except Exception as exc:
        code = _error_code(exc)
        step_now = current or DeleteOperation.objects.filter(pk=op.pk).values_list("step", flat=True).first()
        log.error("erasure of %s stopped at step %s: %s", op.public_id, step_now, type(exc).__name__)
        fields: dict[str, Any] = {"last_error": code, **({"step": current} if current else {})}
        if code not in OPERATOR_FIRST:
            # A run that ended on an error it caught is waiting for something outside (a folder
            # back, free space, the database): it gives back the attempt it counted, so only runs
            # that die (killed on a step) stall the delete (r103: after five such runs nothing
            # retried it, while the page said it goes on once the folder is back; r120: with the
            # count held just under the limit, one run killed after them stalled it). Retried in
            # 30 s after a first such error, every 10 minutes while the same one lasts.
            again = BACKOFF_SECONDS[-1] if op.last_error == code else BACKOFF_SECONDS[2]
            fields.update(stalled_attempts=max(op.stalled_attempts - 1, 0),
                          next_attempt_at=timezone.now() + timedelta(seconds=again))
        DeleteOperation.objects.filter(pk=op.pk, state=DeleteState.PENDING).update(**fields)
        if code == "internal_error" and settings.DEBUG:
            raise
        return DeleteState.PENDING
    finally:
        release(op)


def _clear_residue(op: DeleteOperation, conversation: Conversation, home: EngineHome, by_key: dict) -> datetime:
    """The residue check of every registered store (DESIGN 4.9: a clean report is part of the
    receipt), before the delete may complete. The database's stores are fenced, but a process
    outside Lethe can write a file again after its step removed the folder: a store found
    holding anything is erased once more (its figures added to its step's in the receipt, over
    every round) and checked again.
    Found again, the delete stays Pending (`residue_found`) and the recovery job retries;
    never Completed with residue known. The physical check (reading the database and engine
    files for the erased bytes) stays an operator's command, `verify_erasure --physical`."""
    from lifecycle.deletion.verify import logical_findings

    for attempt in range(2):
        findings = logical_findings(conversation, home)
        engine_folder.check(home)  # none found in a folder that is no longer this database's is no finding (r81)
        _count_erased_again(op, {f.store for f in findings})
        if not findings:
            return timezone.now()
        if attempt:
            break
        for key in dict.fromkeys(f.store for f in findings):
            store = by_key.get(key)
            if store is None:
                break
            renew(op, step=key)
            figures = _residue_figures(store, conversation, home, [f for f in findings if f.store == key])
            # Measured, then recorded as pending before anything is erased, and added to what
            # earlier rounds erased again once it is: a crash in between leaves the pending
            # figures, which the next run adds once it finds the store empty (r21: they were lost,
            # with the note that something was erased again), or keeps while it erases again.
            with stores.erasure_transaction():
                step = DeleteStep.objects.select_for_update().get(operation=op, key=key)
                pending = step.detail.get("again_pending") or {"records": 0, "bytes": 0}
                step.detail = {**step.detail, "again_pending": {
                    "records": max(pending["records"], figures.records), "bytes": max(pending["bytes"], figures.bytes)}}
                step.save(update_fields=["detail"])
            stores.erase(store, conversation, home, renew=lambda: renew(op, every=lease_seconds() / 8),
                         checkpoint=lambda: None)
            faults.kill_point("residue-erased")
            _count_erased_again(op, set(), key)
    log.error("erasure of %s found residue in %s", op.public_id, ", ".join(sorted({f.store for f in findings})))
    raise ResidueFound(op.public_id)


def _count_erased_again(op: DeleteOperation, holding: set[str], key: str | None = None) -> None:
    """Add each step's pending figures of residue erased again (`key`'s, or every step's whose
    store holds nothing now: erased before a crash) to what earlier rounds erased again."""
    with stores.erasure_transaction():
        steps = DeleteStep.objects.select_for_update().filter(operation=op, detail__has_key="again_pending")
        for step in steps.filter(key=key) if key else steps.exclude(key__in=holding):
            pending = step.detail["again_pending"]
            again = step.detail.get("again") or {"records": 0, "bytes": 0}
            step.detail = {**{k: v for k, v in step.detail.items() if k != "again_pending"},
                           "again": {"records": again["records"] + pending["records"],
                                     "bytes": again["bytes"] + pending["bytes"]}}
            step.save(update_fields=["detail"])


def _residue_figures(store, conversation: Conversation, home: EngineHome, findings) -> stores.Measure:
    """What a store's residue holds: its measure, and a fleet file's leftover temporaries
    (which the fleet file's own measure does not read)."""
    from lifecycle.deletion.verify import leftover_temporaries

    figures = stores.measure(store, conversation, home)
    if store.kind == "file" and store.shared_file and any(f.what == "fleet_temporary" for f in findings):
        left = leftover_temporaries(home, store.paths(home, conversation)[0], conversation)
        sizes = [path.stat().st_size for path in left if path.exists()]
        figures = stores.Measure(figures.records + len(sizes), figures.bytes + sum(sizes), figures.detail)
    return figures


def erase_residue(op: DeleteOperation) -> list[str]:
    """A completed delete whose stores hold something of the conversation again (written by a
    process outside Lethe after the delete, or brought back by a restore): erase those stores
    once more (`verify_erasure --erase-residue`). Returns their keys; the caller verifies."""
    from lifecycle.deletion.verify import logical_findings

    conversation, home, by_key = op.conversation, engine_folder.check(EngineHome()), plan.stores_by_key()
    keys = [key for key in dict.fromkeys(f.store for f in logical_findings(conversation, home)) if key in by_key]
    for key in keys:
        stores.erase(by_key[key], conversation, home, renew=lambda: None, checkpoint=lambda: None)
    return keys


def _step_done(op: DeleteOperation, step: DeleteStep, figures: stores.Measure | None = None) -> None:
    with stores.erasure_transaction():
        extra = {"records": figures.records, "bytes": figures.bytes, "detail": figures.detail} if figures else {}
        DeleteStep.objects.filter(pk=step.pk).update(state=StepState.DONE, finished_at=timezone.now(), **extra)
        _progressed(op)


def _progressed(op: DeleteOperation) -> None:
    """Progress: a later crash starts the stall count (and its back-off) afresh. Once per run
    is enough (later steps would write the same), so only the run's first finished step does."""
    if getattr(op, "progress_noted", False):
        return
    DeleteOperation.objects.filter(pk=op.pk).update(stalled_attempts=0, next_attempt_at=timezone.now(),
                                                    last_error="")
    op.progress_noted = True


def _settle_empty(op: DeleteOperation, steps: list[DeleteStep], by_key: dict, conversation: Conversation) -> None:
    """Find, in one query, the pending table steps whose store holds no row of the
    conversation, and mark them done with zero figures in one transaction (as `_run_step`
    does for one step: measured and done at once), so a conversation that never used most
    stores does not pay a lease renewal, a measurement and a completion, each its own
    transaction, for each of them. The tombstone stays last; a store holding rows is left to
    its own step."""
    empty: list[tuple[DeleteStep, stores.Measure]] = []
    with stores.erasure_transaction():
        now = timezone.now()
        held = DeleteOperation.objects.filter(pk=op.pk, lease_holder=op.lease_holder, state=DeleteState.PENDING)
        if not held.update(lease_expires_at=now + timedelta(seconds=lease_seconds())):
            raise LeaseLost(op.public_id)
        _renewed[op.pk] = time.monotonic()
        candidates = [(step, by_key[step.key]) for step in steps
                      if step.state == StepState.PENDING and step.key in by_key
                      and by_key[step.key].kind == "table" and not by_key[step.key].tombstone]
        # A store holding rows is measured by its own step (a measure may read every row).
        holding = stores.tables_holding([store for _step, store in candidates], conversation)
        empty = [(step, stores.empty_measure(store)) for step, store in candidates if store.key not in holding]
        if not empty:
            return
        groups: dict[tuple, list[int]] = {}
        for step, figures in empty:
            groups.setdefault((figures.bytes, tuple(sorted(figures.detail.items()))), []).append(step.pk)
        for (size, detail), ids in groups.items():
            DeleteStep.objects.filter(pk__in=ids).update(state=StepState.DONE, finished_at=now, records=0,
                                                         bytes=size, detail=dict(detail))
        _progressed(op)
    for step, _figures in empty:
        step.state = StepState.DONE


def _run_step(op: DeleteOperation, step: DeleteStep, store, conversation: Conversation, home: EngineHome) -> None:
    """One step: measure (committed before erasing), erase what is still there, mark done.

    A table step small enough for one statement does all three in one transaction (on
    PostgreSQL a table without content is measured by that statement: `stores.erase_counted`).
    A larger one commits its figures first, then erases in batches. A file step cannot share
    the database's transaction: its figures are committed, then the files changed, then it
    is marked done; a crash in between redoes the (idempotent) file change.
    """
    kill = lambda: faults.kill_point(step.key)  # noqa: E731
    in_folder = step.key == plan.FINGERPRINTS or store.kind == "file"
    if in_folder:
        # The folder is checked once more before a step that reads or changes it, and again
        # before the step is marked done: a folder gone meanwhile (a disk unmounted during the
        # messages' step) read as holding nothing, so the delete completed with its files still
        # on the disk and a clean receipt (r81). The step waits for its folder instead.
        engine_folder.check(home)

    def done(figures: stores.Measure | None = None) -> None:
        if in_folder:
            engine_folder.check(home)
        _step_done(op, step, figures)

    if step.key == plan.FINGERPRINTS:
        renew(op, step=step.key)
        fingerprints.record(op, fingerprints.sample(conversation, home))
        kill()
        done()
        return
    if step.state != StepState.PENDING:
        renew(op, step=step.key)
    else:
        # The current step first, in its own commit: a crash inside the step's transaction rolls
        # back everything in it, and the operation would go on naming the step before (its
        # page said "Preparing" while the worker had died erasing messages).
        renew(op, step=step.key)
        # A folder's removal cannot be undone by a crash, as a table's delete can: its figures
        # commit durably before it (a lost commit would leave a receipt counting nothing).
        with stores.erasure_transaction() if store.kind == "table" else stores.durable_transaction():
            # The lease commits with the figures, and is checked again under the step's locks.
            renew(op)
            if stores.counted_by_delete(store):
                figures, erased = stores.erase_counted(store, conversation, home, checkpoint=kill)
                if erased:
                    _step_done(op, step, figures)
                    return
            else:
                figures = stores.measure(store, conversation, home)
            if not figures.records and not figures.detail.get("remaining"):
                done(figures)  # nothing there: measured and done at once
                return
            if store.kind == "table" and figures.records <= stores.one_transaction_rows():
                stores.erase(store, conversation, home, renew=lambda: None, checkpoint=kill, whole=True)
                _step_done(op, step, figures)
                return
            DeleteStep.objects.filter(pk=step.pk).update(
                state=StepState.MEASURED, records=figures.records, bytes=figures.bytes, detail=figures.detail
            )
    stores.erase(store, conversation, home, renew=lambda: renew(op, every=lease_seconds() / 8), checkpoint=kill)
    done()


def receipt_of(op: DeleteOperation, steps: list[DeleteStep] | None = None) -> dict:
    """Per store: class, what was done, records, bytes. Kept stores with their row counts."""
    actions = {RetentionClass.ERASE: "erased", RetentionClass.COMPACT: "compacted",
               RetentionClass.RETAIN_DETACH: "detached", RetentionClass.SHARED: "revoked"}
    changed = []
    if steps is None:
        steps = list(op.steps.exclude(key=plan.FINGERPRINTS).order_by("position"))
    for step in steps:
        s = STORES_BY_KEY[step.key]
        again = step.detail.get("again") or {}  # erased once more before completing (see _clear_residue)
        entry = {"store": s.key, "class": s.retention.value, "action": actions[s.retention],
                 "records": step.records + again.get("records", 0), "bytes": step.bytes + again.get("bytes", 0)}
        if again:
            entry["erased_again"] = True
        if "remaining" in step.detail:
            entry["remaining"] = step.detail["remaining"]
        changed.append(entry)
    kept = []
    counts = stores.row_counts([s for s in STORES if s.retention in (RetentionClass.RETAIN,
                                                                     RetentionClass.RETAIN_FACTS)],
                               op.conversation_id)
    policy = RetainedFactsPolicy.load()
    for s in STORES:
        if s.retention in (RetentionClass.RETAIN, RetentionClass.RETAIN_FACTS):
            entry = {"store": s.key, "class": s.retention.value, "action": "kept", "records": counts[s.key]}
            if s.period:  # the period in force now (a console of this engine reads the receipt again then)
                entry["days"] = getattr(policy, s.period)
            elif s.days:  # a fixed period (the erasure check's fingerprints)
                entry["days"] = s.days
            kept.append(entry)
        elif s.kind == "external":
            kept.append({"store": s.key, "class": s.retention.value, "action": "out_of_scope"})
    return {"engine": connection.vendor, "stores": changed, "kept": kept}


def with_current_periods(kept: Any, load_policy: Callable[[], RetainedFactsPolicy] | None = None) -> Any:
    """A receipt's kept entries with the retained-facts period in force now: facts still kept
    expire by it (lifecycle.actions.expire_facts), whatever period stood when the receipt was
    written, and a console of this engine schedules its next read of the receipt by it.
    `load_policy`: a list of operations passes one that reads the policy once for them all."""
    if not isinstance(kept, list):
        return kept
    periods = {s.key: s.period for s in STORES if s.period}
    policy = None
    entries = []
    for entry in kept:
        if isinstance(entry, dict) and entry.get("action") == "kept" and entry.get("store") in periods:
            policy = policy or (load_policy or RetainedFactsPolicy.load)()
            entry = {**entry, "days": getattr(policy, periods[entry["store"]])}
        entries.append(entry)
    return entries


CHANGED_ACTIONS = ("erased", "compacted")  # what "records erased or compacted" counts


STORES_BY_KEY = {s.key: s for s in STORES}  # the registry's stores by key


def is_tombstone(store_key: Any) -> bool:
    """Whether a store's record stays as the conversation's tombstone (its title erased): it
    is not counted among the records erased, its bytes are."""
    store = STORES_BY_KEY.get(store_key) if isinstance(store_key, str) else None
    return store is not None and store.tombstone


def counts_files(store_key: Any) -> bool:
    """Whether a store's records are files (a conversation's folders); a shared file's records
    are rows in it (the fleet files), as tables' are."""
    store = STORES_BY_KEY.get(store_key) if isinstance(store_key, str) else None
    return store is not None and store.kind == "file" and not store.shared_file


# The largest count a figure may be: what a database integer holds. A larger one is no count of
# anything stored (r46: 10**330 bytes from an engine failed every page that showed it in KB or MB).
MAX_FIGURE = 2**63 - 1


def figure(value: Any) -> int | None:
    """A whole, non-negative count as an engine gave it, or None (not given, or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FIGURE else None


def changed_totals(entries: Any) -> dict[str, int | bool]:
    """What a receipt's stores erased or compacted, from the same entries: records (rows; not
    the tombstone, whose row stays), files (of the conversation's folders) and bytes; `partial` when an entry gives no figure
    or one that is not a whole, non-negative number (a remote engine's receipt): it is left out of
    the sums, which then say so, as its line shows no number."""
    entries = entries if isinstance(entries, list) else []
    changed = [e for e in entries if isinstance(e, dict) and e.get("action") in CHANGED_ACTIONS]
    files = [e for e in changed if counts_files(str(e.get("store")))]
    return {
        "records": sum(figure(e.get("records")) or 0 for e in changed if e not in files and not is_tombstone(e.get("store"))),
        "files": sum(figure(e.get("records")) or 0 for e in files),
        "bytes": sum(figure(e.get("bytes")) or 0 for e in changed),
        "partial": any(figure(e.get(key)) is None for e in changed for key in ("records", "bytes")),
    }


def _complete(op: DeleteOperation, checked_at: datetime) -> None:
    faults.kill_point("complete")
    with stores.durable_transaction():
        locked = DeleteOperation.objects.select_for_update().get(pk=op.pk)
        if locked.state == DeleteState.COMPLETED:
            return
        check_transition(locked.state, DeleteState.COMPLETED)
        steps = list(locked.steps.order_by("position"))
        if any(step.state != StepState.DONE for step in steps):
            raise RuntimeError("a step is not done")
        steps = [step for step in steps if step.key != plan.FINGERPRINTS]
        now = timezone.now()
        # The fact of this deletion first, so the receipt's kept counts include it
        audit.record(
            "conversation.deleted", conversation=locked.conversation,
            old={"state": ConversationState.PENDING_DELETE},
            new={"state": ConversationState.DELETED, "operation": locked.public_id},
        )
        receipt = receipt_of(locked, steps)
        receipt["holders"] = physical.holders(now, physically_erased=False, conversation_id=locked.conversation_id)
        receipt["verification"] = {"at": iso(checked_at), "logical": "clean", "physical": "not_checked",
                                   "findings": 0}
        Conversation.objects.filter(pk=locked.conversation_id).update(state=ConversationState.DELETED,
                                                                      view_changed_at=now)
        DeleteOperation.objects.filter(pk=locked.pk).update(
            state=DeleteState.COMPLETED, completed_at=now, step="", receipt=receipt, last_error="",
            # Every content table, not only those that held rows now: rows removed earlier by
            # another path (Close releases the process lease) left their bytes in the files too.
            touched_tables=content_tables(), physical_state=PhysicalState.PENDING, verified_at=checked_at,
        )


def finish_physical(operation_id: int) -> bool:
    """SQLite: checkpoint the write-ahead log and record physical erasure. PostgreSQL: wait
    for a compaction (record_compaction)."""
    op = DeleteOperation.objects.filter(pk=operation_id, state=DeleteState.COMPLETED,
                                        physical_state=PhysicalState.PENDING).first()
    if op is None or connection.vendor != "sqlite":
        return False
    if not physical.checkpoint_sqlite():
        return False
    now = timezone.now()
    # The receipt as it is now, not as read before the checkpoint's retries: facts may have
    # expired (or a check been recorded) meanwhile, and writing the older copy back would undo it.
    with transaction.atomic():
        locked = DeleteOperation.objects.select_for_update().filter(
            pk=op.pk, physical_state=PhysicalState.PENDING).first()
        if locked is None:
            return False
        receipt = dict(locked.receipt or {})
        receipt["holders"] = [h for h in receipt.get("holders", []) if h.get("kind") != "wal"]
        DeleteOperation.objects.filter(pk=op.pk).update(
            physical_state=PhysicalState.ERASED, physically_erased_at=now, receipt=receipt
        )
    return True


def outstanding(now=None) -> list[int]:
    """Pending operations a worker may take now, oldest first."""
    now = now or timezone.now()
    return [op.pk for op in DeleteOperation.objects.outstanding().order_by("requested_at", "pk")
            if eligible(op, now)]


def unfinished_physical() -> list[int]:
    if connection.vendor != "sqlite":
        return []
    return list(DeleteOperation.objects.filter(state=DeleteState.COMPLETED, physical_state=PhysicalState.PENDING)
                .values_list("pk", flat=True))


def retry(operation_id: int) -> None:
    """An admin's retry of a stalled operation: the stall count starts afresh."""
    DeleteOperation.objects.filter(pk=operation_id, state=DeleteState.PENDING).update(
        stalled_attempts=0, next_attempt_at=timezone.now(), last_error=""
    )
