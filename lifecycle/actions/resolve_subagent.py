from __future__ import annotations

from django.db import transaction
from django.utils.translation import gettext as _

from lifecycle import audit, fleet
from lifecycle.enginefs import EngineHome
from lifecycle.errors import ActionRefused, engine_folder_refusal
from lifecycle.fence import lock_writable
from lifecycle.models import AuditFact, Conversation

ACTIONS = ("attribute", "clear")


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

        try:
            for path in fleet.fleet_files(home):
                if path.exists():
                    fleet.update_file(home, path, change)
        except OSError as error:  # a read-only or full engine folder: a refusal, not a 500
            raise engine_folder_refusal(error) from None
        audit.record(
            "subagent.attributed" if action == "attribute" else "subagent.cleared",
            actor=acting_user, conversation=target,
            old={"agent_id": agent_id, "origin": None},
            new={"agent_id": agent_id, "origin": target.public_id if target else None, "cleared": action == "clear"},
        )


def _attributed_to(row: dict, conversation: Conversation) -> bool:
    """Whether this action attributed the row to the conversation (not a row that named it itself)."""
    origin = row.get("origin")
    return (isinstance(origin, dict) and origin.get("attributed") is True
            and origin.get("conversation") == conversation.public_id)
