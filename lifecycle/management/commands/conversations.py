from __future__ import annotations

import json
import secrets
import sys

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils.translation import gettext, ngettext

from console.management.cli import JsonErrors, io_error
from console.shown import shell_word, written_out
from lifecycle.deletion import reasons
from lifecycle.deletion.errors import error_message
from lifecycle.deletion.presentation import (
    holder_text,
    receipt_rows,
    removed_backup_text,
    removed_backups,
    residue,
    unscanned_at,
)
from lifecycle.engine import OperationView, get_engine
from lifecycle.errors import ActionRefused
from lifecycle.models import Conversation, DeleteOperation
from lifecycle.registry import STORES
from lifecycle.serializers import thread_json

LABELS = {s.key: s.label for s in STORES}


class Command(JsonErrors, BaseCommand):
    help = ("Archive, close, delete or show a conversation (the same actions as the screens and the API). "
            "delete exits 2 when refused or unavailable, 3 when it stopped on an error and stays pending.")

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True)
        archive = verbs.add_parser("archive", help="Hide from Recent (--undo to bring it back).")
        archive.add_argument("--undo", action="store_true")
        close = verbs.add_parser("close", help="Stop its workers and release its lease (--resume to reopen).")
        close.add_argument("--resume", action="store_true")
        delete = verbs.add_parser("delete", help="Delete for good, then wait for the erasure (progress on a terminal).")
        delete.add_argument("--key", help="The operation key; a retry with the same key gets the same answer.")
        delete.add_argument("--no-wait", action="store_true", help="Record the delete and return; the job cluster erases.")
        verbs.add_parser("status", help="A conversation's state and its delete, or an operation (op_...).")
        resolve = verbs.add_parser(
            "resolve-subagent", help="The way out of an Unavailable delete: attribute a subagent row of unknown "
                                     "origin to a conversation (--attribute c_...), or clear it (--clear).")
        way = resolve.add_mutually_exclusive_group(required=True)
        way.add_argument("--attribute", metavar="CONVERSATION", help="The conversation the row belongs to.")
        way.add_argument("--clear", action="store_true", help="Remove the row.")
        for sub in (archive, close, delete, verbs.choices["status"], resolve):
            sub.add_argument("target", help="A conversation id (c_...), or for status also an operation id; for "
                                            "resolve-subagent the subagent row's id.")
            sub.add_argument("--json", action="store_true")
        for sub in (archive, close, delete, resolve):  # (status changes nothing: no actor to record)
            sub.add_argument("--as", dest="username", help="Record this admin as the actor.")

    def handle(self, *args, verb: str, target: str, json: bool, username: str | None = None, **options):
        self.as_json = json
        # A delete refused for any reason (an unknown id, an actor who is not an active admin)
        # exits 2, as the help and the README say; the other verbs' refusals exit 1.
        self.refused_status = 2 if verb == "delete" else 1
        if settings.ENGINE_URL:
            # The conversations are the engine's: run it on the engine's host. (Here it read this
            # console's own table for status and deleted on the engine without the console's
            # bound delete: no record, the binding left behind, no Pending while the engine was down.)
            raise CommandError(
                "engine_remote: this console reaches a remote engine (ENGINE_URL); its conversations are the "
                "engine's. Run manage.py conversations on the engine's host, or delete from Engine "
                "conversations on this console's screens. Nothing was done.", returncode=2)
        actor = self.actor(username)
        engine = get_engine()
        try:
            if verb == "archive":
                return self.thread(engine.set_archived(target, not options["undo"], actor=actor))
            if verb == "close":
                return self.thread(engine.set_closed(target, not options["resume"], actor=actor))
            if verb == "delete":
                return self.delete(engine, target, options["key"] or "cli-" + secrets.token_hex(12),
                                   actor, wait=not options["no_wait"])
            if verb == "resolve-subagent":
                return self.resolve(engine, target, options["attribute"], actor)
            return self.status(engine, target)
        except ActionRefused as exc:
            raise CommandError(f"{exc.code}: {exc.message}", returncode=self.refused_status) from None
        except OSError as exc:  # the engine folder (its locks, its files): one line, not a traceback
            raise io_error(exc, "Nothing more was done") from None

    def actor(self, username: str | None):
        if not username:
            return None
        user = get_user_model().objects.filter(username=username, is_active=True, is_staff=True).first()
        if user is None:
            raise CommandError(f"No active admin named {username}.", returncode=self.refused_status)
        return user

    def out(self, value) -> None:
        self.stdout.write(_dumps(value) if self.as_json else written_out(value))

    def thread(self, data: dict) -> None:
        if self.as_json:
            return self.out(data)
        flags = [name for name in ("archived", "closed") if data[name]]
        if data["state"] == "deleted":  # a tombstone: nothing is open, archived or closed any more
            return self.out(f"{data['id']}  deleted  content erased, a content-free tombstone remains")
        if data["state"] == "pending_delete":
            flags.append("accepts no writes, its content is being erased")
        self.out(f"{data['id']}  {data['state']}  {', '.join(flags) or 'open'}  {data['title']}")

    def delete(self, engine, target: str, key: str, actor, *, wait: bool) -> None:
        op = engine.request_delete(target, key=key, actor=actor)
        if not self.as_json:
            self.stdout.write(written_out(f"operation {op.id} (key {key}): {op.state}"))
        if op.state in ("refused", "unavailable"):
            self.report(op)
            raise SystemExit(2)
        if wait and op.is_pending:
            op = engine.wait(op.id, progress=self.progress)
            if sys.stderr.isatty() and not self.as_json:
                sys.stderr.write("\n")
        self.report(op)
        if wait and op.is_pending and (op.error or op.stalled):
            raise SystemExit(3)  # stopped on an error; it stays pending and the recovery job retries

    def resolve(self, engine, agent_id: str, conversation_id: str | None, actor) -> None:
        if actor is None:
            raise CommandError("resolve-subagent needs --as <admin>: the resolution is audited under an admin.")
        action = "attribute" if conversation_id else "clear"
        engine.resolve_subagent(agent_id, action=action, conversation_id=conversation_id, actor=actor)
        if self.as_json:
            return self.out({"agent_id": agent_id, "action": action, "conversation": conversation_id})
        self.out(f"subagent row {agent_id}: " + (f"attributed to {conversation_id}" if conversation_id else "cleared"))

    def progress(self, done: int, total: int, step: str) -> None:
        if not sys.stderr.isatty() or self.as_json:
            return
        width = 24
        filled = width * done // max(total, 1)
        label = "preparing" if step == "fingerprints" else str(LABELS.get(step, step))
        sys.stderr.write(f"\r[{'#' * filled}{'-' * (width - filled)}] {done}/{total} {label[:40]:<40}")
        sys.stderr.flush()

    def status(self, engine, target: str) -> None:
        if target.startswith("op_"):
            return self.report(engine.operation(target))
        conversation = Conversation.objects.with_activity().filter(public_id=target).first()
        if conversation is None:
            raise CommandError("not_found: Nothing with that id exists here.")
        intent = DeleteOperation.objects.intents().filter(conversation=conversation).first()
        if self.as_json:
            return self.out({"thread": thread_json(conversation),
                             "operation": engine.operation(intent.public_id).data if intent else None})
        self.thread(thread_json(conversation))
        if intent:
            self.report(engine.operation(intent.public_id))

    def report(self, op: OperationView) -> None:
        if self.as_json:
            return self.out(op.data)
        lines = [f"{op.id}  {op.state}  target {op.target}"]
        if op.state in ("refused", "unavailable"):
            lines += [f"  {code}: {reasons.message(code)}" for code in op.reasons]
            for row in (op.data.get("way_out") or {}).get("ambiguous", []):
                # its id written out, and in the command as a word a shell reads back as the id
                lines.append(f"  subagent row {written_out(row['agent_id'])}: resolve it with manage.py conversations "
                             f"resolve-subagent {shell_word(row['agent_id'])} --attribute <conversation> (or --clear) "
                             "--as <admin>")
        elif op.is_pending:
            done = sum(1 for s in op.steps if s["state"] == "done")
            # As the operation page says it: the store being erased by its name, the steps done.
            if op.step == "fingerprints":
                doing = "Preparing: taking keyed fingerprints for the residue check, before anything is erased."
            elif op.step:
                doing = f"Erasing: {LABELS.get(op.step, op.step)}."
            else:
                doing = "Finishing."
            lines.append(f"  {doing} Step {done} of {len(op.steps)} done." + (f"  ({op.error})" if op.error else ""))
            if op.error_message:
                lines.append(f"  {op.error_message}")
            if op.stalled and op.error != "stalled":
                lines.append(f"  {error_message('stalled')}")
        else:
            # Each store as the operation page words it: files counted as files, the tombstone
            # said, and the shared copies a publisher could not revoke
            for entry in receipt_rows(op.receipt["stores"]):
                count = entry["records"] or 0
                figures = (ngettext("%(shown)s file", "%(shown)s files", count) if entry["files"]
                           else ngettext("%(shown)s record", "%(shown)s records", count)) % {"shown": count}
                notes = []
                if entry["tombstone"] and entry["action"] == "erased":
                    # Its title erased, the record itself kept, as the page says (r67: "erased 1
                    # record" for the one record that stays)
                    figures, notes = "", [gettext("title erased; the record stays as the tombstone")]
                if entry["remaining"]:
                    notes.append(ngettext("%(shown)s shared copy remains", "%(shown)s shared copies remain",
                                          entry["remaining"]) % {"shown": entry["remaining"]})
                if entry.get("erased_again") is True:  # written again during the delete (the store check)
                    notes.append("erased once more before completing")
                lines.append(f"  {entry['action']:<10} {figures:>16} {entry['bytes'] or 0:>12} bytes  {entry['label']}"
                             + "".join(f" · {note}" for note in notes))
            # The kept facts as the operation page words them, with their period
            kept = receipt_rows(op.receipt.get("kept"))
            if kept:
                lines.append("  kept:")
            lines += [f"    {entry['label']}: {kept_text(entry)}" for entry in kept]
            physical = op.receipt["physical"]
            lines.append(f"  physical erasure: {physical['state']}" + (f" at {physical['erased_at']}" if physical["erased_at"] else ""))
            lines += [f"  verification: {line}" for line in verification_lines(op)]
            # What still holds the deleted bytes, as the operation page lists it (the restore
            # steps in docs/operations.md rely on this report)
            for holder in op.receipt.get("holders") or []:
                lines.append(f"  still held by: {holder_text(holder)}")
            # Backups it named that are no longer in the backup folder (read now): Lethe sees only
            # that folder, so a copy moved elsewhere still holds the content
            for entry in removed_backups(op.receipt.get("removed_backups")):
                when = entry["removed_on"].isoformat() if entry["removed_on"] else ""
                lines.append(f"  not in the backup folder any more: {removed_backup_text(entry, when)}")
        # What the stored data holds (a title, a backup's name, a row's id) written out: a line break or
        # an escape sequence in it would otherwise fake a line of this report or recolour the terminal (r123)
        self.stdout.write("\n".join(written_out(line) for line in lines))


def verification_lines(op: OperationView) -> list[str]:
    """What the receipt's last checks found, in the order and with the commands the operation
    page gives (templates/lifecycle/operation_detail.html; the facts from the same
    presentation.residue): traces written or restored after the delete, content in raw bytes by
    what removes it, else clean and when (on PostgreSQL the raw bytes checked are the engine
    folder's only: the server's files cannot be read from here); not yet verified."""
    receipt = op.receipt or {}
    verification = receipt.get("verification") if isinstance(receipt.get("verification"), dict) else {}
    found = residue(verification) or {}
    lines = []
    if found.get("logical"):
        lines.append(f"on {_when(found['at'])} found {found['logical']} trace(s) of this conversation written or "
                     f"restored after its delete; erase them with: manage.py verify_erasure --erase-residue {op.id}")
    at = _when(found.get("physical_at"))
    if found.get("erasable"):
        lines.append(f"on {at} the raw-byte check found its content in {found['erasable']} of this conversation's own "
                     f"file(s); remove them and check again with: manage.py verify_erasure --erase-residue --physical {op.id}")
    if found.get("engine_folder"):
        lines.append(f"on {at} the raw-byte check found copies of its content in {found['engine_folder']} file(s) of the "
                     "engine folder that are not this conversation's own; --erase-residue does not remove them: find "
                     f"them with manage.py verify_erasure --physical {op.id}, delete them or the copied content by hand, "
                     "then run it again")
    if found.get("database"):
        lines.append(f"on {at} the raw-byte check found some of its content in the database file; --erase-residue does "
                     "not rewrite it: run Compact database (Data & storage, or manage.py tool_payloads compact --as ADMIN), then "
                     f"check again with: manage.py verify_erasure --physical {op.id}")
    if found.get("unknown"):
        lines.append(f"on {at} the raw-byte check found some of its content; manage.py verify_erasure --physical "
                     f"{op.id} names each file (with --erase-residue it also removes this conversation's own files)")
    if not found.get("logical"):
        lines.append(_clean_line(op, receipt, found))
    if unscanned := unscanned_at(verification):
        lines.append(f"a raw-byte check on {_when(unscanned)} scanned nothing: no fingerprints of its content are "
                     "kept (they are dropped after a clean raw-byte check, and a week after the delete)")
    return lines


def _clean_line(op: OperationView, receipt: dict, found: dict) -> str:
    """The stores' clean re-check beside raw-byte findings, else the last clean check and what it
    read, else that none ran yet."""
    if found:
        return f"every store re-checked on {receipt.get('verified_at')}: clean"
    if receipt.get("verified_physical_at") and receipt.get("engine") == "postgresql":
        return (f"clean on {receipt['verified_physical_at']}; the raw bytes of the engine folder's files hold none "
                "of the samples taken of its content (the database server's own files cannot be read from here)")
    if receipt.get("verified_physical_at"):
        return (f"clean on {receipt['verified_physical_at']}; the raw bytes of the database and the engine folder "
                "hold none of the samples taken of its content")
    if receipt.get("verified_at"):
        return f"every store re-checked on {receipt['verified_at']}: clean"
    return f"not verified yet: check with manage.py verify_erasure {op.id}"


def _when(moment) -> str:
    """A receipt's time as the receipt writes it (UTC, with Z), or "an unrecorded time"."""
    return moment.isoformat().replace("+00:00", "Z") if moment else "an unrecorded time"


def kept_text(entry: dict) -> str:
    """A receipt's kept entry in the words of the operation page (_receipt_stores.html), and
    the period that applies to it (days after the delete), as the API states it."""
    n, values = entry["records"], {"shown": entry["records"], "when": entry.get("expired_at")}
    if entry["action"] == "out_of_scope":
        return gettext("follows provider terms")
    if n is None:
        text = gettext("kept")
    elif entry["action"] == "expired" and entry["after_check"]:
        text = ngettext("%(shown)s record, removed on %(when)s after a clean physical check",
                        "%(shown)s records, removed on %(when)s after a clean physical check", n) % values
    elif entry["action"] == "expired":
        text = ngettext("%(shown)s record, removed on %(when)s when its period ran out",
                        "%(shown)s records, removed on %(when)s when their period ran out", n) % values
    elif entry["expires"]:
        text = ngettext("%(shown)s record kept until its period after the delete runs out",
                        "%(shown)s records kept until their period after the delete runs out", n) % values
    else:
        text = ngettext("%(shown)s record kept", "%(shown)s records kept", n) % values
    days = entry.get("days")
    if isinstance(days, int) and not isinstance(days, bool):
        text += " (" + ngettext("%(shown)s day", "%(shown)s days", days) % {"shown": days} + ")"
    return text


def _dumps(value) -> str:
    return json.dumps(value, indent=1, sort_keys=True)
