"""What a delete would do, store by store, built from the registry; read-only."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.utils import timezone

from lifecycle import fleet
from lifecycle.deletion import files, reasons
from lifecycle.deletion.admission import admit
from lifecycle.enginefs import EngineHome, UnsafeEnginePath
from lifecycle.models import Conversation, ConversationState, RetainedFactsPolicy
from lifecycle.registry import STORES, RetentionClass, Store


def _count(store: Store, conversation: Conversation, home: EngineHome, folder_there: bool) -> dict[str, Any]:
    if store.kind == "external":
        return {}
    if store.kind == "file":
        if not folder_there:  # the engine folder itself is missing: nothing in it can be counted (r135: "0 files")
            return {"records": None}
        try:
            path = store.paths(home, conversation)[0]
        except UnsafeEnginePath:  # a symlink on the way: not counted (the delete reports it)
            return {"records": None}
        if store.shared_file:
            try:
                return {"records": len(fleet.children(fleet.read_rows(path, cached=True), conversation))}
            except fleet.FleetUnreadable:
                return {"records": None}
        try:
            count, size = files.usage(home, path)
        except (files.UnsafeFolder, OSError):  # a link on the way, or what cannot be read: not counted
            return {"records": None}
        return {"records": count, "bytes": size}
    rows = store.rows(conversation)
    if store.tombstone:
        # The conversation's title, still to erase; none once it is erased (the tombstone row
        # that stays is not a record a delete would erase).
        return {"records": 0 if conversation.state == ConversationState.DELETED else 1}
    if store.retention == RetentionClass.COMPACT:
        held = rows.none()
        for column in store.content_columns():
            held = held | rows.filter(**{f"{column}__isnull": False})
        return {"records": held.count()}
    if store.retention == RetentionClass.SHARED:
        return {"records": rows.count(), "remaining": rows.filter(publisher_supports_revoke=False).count()}
    return {"records": rows.count()}


def _backups(conversation: Conversation) -> list[dict[str, Any]]:
    """The backups that hold the conversation now and that a delete leaves as they are (r74: the
    confirmation said "Erased for good" and named none; the receipt named them after). A folder
    that cannot be read is named, never taken as empty."""
    from lifecycle.deletion.physical import backups_before
    from retention.errors import BackupFolderUnreadable

    try:
        return backups_before(timezone.now(), conversation_id=conversation.pk)
    except BackupFolderUnreadable as exc:
        return [{"kind": "backup_folder", "name": exc.filename or ""}]


def preview(conversation: Conversation, home: EngineHome | None = None) -> dict[str, Any]:
    home = home or EngineHome()
    live = conversation.state == ConversationState.LIVE
    admission = admit(conversation, home, cached=True) if live else None
    policy = RetainedFactsPolicy.load()
    stores = []
    folder_there = home.root.is_dir()
    for s in STORES:
        # Retained facts: the period they are kept after the delete, as this engine declares it
        period = {"days": getattr(policy, s.period)} if s.period else {"days": s.days} if s.days else {}
        stores.append({"store": s.key, "kind": s.kind, "class": s.retention.value, **_count(s, conversation, home, folder_there),
                       **period})
    shared = next((e for e in stores if e["class"] == RetentionClass.SHARED), {})
    return {
        "backups": _backups(conversation) if live else [],
        "target": conversation.public_id,
        "state": conversation.state,
        "admission": None if admission is None else {
            "outcome": admission.outcome,
            "code": admission.code or None,
            "reasons": [{"code": c, "outcome": reasons.outcome(c), "message": reasons.message(c)}
                        for c in admission.reasons],
            "ambiguous": admission.ambiguous,
        },
        "stores": stores,
        "shared_copy_remains": shared.get("remaining", 0),
    }


def preview_digest(preview: dict) -> str:
    """What a confirmation was shown of the delete (what it erases, keeps and leaves in backups),
    as a short digest the form sends back and the request compares under its locks. The backups
    are taken by kind and name, in no order: a backup being made is named already, and its
    time and its place in the folder's listing change as it is published (r135: a finished
    backup the page had named refused the confirmation as a change)."""
    backups = preview.get("backups")
    named = sorted(json.dumps([b.get("kind"), b.get("name")], default=str)
                   for b in (backups if isinstance(backups, list) else []) if isinstance(b, dict))
    shown = {"stores": preview.get("stores"), "backups": named, "shared_copy_remains": preview.get("shared_copy_remains")}
    return hashlib.sha256(json.dumps(shown, sort_keys=True, default=str).encode()).hexdigest()[:32]
