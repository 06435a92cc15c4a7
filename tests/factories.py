"""Plain factory functions for tests. State goes in through actions where one exists."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone

from lifecycle.actions.append_item import append_item
from lifecycle.models import Account, Computer, Conversation, Item, Scope, Turn, TurnState

_counter = itertools.count(1)


def make_user(username: str | None = None, *, admin: bool = False, password: str = "pw-for-tests"):
    username = username or f"user{next(_counter)}"
    return get_user_model().objects.create_user(username=username, password=password, is_staff=admin)


def make_account(name: str = "Northwind") -> Account:
    return Account.objects.create(name=name)


def make_computer(name: str = "laptop") -> Computer:
    return Computer.objects.create(name=name)


def make_conversation(
    owner: Account | Computer | None = None,
    *,
    thread_id: str | None = None,
    title: str = "A conversation",
    days_idle: float = 0,
    archived: bool = False,
    closed: bool = False,
) -> Conversation:
    owner = owner or make_account()
    bound = isinstance(owner, Account)
    last = timezone.now() - timedelta(days=days_idle)
    return Conversation.objects.create(
        scope=Scope.BOUND if bound else Scope.LOCAL,
        account=owner if bound else None,
        computer=None if bound else owner,
        thread_id=thread_id or f"thr_{next(_counter):06d}",
        title=title,
        created_at=last - timedelta(days=1),
        last_activity_at=last,
        archived_at=last if archived else None,
        closed_at=last if closed else None,
    )


def add_message(conversation: Conversation, role: str = "user", content: str = "hello") -> Item:
    return append_item(conversation, role=role, content=content)


def add_tool(conversation: Conversation, kind: str = "shell", payload: dict[str, Any] | None = None, **kw) -> Item:
    if payload is None:
        payload = {"command": "ls", "cwd": "/w", "exit_code": 0, "stdout": "x" * 2000, "stderr": ""}
    return append_item(conversation, role="tool", tool_kind=kind, payload=payload,
                       tool_call_id=kw.pop("tool_call_id", "call_1"), status=kw.pop("status", "completed"),
                       title=kw.pop("title", "Run"), **kw)


def start_turn(conversation: Conversation, state: str = TurnState.RUNNING) -> Turn:
    seq = (conversation.turns.count() or 0) + 1
    return Turn.objects.create(conversation=conversation, seq=seq, state=state)


def marker(label: str) -> str:
    """Unique, unguessable text of more than one fingerprint window (64 bytes)."""
    import secrets

    return f"MARKER-{label}-" + secrets.token_hex(40)


def fill_every_store(conversation: Conversation, *, settled_child: bool = True) -> dict[str, str]:
    """Content in every store a delete erases, compacts or keeps, each with its own marker.

    Returns the markers by store key. Writes go through the actions where there is one (items,
    engine logs, artifacts, the fleet); the other stores have no write path of their own yet.
    """
    from lifecycle import fleet
    from lifecycle import models as m
    from lifecycle.actions.append_log import append_log
    from lifecycle.actions.write_artifact import write_artifact

    k = {key: marker(key.split(".")[-1]) for key in (
        "lifecycle.Item", "lifecycle.Goal", "lifecycle.MailEnvelope", "lifecycle.SessionDocument",
        "lifecycle.BranchJournalEntry", "lifecycle.Checkpoint", "lifecycle.RecoveryMaterial",
        "lifecycle.RuntimeClaim", "lifecycle.ProcessLease", "lifecycle.OperationBinding",
        "lifecycle.HistoryReceipt", "events", "approval_receipts", "artifacts", "subagents",
        "legacy_subagents", "lifecycle.Export", "lifecycle.SharedLink", "lifecycle.WorkspaceFile",
        "lifecycle.MemoryEntry", "tool")}
    turn = m.Turn.objects.create(conversation=conversation, seq=1, state=TurnState.DONE)
    append_item(conversation, role="user", content=k["lifecycle.Item"])
    add_tool(conversation, payload={"command": "cat notes", "cwd": "/w", "exit_code": 0, "stdout": k["tool"], "stderr": ""})
    m.Item.objects.filter(conversation=conversation).update(turn=turn)
    m.Goal.objects.create(conversation=conversation, text=k["lifecycle.Goal"])
    m.MailEnvelope.objects.create(conversation=conversation, sender="a@x.test", recipient="b@x.test",
                                  subject="Update", body=k["lifecycle.MailEnvelope"])
    m.SessionDocument.objects.create(conversation=conversation, name="s", document={"text": k["lifecycle.SessionDocument"]})
    m.BranchJournalEntry.objects.create(conversation=conversation, seq=1, branch="main",
                                        entry={"summary": k["lifecycle.BranchJournalEntry"]})
    m.Checkpoint.objects.create(conversation=conversation, label="cp", snapshot={"note": k["lifecycle.Checkpoint"]})
    m.RecoveryMaterial.objects.create(conversation=conversation, kind=m.RecoveryKind.PRE_IMPORT_ARCHIVE,
                                      body=k["lifecycle.RecoveryMaterial"])
    m.RuntimeClaim.objects.create(conversation=conversation, kind=m.ClaimKind.APPROVAL,
                                  label=k["lifecycle.RuntimeClaim"], resolved_at=timezone.now())
    m.ProcessLease.objects.create(conversation=conversation, holder=k["lifecycle.ProcessLease"])
    m.OperationBinding.objects.create(conversation=conversation, operation_id="op_b1", target_id="turn_1",
                                      outcome="applied", request={"prompt": k["lifecycle.OperationBinding"]})
    m.HistoryReceipt.objects.create(conversation=conversation, operation_id="op_h1", target_id="item_1",
                                    outcome="applied", detail={"note": k["lifecycle.HistoryReceipt"]})
    append_log(conversation, log="events", records=[{"type": "turn.completed", "note": k["events"]}])
    append_log(conversation, log="approval_receipts", records=[{"command": k["approval_receipts"]}])
    write_artifact(conversation, name="large-output.txt", data=k["artifacts"].encode() * 3)
    if settled_child:
        row = {"agent_id": "sa_" + conversation.public_id[2:10], "origin": {"conversation": conversation.public_id},
               "status": "completed", "delivery": "settled", "started_at": conversation.created_at.isoformat(),
               "finished_at": timezone.now().isoformat(), "prompt": k["subagents"], "result": "done"}
        fleet.put_row(row)
        legacy = {**row, "agent_id": row["agent_id"] + "_legacy", "prompt": k["legacy_subagents"]}
        fleet.update_file(_home(), _home().legacy_fleet_path, lambda rows: [*rows, legacy])
    m.Export.objects.create(conversation=conversation, path=f"exports/{k['lifecycle.Export']}.md", size_bytes=10)
    m.SharedLink.objects.create(conversation=conversation, token=k["lifecycle.SharedLink"][:64], publisher="web")
    m.SharedLink.objects.create(conversation=conversation, token="x" + k["lifecycle.SharedLink"][:63],
                                publisher="mirror", publisher_supports_revoke=False)
    m.WorkspaceFile.objects.create(conversation=conversation, path=f"notes/{k['lifecycle.WorkspaceFile']}.md")
    m.MemoryEntry.objects.create(conversation=conversation, scope="project", text=k["lifecycle.MemoryEntry"])
    m.UsageFact.objects.create(conversation=conversation, input_tokens=10, output_tokens=20)
    m.BillingFact.objects.create(conversation=conversation, amount_minor=42)
    return k


def _home():
    from lifecycle.enginefs import EngineHome

    return EngineHome()


def erasure_stopped_in(conversation, step: str, *, key: str, monkeypatch):
    """A delete of `conversation` requested, and its erasure run until the job dies at the start
    of `step` (a kill point's name, such as a store key: it fires there, as a SIGKILL would end
    the job), what that step had not committed rolled back. Returns the operation (Pending); `monkeypatch.undo()` lets a later
    run go on."""
    import pytest

    from lifecycle import faults
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor

    op = request_deletion(conversation, key=key, acting_user=None)

    class Killed(BaseException):
        pass

    def kill_at(name: str) -> None:
        if name == step:
            raise Killed(name)

    monkeypatch.setattr(faults, "kill_point", kill_at)
    with pytest.raises(Killed):
        executor.run_erasure(op.pk)
    op.refresh_from_db()
    return op


def folder_behind_a_link(conversation: Conversation, tmp_path) -> None:
    """The conversation's thread folder as a symbolic link to a folder outside the engine
    folder, holding a 5,000-byte events file (what no count or erasure may follow)."""
    from lifecycle.enginefs import EngineHome

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "events.jsonl").write_bytes(b"x" * 5000)
    threads = EngineHome().root / "threads"
    threads.mkdir()
    (threads / conversation.storage_key).symlink_to(outside)


def end_database_session() -> int:
    """PostgreSQL: end this connection's session from another connection, as a server restart,
    a failover or an operator's pg_terminate_backend does; the ended session's process id."""
    from django.db import connection, connections

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    finally:
        other.close()
    return pid


@contextlib.contextmanager
def database_read_only() -> Iterator[None]:
    """PostgreSQL: the tests' database takes no writes (default_transaction_read_only on for it,
    as on a standby) for the connections opened inside; set back however the block ends."""
    from django.db import connection

    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    connection.close()  # the next connection takes the database's setting, as after a restart
    try:
        yield
    finally:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = off")
            cursor.execute(f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        connection.close()
