"""Why a delete was not admitted: one stable code per cause, its outcome and its words."""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _

from lifecycle.errors import ENGINE_FOLDER_FULL, ENGINE_FOLDER_NOT_WRITABLE, ENGINE_FOLDER_READ_ONLY
from lifecycle.models import DeleteState

TURN_ACTIVE = "conversation_turn_active"
APPROVAL_PENDING = "conversation_approval_pending"
INPUT_PENDING = "conversation_input_pending"
DYNAMIC_TOOL_PENDING = "conversation_dynamic_tool_pending"
SHELL_JOB_LIVE = "conversation_shell_job_live"
OWNERSHIP_UNRESOLVED = "conversation_ownership_unresolved"
CHILD_CUSTODY = "conversation_child_content_custody_unavailable"
CHILD_AMBIGUOUS = "conversation_child_ownership_ambiguous"
CHILD_STATE_UNREADABLE = "conversation_child_state_unreadable"
CHILD_RECORDS_UNKNOWN = "conversation_child_records_unknown"
ENGINE_FOLDER_UNAVAILABLE = "engine_folder_unavailable"
RESOLUTION_PENDING = "subagent_resolution_pending"

# The engine folder's own state, not the conversation's: a confirmation is not told its
# conversation changed when only these stand in the way now (r135, r139).
ENGINE_FOLDER_CODES = frozenset({ENGINE_FOLDER_UNAVAILABLE, ENGINE_FOLDER_READ_ONLY, ENGINE_FOLDER_FULL,
                                 ENGINE_FOLDER_NOT_WRITABLE})


def admission_reasons(preview) -> list:
    """The reason codes of a preview's admission (an engine's answer: taken only in its shape)."""
    admission = preview.get("admission") if isinstance(preview, dict) else None
    listed = admission.get("reasons") if isinstance(admission, dict) else None
    return [r.get("code") if isinstance(r, dict) else r for r in listed] if isinstance(listed, list) else []


def folder_only(codes) -> bool:
    """Whether the reasons a delete is not admitted are all the engine folder's."""
    codes = list(codes or [])
    return bool(codes) and all(code in ENGINE_FOLDER_CODES for code in codes)


# In the order admission checks them; the first that applies is the operation's code.
REASONS = {
    TURN_ACTIVE: (DeleteState.REFUSED, _(
        "A turn is running or queued. Wait for it to finish, or close the conversation first.")),
    APPROVAL_PENDING: (DeleteState.REFUSED, _(
        "An approval is waiting for an answer. Answer it, or close the conversation first.")),
    INPUT_PENDING: (DeleteState.REFUSED, _(
        "The conversation is waiting for input. Answer it, or close the conversation first.")),
    DYNAMIC_TOOL_PENDING: (DeleteState.REFUSED, _(
        "A dynamic tool call is still open. Wait for it, or close the conversation first.")),
    SHELL_JOB_LIVE: (DeleteState.REFUSED, _(
        "A shell job is still running. Wait for it, or close the conversation first.")),
    OWNERSHIP_UNRESOLVED: (DeleteState.REFUSED, _(
        "A task or an automation still owns this conversation. Resolve that ownership first.")),
    CHILD_CUSTODY: (DeleteState.REFUSED, _(
        "A subagent of this conversation is running, queued or has not delivered its result. "
        "Nothing is cancelled for you: wait until it has settled.")),
    CHILD_AMBIGUOUS: (DeleteState.UNAVAILABLE, _(
        "Subagent rows of unknown origin overlap this conversation's lifetime, so what they hold "
        "cannot be attributed. An admin can attribute each row to a conversation or clear it, "
        "then ask again.")),
    # Also a row of unknown origin whose id cannot name it (lifecycle.fleet.namable_id): no form,
    # address or command could attribute or clear it (r123: the words said only "cannot be read",
    # where Data & storage said the files read correctly).
    CHILD_STATE_UNREADABLE: (DeleteState.UNAVAILABLE, _(
        "The subagent state file (state/subagents.v1.json in the engine folder, or its legacy copy "
        "legacy-state/subagents.v1.json) cannot be read, or holds a row of unknown origin whose id cannot "
        "be named (empty, not text, longer than 256 characters, or with a NUL or a lone surrogate), so this "
        "conversation's subagent rows cannot be checked. Repair or restore the file, then ask again.")),
    # Lethe's engine keeps every child record as a row of the file's `agents` list; another
    # entry of the file naming the conversation was written by another runtime, in a form Lethe
    # does not compact (lifecycle.fleet.named_outside_rows; r128: it stayed, the check said clean).
    CHILD_RECORDS_UNKNOWN: (DeleteState.UNAVAILABLE, _(
        "The subagent state file (state/subagents.v1.json in the engine folder, or its legacy copy) names "
        "this conversation outside its subagent rows, in records of a kind Lethe does not know how to "
        "erase (written by another program), so they would stay after a delete. Remove the records that name "
        "this conversation's id from that file (outside its \"agents\" list), then ask again.")),
    ENGINE_FOLDER_UNAVAILABLE: (DeleteState.UNAVAILABLE, _(
        "The engine folder is missing or is not the one this database uses (a disk not mounted, a wrong "
        "ENGINE_HOME, a folder another database uses, or this database is a copy of the one that uses it), "
        "so this conversation's files and subagent rows cannot be checked. Ask again once the folder is "
        "back, or once an operator has made it this database's: manage.py engine_folder says which it is "
        "and what to run.")),
    # The delete takes the subagent state's locks (files in the engine folder) before anything
    # is recorded, and erases files there: a folder it cannot write is no place to start.
    ENGINE_FOLDER_READ_ONLY: (DeleteState.UNAVAILABLE, _(
        "The engine folder is on a read-only disk, and a delete must change files there, so it cannot "
        "start. Ask again once the folder can be written.")),
    ENGINE_FOLDER_FULL: (DeleteState.UNAVAILABLE, _(
        "The engine folder's disk is full, and a delete must change files there, so it cannot start. "
        "Ask again once that disk has free space.")),
    ENGINE_FOLDER_NOT_WRITABLE: (DeleteState.UNAVAILABLE, _(
        "Lethe cannot write in the engine folder (a permission, a file where a folder belongs, an error of "
        "its disk), and a delete must change files there, so it cannot start. Ask again once it can.")),
    # A resolution of a subagent row (attribute or clear) is written down and its files are not
    # all changed yet: under way, or stopped part-way (lifecycle.actions.resolve_subagent). The
    # rows admission would read are not yet what the admin decided, nor on record.
    RESOLUTION_PENDING: (DeleteState.UNAVAILABLE, _(
        "A subagent row is being attributed or cleared, or that stopped part-way and is not finished, so "
        "the subagent rows cannot be checked yet. It finishes by itself (within a minute, or once the "
        "engine folder can be written again); then ask again.")),
}


def outcome(code: str) -> str:
    return REASONS[code][0]


def message(code: str) -> str:
    return str(REASONS[code][1]) if code in REASONS else ""
