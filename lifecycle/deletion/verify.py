"""The residue verifier: is anything of a deleted conversation left?

Logical: every store of the registry is re-read for the conversation (rows, content columns
of compacted rows, links, folders, fleet rows): anything found is residue.

Physical (`physical=True`): the raw bytes are scanned for the conversation's content using
the fingerprints taken before erasure (see `fingerprints`): the SQLite database file and its
write-ahead log, and every file under the engine folder. A window found in the raw bytes is
residue unless live data explains it: a database hit is explained when a live row of a
registered table holds the same bytes (two conversations may share text, such as tool
output); an engine-folder hit when it sits in a live conversation's folder or in a fleet
file itself (whose rows of this conversation the logical check has already shown gone; a
temporary beside it is not explained). On
PostgreSQL the table files cannot be read from here: physical erasure there is "pending"
until a compaction has been recorded, and only the engine folder is scanned.

Each check is recorded on the receipt (`verification`). The raw-byte result recorded there is
the last one that scanned raw bytes, with its date and where it found anything: a check that
did not scan them (a logical check, `verify_erasure --all` without `--physical`) keeps it, so
a finding is not forgotten because a later check did not look. A physical finding in a file
`--erase-residue` removes (the conversation's own folders, a fleet temporary naming it) is
told apart from one it cannot remove (another file in the engine folder, the database file).
A clean physical result also drops the fingerprints; a later `--physical` check then scans
nothing and says so (`no_fingerprints`), recorded as `unscanned` beside the kept result.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from console.shown import written_out
from lifecycle import engine_folder, fleet
from lifecycle.deletion import executor, files
from lifecycle.deletion.fingerprints import Hit, Scanner
from lifecycle.enginefs import EngineHome, EnginePathError, read_regular, walk, written
from lifecycle.models import (
    Conversation,
    ConversationState,
    DeleteOperation,
    DeleteState,
    ErasureFingerprint,
    PhysicalState,
)
from lifecycle.registry import FINGERPRINTS_STORE, STORES, RetentionClass, Store
from lifecycle.serializers import iso

# Physical results of a check that scanned raw bytes; the others (not_checked,
# no_fingerprints, no_samples) looked at none.
SCANNED = ("clean", "found", "pending")
UNSCANNED = ("no_fingerprints", "no_samples")  # asked for, and nothing could be scanned


@dataclass
class Finding:
    store: str
    what: str
    count: int = 1
    where: str = ""
    # Raw bytes: whether `verify_erasure --erase-residue` removes the file that holds them.
    erasable: bool | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"store": self.store, "what": self.what, "count": self.count, "where": self.where}
        if self.erasable is not None:
            out["erasable"] = self.erasable
        return out


@dataclass
class Report:
    operation: str
    target: str
    logical: list[Finding] = field(default_factory=list)
    physical: str = "not_checked"  # clean | found | pending | not_checked | no_fingerprints
    physical_findings: list[Finding] = field(default_factory=list)
    windows: int = 0
    explained: int = 0
    # When this check scanned no raw bytes: the last raw-byte result recorded before it, if any.
    last_physical: dict[str, Any] | None = None

    @property
    def found(self) -> bool:
        return bool(self.logical or self.physical_findings)

    def as_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation, "target": self.target, "found": self.found,
            "logical": "found" if self.logical else "clean",
            "logical_findings": [f.as_dict() for f in self.logical],
            "physical": self.physical, "physical_findings": [f.as_dict() for f in self.physical_findings],
            "windows": self.windows, "explained_by_live_data": self.explained,
            "last_physical": self.last_physical,
        }


# ---- Logical ----------------------------------------------------------------------------------


def _holding(store: Store, rows):
    held = rows.none()
    for column in store.content_columns():
        held = held | rows.filter(**{f"{column}__isnull": False})
    return held


def leftover_temporaries(home: EngineHome, path: Path, conversation: Conversation) -> list[Path]:
    """Temporaries a killed writer left beside a fleet file that hold this conversation's rows."""
    return [t for t in home.stale_temporaries(path) if _mentions(t, conversation.public_id)]


def _mentions(path: Path, public_id: str) -> bool:
    """Whether the file holds the conversation's public id (fleet rows name their origin by it)."""
    try:
        return public_id.encode() in read_regular(path)
    except (OSError, EnginePathError):  # gone, or replaced by a link or a FIFO since
        return False


def logical_findings(conversation: Conversation, home: EngineHome) -> list[Finding]:
    out: list[Finding] = []
    for s in STORES:
        if not s.acts:
            continue
        if s.kind == "file":
            try:
                path = s.paths(home, conversation)[0]
            except EnginePathError:  # e.g. an area folder turned into a symlink since the delete
                out.append(Finding(s.key, "unsafe_folder"))
                continue
            if s.shared_file:
                try:
                    # its rows, and rows of unknown origin naming it (r154), these by their ids:
                    # what the admin clears (r156: no screen or line named them)
                    named = fleet.named_rows(fleet.read_rows(path, cached=True), conversation)
                    n = len(named)
                    unknown = sorted({written_out(r.get("agent_id")) for r in named if fleet.origin_of(r) is None})
                    # entries of the file besides its rows that name it (another runtime's records)
                    outside = fleet.named_outside_rows(path, conversation.public_id, cached=True)
                except fleet.FleetUnreadable:
                    out.append(Finding(s.key, "unreadable"))
                    continue
                if n:
                    out.append(Finding(s.key, "fleet_rows", n, where=", ".join(unknown)))
                if outside:
                    out.append(Finding(s.key, "fleet_records", len(outside), where=", ".join(outside)))
                # a temporary a killed writer left beside the fleet file, holding its rows
                left = leftover_temporaries(home, path, conversation)
                if left:
                    out.append(Finding(s.key, "fleet_temporary", len(left)))
                continue
            try:
                count, _size = files.usage(home, path)
                present = files.checked(home, path) is not None
            except (files.UnsafeFolder, EnginePathError, OSError):  # not shown to be gone: a finding
                out.append(Finding(s.key, "unsafe_folder"))
                continue
            if present:
                out.append(Finding(s.key, "folder", count))
            continue
        rows = s.rows(conversation)
        if s.tombstone:
            row = rows.values(*s.content_columns()).first() or {}
            if any(v not in ("", None) for v in row.values()):
                out.append(Finding(s.key, "content"))
            continue
        if s.retention == RetentionClass.ERASE:
            n = rows.count()
        elif s.retention == RetentionClass.COMPACT:
            n = _holding(s, rows).count()
        elif s.retention == RetentionClass.SHARED:
            n = rows.filter(publisher_supports_revoke=True, revoked_at__isnull=True).count()
        else:  # retain-detach: still linked
            n = rows.count()
        if n:
            out.append(Finding(s.key, "rows", n))
    return out


# ---- Physical ---------------------------------------------------------------------------------


def database_files() -> list[Path]:
    if connection.vendor != "sqlite":
        return []
    name = Path(str(connection.settings_dict["NAME"]))
    return [p for p in (name, Path(f"{name}-wal")) if p.exists()]


def _unread(error: OSError) -> None:
    raise error


def engine_files(home: EngineHome) -> list[Path]:
    """The regular files of the engine folder, listed through folder descriptors (`walk`):
    never one outside it, even while a folder in it is swapped for a link. A folder that cannot
    be read raises its OSError: a scan that left it out would call the raw bytes clean and drop
    the fingerprints that could find a copy in it later (r143)."""
    return [folder / name for folder, _fd, entries in walk(home.root, _unread)
            for name, info in entries if stat.S_ISREG(info.st_mode)]


def _explained_in_database(window: bytes) -> bool:
    """A live row of a registered table holds these bytes (text shared with another conversation)."""
    with connection.cursor() as cursor:
        for s in STORES:
            if s.kind != "table":
                continue
            for column in s.content_columns():
                q = connection.ops.quote_name
                cursor.execute(
                    f"SELECT 1 FROM {q(s.db_table)} WHERE instr(CAST({q(column)} AS BLOB), %s) > 0 LIMIT 1", [window]
                )
                if cursor.fetchone():
                    return True
    return False


def _explained_in_engine(home: EngineHome, path: Path) -> bool:
    try:
        parts = path.relative_to(home.root).parts
    except ValueError:
        return False
    if path in (home.fleet_path, home.legacy_fleet_path):
        return True  # the fleet files themselves: the logical check showed this conversation's rows gone
    if len(parts) >= 3 and parts[0] in ("threads", "sessions", "artifacts"):
        return Conversation.objects.filter(public_id=parts[1], state=ConversationState.LIVE).exists()
    return False


def _relative(home: EngineHome, path: Path) -> str:
    try:
        return written(path.relative_to(home.root))
    except ValueError:
        return written(path.name)


def _erasable(home: EngineHome, conversation: Conversation, path: Path) -> bool:
    """Whether `verify_erasure --erase-residue` removes this engine file: it lies in one of the
    conversation's own folders, or it is a temporary left beside a fleet file that names it.
    Any other file (a copy somewhere else in the engine folder) is the operator's to remove."""
    try:
        folders = home.conversation_paths(conversation.storage_key)
    except EnginePathError:
        return False
    if any(path.is_relative_to(folder) for folder in folders):
        return True
    return any(path in leftover_temporaries(home, shared, conversation) for shared in fleet.fleet_files(home))


def physical_check(op: DeleteOperation, report: Report, home: EngineHome) -> None:
    fingerprint = ErasureFingerprint.objects.filter(operation=op).first()
    if fingerprint is None:
        # Dropped after a clean raw-byte check or a week after the delete (or never taken):
        # nothing to look for, so nothing is scanned, and nothing is called clean now. The
        # receipt keeps the last result that did scan.
        report.physical = "no_fingerprints"
        return
    scanner = Scanner(fingerprint)
    report.windows = len(scanner.windows)
    if not report.windows:
        # Nothing was sampled (short messages, titles; on PostgreSQL, which samples no table
        # value, no engine file of the conversation): there is nothing to look for in the raw
        # bytes, so the raw bytes are not called clean (a copy left in the engine folder could
        # not be found).
        report.physical = "no_samples"
        return
    explained: dict[int, bool] = {}
    found: dict[str, int] = {}
    erasable: dict[str, bool] = {}
    # SQLite with its checkpoint still held back (a reader): the database file keeps the old pages
    # until it runs, so a hit there is what "pending" says, not content found elsewhere (r129: it
    # was called found, with advice to hunt a row of another program's table).
    checkpointed = op.physical_state != PhysicalState.PENDING
    for path in database_files() if checkpointed else []:
        for hit in scanner.scan_file(path):
            if hit.window not in explained:
                explained[hit.window] = _explained_in_database(scanner.window_at(hit))
            if explained[hit.window]:
                report.explained += 1
            else:
                found[f"database:{path.name}"] = found.get(f"database:{path.name}", 0) + 1
                erasable[f"database:{path.name}"] = False
    for path in engine_files(home):
        try:
            hits: list[Hit] = scanner.scan_file(path, engine=True)
        except OSError as error:  # opened by its folder's descriptor: named by its whole path (r145)
            raise OSError(error.errno, error.strerror, str(path)) from error
        for _hit in hits:
            if _explained_in_engine(home, path):
                report.explained += 1
            else:
                key = f"engine:{_relative(home, path)}"
                found[key] = found.get(key, 0) + 1
                if key not in erasable:
                    erasable[key] = _erasable(home, op.conversation, path)
    report.physical_findings = [Finding("raw_bytes", "content_window", n, where, erasable=erasable[where])
                                for where, n in sorted(found.items())]
    if report.physical_findings:
        report.physical = "found"
    elif op.physical_state != PhysicalState.ERASED:
        # SQLite: the checkpoint is still busy; PostgreSQL: no compaction since the delete.
        report.physical = "pending"
    else:
        report.physical = "clean"


def verify(op: DeleteOperation, *, physical: bool = False, record: bool = True,
           home: EngineHome | None = None) -> Report:
    # A folder that is not this database's would look clean: refuse (EngineFolderUnavailable).
    home = engine_folder.check(home or EngineHome())
    conversation = op.conversation
    report = Report(op.public_id, conversation.public_id)
    if op.state == DeleteState.COMPLETED and op.physical_state == PhysicalState.PENDING:
        executor.finish_physical(op.pk)  # SQLite: one more checkpoint before looking
        op.refresh_from_db()
    report.logical = logical_findings(conversation, home)
    if physical:
        physical_check(op, report, home)
    # Read from the folder only while it was still this database's: gone meanwhile (a disk
    # unmounted during a long raw-byte scan), it read as clean, and the receipt said so (r84).
    engine_folder.check(home)
    if report.physical not in SCANNED:
        report.last_physical = last_physical(op.receipt)
    if record and op.state == DeleteState.COMPLETED:
        _record(op, report)
    return report


def physical_files(findings: list[Finding]) -> dict[str, int]:
    """Files holding raw bytes of the conversation, by what removes them: `erasable` (this
    conversation's own files, which --erase-residue removes), `engine_folder` (other files
    in the engine folder) and `database` (the database file or its write-ahead log)."""
    files = {"erasable": 0, "engine_folder": 0, "database": 0}
    for f in findings:
        kind = "erasable" if f.erasable else "database" if f.where.startswith("database:") else "engine_folder"
        files[kind] += 1
    return files


def last_physical(receipt: dict[str, Any] | None) -> dict[str, Any] | None:
    """The last raw-byte result a receipt records (result, when, files found), or None when
    no check has scanned raw bytes yet. Receipts recorded before this was kept apart give
    their last check's time and no breakdown of the files."""
    verification = (receipt or {}).get("verification") or {}
    if verification.get("physical") not in SCANNED:
        return None
    return {"result": verification["physical"], "at": verification.get("physical_at") or verification.get("at"),
            "files": verification.get("physical_files")}


def _record(op: DeleteOperation, report: Report) -> None:
    """This check's result on the receipt. Its logical result replaces the last one; its raw-byte
    result replaces the last one only if it scanned raw bytes, else the last one stays, with
    its date and files. A raw-byte check that could scan nothing (no fingerprints, nothing
    sampled) is recorded as `unscanned` (when, why) until one scans again."""
    now = timezone.now()
    with transaction.atomic():
        locked = DeleteOperation.objects.select_for_update().get(pk=op.pk)
        receipt = dict(locked.receipt or {})
        earlier = receipt.get("verification") or {}
        verification: dict[str, Any] = {"at": iso(now), "logical": "found" if report.logical else "clean",
                                        "logical_findings": len(report.logical)}
        unscanned = None
        if report.physical in SCANNED:
            physical = {"result": report.physical, "at": iso(now),
                        "files": physical_files(report.physical_findings)}
        else:
            physical = last_physical(receipt)
            if physical is None and report.physical == "not_checked" and earlier.get("physical") in UNSCANNED:
                physical = {"result": earlier["physical"], "at": earlier.get("physical_at"), "files": None}
            physical = physical or {"result": report.physical, "at": None, "files": None}
            unscanned = earlier.get("unscanned") if report.physical == "not_checked" else {
                "at": iso(now), "reason": report.physical}
        files = physical["files"] or {}
        verification.update(physical=physical["result"], physical_at=physical["at"], physical_files=physical["files"],
                            findings=len(report.logical) + sum(files.values()))
        if unscanned:
            verification["unscanned"] = unscanned
        receipt["verification"] = verification
        fields: dict[str, Any] = {"receipt": receipt}
        if not report.logical:
            fields["verified_at"] = now
        if report.physical == "clean" and not report.found and locked.verified_physical_at is None:
            fields["verified_physical_at"] = now
            if ErasureFingerprint.objects.filter(operation=locked).delete()[0]:
                # The receipt stops saying they are kept: removed now, before their period ran out.
                receipt["kept"] = [
                    {**e, "action": "expired", "expired_at": iso(now), "after_check": True}
                    if isinstance(e, dict) and e.get("store") == FINGERPRINTS_STORE and e.get("action") == "kept"
                    else e
                    for e in receipt.get("kept", [])
                ]
        DeleteOperation.objects.filter(pk=locked.pk).update(**fields)


def targets(ident: str | None) -> list[DeleteOperation]:
    """Completed deletes (--all), or the one named by operation id or conversation id."""
    qs = DeleteOperation.objects.select_related("conversation")
    if ident is None:
        return list(qs.filter(state=DeleteState.COMPLETED).order_by("completed_at", "pk"))
    if ident.startswith("op_"):
        return list(qs.filter(public_id=ident))
    return list(qs.intents().filter(conversation__public_id=ident))
