"""Plain factory functions for tests. State goes in through actions where one exists."""

from __future__ import annotations

import itertools
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
