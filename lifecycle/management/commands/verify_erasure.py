from __future__ import annotations

import json

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection
from django.utils import timezone

from console.management.cli import JsonErrors, io_error, refusal
from console.shown import written_out
from lifecycle.deletion.executor import erase_residue as erase_residue_of
from lifecycle.deletion.physical import holders_now, record_removed_backups
from lifecycle.deletion.verify import targets, verify
from lifecycle.models import DeleteOperation

PHYSICAL_WORDS = {
    "clean": "clean",
    "found": "CONTENT FOUND",
    "pending": ("pending (SQLite: write-ahead log not checkpointed yet; PostgreSQL: manage.py finish_erasure has "
                "not run since the delete)"),
    "not_checked": "not checked (add --physical)",
    "no_fingerprints": "no fingerprints, so nothing was scanned (they are dropped after a clean raw-byte check and "
                       "a week after the delete, or were never taken)",
    "no_samples": ("nothing to look for (SQLite: no stored value was long enough to sample; PostgreSQL: no "
                   "engine file of the conversation was sampled, and its table values never are)"),
}
# What an operator does about raw bytes --erase-residue cannot remove (it removes only the
# conversation's own files and fleet temporaries naming it).
BY_HAND = {
    "engine": "not this conversation's own file, so --erase-residue does not remove it: delete the file (or the "
              "copied content) by hand, then run --physical again",
    "database": "the database file, which --erase-residue does not rewrite: run Compact database (Data & "
                "storage), which clears free pages, then --physical again; still found after it, the copy is in a "
                "row of a table outside Lethe's stores (another program's, or a job's stored arguments): find that "
                "row and remove it by hand",
}


class Command(JsonErrors, BaseCommand):
    help = ("Re-scan every registered store for anything of deleted conversations; with --physical also the "
            "raw bytes of the database (SQLite) and the engine folder; with --erase-residue first erase again what the "
            "stores hold. Exits 1 when anything is found, 2 when the target is unknown or not deleted yet (or the engine "
            "folder cannot be checked); with --json a refusal is a JSON document {\"error\": {\"code\", \"message\"}} "
            "on standard output.")

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("target", nargs="?", help="An operation id (op_...) or a conversation id (c_...).")
        which.add_argument("--all", action="store_true", help="Every completed delete.")
        parser.add_argument("--physical", action="store_true")
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--erase-residue", action="store_true",
                            help="Erase again the stores that hold something of a deleted conversation "
                                 "(written after the delete by a process outside Lethe, or restored), then check.")

    def handle(self, *args, target, all, physical, json: bool, erase_residue: bool, **options):
        if settings.ENGINE_URL:  # (r42: "0 deleted conversation(s) checked.", exit 0, having checked nothing)
            raise refusal("engine_remote", "This console reaches a remote engine (ENGINE_URL): the deletes, their "
                          "stores and files are the engine's. Run manage.py verify_erasure on the engine's host. "
                          "Nothing was checked.", returncode=2)
        ops = targets(None if all else target)
        if not all and not ops:
            raise refusal("not_found", f"No delete operation for {target}.", returncode=2)
        unfinished = [op for op in ops if op.state != "completed"]
        if unfinished:
            raise refusal("not_completed", f"{unfinished[0].public_id} is {unfinished[0].state}; nothing to verify "
                          "yet.", returncode=2)
        from lifecycle.engine_folder import EngineFolderUnavailable, described

        # Each operation's lines are written as it is checked (--all over thousands of deletes
        # takes long); --json is one document, written at the end.
        reports, documents, found = 0, [], False
        from lifecycle.deletion.files import UnsafeFolder
        from lifecycle.enginefs import UnsafeEnginePath
        from retention.backups import names_in_folder

        present = names_in_folder()  # the backup folder, read once: what the receipts' backups are now
        try:
            for op in ops:
                try:
                    erased = erase_residue_of(op) if erase_residue else []
                except (UnsafeEnginePath, UnsafeFolder) as exc:
                    # r48: a traceback, exit 1 ("found") and no --json document
                    where = (f"{exc.relative} in the engine folder is a symbolic link, a file or a path outside it"
                             if isinstance(exc, UnsafeFolder) else f"{exc} in the engine folder")
                    checked = (f"{reports} deleted conversation(s) were checked before it" if reports
                               else "nothing was checked")
                    raise refusal(
                        "unsafe_path", f"The residue of {op.public_id} was not all removed: {where}, where a folder "
                        "of the conversation would be. Lethe never follows a link or removes what is not a folder "
                        f"of its own, so {checked}. Move it aside, then run this again.", returncode=2) from None
                try:
                    r = verify(op, physical=physical)
                except OSError as exc:  # r143: worded as residue not removed, with none asked to be
                    before = f" ({reports} deleted conversation(s) were checked before it)" if reports else ""
                    raise io_error(exc, f"The check of {op.public_id} could not read it, so nothing was recorded "
                                   f"for it{before}", returncode=2) from None
                backups = _backups(op.pk, present)
                reports += 1
                found = found or r.found
                if json:
                    documents.append({**r.as_dict(), "erased_again": erased, "backups": backups})
                else:
                    self._write(r, erased, physical=physical)
                    self._write_backups(backups)
        except EngineFolderUnavailable as exc:
            checked = f"{reports} deleted conversation(s) were checked before it" if reports else "nothing was checked"
            raise refusal(
                "engine_folder_unavailable", f"The engine folder {exc.root} is {described(exc.root, exc.reason)}, so {checked} (a "
                "folder that is not there would look clean). Mount it or set ENGINE_HOME, then run this again"
                + _adopt_advice(exc.reason), returncode=2) from None
        except OSError as exc:  # residue it could not remove (a read-only mount): one line
            raise io_error(exc, "The residue was not all removed", returncode=2) from None
        if json:
            self.stdout.write(_dumps({"reports": documents, "found": found}))
        else:
            self.stdout.write(f"{reports} deleted conversation(s) checked.")
        if found:
            raise SystemExit(1)

    def _line(self, text: str) -> None:
        """A line of the report, what the stored data holds written out (a backup's name, an engine
        file's path: a control character in it would act on the terminal, a line break fake a line)."""
        self.stdout.write(written_out(text))

    def _write(self, r, erased: list[str], *, physical: bool) -> None:
        logical = "clean" if not r.logical else "FOUND " + ", ".join(
            f"{f.store} ({f.what}: {f.count}{f'; {f.where}' if f.where else ''})" for f in r.logical)
        if erased:
            self._line(f"{r.operation}  {r.target}  erased again: {', '.join(erased)}")
        self._line(f"{r.operation}  {r.target}  logical: {logical}")
        if physical:
            detail = ", ".join(f"{f.where} ({f.count})" for f in r.physical_findings)
            words = PHYSICAL_WORDS[r.physical]
            if r.physical == "clean" and connection.vendor != "sqlite":
                words = "clean in the engine folder's files (the database server's files are not read)"
            self._line(f"    physical: {words}"
                       + (f": {detail}" if detail else "")
                       + f"  [{r.windows} windows; {r.explained} hits explained by live data]")
            for f in r.physical_findings:
                if not f.erasable:
                    self._line(f"      {f.where}: {BY_HAND[f.where.split(':', 1)[0]]}")
        if r.last_physical:
            # This check scanned no raw bytes: the last one that did stands on the receipt.
            last = {"found": "CONTENT FOUND", "pending": "pending"}.get(r.last_physical["result"], "clean")
            self._line(f"    last raw-byte check ({r.last_physical['at']}): {last}, as the receipt "
                       "still records")
        self.stdout.flush()

    def _write_backups(self, backups: dict[str, list]) -> None:
        for held in backups["held"]:
            self._line(f"    backup {held['name']}: made before the delete, still holds its content until it "
                       "is deleted")
        for gone in backups["removed"]:
            self._line(f"    backup {gone['name']}: removed from the backup folder (found gone on "
                       f"{gone['removed_at']}), no longer holds its content")
        self.stdout.flush()


def _backups(operation_id: int, present) -> dict[str, list]:
    """The backups a receipt named at completion as they are now: those still in the backup
    folder hold the content; one gone from it is dated on the receipt the first time a check
    finds it gone (`removed_at`), and no surface lists it as holding the content since."""
    receipt = DeleteOperation.objects.filter(pk=operation_id).values_list("receipt", flat=True).first() or {}
    named = any(isinstance(h, dict) and h.get("kind") == "backup" for h in receipt.get("holders") or [])
    if named and record_removed_backups(operation_id, present, timezone.now()):
        receipt = DeleteOperation.objects.filter(pk=operation_id).values_list("receipt", flat=True).first() or {}
    held, removed = holders_now(receipt.get("holders"), present)
    return {"held": [{"name": h.get("name"), "made_at": h.get("made_at")} for h in held
                     if isinstance(h, dict) and h.get("kind") == "backup"],
            "removed": removed}


def _dumps(value) -> str:
    return json.dumps(value, indent=1, sort_keys=True)


def _adopt_advice(reason: str) -> str:
    """The way to make the folder this database's, as `engine_folder --adopt` takes it: another
    database's folder only with --take-from-other-database (r98: the advice named --adopt alone,
    which refuses it)."""
    if reason == "missing":
        return "."
    if reason == "not_this_folder":
        return ("; if no other database uses this one any more, mark it with manage.py engine_folder --adopt "
                "--take-from-other-database.")
    return "; if this folder is the right one, mark it with manage.py engine_folder --adopt."
