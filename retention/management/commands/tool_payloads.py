"""`manage.py tool_payloads status|analyze|run|retry|cancel|cancel-preparation|compact`: the operator's view of the
tool payload cleanup, with the same rules as the screens and the API (retention.service)."""

from __future__ import annotations

import json as jsonlib
import sys
import time

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from console.management.cli import JsonErrors
from retention import jobs, service
from retention.api import _json
from retention.models import (
    OPEN_STATES,
    OperationKind,
    OperationState,
    ToolPayloadOperation,
    ToolPayloadPolicy,
)
from retention.views import _unit_label

# What each verb asks for, as the lines about an operation left open name it.
ASKED = {"analyze": "analysis", "run": "cleanup run", "retry": "backup", "compact": "compaction"}


# The service's words for a page ("Reload to see them") said for a terminal (r37).
TERMINAL_WORDS = {
    "stale_revision": "The settings changed meanwhile (another admin saved them, or the revision given is not the "
                      "current one). Run tool_payloads status to see them.",
    "preparation_changed": "The backup preparation changed meanwhile (it was retried, or the settings were saved). "
                           "Run tool_payloads status to see where cleanup stands.",
}


def terminal_error(exc: service.CleanupError) -> CommandError:
    return CommandError(f"{exc.code}: {TERMINAL_WORDS.get(exc.code, exc.message)}")


class Command(JsonErrors, BaseCommand):
    help = ("Tool payload cleanup: show the status, analyze a period, run cleanup now, retry a failed or "
            "cancelled backup (or turn cleanup off instead: cancel-preparation), cancel an operation "
            "or compact the database. Changes need --as ADMIN. Waits for the job (progress bar on a terminal) "
            "unless --no-wait; --here runs it in this process instead of the job cluster, and first takes to its "
            "end an operation left open with no worker on it (its line on standard error), then runs the one asked "
            "for: only that one is printed and sets the exit status. Exit status: 0 succeeded (or queued, with "
            "--no-wait), 1 refused (not an admin, a bad period, busy: another operation is running, the settings "
            "changed...; with --json a JSON error document), 2 bad arguments, settings or database, 3 failed or "
            "cancelled before it changed anything, 4 stopped part-way (partial: what it removed before stays).")

    def add_arguments(self, parser):
        verbs = parser.add_subparsers(dest="verb", required=True)
        status = verbs.add_parser("status", help="Policy, preparation, current operation and history.")
        analyze = verbs.add_parser("analyze", help="Analyze a period (changes nothing).")
        analyze.add_argument("--age", type=int, required=True, help="Whole weeks or calendar months.")
        analyze.add_argument("--unit", choices=["weeks", "months"], default="months")
        run = verbs.add_parser("run", help="Run cleanup now under the saved, enabled policy.")
        run.add_argument("--revision", type=int, help="The policy revision you read (default: the current one).")
        retry = verbs.add_parser("retry", help="Make the backup again after it failed or was cancelled; the "
                                 "cleanup follows it when cleanup is on.")
        cancel_preparation = verbs.add_parser(
            "cancel-preparation", help="After a failed or cancelled backup: turn cleanup off instead (nothing was "
                                       "removed; saving a backup choice turns it on again).")
        cancel_preparation.add_argument("--revision", type=int,
                                        help="The policy revision you read (default: the current one).")
        cancel = verbs.add_parser("cancel", help="Stop an operation after its current batch.")
        cancel.add_argument("operation_id", type=int)
        cancel.add_argument("--here", action="store_true",
                            help="Then take the operation to its end in this process (no job cluster running).")
        compact = verbs.add_parser("compact", help="Compact the database (VACUUM).")
        for sub in (status, analyze, run, retry, cancel_preparation, cancel, compact):
            sub.add_argument("--json", action="store_true", help="Print JSON.")
        for sub in (analyze, run, retry, cancel_preparation, cancel, compact):
            sub.add_argument("--as", dest="username", required=True, help="The admin acting.")
        for sub in (analyze, run, retry, compact):
            sub.add_argument("--no-wait", action="store_true", help="Queue the job and return.")
            sub.add_argument("--here", action="store_true", help="Run the job in this process.")

    def handle(self, *args, verb: str, json: bool, **options):
        self.as_json = json
        if verb == "status":
            return self.show(service.status_document())
        user = self.admin(options["username"])
        if verb == "cancel-preparation":
            revision = options["revision"] if options["revision"] is not None else ToolPayloadPolicy.load().revision
            try:
                service.cancel_preparation(user=user, revision=revision)
            except service.CleanupError as exc:
                raise terminal_error(exc) from None
            return self.show(service.status_document())
        if verb == "cancel":
            try:
                service.cancel(user=user, operation_id=options["operation_id"])
            except service.CleanupError as exc:
                raise terminal_error(exc) from None
            if options["here"]:  # the cancel takes effect at the run's next check, here
                return self.operation(self.follow(options["operation_id"], here=True, echo=self.operation))
            op = ToolPayloadOperation.objects.get(pk=options["operation_id"])
            return self.operation(service.operation_document(op))
        if verb == "run" and options["revision"] is None:
            # not given: the current one (0 is a revision nobody read)
            options["revision"] = ToolPayloadPolicy.load().revision
        try:
            op_id = self.start(verb, user, options)
        except CommandError as refused:
            busy = str(refused).startswith("busy: ")
            stalled = self.stalled_operation() if busy and not options["no_wait"] else None
            if stalled is not None and not options["here"]:
                raise CommandError(f"{refused} No worker has taken {stalled.kind} #{stalled.pk} or shown progress "
                                   "for a while: is the job cluster running? (--here runs it in this process, "
                                   "then the one asked for.)", returncode=refused.returncode) from None
            if stalled is None:
                raise
            # An operation left open with no worker on it (its process was interrupted, or it
            # was queued and no job cluster runs): one at a time, so it is taken to its end here
            # first. When it is the one asked for (same kind and period, or the same policy
            # revision for a run), its result is this command's; else this command's own
            # operation is started and run after it, and only that one's result is printed.
            queued = stalled.state == OperationState.QUEUED
            left = (f"{stalled.kind} #{stalled.pk} is queued and no worker has taken it; running it here" if queued
                    else f"{stalled.kind} #{stalled.pk} was left open with no worker on it; continuing it here")
            if self.is_requested(stalled, verb, options):
                self.stderr.write(f"{left} (it is the {ASKED[verb]} asked for).")
                op_id = stalled.pk
            else:
                self.stderr.write(f"{left} first, then the {ASKED[verb]} asked for.")
                leftover = self.follow(stalled.pk, here=True, echo=lambda doc: self.stderr.write(self.line(doc)))
                self.stderr.write(self.line(leftover))
                op_id = self.start(verb, user, options)
        if options["no_wait"]:
            return self.operation(self.doc(op_id))
        doc = self.follow(op_id, here=options["here"], echo=self.operation)
        self.operation(doc)
        if doc["state"] in ("failed", "cancelled"):
            raise SystemExit(3)
        if doc["state"] == "partial":
            raise SystemExit(4)

    def start(self, verb: str, user, options: dict) -> int:
        """Queue the operation `verb` asks for; CommandError for a refusal (busy included)."""
        try:
            if verb == "analyze":
                return service.start_analysis(user=user, age_value=options["age"], age_unit=options["unit"])
            if verb == "run":
                return service.start_run(user=user, revision=options["revision"])
            if verb == "retry":
                return service.retry_preparation(user=user)
            return service.start_compact(user=user)
        except service.CleanupError as exc:
            raise terminal_error(exc) from None

    @staticmethod
    def is_requested(op: ToolPayloadOperation, verb: str, options: dict) -> bool:
        """Whether the open operation `op` is the one this command asks for: an analysis of the
        same period (its cutoff is taken when it starts), a run of the same policy revision (a
        backup first when it goes on to the cleanup), a compaction; never one asked to stop (it
        ends cancelled: the operation asked for is started after it), nor a backup a run already
        held (a backup is not continued: it ends interrupted, and `retry` then makes the backup
        asked for, r70; `run` says the backup must be retried)."""
        if op.cancel_requested or (op.kind == OperationKind.BACKUP and op.lease):
            return False
        if verb == "analyze":
            return (op.kind == OperationKind.ANALYSIS and op.age_value == options["age"]
                    and op.age_unit == options["unit"])
        if verb == "run":
            runs = op.kind == OperationKind.CLEANUP or (op.kind == OperationKind.BACKUP and op.then_cleanup)
            return runs and op.policy_revision == options["revision"]
        if verb == "retry":
            return op.kind == OperationKind.BACKUP
        return op.kind == OperationKind.COMPACT

    def admin(self, username: str):
        user = get_user_model().objects.filter(username=username, is_active=True, is_staff=True).first()
        if user is None:
            raise CommandError(f"No active admin named {username}.")
        return user

    def stalled_operation(self) -> ToolPayloadOperation | None:
        """The open operation, when no worker is on it: it stalled, or it is queued and no
        worker ever took it (a job cluster that runs would take it as soon, and the lease keeps
        the two from running it at once)."""
        op = ToolPayloadOperation.objects.filter(slot__isnull=False).first()
        if op is None:
            return None
        never_taken = op.state == OperationState.QUEUED and not op.lease
        return op if never_taken or service._progress_signs(op)["stalled"] else None

    def doc(self, op_id: int) -> dict:
        return service.operation_document(ToolPayloadOperation.objects.select_related("started_by").get(pk=op_id))

    def follow(self, op_id: int, *, here: bool, echo) -> dict:
        """Wait for the operation (and a cleanup that follows its backup), drawing progress;
        `echo(doc)` writes the backup's line before its cleanup's."""
        tty = sys.stderr.isatty() and not self.as_json
        hinted = False
        while True:
            # Here, a job the cluster holds ("busy") is waited for like any other
            ran = jobs.run_operation(op_id) if here else "busy"
            doc = self.doc(op_id)
            if tty:
                done, total = doc["progress"]["done"], doc["progress"]["total"]
                width = 30
                filled = int(width * done / total) if total else 0
                sys.stderr.write(f"\r{doc['kind']} #{op_id} [{'#' * filled}{'.' * (width - filled)}] "
                                 f"{done}/{total} {doc['state']}  ")
                sys.stderr.flush()
            if doc["state"] not in OPEN_STATES:
                break
            if doc["stalled"] and not hinted:
                hinted = True
                sys.stderr.write(("\n" if tty else "") + "No worker has taken it or shown progress for a while: is "
                                 "the job cluster running? (--here runs it in this process.)\n")
            if ran == "busy":
                time.sleep(1)
        if tty:
            sys.stderr.write("\n")
        if doc["kind"] == "backup" and doc["state"] == "succeeded":
            follow = ToolPayloadOperation.objects.filter(kind="cleanup", pk__gt=op_id).order_by("pk").first()
            if follow is not None:
                if not self.as_json:
                    echo(doc)
                # --json prints one document: the cleanup's, with the backup it waited for
                return {**self.follow(follow.pk, here=here, echo=echo), "preceded_by": doc}
        return doc

    def operation(self, doc: dict) -> None:
        if self.as_json:
            self.stdout.write(jsonlib.dumps(_json(doc), sort_keys=True))
            return
        self.stdout.write(self.line(doc))

    @staticmethod
    def line(doc: dict) -> str:
        """One operation as text. Figures only where they are a result, as on the screens: a
        completed or partial analysis, a completed or partial run (or one that removed anything
        before it ended), a completed compaction; a queued, running, cancelled or failed one
        says its state and error, never "0". The --json document keeps every figure."""
        line = f"{doc['kind']} #{doc['id']}: {doc['state']}"
        state, finished = doc["state"], doc["state"] not in OPEN_STATES
        if doc["kind"] == "compact":
            if state == "succeeded" and doc["before_bytes"] is not None and doc["after_bytes"] is not None:
                line += f"; database file {doc['before_bytes']} -> {doc['after_bytes']} bytes"
                if doc["before_reusable_bytes"] is not None and doc["after_reusable_bytes"] is not None:
                    line += f", reusable {doc['before_reusable_bytes']} -> {doc['after_reusable_bytes']} bytes"
        elif doc["kind"] == "backup":
            if doc["backup"]:
                line += (f"; {doc['backup']['name']}, {doc['backup']['size']} bytes, "
                         f"SHA-256 {doc['backup']['sha256']}")
        elif state in ("succeeded", "partial") or (
                doc["kind"] == "cleanup" and finished and doc["removed_messages"]):
            line += (f"; conversations {doc['eligible_conversations']}, messages {doc['eligible_messages']}, "
                     f"removed {doc['removed_messages']}, payload bytes {doc['payload_bytes']}")
            if doc["skipped"]:
                line += "; skipped " + ", ".join(f"{k} {v}" for k, v in sorted(doc["skipped"].items()))
        if doc["error"]:
            line += f"; {doc['error']['code']}: {doc['error']['message']}"
        if doc["cancel_requested"] and state in OPEN_STATES:
            line += "; cancel requested (it stops at its next check)"
        return line

    def show(self, doc: dict) -> None:
        if self.as_json:
            self.stdout.write(jsonlib.dumps(_json(doc), sort_keys=True))
            return
        policy = doc["policy"]
        analysis = doc["analysis_state"]
        if analysis == "running" and doc["last_analysis"]["state"] == OperationState.QUEUED:
            analysis = "queued"  # as its own line says: no worker has taken it yet
        self.stdout.write(
            f"cleanup {'on' if policy['enabled'] else 'off'}, "
            f"{policy['age']['value']} {_unit_label(policy['age']['unit'], policy['age']['value'])}, "
            f"revision {policy['revision']}; preparation {doc['preparation']['state']} "
            f"({doc['preparation']['choice'] or 'no choice'}); analysis {analysis}"
        )
        if doc["error"]:
            self.stdout.write(f"error {doc['error']['code']}: {doc['error']['message']}")
        preparation = doc["preparation"]
        if preparation["state"] in ("failed", "cancelled") and preparation["choice"] == "create":
            # what the card shows with its Retry and Cancel (r34: the command said only "failed")
            said = f"backup {preparation['state']}"
            if preparation["error"]:
                said += f": {preparation['error']}"
            self.stdout.write(f"{said} (tool_payloads retry --as ADMIN makes it again; tool_payloads "
                              "cancel-preparation --as ADMIN turns cleanup off)")
        if doc["next_check_at"]:
            self.stdout.write(f"next check {doc['next_check_at'].isoformat()}"
                              + (" (due: it runs when the job cluster next runs)"
                                 if jobs.check_is_due(doc["next_check_at"]) else ""))
        db = doc["database"]
        measured = db.get("reusable_measured_at")
        self.stdout.write(f"database {db['file_bytes']} bytes, reusable {db['reusable_bytes']} bytes"
                          + (f" (measured {measured.isoformat()})" if measured else ""))
        for op in doc["history"][:10]:
            self.operation(op)
