"""Admission: may this conversation be deleted now? Read-only; the caller holds the row lock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lifecycle import engine_folder, fleet
from lifecycle.deletion import reasons as r
from lifecycle.enginefs import EngineHome, UnsafeEnginePath
from lifecycle.errors import engine_folder_code
from lifecycle.models import (
    ACTIVE_TURN_STATES,
    ClaimKind,
    Conversation,
    DeleteState,
    RuntimeClaim,
    SubagentResolution,
    Turn,
)

CLAIM_REASONS = (
    ((ClaimKind.APPROVAL,), r.APPROVAL_PENDING),
    ((ClaimKind.USER_INPUT,), r.INPUT_PENDING),
    ((ClaimKind.DYNAMIC_TOOL,), r.DYNAMIC_TOOL_PENDING),
    ((ClaimKind.SHELL_JOB,), r.SHELL_JOB_LIVE),
    ((ClaimKind.TASK, ClaimKind.AUTOMATION), r.OWNERSHIP_UNRESOLVED),
)


@dataclass
class Admission:
    reasons: list[str] = field(default_factory=list)
    ambiguous: list[dict[str, Any]] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        """"admitted", or the state a not-admitted request is recorded in."""
        if not self.reasons:
            return "admitted"
        if any(r.outcome(code) == DeleteState.REFUSED for code in self.reasons):
            return DeleteState.REFUSED
        return DeleteState.UNAVAILABLE

    @property
    def code(self) -> str:
        """The recorded code: the first refusal, else the first reason."""
        refusals = [c for c in self.reasons if r.outcome(c) == DeleteState.REFUSED]
        return (refusals or self.reasons or [""])[0]


def admit(conversation: Conversation, home: EngineHome | None = None, *, cached: bool = False) -> Admission:
    """Why a delete could not start now. `cached` (a preview): the fleet's last parse is reused
    when the files did not change."""
    admission = Admission()
    if Turn.objects.filter(conversation=conversation, state__in=ACTIVE_TURN_STATES).exists():
        admission.reasons.append(r.TURN_ACTIVE)
    open_kinds = set(RuntimeClaim.objects.open().filter(conversation=conversation).values_list("kind", flat=True))
    for kinds, code in CLAIM_REASONS:
        if open_kinds & set(kinds):
            admission.reasons.append(code)
    try:
        home = engine_folder.check(home or EngineHome())
        if cached:
            # A preview takes no lock; the request will (lifecycle.actions.request_deletion), and
            # on a read-only disk it cannot: the preview says so rather than "can be deleted".
            fleet.check_locks_writable(home)
    except engine_folder.EngineFolderUnavailable:  # its subagent rows cannot be read: not "none"
        admission.reasons.append(r.ENGINE_FOLDER_UNAVAILABLE)
        return admission
    except UnsafeEnginePath:  # a link or a FIFO where a fleet lock belongs (as the request says)
        admission.reasons.append(r.ENGINE_FOLDER_NOT_WRITABLE)
        return admission
    except OSError as error:  # a first use writes the folder's mark: a read-only or full folder
        admission.reasons.append(engine_folder_code(error))
        return admission
    if SubagentResolution.objects.exists():  # (the request settles what it can first)
        admission.reasons.append(r.RESOLUTION_PENDING)
    try:
        rows = [row for _path, row in fleet.all_rows(home, cached=cached)]
    except fleet.FleetUnreadable:
        admission.reasons.append(r.CHILD_STATE_UNREADABLE)
        return admission
    if any(fleet.is_unsettled(row) for row in fleet.children(rows, conversation)):
        admission.reasons.append(r.CHILD_CUSTODY)
    admission.ambiguous, unnamable = fleet.way_out(rows, conversation)
    if admission.ambiguous:
        admission.reasons.append(r.CHILD_AMBIGUOUS)
    if unnamable:  # no way to name such a row: the file needs repair, as an unreadable one does
        admission.reasons.append(r.CHILD_STATE_UNREADABLE)
    try:
        # records of the conversation beside the files' rows, written by another runtime
        unknown = any(fleet.named_outside_rows(path, conversation.public_id, cached=cached)
                      for path in fleet.fleet_files(home))
    except fleet.FleetUnreadable:
        admission.reasons.append(r.CHILD_STATE_UNREADABLE)
        return admission
    if unknown:
        admission.reasons.append(r.CHILD_RECORDS_UNKNOWN)
    return admission
