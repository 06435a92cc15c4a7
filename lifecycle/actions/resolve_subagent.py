from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.utils.translation import gettext as _

from lifecycle import audit, faults, fleet
from lifecycle.enginefs import EngineHome, UnsafeEnginePath
from lifecycle.errors import (
    ENGINE_FOLDER_FULL,
    ENGINE_FOLDER_NOT_WRITABLE,
    ENGINE_FOLDER_READ_ONLY,
    ActionRefused,
    engine_folder_refusal,
)
from lifecycle.fence import check_writable, lock_writable
from lifecycle.models import AuditFact, Conversation, SubagentResolution
from retention.errors import os_reason

log = logging.getLogger(__name__)
ACTIONS = ("attribute", "clear")
# Where a crash test kills a resolution: the fleet files changed, the audit fact not committed.
FILES_CHANGED = "subagent-files-changed"
ABSENT, DONE, CHANGE = "absent", "done", "change"
# Resolutions of the same row a request waits for in turn before it answers busy (each begun
# after the one before ended: more than two in a row is a loop, not a double press).
ROUNDS = 3
FACTS = {"attribute": "subagent.attributed", "clear": "subagent.cleared"}
# Refusals a settle keeps its resolution for (the engine folder may be readable or writable later).
KEPT_FOR_LATER = {"fleet_unreadable", ENGINE_FOLDER_READ_ONLY, ENGINE_FOLDER_FULL, ENGINE_FOLDER_NOT_WRITABLE}


def resolve_subagent(agent_id: str, *, action: str, conversation: Conversation | None = None,
                     acting_user, home: EngineHome | None = None) -> None:
    """The way out of an ambiguous delete: attribute a subagent row of unknown origin to a
    conversation, or clear the row, in the fleet file and its legacy copy. Audited (agent
    id and origin only). Rows that already name a conversation are not touched here.

    A retry of a resolution already made (a client that lost the first answer) does nothing
    and answers as the first did: the row attributed here to that very conversation, or a
    cleared row gone while its audit fact is kept.

    The files cannot change in the database's transaction, so the resolution is first written
    down (a SubagentResolution row, committed), then the files change and its audit fact is
    recorded in the commit that removes that row. A process killed between the two leaves the
    row: the retry (here, first thing) and the every-minute recovery finish the resolution from
    it and record its fact, so no change of the files goes unrecorded."""
    if action not in ACTIONS:
        raise ActionRefused("invalid_action", _("Choose attribute or clear."), status=400)
    if action == "attribute" and conversation is None:
        raise ActionRefused("missing_conversation", _("Name the conversation to attribute the row to."), status=400)
    if not fleet.namable_id(agent_id):  # (a NUL cannot be looked up in jsonb)
        raise unnamable_refusal()
    home = home or EngineHome()
    for _round in range(ROUNDS):
        # A resolution of this row cut short is finished first (a refusal of the files' is this
        # one's); the same resolution under way in another request (a double press, a retry racing
        # the request whose answer was lost) is waited for, and this one then answers as its retry.
        for pending in SubagentResolution.objects.filter(agent_id=agent_id):
            _carry_out(pending.pk, home, settling=True, wait=_same(pending, action, conversation))
        with transaction.atomic():
            target = lock_writable(conversation) if action == "attribute" else None
            under_way = SubagentResolution.objects.filter(agent_id=agent_id).first()
            if under_way is not None:
                if not _same(under_way, action, target):
                    raise _busy()  # passed over above: another resolution, locked by its request (PostgreSQL)
                continue  # the same one, begun since: waited for in the next round
            if _answered(_state(_rows(home), agent_id, action, target), agent_id, action):
                return
            try:
                with transaction.atomic():
                    intent = SubagentResolution.objects.create(
                        agent_id=agent_id, action=action, actor=acting_user,
                        conversation_public_id=target.public_id if target else "")
            except IntegrityError:  # another request resolves this row right now (its own row)
                continue  # the next round waits for it if it is this same resolution, else refuses
        break
    else:
        raise _busy()
    if not _carry_out(intent.pk, home, settling=False):
        # Settled between the two commits by recovery or a delete's admission (which may have
        # erased the row since, the conversation's delete admitted on it): done when its fact
        # is on record; else it was dropped, and a retry gets the reason.
        facts = AuditFact.objects.filter(action=FACTS[action], new_value__agent_id=agent_id)
        if not (facts.filter(conversation=target) if target else facts).exists():
            raise _busy()


def _same(resolution: SubagentResolution, action: str, conversation: Conversation | None) -> bool:
    """Whether a resolution under way is this very request's: the same action (an attribution
    to the same conversation)."""
    return resolution.action == action and (
        action == "clear" or (conversation is not None and resolution.conversation_public_id == conversation.public_id))


def _busy() -> ActionRefused:
    return ActionRefused("busy", _("Another resolution of this subagent row is under way. Try again in a moment."),
                         status=409)


def unnamable_refusal() -> ActionRefused:
    """The answer to an id that no row can be named by (empty, too long, a NUL or a lone
    surrogate): unknown, before any lookup. A row whose id is such one makes the delete preview
    ask for the state file's repair, so the answer points there too."""
    return ActionRefused("not_found", _(
        "No subagent row can be named by that id: an id has 1 to %(max)d characters and no NUL. A row whose "
        "id is not one makes the subagent state file need repair; repair or restore it.")
        % {"max": fleet.AGENT_ID_MAX}, status=404)


def settle_resolutions(home: EngineHome | None = None) -> int:
    """Finish the resolutions a killed process left (every minute, and before a delete is
    admitted), every one of them, a page at a time. One under way in a live request is locked by
    it and passed over (PostgreSQL); SQLite's one write lock keeps its transaction and this one
    apart. Returns how many ended."""
    settled, after = 0, 0
    while pks := list(SubagentResolution.objects.filter(pk__gt=after).order_by("pk")
                      .values_list("pk", flat=True)[:100]):
        home = home or EngineHome()
        for pk in pks:
            try:
                settled += int(_carry_out(pk, home, settling=True))
            except ActionRefused as refusal:  # the files cannot be read or written now: next time
                log.warning("subagent resolution %s not settled: %s", pk, refusal.code)
            except Exception:  # one that cannot be settled keeps none of the others waiting
                log.exception("subagent resolution %s not settled", pk)
        after = pks[-1]
    return settled


def _carry_out(pk: int, home: EngineHome, *, settling: bool, wait: bool = False) -> bool:
    """Change the files as the written-down resolution says and record its fact, in the commit
    that removes it. False when it is gone (settled by another) or, settling, locked by the
    request making it, unless `wait`: then its lock is waited for (as any row lock: on the web
    server at most DB_LOCK_WAIT_SECONDS, then 503 database_busy), and it is gone by then unless
    that request stopped short of finishing it.

    A refusal removes the resolution and is raised (settling: logged), except while the engine
    folder cannot be read or written: then a settle keeps it for later, and so does a request
    whose change was written to one fleet file and not the other (what was written is recorded
    once the rest is). While one is kept no delete is admitted (admission's
    `subagent_resolution_pending`). An attribution whose conversation is being deleted or was
    deleted (written down before this check existed, or by an older version) changes nothing
    more; it is recorded when the files show it was made, in one file or both (or the rows are
    gone with the conversation's delete), else dropped."""
    refusal = None
    with transaction.atomic():
        pending = SubagentResolution.objects.all()
        if settling and not wait:
            pending = pending.select_for_update(skip_locked=True)
        else:
            pending = pending.select_for_update()
        intent = pending.filter(pk=pk).first()
        if intent is None:
            return False
        agent_id, action = intent.agent_id, intent.action
        try:
            target = None
            if action == "attribute":
                target = Conversation.objects.select_for_update().filter(
                    public_id=intent.conversation_public_id).first()
                if target is None:
                    raise ActionRefused("not_found", _("Conversation not found."), status=404)
                try:
                    check_writable(target)
                except ActionRefused:
                    found = [row for _path, row in _rows(home) if row.get("agent_id") == agent_id]
                    if found and not any(_attributed_to(row, target) for row in found):
                        raise  # never made: nothing to record
                else:
                    state = _state(_rows(home), agent_id, action, target)
                    if state == ABSENT:  # the row went away meanwhile
                        raise ActionRefused("not_found", _("No subagent row has that id."), status=404)
                    _change_files(home, agent_id, action, target, keep=not settling)
            elif _state(_rows(home), agent_id, action, target) != ABSENT:  # (none left: cleared before the kill)
                _change_files(home, agent_id, action, target, keep=not settling)
        except ActionRefused as refused:
            if (settling and refused.code in KEPT_FOR_LATER) or getattr(refused, "kept", False):
                raise
            refusal = refused
        else:
            faults.kill_point(FILES_CHANGED)
            audit.record(
                FACTS[action], actor=intent.actor, conversation=target,
                old={"agent_id": agent_id, "origin": None},
                new={"agent_id": agent_id, "origin": target.public_id if target else None,
                     "cleared": action == "clear"},
            )
        intent.delete()
    if refusal is not None:
        if settling:
            log.info("subagent resolution %s dropped: %s", pk, refusal.code)
            return True
        raise refusal
    return True


def _rows(home: EngineHome) -> list:
    try:
        return fleet.all_rows(home)
    except fleet.FleetUnreadable:
        raise _unreadable_refusal() from None
    except UnsafeEnginePath:
        raise _unsafe_refusal() from None


def _unreadable_refusal() -> ActionRefused:
    return ActionRefused("fleet_unreadable", _("The subagent state file cannot be read. Repair or restore it first."))


def _unsafe_refusal() -> ActionRefused:
    # A link, a FIFO or a device where a fleet file or its lock belongs: never followed nor waited on.
    return ActionRefused(ENGINE_FOLDER_NOT_WRITABLE, _(
        "A subagent state file or its lock is not a regular file (a link, for one), so it was not read or "
        "changed. An operator must put it right; then ask again."))


def _state(rows: list, agent_id: str, action: str, target: Conversation | None) -> str:
    """ABSENT: no row has the id (or a clear of it is recorded and no copy of unknown origin is
    left); DONE: none is left and a copy is attributed here to the target; CHANGE: the files are
    to change. Refuses a row that names its conversation itself."""
    found = [row for _path, row in rows if row.get("agent_id") == agent_id]
    if not found:
        return ABSENT
    # Only the copies of unknown origin are the action's: a copy of the same id that names its
    # conversation (in the other file, or twice in one) stays as it is (r156: with one such copy
    # every resolution was refused, and the delete the other copy held back had no way out).
    unknown = [row for row in found if fleet.origin_of(row) is None]
    if unknown:
        return CHANGE
    # A row this action attributed to this very conversation is no obstacle: a retry after a
    # write stopped between the two files (a full disk) finishes the other file's rows.
    if action == "attribute" and any(_attributed_to(row, target) for row in found):
        return DONE
    if action == "clear" and AuditFact.objects.filter(action=FACTS["clear"], new_value__agent_id=agent_id).exists():
        return ABSENT  # cleared before: the retry's answer is the first one's
    raise ActionRefused(
        "subagent_not_ambiguous", _("This subagent row already names its conversation; it is not changed here.")
    )


def _answered(state: str, agent_id: str, action: str) -> bool:
    """Whether the files already answer the request (a retry of one made), raising when no row has
    the id and no clear of it is recorded."""
    if state == ABSENT:
        if action == "clear" and AuditFact.objects.filter(action=FACTS["clear"],
                                                         new_value__agent_id=agent_id).exists():
            return True  # cleared before: the retry's answer is the first one's
        raise ActionRefused("not_found", _("No subagent row has that id."), status=404)
    return state == DONE  # attributed here to this conversation before: nothing to change


def _change_files(home: EngineHome, agent_id: str, action: str, target: Conversation | None, *,
                  keep: bool) -> None:
    """Write the change to each fleet file. A write that fails (a read-only or full engine folder,
    a file or lock that is not a regular file, a file broken meanwhile) is a refusal, never a
    500; once a file was written, the refusal of a request (`keep`) keeps the resolution
    (`kept`), so recovery finishes the rest and records the whole, and says so."""

    def change(rows: list[dict]) -> list[dict]:
        def ours(r: dict) -> bool:  # the id's copies of unknown origin (see _state)
            return r.get("agent_id") == agent_id and fleet.origin_of(r) is None

        if action == "clear":
            return [r for r in rows if not ours(r)]
        return [{**r, "origin": {"conversation": target.public_id, "attributed": True}} if ours(r) else r
                for r in rows]

    written = 0
    try:
        for path in fleet.fleet_files(home):
            if path.exists():
                fleet.update_file(home, path, change)
                written += 1
        return
    except OSError as error:
        refusal = engine_folder_refusal(error)
        partly = _("The engine folder could not be written: %(reason)s. Part of the change was written already: the "
                   "rest is written and recorded by itself once the folder can be written.") % {
                       "reason": os_reason(error)}
    except UnsafeEnginePath:
        refusal = _unsafe_refusal()
        partly = _("A subagent state file or its lock is not a regular file (a link, for one). Part of the change "
                   "was written already: the rest is written and recorded by itself once an operator puts it right.")
    except fleet.FleetUnreadable:
        refusal = _unreadable_refusal()
        partly = _("The subagent state file cannot be read. Part of the change was written already: the rest is "
                   "written and recorded by itself once the file is repaired or restored.")
    if written and keep:  # kept: a refusal that says the rest follows, never to ask again
        refusal = ActionRefused(refusal.code, partly, status=refusal.status)
        refusal.kept = True
    raise refusal


def _attributed_to(row: dict, conversation: Conversation) -> bool:
    """Whether this action attributed the row to the conversation (not a row that named it itself)."""
    origin = row.get("origin")
    return (isinstance(origin, dict) and origin.get("attributed") is True
            and origin.get("conversation") == conversation.public_id)
