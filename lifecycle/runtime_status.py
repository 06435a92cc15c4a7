"""What a conversation's page says of its runtime, and `GET /v1/threads/{id}/runtime`: its
message count (capped), running or queued turns, open runtime work, subagents and engine
files. Engine files are read, never guessed at: one that cannot be read is named with why, and
the figures say they leave it out."""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path

from django.utils.translation import gettext_lazy as _

from lifecycle import enginefs
from lifecycle.engine_health import EngineProblem, describe, shown_path
from lifecycle.models import ACTIVE_TURN_STATES, Conversation, Item, RuntimeClaim

CHILD_STATUS = {
    "queued": _("Queued"),
    "running": _("Running"),
    "completed": _("Completed"),
    "failed": _("Failed"),
    "interrupted": _("Interrupted"),
    "cancelled": _("Cancelled"),
}
# Counts of a conversation's messages stop here: counting a million rows per view took half a
# second, so past it the page says "more than" this many (true, and cheap to know).
COUNT_CAP = 10_000


def capped_count(items) -> tuple[int, bool]:
    """(count, over): the number of rows up to COUNT_CAP, and whether there are more."""
    count = items.order_by()[: COUNT_CAP + 1].count()
    return min(count, COUNT_CAP), count > COUNT_CAP


@dataclass
class Subagent:
    agent_id: str
    status: str  # a key of CHILD_STATUS, or "unknown"

    @property
    def label(self) -> str:
        return str(CHILD_STATUS.get(self.status, _("Unknown")))


@dataclass
class RuntimeStatus:
    messages: int
    messages_over: bool  # more than COUNT_CAP
    turns: int  # running or queued
    claims: list[RuntimeClaim]
    subagents: list[Subagent]
    fleet_unreadable: bool  # the fleet file could not be read: its subagents are unknown
    engine_files: int
    engine_bytes: int
    engine_uncounted: bool  # the figures leave out what could not be read (engine_problems)
    engine_problems: list[EngineProblem] = field(default_factory=list)


def _engine_files(home: enginefs.EngineHome, conversation: Conversation) -> tuple[list[Subagent], list[EngineProblem]]:
    """This conversation's subagents, and the engine files that could not be read.

    An unreadable file is reported, never taken as empty, and never fails the page.
    """
    fleet = home.try_read_fleet()
    problems = [describe(home, fleet.problem)] if fleet.problem else []
    children = []
    for row in fleet.rows:
        origin = row.get("origin")
        if isinstance(origin, dict) and origin.get("conversation") == conversation.public_id:
            status = row.get("status")
            children.append(Subagent(str(row.get("agent_id", "")),
                                     status if isinstance(status, str) and status in CHILD_STATUS else "unknown"))
    key = conversation.storage_key
    try:
        logs = [home.events_path(key), home.receipts_path(key)]
    except enginefs.UnsafeEnginePath:
        logs = []  # its folder is reported by the count of its files (_engine_usage)
    problems += [describe(home, problem) for problem in map(home.inspect_jsonl, logs) if problem]
    return children, problems


def _engine_usage(home: enginefs.EngineHome, conversation: Conversation) -> tuple[int, int, list[EngineProblem]]:
    """(files, bytes) in the conversation's engine folders, and what they could not count: a
    folder behind a symbolic link (not followed) or a file or folder that cannot be read."""
    unread: list[OSError] = []
    files, size = home.conversation_usage(conversation.storage_key, unread)
    problems = []
    for exc in unread:
        shown = shown_path(home, Path(exc.filename or ""))
        code = {errno.ELOOP: "unsafe", errno.EXDEV: "mounted"}.get(exc.errno, "unreadable")
        problems.append(EngineProblem(shown, code))
    return files, size, problems


def runtime_status(conversation: Conversation) -> RuntimeStatus:
    messages, over = capped_count(Item.objects.filter(conversation=conversation))
    home = enginefs.EngineHome()
    children, problems = _engine_files(home, conversation)
    files, size, uncounted = _engine_usage(home, conversation)
    return RuntimeStatus(
        messages=messages, messages_over=over,
        turns=conversation.turns.filter(state__in=ACTIVE_TURN_STATES).count(),
        claims=list(conversation.runtime_claims.open().order_by("opened_at")),
        subagents=children,
        fleet_unreadable=any(p.path == enginefs.FLEET_FILE for p in problems),
        engine_files=files, engine_bytes=size, engine_uncounted=bool(uncounted),
        engine_problems=problems + uncounted,
    )
