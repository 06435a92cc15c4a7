"""The console API for the Storage card of Data & storage: the last measurement's figures and
Measure now, with the card's rules (members read, admins measure; no read measures anything)."""

from __future__ import annotations

from typing import Literal

from django.conf import settings
from django.http import HttpRequest
from pydantic import Field

from console.api import Schema, endpoint
from insight import figures
from insight.actions import request_measurement
from insight.models import DailySize, Measurement
from lifecycle.serializers import ThreadOwnerOut, iso, owner_json

BASE = "/api/v1/system/storage"


class TotalsOut(Schema):
    database_bytes: int = Field(description="The database's size on disk.")
    engine_bytes: int | None = Field(description="The engine folder's files; null when it was missing (or not a "
                                                 "folder) when measured, or the engine is remote.")
    engine_files: int | None
    engine_unreadable: int = Field(description="Folders and files of the engine folder that could not be read: "
                                               "the engine figures count only the rest.")
    unattributed_engine_bytes: int | None = Field(description="Engine bytes in no conversation's folders.")
    text_bytes: int = Field(description="Message text, as written.")
    payload_bytes: int = Field(description="Tool details, as written.")
    removable_bytes: int = Field(description="What tool payload cleanup could remove.")


class ConversationSizeOut(Schema):
    id: str
    thread_id: str
    title: str = Field(description="Empty from the conversation's delete intent on (the title is content).")
    owner: ThreadOwnerOut
    db_bytes: int
    engine_bytes: int
    total_bytes: int


class OwnerSizeOut(Schema):
    id: int
    name: str
    conversations: int
    db_bytes: int
    engine_bytes: int
    total_bytes: int


class ToolKindSizeOut(Schema):
    kind: str
    items: int
    payload_bytes: int
    removable_bytes: int


class DayOut(Schema):
    day: str = Field(description="A UTC day (YYYY-MM-DD); a second measurement that day replaced its figures.")
    measured_at: str
    database_bytes: int
    engine_bytes: int
    payload_bytes: int
    removable_bytes: int


class StorageOut(Schema):
    measured_at: str | None = Field(description="When the last finished measurement ran; null: never. A background "
                                                "job measures once a day.")
    request: Literal["none", "waiting", "lost"] = Field(
        description="Measure now's request: `waiting` for the job, or `lost` (asked for over 15 minutes ago "
                    "and not finished: it failed or was lost; measuring again tries again).")
    requested_at: str | None
    remote_engine: bool = Field(description="The conversations are on a remote engine: these figures are this "
                                            "console's own store.")
    totals: TotalsOut | None = Field(description="Null until a measurement finished.")
    conversations: list[ConversationSizeOut] = Field(
        description=f"The {figures.TOP} largest conversations holding data, largest first (none deleted since).")
    accounts: list[OwnerSizeOut] = Field(description=f"The {figures.TOP} largest accounts (their synced "
                                                     "conversations), without conversations deleted since.")
    computers: list[OwnerSizeOut] = Field(description=f"The {figures.TOP} largest computers (their local "
                                                      "conversations), without conversations deleted since.")
    tool_kinds: list[ToolKindSizeOut] = Field(description="Every tool kind, largest first, as measured.")
    deleted_since: int = Field(description="Conversations deleted since the measurement that the tool kinds' "
                                           "figures still count.")
    days: list[DayOut] = Field(description="The size over time: one row per UTC day measured (at most 400), "
                                           "oldest first.")


def _request_state(m: Measurement) -> str:
    return "lost" if m.request_lost else "waiting" if m.pending else "none"


def _owner(row: figures.Row) -> dict:
    s = row.size
    return {"id": s.owner_id, "name": row.name.name, "conversations": s.conversations, "db_bytes": s.db_bytes,
            "engine_bytes": s.engine_bytes, "total_bytes": s.total_bytes}


def storage_document() -> dict:
    m = figures.measurement()
    remote = bool(settings.ENGINE_URL)
    doc = {"measured_at": iso(m.measured_at), "request": _request_state(m), "requested_at": iso(m.requested_at),
           "remote_engine": remote, "totals": None, "conversations": [], "accounts": [], "computers": [],
           "tool_kinds": [], "deleted_since": 0, "days": []}
    if m.measured_at is None:
        return doc
    no_folder = remote or m.engine_missing  # as the card: a figure of no folder is not a size
    lists = figures.lists()
    doc.update(
        totals={"database_bytes": m.database_bytes, "engine_bytes": None if no_folder else m.engine_bytes,
                "engine_files": None if no_folder else m.engine_files, "engine_unreadable": m.engine_unreadable,
                "unattributed_engine_bytes": None if no_folder else m.unattributed_engine_bytes,
                "text_bytes": m.text_bytes, "payload_bytes": m.payload_bytes, "removable_bytes": m.removable_bytes},
        conversations=[{"id": row.name.public_id, "thread_id": row.name.thread_id, "title": row.name.shown_title,
                        "owner": owner_json(row.name), "db_bytes": row.size.db_bytes,
                        "engine_bytes": row.size.engine_bytes, "total_bytes": row.size.total_bytes}
                       for row in lists["conversations"]],
        accounts=[_owner(row) for row in lists["accounts"]],
        computers=[_owner(row) for row in lists["computers"]],
        tool_kinds=[{"kind": row.name, "items": row.size.items, "payload_bytes": row.size.payload_bytes,
                     "removable_bytes": row.size.removable_bytes} for row in lists["tool_kinds"]],
        deleted_since=lists["deleted_since"],
        days=[{"day": d.day.isoformat(), "measured_at": iso(d.measured_at), "database_bytes": d.database_bytes,
               "engine_bytes": d.engine_bytes, "payload_bytes": d.payload_bytes, "removable_bytes": d.removable_bytes}
              for d in DailySize.objects.order_by("day")],
    )
    return doc


@endpoint("GET", BASE, response=StorageOut, name="api-storage",
          summary="Storage: the last measurement's figures (Data & storage's Storage card)",
          description="Read from the last measurement; nothing is measured by this read.")
def storage(request: HttpRequest) -> dict:
    return storage_document()


@endpoint("POST", BASE + "/measure", response={202: StorageOut}, admin=True, name="api-storage-measure",
          summary="Measure now: queue a measurement (Measure now on the Storage card)",
          description="Answers the document with `request: waiting`; a request already waiting is not queued "
                      "twice. The job measures in the background; read the document again for its figures.")
def measure(request: HttpRequest) -> tuple[int, dict]:
    request_measurement()
    return 202, storage_document()
