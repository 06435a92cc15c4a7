"""The storage measurement job: sizes per conversation, account, computer and tool kind,
and one row of totals per UTC day.

What is counted, per conversation:
- database bytes: the stored bytes of its items' text (content and title, as encoded bytes)
  plus their tool payloads (`payload_bytes`, measured when each item was written). Other
  tables, indexes and the database's own row overhead are not split by conversation; the
  database file size is recorded as a whole.
- engine bytes: the files in its engine folders (threads, sessions, artifacts).

Crash safety: everything is read first, then the snapshot tables are replaced in one
transaction that starts by locking the measurement row. A worker killed at any line leaves
the previous snapshot whole; the rerun measures again from scratch, so nothing is lost or
counted twice. Two runs at once (two job clusters) take turns on the lock and each writes a
complete snapshot; a second run on the same day replaces that day's totals.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

from insight.models import (
    HISTORY_DAYS,
    ConversationSize,
    DailySize,
    Measurement,
    OwnerKind,
    OwnerSize,
    ToolKindSize,
)
from lifecycle import faults
from lifecycle.enginefs import CONVERSATION_AREAS, EngineHome
from lifecycle.functions import OctetLength
from lifecycle.models import Conversation, ConversationState, Item, Role, Scope
from ops.logs import os_error
from retention.models import StorageSnapshot
from retention.storage import database_size

BATCH = 1000
log = logging.getLogger(__name__)


def item_bytes_by_conversation() -> dict[int, tuple[int, int]]:
    """conversation id -> (text bytes, payload bytes) of its items."""
    rows = (Item.objects.order_by().values("conversation_id")
            .annotate(text=Sum(OctetLength("content") + OctetLength("title")), payload=Sum("payload_bytes")))
    return {r["conversation_id"]: (r["text"] or 0, r["payload"] or 0) for r in rows.iterator()}


def tool_kind_sizes() -> list[dict[str, int | str]]:
    rows = (Item.objects.filter(role=Role.TOOL).order_by().values("tool_kind")
            .annotate(items=Count("id"), payload=Sum("payload_bytes"), removable=Sum("removable_bytes")))
    return [{"tool_kind": r["tool_kind"], "items": r["items"], "payload_bytes": r["payload"] or 0,
             "removable_bytes": r["removable"] or 0} for r in rows]


def engine_bytes_by_key(home: EngineHome, problems: list[OSError] | None = None) -> dict[str, int]:
    """storage key -> bytes in that conversation's engine folders, for every key found on disk;
    what could not be read goes to `problems`."""
    # An area that cannot be listed (or is behind a link) is counted as unreadable, not empty.
    unreadable = [] if problems is None else problems
    keys = {key for area in CONVERSATION_AREAS for key in home.conversation_keys(area, unreadable)}
    return {key: home.conversation_usage(key, problems)[1] for key in sorted(keys)}


def measure_storage() -> dict[str, int]:
    started = timezone.now()
    owners = {
        pk: (public_id, OwnerKind.ACCOUNT if scope == Scope.BOUND else OwnerKind.COMPUTER,
             account_id if scope == Scope.BOUND else computer_id)
        for pk, public_id, scope, account_id, computer_id in Conversation.objects.exclude(
            state=ConversationState.DELETED).order_by().values_list("pk", "public_id", "scope", "account_id",
                                                                    "computer_id").iterator()
    }
    items = item_bytes_by_conversation()
    kinds = tool_kind_sizes()
    faults.kill_point("insight.read_database")
    home = EngineHome()
    engine_missing = not home.root.is_dir()
    problems: list[OSError] = []
    engine_files, engine_total = home.usage(problems)
    by_key = engine_bytes_by_key(home, problems)
    if problems:
        log.warning("storage measurement: %s engine folders or files could not be read (first: %s)",
                    len(problems), os_error(problems[0]))
    faults.kill_point("insight.read_engine")
    file_bytes = database_size().file_bytes

    conversation_rows = []
    per_owner: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0])
    attributed = 0
    for pk, (public_id, kind, owner_id) in owners.items():
        text, payload = items.get(pk, (0, 0))
        engine = by_key.get(public_id, 0)
        attributed += engine
        owner = per_owner[(kind, owner_id)]
        owner[0] += 1
        owner[1] += text + payload
        owner[2] += engine
        # A row for each conversation measured, empty ones too: a delete since takes it off its
        # owner's figures by this row (r58: an empty one stayed counted)
        conversation_rows.append(ConversationSize(conversation_id=pk, db_bytes=text + payload,
                                                  engine_bytes=engine, total_bytes=text + payload + engine))
    owner_rows = [OwnerSize(kind=kind, owner_id=owner_id, conversations=n, db_bytes=db, engine_bytes=engine,
                            total_bytes=db + engine)
                  for (kind, owner_id), (n, db, engine) in per_owner.items()]
    text_total = sum(text for text, _payload in items.values())
    payload_total = sum(int(k["payload_bytes"]) for k in kinds)
    removable_total = sum(int(k["removable_bytes"]) for k in kinds)

    with transaction.atomic():
        measurement, _created = Measurement.objects.select_for_update().get_or_create(id=1)
        if measurement.measured_at is not None and measurement.measured_at > started:
            # A run that started later committed first: its figures are newer than these.
            return {"superseded": 1}
        ConversationSize.objects.all().delete()
        faults.kill_point("insight.write")
        ConversationSize.objects.bulk_create(conversation_rows, batch_size=BATCH)
        OwnerSize.objects.all().delete()
        OwnerSize.objects.bulk_create(owner_rows, batch_size=BATCH)
        ToolKindSize.objects.all().delete()
        ToolKindSize.objects.bulk_create([ToolKindSize(**k) for k in kinds])
        day = started.date()  # started is in UTC: one row per UTC day
        DailySize.objects.update_or_create(day=day, defaults={
            "measured_at": started, "database_bytes": file_bytes, "engine_bytes": engine_total,
            "payload_bytes": payload_total, "removable_bytes": removable_total})
        DailySize.objects.filter(day__lte=day - timedelta(days=HISTORY_DAYS)).delete()
        Measurement.objects.filter(pk=measurement.pk).update(
            measured_at=started, database_bytes=file_bytes, engine_bytes=engine_total, engine_files=engine_files,
            engine_missing=engine_missing, engine_unreadable=len(problems),
            unattributed_engine_bytes=max(engine_total - attributed, 0), text_bytes=text_total,
            payload_bytes=payload_total, removable_bytes=removable_total)
        if not problems and not engine_missing:
            # The engine folder's figure Data & storage shows beside the database's (the
            # 15-minute measure's) is this one too, unless that one is newer: one page, one figure.
            snapshot = StorageSnapshot.objects.select_for_update().filter(id=1).first()
            if snapshot is None or snapshot.measured_at is None or snapshot.measured_at < started:
                StorageSnapshot.objects.update_or_create(id=1, defaults={
                    "engine_files": engine_files, "engine_bytes": engine_total, "measured_at": started})
    faults.kill_point("insight.committed")
    return {"conversations": len(conversation_rows), "owners": len(owner_rows), "database_bytes": file_bytes,
            "engine_bytes": engine_total, "payload_bytes": payload_total, "removable_bytes": removable_total,
            "engine_missing": int(engine_missing), "engine_unreadable": len(problems)}
