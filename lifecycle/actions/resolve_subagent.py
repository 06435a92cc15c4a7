from __future__ import annotations

import contextlib
import json
import logging
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from lifecycle import audit, faults, fleet
from lifecycle.enginefs import EngineHome, UnsafeEnginePath, read_regular
from lifecycle.errors import ActionRefused, engine_folder_refusal
from lifecycle.fence import lock_writable
from lifecycle.models import AuditFact, Conversation

ACTIONS = ("attribute", "clear")
log = logging.getLogger(__name__)


def _intent_path(home: EngineHome):
    """Where a resolution under way is written before the subagent files change, and removed
    once its audit fact is committed."""
    return home.fleet_path.with_name("subagents.resolving.json")


# A resolution commits within moments of writing its intent; one older than this was
# interrupted (a resolution still under way is left alone: its own commit records it).
SETTLE_AFTER_SECONDS = 10


def settle_interrupted(home: EngineHome | None = None) -> bool:
    """A resolution killed after its files changed and before its audit fact was committed
    (r21: a row cleared with no record, and its retry answered that no row had that id):
    recorded now if the files show it done, else forgotten (nothing changed). Runs before each
    resolution and with the lifecycle's recovery (at worker start, then every minute).
    Returns whether it recorded one."""
    home = home or EngineHome()
    path = _intent_path(home)
    try:
        intent = json.loads(read_regular(path))
        agent_id, action = intent["agent_id"], intent["action"]
        at = parse_datetime(intent["at"])
        if at is None or action not in ACTIONS:
            raise ValueError(action)
    except FileNotFoundError:
        return False
    except (OSError, UnsafeEnginePath, ValueError, KeyError, TypeError):
        log.warning("an unreadable subagent resolution intent was set aside")
        with contextlib.suppress(OSError):
            path.unlink()
        return False
    if (timezone.now() - at).total_seconds() < SETTLE_AFTER_SECONDS:
        return False
    recorded = False
    with transaction.atomic():
        target = (Conversation.objects.filter(public_id=intent.get("conversation")).first()
                  if action == "attribute" else None)
        found = [row for _path, row in fleet.all_rows(home) if row.get("agent_id") == agent_id]
        done = (not found) if action == "clear" else bool(target and found and all(
            _attributed_to(row, target) for row in found))
        name = "subagent.attributed" if action == "attribute" else "subagent.cleared"
        if done and not AuditFact.objects.filter(action=name, new_value__agent_id=agent_id,
                                                        recorded_at__gte=at - timedelta(seconds=1)).exists():
            actor = get_user_model().objects.filter(pk=intent.get("actor")).first()
            _audit(action, agent_id, actor, target)
            recorded = True
    with contextlib.suppress(OSError):
        path.unlink()
    return recorded


def _audit(action: str, agent_id: str, actor, target: Conversation | None) -> None:
    audit.record(
        "subagent.attributed" if action == "attribute" else "subagent.cleared",
        actor=actor, conversation=target,
        old={"agent_id": agent_id, "origin": None},
        new={"agent_id": agent_id, "origin": target.public_id if target else None, "cleared": action == "clear"},
    )


def resolve_subagent(agent_id: str, *, action: str, conversation: Conversation | None = None,
                     acting_user, home: EngineHome | None = None) -> None:
    """The way out of an ambiguous delete: attribute a subagent row of unknown origin to a
    conversation, or clear the row, in the fleet file and its legacy copy. Audited (agent
    id and origin only). Rows that already name a conversation are not touched here.

    A retry of a resolution already made (a client that lost the first answer) does nothing
    and answers as the first did: the row attributed here to that very conversation, or a
    cleared row gone while its audit fact is kept."""
    if action not in ACTIONS:
        raise ActionRefused("invalid_action", _("Choose attribute or clear."), status=400)
    if action == "attribute" and conversation is None:
        raise ActionRefused("missing_conversation", _("Name the conversation to attribute the row to."), status=400)
    if not fleet.namable_id(agent_id):  # (no row has such an id; a NUL cannot be looked up in jsonb)
        raise ActionRefused("not_found", _("No subagent row has that id."), status=404)
    home = home or EngineHome()
    with contextlib.suppress(fleet.FleetUnreadable):  # (said below, where the rows are read)
        settle_interrupted(home)
    with transaction.atomic():
        target = lock_writable(conversation) if action == "attribute" else None
        try:
            rows = fleet.all_rows(home)
        except fleet.FleetUnreadable:
            raise ActionRefused(
                "fleet_unreadable", _("The subagent state file cannot be read. Repair or restore it first.")
            ) from None
        found = [row for _path, row in rows if row.get("agent_id") == agent_id]
        if not found:
            if action == "clear" and AuditFact.objects.filter(action="subagent.cleared",
                                                             new_value__agent_id=agent_id).exists():
                return  # cleared before: the retry's answer is the first one's
            raise ActionRefused("not_found", _("No subagent row has that id."), status=404)
        if action == "attribute" and all(_attributed_to(row, target) for row in found):
            return  # attributed here to this conversation before: nothing to change
        # A row this action attributed to this very conversation is no obstacle: a retry after a
        # write stopped between the two files (a full disk) finishes the other file's rows.
        if any(fleet.origin_of(row) is not None and not (action == "attribute" and _attributed_to(row, target))
               for row in found):
            raise ActionRefused(
                "subagent_not_ambiguous", _("This subagent row already names its conversation; it is not changed here.")
            )

        def change(rows: list[dict]) -> list[dict]:
            if action == "clear":
                return [r for r in rows if r.get("agent_id") != agent_id]
            return [{**r, "origin": {"conversation": target.public_id, "attributed": True}}
                    if r.get("agent_id") == agent_id else r for r in rows]

        intent = _intent_path(home)
        try:
            # What is under way, written first: a crash once the files changed leaves it for
            # settle_interrupted to record (an engine folder's writes cannot join the transaction)
            home.write_atomic(intent, json.dumps({
                "action": action, "agent_id": agent_id, "conversation": target.public_id if target else None,
                "actor": acting_user.pk if acting_user is not None and acting_user.is_authenticated else None,
                "at": timezone.now().isoformat()}).encode())
            for path in fleet.fleet_files(home):
                if path.exists():
                    fleet.update_file(home, path, change)
        except OSError as error:  # a read-only or full engine folder: a refusal, not a 500
            raise engine_folder_refusal(error) from None
        faults.kill_point("subagent-files-written")
        _audit(action, agent_id, acting_user, target)
        transaction.on_commit(lambda: intent.unlink(missing_ok=True))


def _attributed_to(row: dict, conversation: Conversation) -> bool:
    """Whether this action attributed the row to the conversation (not a row that named it itself)."""
    origin = row.get("origin")
    return (isinstance(origin, dict) and origin.get("attributed") is True
            and origin.get("conversation") == conversation.public_id)
