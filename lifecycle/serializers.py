"""JSON shapes of the engine API: one function per resource, and the schema it answers with.

The `*Out` models are the published schema (OpenAPI); tests check every answer against them.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from django.db.models import Prefetch, QuerySet
from pydantic import Field, JsonValue

from console.api import Schema
from lifecycle.models import (
    INTENT_STATES,
    Conversation,
    DeleteOperation,
    DeleteState,
    DeleteStep,
    Item,
    RetainedFactsPolicy,
)


def iso(value) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


_UTC_OFFSET_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")


def utc_times(value: Any) -> Any:
    """A stored document's UTC times as every time the API gives (Z): receipts written before
    r75 keep "+00:00" in the database (r77: they were served so)."""
    if isinstance(value, dict):
        return {k: utc_times(v) for k, v in value.items()}
    if isinstance(value, list):
        return [utc_times(v) for v in value]
    if isinstance(value, str) and _UTC_OFFSET_TIME.fullmatch(value):
        return value[:-6] + "Z"
    return value


class OwnerOut(Schema):
    kind: Literal["account", "computer"]
    id: int


class ThreadOwnerOut(OwnerOut):
    name: str = Field(description="The account's or computer's name, as the screens show it.")


class ThreadOut(Schema):
    id: str
    thread_id: str
    owner: ThreadOwnerOut
    scope: Literal["bound", "local"]
    title: str = Field(description="Empty from the conversation's delete intent on: the title is content, "
                                   "erased with the rest.")
    archived: bool
    closed: bool
    active: bool
    last_activity_at: str
    created_at: str
    state: Literal["live", "pending_delete", "deleted"]
    delete: str | None = Field(description="From its delete intent on: that delete operation's id "
                                           "(GET /v1/operations/{id}: its progress, or its erasure receipt).")
    deleted_at: str | None = Field(description="When that delete completed.")


class ThreadPageOut(Schema):
    results: list[ThreadOut]
    next: str | None
    as_of: str = Field(description="The snapshot moment the pages are listed against.")
    changed_since_start: int = Field(
        ge=0, description="Matching conversations with activity after `as_of`, or that came into the view "
                          "after it, which these pages leave out."
    )


def owner_json(c: Conversation) -> dict[str, Any]:
    """A conversation's owner as the API names it (r72: with its name, as the screens say it)."""
    return {"kind": c.owner_kind, "id": c.owner_id, "name": c.owner.name}


def thread_json(c: Conversation) -> dict[str, Any]:
    return {
        "id": c.public_id,
        "thread_id": c.thread_id,
        "owner": owner_json(c),
        "scope": c.scope,
        "title": c.shown_title,
        "archived": c.archived_at is not None,
        "closed": c.closed_at is not None,
        "active": bool(getattr(c, "is_active", False)),
        "last_activity_at": iso(c.last_activity_at),
        "created_at": iso(c.created_at),
        "state": c.state,
        **_delete_of(c),
    }


def _delete_of(c: Conversation) -> dict[str, Any]:
    """The conversation's delete intent, as the list's Erasure receipt link gives it: read from
    `with_delete_operation()` when the rows were read with it, else asked for (a live
    conversation has none)."""
    if c.state == "live":
        return {"delete": None, "deleted_at": None}
    if not hasattr(c, "delete_op"):
        c.delete_op, c.deleted_at = DeleteOperation.objects.filter(
            conversation=c, state__in=INTENT_STATES).values_list(
            "public_id", "completed_at").first() or (None, None)
    return {"delete": c.delete_op, "deleted_at": iso(c.deleted_at)}


Payload = dict[str, JsonValue] | list[JsonValue] | str | int | float | None


class ItemOut(Schema):
    id: int
    seq: int
    role: Literal["user", "assistant", "tool"]
    tool_kind: str | None
    tool_call_id: str | None
    status: str | None
    title: str
    content: str
    payload: Payload
    payload_bytes: int
    revision: int
    created_at: str
    updated_at: str


class ItemPageOut(Schema):
    results: list[ItemOut]
    # (r108: the only `next` that is not a `cursor`, and nothing said so)
    next: str | None = Field(description=(
        "Pass it as `after` for the next page (it is the last item's `seq`); null on the last page. "
        "A page ends at `limit` items or at API_MAX_PAGE_BYTES of stored text and payload, whichever "
        "comes first."))


def item_json(i: Item) -> dict[str, Any]:
    return {
        "id": i.pk,
        "seq": i.seq,
        "role": i.role,
        "tool_kind": i.tool_kind or None,
        "tool_call_id": i.tool_call_id or None,
        "status": i.status or None,
        "title": i.title,
        "content": i.content,
        "payload": i.payload,
        "payload_bytes": i.payload_bytes,
        "revision": i.revision,
        "created_at": iso(i.created_at),
        "updated_at": iso(i.updated_at),
    }


StoreClass = Literal["erase", "compact", "retain_detach", "shared", "retain", "retain_facts", "out_of_scope"]
OperationState = Literal["pending", "completed", "refused", "unavailable"]


class StepOut(Schema):
    store: str
    state: Literal["pending", "measured", "done"]
    records: int
    bytes: int


class ReceiptStoreOut(Schema):
    store: str
    klass: StoreClass = Field(alias="class")
    action: Literal["erased", "compacted", "detached", "revoked", "kept", "expired", "out_of_scope"]
    records: int | None = None
    bytes: int | None = None
    expired_at: str | None = Field(default=None, description="Kept facts: when they were removed (their retention "
                                                             "period ran out, or `after_check`).")
    after_check: bool | None = Field(default=None, description="Removed before their period ran out, once a clean "
                                                               "physical check of the erasure was recorded (the "
                                                               "check's own fingerprints).")
    days: int | None = Field(default=None, description="Kept facts that expire: their retention period, in days from "
                                                       "the delete's completion: the one in force now while they "
                                                       "are kept, the one that applied once they expired.")
    remaining: int | None = Field(default=None, description="Shared copies whose publisher cannot revoke them.")


class HolderOut(Schema):
    """Something that still holds the erased bytes, and what ends that."""

    kind: Literal["backup", "backup_folder", "database_files", "wal", "wal_archive", "server_wal", "statistics"]
    name: str | None = None
    made_at: str | None = None


class RemovedBackupOut(Schema):
    """A backup the receipt named at completion that is no longer in the backup folder."""

    name: str | None = None
    made_at: str | None = None
    removed_at: str | None = Field(default=None, description="When manage.py verify_erasure first found it gone; "
                                                             "null until a check has.")


class PhysicalOut(Schema):
    state: Literal["pending", "erased"] | None
    erased_at: str | None


class PhysicalFilesOut(Schema):
    """Files whose raw bytes held the conversation's content, by what removes them."""

    erasable: int = Field(description="Its own files (its folders, a fleet file's leftover temporary naming it), "
                                      "which `verify_erasure --erase-residue` removes.")
    engine_folder: int = Field(description="Other files in the engine folder, which an operator must remove.")
    database: int = Field(description="The database file or its write-ahead log (SQLite), rewritten by Compact "
                                      "database.")


class UnscannedOut(Schema):
    at: str
    reason: Literal["no_fingerprints", "no_samples"] = Field(
        description="no_fingerprints: dropped after a clean raw-byte check and a week after the delete; "
                    "no_samples: nothing was sampled (SQLite: no stored value was long enough; PostgreSQL, which "
                    "samples no table value: no engine file of the conversation).")


class VerificationOut(Schema):
    at: str = Field(description="When the last check ran.")
    logical: Literal["clean", "found"]
    logical_findings: int | None = None
    physical: Literal["clean", "found", "pending", "not_checked", "no_fingerprints", "no_samples"] = Field(
        description="The last check that scanned raw bytes (clean, found, pending); a later check that did "
                    "not scan them keeps it. The other values: no check has scanned them.")
    physical_at: str | None = Field(default=None, description="When that raw-byte result was found.")
    physical_files: PhysicalFilesOut | None = None
    unscanned: UnscannedOut | None = Field(
        default=None, description="A later raw-byte check that could scan nothing, and why.")
    findings: int


class ReceiptOut(Schema):
    engine: Literal["sqlite", "postgresql"]
    stores: list[ReceiptStoreOut]
    kept: list[ReceiptStoreOut]
    holders: list[HolderOut] = Field(description="What still holds the erased bytes now: the backups named are "
                                                 "read again from the backup folder when the receipt is read.")
    removed_backups: list[RemovedBackupOut] = Field(
        default_factory=list, description="Backups the receipt named at completion that have been removed from the "
                                          "backup folder since. Lethe sees only that folder: a copy moved elsewhere still holds the "
                                          "content.")
    physical: PhysicalOut
    verified_at: str | None
    verified_physical_at: str | None
    verification: VerificationOut | None = None


class AmbiguousRowOut(Schema):
    agent_id: str = Field(description="As a runtime wrote it in the fleet file: 1 to 256 characters, no NUL or lone "
                                     "surrogate. A row whose id is not such text is not listed: it makes the delete "
                                     "`conversation_child_state_unreadable` (repair the file).")
    status: str | None = Field(description="As the fleet file has it; null when it is not text.")
    started_at: str | None = Field(description="A time (UTC, as every time here) when the file has one; other "
                                               "text as written; null when it is not text.")
    finished_at: str | None = Field(description="As started_at.")


class WayOutOut(Schema):
    ambiguous: list[AmbiguousRowOut] = Field(
        description="Subagent rows of unknown origin overlapping the conversation: attribute or clear each "
                    "(POST /v1/subagents/{agent_id}/resolve), then ask again with a new key.")


class OperationOut(Schema):
    id: str
    kind: Literal["delete"]
    target: str
    state: OperationState
    outcome: OperationState
    code: str | None = Field(description="Why it was refused or is unavailable.")
    message: str | None
    reasons: list[str] = Field(description="Every cause found, one code each; `code` is the first.")
    step: str | None = Field(description="The store being erased while pending.")
    steps: list[StepOut]
    attempts: int
    error: str | None = Field(description="What stopped the last run, while pending.")
    error_message: str | None
    stalled: bool = Field(description="Pending and no longer retried by itself: its last runs stopped without "
                                       "progress (`error` says on what). POST /v1/operations/{id}/retry starts "
                                       "it again.")
    # (r108: a client polling a pending delete could not tell when it is tried again, as a
    # bound delete's answer says)
    next_attempt_at: str | None = Field(default=None, description=(
        "While pending and retried by itself: the earliest time its next run may start (a run may be "
        "under way). Null otherwise."))
    requested_at: str
    completed_at: str | None
    receipt: ReceiptOut | None
    way_out: WayOutOut | None


class OperationPageOut(Schema):
    results: list[OperationOut]
    next: str | None = Field(description="Older operations: pass it as `cursor`; null on the last page.")
    previous: str | None = Field(description="Newer operations: pass it as `cursor`; null on the first page.")


class PreviewStoreOut(Schema):
    store: str
    kind: Literal["table", "file", "external"]
    klass: StoreClass = Field(alias="class")
    records: int | None = None
    bytes: int | None = None
    remaining: int | None = None
    days: int | None = Field(default=None, description="Retained facts: the days they are kept after the delete, "
                                                       "then expired.")


class ReasonOut(Schema):
    code: str
    outcome: Literal["refused", "unavailable"]
    message: str


class AdmissionOut(Schema):
    outcome: Literal["admitted", "refused", "unavailable"]
    code: str | None
    reasons: list[ReasonOut]
    ambiguous: list[AmbiguousRowOut]


class PreviewOut(Schema):
    target: str
    state: Literal["live", "pending_delete", "deleted"]
    admission: AdmissionOut | None = Field(description="None once a delete is under way.")
    stores: list[PreviewStoreOut]
    shared_copy_remains: int
    backups: list[HolderOut] = Field(
        default_factory=list,
        description="Backups in the backup folder that hold the conversation now (`backup`), or a folder that "
                    "cannot be read (`backup_folder`): a delete leaves them as they are, and restoring one brings "
                    "the conversation back. Empty once a delete is under way.")


class OperationReads:
    """What the operations of one list share, read at most once for them all: the retained-facts
    policy and the fleet files' rows (a large fleet takes long to parse)."""

    def __init__(self) -> None:
        self._policy: RetainedFactsPolicy | None = None
        self._rows: list[dict[str, Any]] | None = None
        self._backups: tuple[frozenset[str] | None] | None = None

    def policy(self) -> RetainedFactsPolicy:
        if self._policy is None:
            self._policy = RetainedFactsPolicy.load()
        return self._policy

    def backups_present(self) -> frozenset[str] | None:
        """The backup folder's names now (None: it cannot be told), read once for the list."""
        from retention.backups import names_in_folder

        if self._backups is None:
            self._backups = (names_in_folder(),)
        return self._backups[0]

    def fleet_rows(self) -> list[dict[str, Any]]:
        """Both fleet files' rows; none when one cannot be read (no way out is offered then)."""
        from lifecycle import fleet
        from lifecycle.enginefs import EngineHome

        if self._rows is None:
            try:
                self._rows = [row for _path, row in fleet.all_rows(EngineHome(), cached=True)]
            except fleet.FleetUnreadable:
                self._rows = []
        return self._rows


def with_steps(operations: QuerySet[DeleteOperation]) -> QuerySet[DeleteOperation]:
    """Operations with their conversations and steps read in a constant number of queries."""
    return operations.select_related("conversation").prefetch_related(
        Prefetch("steps", queryset=DeleteStep.objects.order_by("position")))


def operation_json(op: DeleteOperation, reads: OperationReads | None = None) -> dict[str, Any]:
    """A delete operation: state, step, attempts, receipt. Content-free, like the operation.

    A list passes one `reads` for all its operations and reads them `with_steps`."""
    from lifecycle import fleet
    from lifecycle.deletion import reasons
    from lifecycle.deletion.errors import error_message
    from lifecycle.deletion.executor import OPERATOR_FIRST, stalled, with_current_periods
    from lifecycle.deletion.physical import holders_now

    reads = reads or OperationReads()
    steps = [
        {"store": s.key, "state": s.state, "records": s.records, "bytes": s.bytes}
        for s in sorted(op.steps.all(), key=lambda s: s.position)
    ] if op.is_intent else []
    receipt = None
    if op.state == DeleteState.COMPLETED:
        stored = (op.receipt or {}).get("holders", [])
        # The backups it named as they are now: one removed since no longer holds the content
        named = any(isinstance(h, dict) and h.get("kind") == "backup" for h in stored or [])
        holders, removed = holders_now(stored, reads.backups_present() if named else None)
        receipt = utc_times({
            **(op.receipt or {}),
            "holders": holders,
            "removed_backups": removed,
            "kept": with_current_periods((op.receipt or {}).get("kept", []), reads.policy),
            "physical": {"state": op.physical_state or None, "erased_at": iso(op.physically_erased_at)},
            "verified_at": iso(op.verified_at),
            "verified_physical_at": iso(op.verified_physical_at),
        })
    way_out = None
    # Also when it was refused for another reason besides: asked again later, it would need it.
    if reasons.CHILD_AMBIGUOUS in {op.reason, *(op.reasons or [])}:
        conversation = op.conversation
        rows = reads.fleet_rows() if conversation.state == "live" else []
        # The rows that can be named, as the preview lists them: one whose id cannot (a lone
        # surrogate) made every page of the operation fail (r123), and no form could resolve it
        way_out = {"ambiguous": fleet.way_out(rows, conversation)[0]}
    return {
        "id": op.public_id,
        "kind": "delete",
        "target": op.conversation.public_id,
        "state": op.state,
        "outcome": op.state,
        "code": op.reason or None,
        "message": reasons.message(op.reason) or None,
        "reasons": list(op.reasons or []),
        "step": op.step or None,
        "steps": steps,
        "attempts": op.attempts,
        # Stalled by runs that died after an error that is retried (its words say so): what
        # stopped the delete is those runs, said as "stalled" (r120: the page said both "is
        # retried" and "no longer retried by itself")
        "error": (shown_error := "stalled" if (is_stalled := stalled(op)) and op.last_error
                  and op.last_error not in OPERATOR_FIRST else op.last_error) or None,
        "error_message": error_message(shown_error) or None,
        "stalled": is_stalled,
        "next_attempt_at": iso(op.next_attempt_at) if op.state == DeleteState.PENDING and not is_stalled else None,
        "requested_at": iso(op.requested_at),
        "completed_at": iso(op.completed_at),
        "receipt": receipt,
        "way_out": way_out,
    }
