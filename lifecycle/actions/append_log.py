from __future__ import annotations

from typing import Any

from django.db import transaction

from lifecycle.enginefs import EngineHome
from lifecycle.errors import ActionRefused, engine_folder_refusal
from lifecycle.fence import lock_writable
from lifecycle.models import Conversation

LOGS = ("events", "approval_receipts")


def append_log(conversation: Conversation, *, log: str, records: list[dict[str, Any]],
               home: EngineHome | None = None) -> None:
    """The engine's append to a conversation's event log or approval receipt log.

    Done under the conversation's row lock after the fence check: once a delete intent is
    committed no writer can recreate a folder the erasure removes.
    """
    if log not in LOGS:
        raise ActionRefused("invalid_log", "unknown log", status=400)
    home = home or EngineHome()
    with transaction.atomic():
        locked = lock_writable(conversation)
        key = locked.storage_key
        path = home.events_path(key) if log == "events" else home.receipts_path(key)
        try:
            home.append_jsonl(path, records)
        except OSError as error:  # a read-only or full engine folder (the append left no torn line)
            raise engine_folder_refusal(error) from None
