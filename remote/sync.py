"""Bindings from an engine: one per conversation it holds, under that conversation's owner."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from remote.delivery import engine_for
from remote.models import BoundDelete, BoundDeleteState, EngineBinding

PAGE = 200


def refresh(engine_url: str = "") -> dict[str, int]:
    """Read every conversation the engine holds and keep the bindings in step.

    New live conversations get a binding; known ones get the engine's title, state and
    activity (a binding with a delete under way keeps its title cleared). Nothing is
    removed here: only an acknowledged receipt lets a binding go.
    """
    engine = engine_for(engine_url)
    counts = {"created": 0, "updated": 0}
    cursor = None
    now = timezone.now()
    busy = set(BoundDelete.objects.filter(engine_url=engine_url, state=BoundDeleteState.PENDING)
               .values_list("engine_id", flat=True))
    while True:
        page = engine.threads(view="all", limit=PAGE, cursor=cursor)
        with transaction.atomic():
            for row in page["results"]:
                known = EngineBinding.objects.filter(engine_url=engine_url, engine_id=row["id"]).first()
                fields = {
                    "owner_kind": row["owner"]["kind"], "owner_id": row["owner"]["id"], "scope": row["scope"],
                    "thread_id": row["thread_id"], "engine_state": row["state"],
                    "title": "" if row["id"] in busy or row["state"] != "live" else row["title"],
                    "last_activity_at": parse_datetime(row["last_activity_at"]) if row.get("last_activity_at") else None,
                    "synced_at": now,
                }
                if known is not None:
                    EngineBinding.objects.filter(pk=known.pk).update(**fields)
                    counts["updated"] += 1
                elif row["state"] == "live":
                    EngineBinding.objects.create(engine_url=engine_url, engine_id=row["id"], **fields)
                    counts["created"] += 1
        cursor = page.get("next")
        if not cursor:
            return counts
