"""What the delete screens say per store, from the registry: its label, what a delete does with
it, and the unit of its figures; for the preview (before confirming) and for receipts.

The embedded pages and the pages of conversations bound to a remote engine share these, so
both say the same things in the same words. An engine names stores by key (never shown) and a
newer engine may name stores this console does not know: those are shown under a generic
label, grouped by the class the engine gives. A figure is shown only where the engine gave
one, and a store the engine did not report is still stated by its rule, uncounted.
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _

from lifecycle.deletion.executor import STORES_BY_KEY, counts_files, figure, is_tombstone
from lifecycle.moments import read_moment
from lifecycle.registry import FACTS_KEPT, STORES, RetentionClass, Store

OTHER_LABEL = _("Other data on the engine")
# What a delete does with a store this console does not know, by the class its engine gives.
CLASS_RULES = {
    RetentionClass.ERASE: _("Gone."),
    RetentionClass.COMPACT: _("Compacted to a content-free record."),
    RetentionClass.RETAIN_DETACH: _("Kept; its link to the conversation is cut."),
    RetentionClass.SHARED: _("Revoked where the publisher supports it; otherwise the shared copy remains."),
    RetentionClass.RETAIN: _("Untouched."),
    RetentionClass.RETAIN_FACTS: FACTS_KEPT,
    RetentionClass.OUT_OF_SCOPE: _("Provider retention follows provider terms."),
}
UNKNOWN_RULE = _("The engine did not say what a delete does with it.")
_GROUPS = {RetentionClass.ERASE: "erase", RetentionClass.COMPACT: "compact",
           RetentionClass.OUT_OF_SCOPE: "outside", RetentionClass.RETAIN_DETACH: "kept",
           RetentionClass.SHARED: "kept", RetentionClass.RETAIN: "kept", RetentionClass.RETAIN_FACTS: "kept"}
_PLACE = {s.key: n for n, s in enumerate(STORES)}


def moment(value: Any):
    """The time an entry gives, or None when it gives none it can (shown without a time)."""
    try:
        return read_moment(value) if isinstance(value, str) and value else None
    except ValueError:  # no such date, or one outside the calendar a page can show (lifecycle.moments)
        return None


def _known(entry: dict[str, Any]) -> Store | None:
    return STORES_BY_KEY.get(entry.get("store")) if isinstance(entry.get("store"), str) else None


def _described(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry's store: label, class, rule and kind, from the registry or, for a store this
    console does not know, from the class the engine gave."""
    store = _known(entry)
    if store is not None:
        return {"label": store.label, "class": store.retention.value, "on_delete": store.on_delete,
                "kind": store.kind, "files": counts_files(store.key),
                "expires": bool(store.period or store.days),
                # kept for a fixed time for a purpose its own rule says (r102: the erasure check's
                # fingerprints were called content-free, which they are not)
                "fixed_days": bool(store.days)}
    klass = entry.get("class") if entry.get("class") in RetentionClass.values else ""
    return {"label": OTHER_LABEL, "class": klass, "on_delete": CLASS_RULES.get(klass, UNKNOWN_RULE),
            "kind": entry.get("kind") if entry.get("kind") in ("table", "file", "external") else "table",
            "files": False, "expires": False, "fixed_days": False}


def _order(entry: dict[str, Any]) -> int:
    return _PLACE.get(entry.get("store"), len(_PLACE)) if isinstance(entry.get("store"), str) else len(_PLACE)


def preview_groups(entries: Any) -> dict[str, list[dict[str, Any]]]:
    """A preview's stores with their figures, grouped as the page shows them (erased,
    compacted, kept, outside Lethe, and what the engine reported that this console does not
    know), in the registry's order. `days`: the retained-facts period the engine declared."""
    rows = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    reported = {e.get("store") for e in rows}
    rows += [{"store": s.key} for s in STORES if s.key not in reported]  # stated by its rule, uncounted
    groups: dict[str, list[dict[str, Any]]] = {"erase": [], "compact": [], "kept": [], "outside": [], "other": []}
    for entry in sorted(rows, key=_order):
        row = {"store": entry.get("store"), **_described(entry), "records": figure(entry.get("records")),
               "bytes": figure(entry.get("bytes")), "remaining": figure(entry.get("remaining")),
               "days": figure(entry.get("days")) or None}
        groups[_GROUPS.get(row["class"], "other")].append(row)
    return groups


_RANK = {RetentionClass.ERASE: 0, RetentionClass.COMPACT: 1}


def receipt_rows(entries: Any) -> list[dict[str, Any]]:
    """Receipt lines (or a delete's steps) in the preview's order: erased stores, then
    compacted, then the rest, each group in the registry's order; stores this console does not
    know last. Each with its label, whether its records are files, and its figures as given."""
    rows = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def order(entry: dict[str, Any]) -> tuple[int, int]:
        store = _known(entry)
        return (_RANK.get(store.retention, 2) if store else 3, _order(entry))

    return [{**e, **_described(e), "records": figure(e.get("records")), "bytes": figure(e.get("bytes")),
             "remaining": figure(e.get("remaining")), "expired_on": moment(e.get("expired_at")),
             "after_check": e.get("after_check") is True, "tombstone": is_tombstone(e.get("store")),
             "action": e.get("action") if isinstance(e.get("action"), str) else ""}
            for e in sorted(rows, key=order)]


# What still holds a delete's bytes after it (the receipt's `holders`), as the operation page
# and `manage.py conversations` say it.
HOLDER_WORDS = {
    "backup": _("Backup %(name)s, made before the delete: until that backup is deleted."),
    # (a bound delete's page reads the folder when shown: one that cannot be read is named)
    "backup_folder": _("Any backup made before the delete in the backup folder %(name)s, which cannot be read "
                       "now: until those backups are deleted."),
    "database_files": _("The database's table files: until an operator runs manage.py finish_erasure."),
    "wal": _("The database's write-ahead log: until the next successful checkpoint."),
    "server_wal": _("The database server's write-ahead log files: until the server reuses them, after later "
                    "checkpoints. Lethe cannot see when."),
    "statistics": _("The database's planner statistics catalog (pg_statistic): until its owner runs VACUUM FULL "
                    "pg_statistic; the database user Lethe connects as may not."),
    "archive": _("The database's WAL archive: until the archive is pruned."),
}


def holder_text(holder: Any) -> str:
    """(A remote engine's receipt may carry anything: what is not an object reads as the last kind.)"""
    holder = holder if isinstance(holder, dict) else {}
    kind = holder.get("kind")
    words = HOLDER_WORDS.get(kind, HOLDER_WORDS["archive"]) if isinstance(kind, str) else HOLDER_WORDS["archive"]
    return str(words) % {"name": holder.get("name", "")}


def preview_backups(preview: Any) -> list[str]:
    """A deletion preview's backups that hold the conversation, in words, every one the preview
    names (r77: names with a control character were left out, and past 50 the rest, while the
    API and the receipt name them): a name's invisible characters written out. (A remote
    engine's preview may carry anything: entries that are no backup are not read.)"""
    from console.shown import visible_format

    entries = preview.get("backups") if isinstance(preview, dict) else None
    rows = [e for e in entries if isinstance(e, dict) and e.get("kind") in ("backup", "backup_folder")
            and isinstance(e.get("name", ""), str)] if isinstance(entries, list) else []
    return [holder_text({**e, "name": visible_format(e.get("name", ""))}) for e in rows]


def removed_backups(entries: Any) -> list[dict[str, Any]]:
    """A receipt's `removed_backups` (backups it named that are gone from the backup folder), in
    the shape a page reads them: a name and, when a check recorded it, when it was found gone."""
    rows = [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []
    return [{"name": e.get("name") if isinstance(e.get("name"), str) else "", "removed_on": moment(e.get("removed_at"))}
            for e in rows]


def removed_backup_text(entry: dict[str, Any], when: str = "") -> str:
    """One removed backup, as `manage.py conversations` says it (the page words it the same)."""
    if when:
        return _("Backup %(name)s, made before the delete: removed from the backup folder (found gone on "
                 "%(when)s).") % {"name": entry["name"], "when": when}
    return _("Backup %(name)s, made before the delete: no longer in the backup folder.") % {"name": entry["name"]}


def residue(verification: dict[str, Any]) -> dict[str, Any] | None:
    """What the receipt's checks found, by what removes it (None when nothing): traces in the
    conversation's stores (the last check's, which --erase-residue erases), and files whose raw
    bytes held its content at the last raw-byte check: its own files (--erase-residue removes
    them), other files in the engine folder and the database file (it does not; the page says
    what the operator does). A receipt recorded before files were told apart gives no breakdown
    (`unknown`). The operation page and `manage.py conversations status` both word this."""
    logical = verification.get("logical") == "found"
    physical = verification.get("physical") == "found"
    if not (logical or physical):
        return None
    found: dict[str, Any] = {
        "at": moment(verification.get("at")),
        "logical": (_count(verification.get("logical_findings", verification.get("findings"))) or 1) if logical else 0,
    }
    if physical:
        files = verification.get("physical_files")
        found["physical_at"] = moment(verification.get("physical_at") or verification.get("at"))
        if isinstance(files, dict):
            found.update({kind: _count(files.get(kind)) for kind in ("erasable", "engine_folder", "database")})
        else:
            found["unknown"] = True
    return found


def _count(value: Any) -> int:
    """A whole, non-negative count from a receipt, else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def unscanned_at(verification: dict[str, Any]) -> Any:
    """When the last raw-byte check could scan nothing because no fingerprints are kept (else
    None): the page says so beside the last result that did scan."""
    unscanned = verification.get("unscanned") if isinstance(verification.get("unscanned"), dict) else {}
    return moment(unscanned.get("at")) if unscanned.get("reason") == "no_fingerprints" else None
