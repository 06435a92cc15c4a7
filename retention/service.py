"""The tool payload cleanup service: the one entry point for screens, API and command.

Every mutation checks the caller is an admin, validates its input, and either changes
nothing (raising `CleanupError` with a stable code, a localized message and an HTTP status)
or commits its row(s) and queues the django-q2 job in the same transaction (enqueueing is
transactional on the ORM broker, so an operation row never exists without its job).

"One operation at a time, whoever starts it" is the unique constraint on
`ToolPayloadOperation.slot`: a second start loses on the database, not in Python.

The status document (`status_document`) follows DESIGN.md section 8, plus `database`,
`backups`, `last_compact` and `analysis_state`. Timestamps are aware datetimes; the API
serializes them as ISO 8601 and the views format them.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from console.auth import is_admin
from lifecycle.errors import ActionRefused
from retention import jobs
from retention.errors import BackupFolderUnreadable, said
from retention.models import (
    AGE_LIMITS,
    OPEN_STATES,
    AgeUnit,
    BackupChoice,
    OperationKind,
    OperationState,
    PreparationState,
    ToolPayloadOperation,
    ToolPayloadPolicy,
)

log = logging.getLogger(__name__)
HISTORY_LENGTH = 50


class CleanupError(Exception):
    """A refused request: nothing changed. `code` is stable, `message` localized."""

    STATUS = {
        "invalid_age": 400,
        "backup_choice_required": 400,
        "invalid_backup_choice": 400,
        "stale_revision": 409,
        "busy": 409,
        "preparation_required": 409,
        "not_enabled": 409,
        "not_cancellable": 409,
        "nothing_to_retry": 409,
        "not_found": 404,
        "forbidden": 403,
        "state_unreadable": 409,
        "unsupported": 409,
    }

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else self.STATUS.get(code, 409)


class StateUnreadable(Exception):
    """Stored state that this version cannot interpret: fail closed, never guess."""


# ---- Reading stored state (fail closed) -----------------------------------------------------


def _check_policy(policy: ToolPayloadPolicy) -> None:
    if policy.preparation_state not in PreparationState.values:
        raise StateUnreadable(f"preparation_state={policy.preparation_state!r}")
    if policy.backup_choice not in ("", *BackupChoice.values):
        raise StateUnreadable(f"backup_choice={policy.backup_choice!r}")
    if policy.age_unit not in AgeUnit.values:
        raise StateUnreadable(f"age_unit={policy.age_unit!r}")


def _skipped(op: ToolPayloadOperation) -> dict[str, int]:
    try:
        value = json.loads(op.skipped_json or "{}")
    except ValueError as exc:
        raise StateUnreadable(f"operation {op.pk}: skipped counts") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in value.items()
    ):
        raise StateUnreadable(f"operation {op.pk}: skipped counts")
    return value


def _check_operation(op: ToolPayloadOperation) -> None:
    if op.kind not in OperationKind.values or op.state not in OperationState.values:
        raise StateUnreadable(f"operation {op.pk}: kind={op.kind!r} state={op.state!r}")
    _skipped(op)


def _unreadable_error() -> CleanupError:
    return CleanupError(
        "state_unreadable",
        _("The stored cleanup state could not be read, so nothing will run. Check the server log."),
    )


def _require_admin(user) -> None:
    if not is_admin(user):
        raise CleanupError("forbidden", _("Only admins can change tool payload cleanup."))


def _check_age(age_value, age_unit) -> None:
    if (
        not isinstance(age_value, int)
        or isinstance(age_value, bool)
        or age_unit not in AgeUnit.values
        or not AGE_LIMITS[AgeUnit(age_unit)][0] <= age_value <= AGE_LIMITS[AgeUnit(age_unit)][1]
    ):
        raise CleanupError(
            "invalid_age", _("Choose from 1 to 520 weeks, or from 1 to 120 months.")
        )


def _load_checked_policy() -> ToolPayloadPolicy:
    policy = ToolPayloadPolicy.load()
    try:
        _check_policy(policy)
        for op in ToolPayloadOperation.objects.filter(slot__isnull=False):
            _check_operation(op)
    except StateUnreadable:
        log.exception("tool payload cleanup state unreadable")
        raise _unreadable_error() from None
    return policy


_BUSY_QUEUED = {
    OperationKind.ANALYSIS: gettext_lazy("An analysis is waiting to start; one operation runs at a time, so nothing "
                                         "new was started."),
    OperationKind.BACKUP: gettext_lazy("The backup for cleanup is waiting to start; one operation runs at a time, "
                                       "so nothing new was started."),
    OperationKind.CLEANUP: gettext_lazy("A cleanup is waiting to start; one operation runs at a time, so nothing new "
                                        "was started."),
    OperationKind.COMPACT: gettext_lazy("Compact database is waiting to start; one operation runs at a time, so "
                                        "nothing new was started."),
}
_BUSY_RUNNING = {
    OperationKind.ANALYSIS: gettext_lazy("An analysis is running; one operation runs at a time, so nothing new was "
                                         "started."),
    OperationKind.BACKUP: gettext_lazy("The backup for cleanup is being made; one operation runs at a time, so "
                                       "nothing new was started."),
    OperationKind.CLEANUP: gettext_lazy("A cleanup is running; one operation runs at a time, so nothing new was "
                                        "started."),
    OperationKind.COMPACT: gettext_lazy("Compact database is running; one operation runs at a time, so nothing new "
                                        "was started."),
}


def _busy() -> CleanupError:
    """`busy`, naming the operation in the way and whether it runs or waits (r22, r23: a queued
    analysis, or the admin's own compaction sent twice, was "another cleanup operation ... running",
    to wait for or cancel; a compaction has no Cancel)."""
    blocking = ToolPayloadOperation.objects.filter(state__in=OPEN_STATES).order_by("pk").first()
    words = blocking and (_BUSY_QUEUED if blocking.state == OperationState.QUEUED else _BUSY_RUNNING).get(blocking.kind)
    return CleanupError("busy", str(words or _("Another cleanup operation is under way; one operation runs at a "
                                               "time, so nothing new was started.")))


# ---- Operation documents --------------------------------------------------------------------


def _operation_dict(op: ToolPayloadOperation) -> dict[str, Any]:
    return {
        "id": op.pk,
        "kind": op.kind,
        "state": op.state,
        "cutoff": op.cutoff,
        "scanned": op.scanned,
        "eligible_conversations": op.eligible_conversations,
        "eligible_messages": op.eligible_messages,
        "removed_messages": op.removed_messages,
        "payload_bytes": op.payload_bytes,
        "skipped": _skipped(op),
        "created_at": op.created_at,
        "started_at": op.started_at,
        "finished_at": op.finished_at,
        "error": {"code": op.error_code, "message": said(op.error_message)} if op.error_code else None,
        "started_by": op.starter,
        "started_by_kind": "schedule" if op.by_schedule else "user",
        "progress": {"done": op.progress_done, "total": op.progress_total},
        "stale": op.stale,
        "cancel_requested": op.cancel_requested,
        **_progress_signs(op),
        "age": {"value": op.age_value, "unit": op.age_unit} if op.age_value else None,
        "policy_revision": op.policy_revision,
        "before_bytes": op.before_bytes,
        "after_bytes": op.after_bytes,
        "before_reusable_bytes": op.before_reusable_bytes,
        "after_reusable_bytes": op.after_reusable_bytes,
        "backup": (
            {"name": op.backup_name, "sha256": op.backup_sha256, "size": op.backup_size, "present": None}
            if op.backup_name else None
        ),
    }


def _progress_signs(op: ToolPayloadOperation) -> dict[str, Any]:
    """An open operation's last sign of progress, and whether it has stalled: no batch and no
    heartbeat for twice the lease (a worker renews it at every batch, and a backup's or a
    compaction's heartbeat thread every few seconds), so no worker is on it now."""
    if op.state not in OPEN_STATES:
        return {"last_progress_at": None, "stalled": False}
    return {"last_progress_at": op.heartbeat_at or op.created_at,
            "stalled": jobs.quiet_since(op) > 2 * jobs.LEASE_SECONDS}


def analysis_view_state(op: ToolPayloadOperation | None) -> str:
    """not_analyzed | running | completed | empty | partial | failed | stale (AC-TPR-001.5)."""
    if op is None:
        return "not_analyzed"
    if op.state in OPEN_STATES:
        return "running"
    if op.state == OperationState.CANCELLED:
        # No estimate, whatever it counted before the cancel (as the card, the history and the
        # figures' description say); its own state, in last_analysis, says it was cancelled.
        return "not_analyzed"
    if op.state not in (OperationState.SUCCEEDED, OperationState.PARTIAL):
        return "failed"  # no estimate either: never "stale" (r72: the card says failed, or cancelled)
    if op.stale:
        return "stale"
    return "partial" if op.state == OperationState.PARTIAL else "completed" if op.eligible_messages else "empty"


def _database() -> dict[str, Any]:
    from retention.storage import database_size

    size = database_size()
    return {
        "engine": size.engine,
        "file_bytes": size.file_bytes,
        "reusable_bytes": size.reusable_bytes,
        "reusable_is_estimate": size.reusable_is_estimate,
        "reusable_measured_at": size.reusable_measured_at,
    }


BACKUPS_SHOWN = 20  # the newest backups the status lists (it is read every second while something runs)


def _backups() -> tuple[list[dict[str, Any]], int, set[str] | None]:
    """The newest BACKUPS_SHOWN backups, how many older ones the backup folder holds, and the
    names of all of them (None: the backup primitives are not installed, or the folder is missing)."""
    try:
        from retention.backups import ever_used, list_backups, readable_backup_dir
    except ImportError:  # the backup primitives are not installed in this build
        return [], 0, None
    folder = readable_backup_dir()
    if folder is None or not ever_used(folder):
        # No folder (a disk not mounted, a host without the shared one): whether a backup is
        # still there cannot be told (r154: every backup was said to be gone from it)
        return [], 0, None
    receipts = list_backups()
    return [
        {"name": r.name, "size": r.size, "created_at": r.created_at, "sha256": r.sha256, "changed": r.changed}
        for r in receipts[:BACKUPS_SHOWN]
    ], max(len(receipts) - BACKUPS_SHOWN, 0), {r.name for r in receipts}


def _mark_present(docs: list[dict | None], listed: set[str] | None) -> None:
    """Each backup operation's `backup.present`: whether the backup folder still lists its
    file (an operator may remove old backups; Lethe never does). None when the folder could
    not be listed. From the listing the status makes anyway: nothing more is read."""
    for doc in docs:
        if doc and doc.get("backup") is not None:
            doc["backup"]["present"] = None if listed is None else doc["backup"]["name"] in listed


def operation_document(op: ToolPayloadOperation) -> dict:
    """One operation as the status shows it, asked about alone (the command's documents): its
    backup's `present` read from the backup folder, as the status reads it (r83: always null
    here, which the schema says means the folder could not be listed)."""
    doc = _operation_dict(op)
    if doc["backup"] is not None:
        try:
            listed = _backups()[2]
        except Exception as exc:  # said as the status says it: not known
            log.warning("the backup folder cannot be read: %s", type(exc).__name__)
            listed = None
        _mark_present([doc], listed)
    return doc


def _newest_of(kind: str) -> tuple[dict | None, ToolPayloadOperation | None]:
    """The newest readable operation of a kind, as the history shows it (an unreadable one is
    skipped, as in the history)."""
    for op in ToolPayloadOperation.objects.filter(kind=kind).select_related("started_by")[:HISTORY_LENGTH]:
        try:
            _check_operation(op)
            return _operation_dict(op), op
        except StateUnreadable:
            continue
    return None, None


def status_document(*, with_database: bool = True) -> dict:
    """The whole state of tool payload cleanup (DESIGN.md section 8 and more).

    `with_database=False` leaves out the database figures (`None`): measuring reusable space
    reads pages, and the card's status reads (every second while something runs) do not
    show them (the page measures once when it renders).

    Never raises for unreadable stored state: with an unreadable policy or open operation
    it answers with `error` set ({code: "state_unreadable", message}) and as much as it could
    read, and every mutation refuses until the state is readable again. A finished operation
    that cannot be read is left out of the history and sets no error (the job that failed it
    for that reason also reset what it could not read).
    """
    policy = ToolPayloadPolicy.load()
    error = None
    try:
        _check_policy(policy)
    except StateUnreadable:
        log.exception("tool payload cleanup policy unreadable")
        error = _unreadable_error()
    ops = list(ToolPayloadOperation.objects.select_related("started_by")[:HISTORY_LENGTH])
    history, current, last_analysis, last_run, last_compact = [], None, None, None, None
    analysis_op = None
    for op in ops:
        try:
            _check_operation(op)
            doc = _operation_dict(op)
        except StateUnreadable:
            log.exception("tool payload cleanup operation unreadable")
            if op.slot is not None:  # an open one: nothing runs until it reads again
                error = _unreadable_error()
            continue  # a finished one is left out of the history (the log names it)
        history.append(doc)
        if current is None and op.slot is not None:
            current = doc
        if last_analysis is None and op.kind == OperationKind.ANALYSIS:
            last_analysis, analysis_op = doc, op
        if last_run is None and op.kind == OperationKind.CLEANUP:
            last_run = doc
        if last_compact is None and op.kind == OperationKind.COMPACT:
            last_compact = doc
    # A kind not among the newest HISTORY_LENGTH: its newest readable one however old (the
    # (kind, -id) index), so 50 analyses after a cleanup do not make it "Never".
    if last_analysis is None:
        last_analysis, analysis_op = _newest_of(OperationKind.ANALYSIS)
    if last_run is None:
        last_run, _op = _newest_of(OperationKind.CLEANUP)
    if last_compact is None:
        last_compact, _op = _newest_of(OperationKind.COMPACT)
    try:
        backups, older_backups, listed = _backups()
    except BackupFolderUnreadable as exc:  # said where backups are listed; no fault of Lethe's (r37)
        log.warning("the backup folder cannot be read: %s", exc)
        backups, older_backups, listed = [], 0, None
    except Exception:  # a broken backup folder must not hide the rest of the status
        log.exception("could not list backups")
        backups, older_backups, listed = [], 0, None
    _mark_present([*history, last_analysis, last_run, last_compact], listed)
    return {
        "policy": {
            "enabled": policy.enabled,
            "age": {"value": policy.age_value, "unit": policy.age_unit},
            "revision": policy.revision,
            "updated_at": policy.updated_at,
        },
        "supported": connection.vendor in ("sqlite", "postgresql"),
        "preparation": {
            "state": policy.preparation_state,
            "choice": policy.backup_choice or None,
            "error": said(policy.preparation_error) or None,
            "receipt": policy.backup_receipt_name or None,
        },
        "operation": current,
        "analysis_state": analysis_view_state(analysis_op) if last_analysis else "not_analyzed",
        "last_analysis": last_analysis,
        "last_run": last_run,
        "last_compact": last_compact,
        "next_check_at": jobs.next_check_at() if policy.enabled and error is None else None,
        "history": history,
        "database": _database() if with_database else None,
        "backups": backups,
        "older_backups": older_backups,
        "error": {"code": error.code, "message": error.message} if error else None,
    }


# ---- Policy ---------------------------------------------------------------------------------


def _needs_choice(policy: ToolPayloadPolicy, *, enabled: bool, age_value: int, age_unit: str) -> bool:
    """Enabling (first time or again) or shortening the period needs an explicit choice. A
    period shorter on some day counts as shorter, whatever day it is saved on (r34: 1 month to
    4 weeks needed no choice when saved early in March, though 4 weeks removes more from the
    29th of most months on)."""
    if not enabled:
        return False
    if not policy.enabled:
        return True
    return jobs.may_be_shorter(age_value, age_unit, policy.age_value, policy.age_unit)


def save_policy(*, user, enabled: bool, age_value: int, age_unit: str, revision: int,
                backup_choice: str | None, new_preparation: bool = False) -> ToolPayloadPolicy:
    """Save the policy (AC-TPR-001.2, 002.1).

    `backup_choice` ("create" | "skip") is required, never inferred, when enabling the first
    time, re-enabling or shortening the period; it may be given on any other save too, and
    then starts the preparation over, unless the save changes nothing: the stored switch,
    period and choice sent again leave the preparation as it is (its backup made, being made,
    failed or cancelled); with `new_preparation` they start it over all the same (Cancel
    after a failed backup). Every save that changes something bumps the revision and marks
    analyses of other settings stale.
    Raises CleanupError forbidden/invalid_age/invalid_backup_choice/backup_choice_required/
    stale_revision/state_unreadable.
    """
    from retention.actions.save_policy import policy_fields, save_tool_payload_policy

    _require_admin(user)
    _check_age(age_value, age_unit)
    if not isinstance(enabled, bool):
        raise CleanupError("invalid_age", _("Choose whether cleanup is on or off."), 400)
    if backup_choice not in (None, *BackupChoice.values):
        raise CleanupError("invalid_backup_choice", _("Choose Create backup or Continue without backup."))
    policy = _load_checked_policy()
    fields = policy_fields(enabled=enabled, age_value=age_value, age_unit=age_unit, backup_choice=None)
    # Changes nothing, whatever revision it was read at (a form sent twice: r23), unless it
    # turns cleanup on without a backup choice: at the revision it read, that may have needed
    # one, which another admin's save made since must not answer for it (r24). The stored
    # choice sent again with the stored switch and period is no new choice (r108: it started
    # the preparation over, so an enabling request sent again once the backup was made, or
    # while it was being made, bumped the revision, dropped that backup and made another at
    # the next run; one sent again after the backup failed cleared the failure and had the
    # daily check retry it, where Retry backup is the admin's to choose).
    same_choice = backup_choice is None or (backup_choice == policy.backup_choice and not new_preparation)
    if same_choice and all(getattr(policy, name) == value for name, value in fields.items()) and (
            revision == policy.revision or backup_choice is not None or not enabled):
        return policy
    if revision != policy.revision:
        # First: whether a choice is needed depends on settings this client has not seen.
        # (The save checks the revision again under its row lock.)
        raise CleanupError("stale_revision", _("Someone else saved these settings meanwhile. Reload to see them."))
    # Turned on (first time or again) or the period shortened: the first run under it starts at
    # the cluster's next pass, after the backup if one was chosen (AC-TPR-002.6; r90: it waited
    # for the daily check, up to a day, with nothing shown as started)
    first_run = _needs_choice(policy, enabled=enabled, age_value=age_value, age_unit=age_unit)
    if backup_choice is None and first_run:
        raise CleanupError(
            "backup_choice_required",
            _("Removal is permanent. Choose Create backup or Continue without backup before saving."),
        )
    try:
        with transaction.atomic():
            saved = save_tool_payload_policy(
                enabled=enabled, age_value=age_value, age_unit=age_unit, revision=revision,
                acting_user=user, backup_choice=backup_choice,
            )
            if saved.revision != revision:  # a save that changed nothing is no save
                ToolPayloadOperation.objects.filter(kind=OperationKind.ANALYSIS, stale=False).exclude(
                    age_value=saved.age_value, age_unit=saved.age_unit
                ).update(stale=True)
                woken = user if first_run and getattr(user, "is_authenticated", False) else None
                ToolPayloadPolicy.objects.filter(id=1, revision=saved.revision).update(
                    woken_by=woken, woken_by_name=woken.get_username() if woken is not None else "")
    except ActionRefused as exc:
        raise CleanupError(exc.code, exc.message, exc.status) from None
    jobs.wake_schedule(now_due=first_run)
    return saved


# ---- Starting and stopping operations -------------------------------------------------------


def _create_operation(*, started_by, started_by_name: str = "", **fields) -> ToolPayloadOperation:
    """Insert an operation holding the slot, or raise busy (the database decides). Its
    starter's name is kept with it: a user deleted later is still named (None: the schedule,
    unless `started_by_name` names a starter deleted before it was made)."""
    name = started_by.get_username() if started_by is not None else started_by_name
    try:
        with transaction.atomic():
            op = ToolPayloadOperation.objects.create(started_by=started_by, started_by_name=name, **fields)
            jobs.enqueue(op.pk)
    except IntegrityError:
        raise _busy() from None
    return op


def start_analysis(*, user, age_value: int, age_unit: str) -> int:
    """Queue an analysis of the given (draft) period; it changes no row. Returns its id."""
    _require_admin(user)
    _check_age(age_value, age_unit)
    policy = _load_checked_policy()
    op = _create_operation(
        kind=OperationKind.ANALYSIS, started_by=user, age_value=age_value, age_unit=age_unit,
        policy_revision=policy.revision,
    )
    jobs.wake_schedule()
    return op.pk


def _start_cleanup_or_preparation(*, user, policy: ToolPayloadPolicy, user_name: str = "") -> ToolPayloadOperation:
    """Cleanup if the preparation is ready, else the backup first (cleanup follows it)."""
    common = {
        "started_by": user, "started_by_name": user_name, "policy_revision": policy.revision,
        "age_value": policy.age_value, "age_unit": policy.age_unit,
    }
    if policy.preparation_state == PreparationState.READY:
        return _create_operation(kind=OperationKind.CLEANUP, **common)
    if policy.backup_choice == BackupChoice.SKIP:
        return _create_operation(kind=OperationKind.CLEANUP, **common)
    if policy.backup_choice == BackupChoice.CREATE and policy.preparation_state == PreparationState.NONE:
        with transaction.atomic():
            op = _create_operation(kind=OperationKind.BACKUP, then_cleanup=True, **common)
            _mark_preparing(policy, PreparationState.NONE)
        return op
    if policy.backup_choice == BackupChoice.CREATE and policy.preparation_state == PreparationState.PREPARING:
        # Another operation is under way (r70: "Retry the backup" was said of a backup being made,
        # which refuses a retry, and `run --here` did not take over a backup left with no worker).
        raise CleanupError("busy", _("The backup is being made; the cleanup follows it once it is verified."))
    raise CleanupError(
        "preparation_required",
        _("Cleanup waits for the backup. Retry the backup, or change the backup choice."),
    )


def _mark_preparing(policy: ToolPayloadPolicy, *states: str) -> None:
    """Mark the backup as being made, only if the policy is still the one read (its revision,
    the choice to create one, a preparation state of `states`): a save that committed since
    (Continue without backup, say) would otherwise be left showing a backup that no job
    finishes. Raised inside the caller's transaction, stale_revision undoes the operation
    queued with it."""
    if not ToolPayloadPolicy.objects.filter(
        id=1, revision=policy.revision, backup_choice=BackupChoice.CREATE, preparation_state__in=states
    ).update(preparation_state=PreparationState.PREPARING, preparation_error=""):
        raise CleanupError("stale_revision", _("The settings changed meanwhile. Reload to see them."))


def start_run(*, user, revision: int) -> int:
    """Run cleanup now under the saved, enabled policy at `revision` (AC-TPR-002.6).

    When the saved choice is "create" and no verified backup exists yet, the backup runs
    first and cleanup follows it; the id returned is the first operation queued.
    """
    _require_admin(user)
    policy = _load_checked_policy()
    if not isinstance(revision, int) or revision != policy.revision:
        raise CleanupError("stale_revision", _("The settings changed meanwhile. Reload to see them."))
    if not policy.enabled:
        raise CleanupError("not_enabled", _("Turn cleanup on and save before running it."))
    op = _start_cleanup_or_preparation(user=user, policy=policy)
    # The save's first run is this one: the check the save made due is the schedule's again.
    ToolPayloadPolicy.objects.filter(id=1, revision=policy.revision).exclude(woken_by_name="").update(
        woken_by=None, woken_by_name="")
    jobs.wake_schedule()
    return op.pk


def retry_preparation(*, user, revision: int | None = None) -> int:
    """Start the backup again after it failed or was cancelled; cleanup follows it.

    `revision`: the policy's revision the page offering Retry showed. A save since (another
    admin's Cancel turns cleanup off) refuses it, as cancel_preparation refuses once a Retry
    came first (r134: a Retry from a page left open undid the Cancel's intent and made a full
    backup nobody then wanted, which every later delete names as holding its conversation)."""
    _require_admin(user)
    policy = _load_checked_policy()
    if revision is not None and policy.revision != revision:
        raise CleanupError("preparation_changed",
                           _("The backup preparation was cancelled or the settings were saved meanwhile, so no "
                             "backup was started. Reload to see where cleanup stands."))
    if policy.backup_choice == BackupChoice.CREATE and policy.preparation_state == PreparationState.PREPARING:
        raise CleanupError("busy", _("The backup is being made already."))
    retryable = (PreparationState.FAILED, PreparationState.CANCELLED, PreparationState.NONE)
    if policy.backup_choice != BackupChoice.CREATE or policy.preparation_state not in retryable:
        raise CleanupError("nothing_to_retry", _("There is no backup to retry."))
    with transaction.atomic():
        op = _create_operation(
            kind=OperationKind.BACKUP, then_cleanup=policy.enabled, started_by=user,
            policy_revision=policy.revision, age_value=policy.age_value, age_unit=policy.age_unit,
        )
        _mark_preparing(policy, *retryable)
    return op.pk


def cancel_preparation(*, user, revision: int) -> ToolPayloadPolicy:
    """Cancel after a failed or cancelled backup: cleanup is turned off at the saved settings
    (a policy save, which also resets the preparation); nothing was removed. Refused while a
    backup is being made (another admin's Retry since this page was shown): turning cleanup
    off then left that backup running with nothing on the page to show or stop it; it has
    its own Cancel."""
    _require_admin(user)
    with transaction.atomic():
        policy = ToolPayloadPolicy.objects.select_for_update().filter(id=1).first()
        state = policy.preparation_state if policy else PreparationState.NONE
        if state == PreparationState.PREPARING:
            raise CleanupError("preparation_changed",
                               _("The backup was started again meanwhile. Reload to see it; it can be cancelled there."))
        if state not in (PreparationState.FAILED, PreparationState.CANCELLED):
            if policy is None or not policy.enabled:
                # Cancelled already (the form sent twice, r23): cleanup is off and nothing was
                # removed, as this cancel asks.
                return policy or ToolPayloadPolicy.load()
            raise CleanupError("preparation_changed",
                               _("No failed backup waits to be cancelled any more: it was retried, or the "
                                 "settings were saved, meanwhile. Reload to see where cleanup stands."))
        # A new preparation even when cleanup is off already (a Retry while it was off that
        # failed): the stored choice sent again would otherwise change nothing (r108).
        return save_policy(user=user, enabled=False, age_value=policy.age_value, age_unit=policy.age_unit,
                           revision=revision, backup_choice=policy.backup_choice or BackupChoice.CREATE,
                           new_preparation=True)


def cancel(*, user, operation_id: int) -> None:
    """Ask a queued or running operation to stop after its current batch.

    Committed batches stay; the job records the operation as cancelled (or partial) when it
    sees the request. Raises not_found for an unknown id, not_cancellable when it finished.
    """
    _require_admin(user)
    if not isinstance(operation_id, int) or isinstance(operation_id, bool):
        raise CleanupError("not_found", _("No such operation."))
    with transaction.atomic():
        op = ToolPayloadOperation.objects.select_for_update().filter(pk=operation_id).first()
        if op is None:
            raise CleanupError("not_found", _("No such operation."))
        if op.state not in OPEN_STATES:
            # Cancel on the failed backup the preparation waits on (the newest backup, failed):
            # stop offering Retry; cleanup stays blocked until the admin saves a new backup
            # choice. Any other finished operation, an older backup's included, changes nothing.
            newest_backup = ToolPayloadOperation.objects.filter(kind=OperationKind.BACKUP).order_by("-pk").first()
            if (op.kind == OperationKind.BACKUP and op.state == OperationState.FAILED and newest_backup == op
                    and ToolPayloadPolicy.objects.filter(id=1, preparation_state=PreparationState.FAILED).update(
                        preparation_state=PreparationState.CANCELLED)):
                return
            raise CleanupError("not_cancellable", _("This operation has already finished."))
        if op.kind == OperationKind.COMPACT and op.state == OperationState.RUNNING:
            # VACUUM cannot stop half-way; its run honours only a cancel that came before it
            # started (r72: a cancel here was 202 and the compaction went on; one that took over
            # after a kill would have said "cancelled before the database was compacted").
            raise CleanupError("not_cancellable", _("Compact database cannot be stopped once it has started; it "
                                                    "runs to its end."))
        op.cancel_requested = True
        op.save(update_fields=["cancel_requested"])
    jobs.enqueue_soon(operation_id)


def start_compact(*, user) -> int:
    """Queue Compact database (VACUUM) with before and after sizes."""
    _require_admin(user)
    _load_checked_policy()
    op = _create_operation(kind=OperationKind.COMPACT, started_by=user)
    return op.pk


def format_when(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
