"""Bound delete: record here, erase on the engine, let the binding go only on the engine's receipt.

1. `request_bound_delete` (screen, API): the key answers with its recorded outcome ever
   after (422 for another conversation); a conversation with a delete under way answers
   with it, and a binding already let go with the delete that completed. A conversation
   listed again after its delete completed (its engine restored) is deleted anew.
   The engine is asked whether it offers delete at all: not offered is Unavailable
   (recorded under the key); not reachable is Pending (recorded, retried), or with
   `LIFECYCLE_OFFLINE_DELETE=refuse` an Unavailable answer that records nothing. The
   record, the cleared title copy and the job commit in one transaction; the binding stays.
2. `deliver` (the job, under a lease on the record): calls the engine's
   `DELETE /v1/threads/{id}` with the record's key, then follows the engine's operation
   until it is no longer pending. While the engine cannot be reached it waits (next retry
   stored, doubling up to REMOTE_RETRY_MAX_SECONDS) and tries again with the same key,
   so a lost answer costs nothing: the engine answers a repeated key with its recorded
   operation and erases nothing twice.
3. The engine's receipt is stored first (waiting on this console), then acknowledged: in
   one transaction the record turns Completed and the binding is deleted. A worker killed
   between the two asks the engine again with the same key and acknowledges then.
4. This console's copy of the title is then physically pending until a checkpoint (SQLite,
   tried at once) or finish_erasure (PostgreSQL) takes it out of the database's files
   (remote.physical).
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from lifecycle import audit, faults, fleet
from lifecycle.actions.request_deletion import check_key
from lifecycle.deletion.executor import figure, holder_alive, holder_id, lease_seconds
from lifecycle.deletion.reasons import message as reason_message
from lifecycle.engine.http import (
    CODE,
    EngineCredentialsRefused,
    EngineUnreachable,
    EngineUnsupported,
    HttpEngine,
)
from lifecycle.errors import ActionRefused
from lifecycle.item_payload import has_bad_text
from lifecycle.models import PhysicalState
from remote import physical, receipts
from remote.models import (
    BoundDelete,
    BoundDeleteKey,
    BoundDeleteState,
    EngineBinding,
    WaitingOn,
    engine_key_for,
    new_bound_delete_id,
)

# Seconds a job run follows the engine's erasure (or waits for a retry due soon) before it
# leaves the delete to the minute sweep: a job worker is never held for minutes by an engine that
# erases slowly or whose own job cluster is down (r40: two such deletes took both workers for
# 240 s at a time, and every other job of the console queued behind them).
RUN_BUDGET = 20
# What the minute sweep gives each due delete: about one look at the engine's operation.
SWEEP_EACH = 1
ENGINE_STATES = frozenset(BoundDeleteState.values)  # what an engine operation can be
SLEEP_WITHIN_RUN = 30  # a retry due sooner than this waits inside the run

ERRORS = {
    "engine_unreachable": gettext_lazy("The engine cannot be reached (no connection, a timeout, or its answer "
                                       "was lost). Waiting for the engine; it is retried by itself."),
    "engine_unsupported": gettext_lazy("The engine does not offer delete, so this conversation cannot be "
                                       "deleted there."),
    "engine_credentials_refused": gettext_lazy("The engine refused this console's token. An operator must "
                                               "set a valid ENGINE_TOKEN; it is retried by itself."),
    "engine_thread_unknown": gettext_lazy("The engine does not know this conversation."),
    "engine_key_conflict": gettext_lazy("The engine already used this operation key for another "
                                        "conversation."),
    "engine_offline": gettext_lazy("The engine cannot be reached, and this console is set to refuse deletes "
                                   "while it is offline. Nothing was recorded; try again when the engine is back."),
    "engine_error": gettext_lazy("The engine answered with an error."),
    "engine_stalled": gettext_lazy("The engine's erasure stopped several times without progress and is no "
                                   "longer retried by itself there: the engine's operator can retry it on the "
                                   "engine's page for this delete. This console keeps following it."),
    "engine_bad_answer": gettext_lazy("The engine's answer could not be used (not about this conversation, or "
                                      "not in the form expected). Nothing was taken from it; it is retried by "
                                      "itself."),
    "engine_not_configured": gettext_lazy("This console has no address and token for that engine (ENGINE_URL, "
                                          "or ENGINE_TOKENS for another engine), so nothing was sent to it."),
}

log = logging.getLogger(__name__)


def error_text(code: str) -> str:
    if not code:
        return ""
    if code in ERRORS:
        return str(ERRORS[code])
    return reason_message(code) or str(ERRORS["engine_error"])


class EngineNotConfigured(ActionRefused):
    def __init__(self) -> None:
        super().__init__("engine_not_configured", error_text("engine_not_configured"), status=409)


def engine_for(url: str) -> HttpEngine:
    """The engine a binding lives on: ENGINE_URL (blank), or another listed in ENGINE_TOKENS."""
    if not url or url.rstrip("/") == settings.ENGINE_URL.rstrip("/"):
        if not settings.ENGINE_URL:
            raise EngineNotConfigured()
        return HttpEngine()
    if url.rstrip("/") not in settings.ENGINE_TOKENS:
        raise EngineNotConfigured()
    return HttpEngine(url, settings.ENGINE_TOKENS[url.rstrip("/")])


def retry_delay(failures: int, asked: float | None = None) -> timedelta:
    """The wait before the next try: doubling from REMOTE_RETRY_SECONDS, and not sooner than
    the engine asked (its Retry-After), both capped at REMOTE_RETRY_MAX_SECONDS."""
    # (the exponent is bounded: 2**1024 is past what a float holds, and the cap is reached long before)
    seconds = max(settings.REMOTE_RETRY_SECONDS * 2 ** min(max(failures - 1, 0), 60), asked or 0)
    return timedelta(seconds=min(seconds, settings.REMOTE_RETRY_MAX_SECONDS))


# ---- the request ----------------------------------------------------------------------------


def _recorded(key: str, binding: EngineBinding) -> BoundDelete | None:
    known = BoundDeleteKey.objects.select_related("delete").filter(key=key).first()
    if known is None:
        return None
    op = known.delete
    if (op.engine_url, op.engine_id) != (binding.engine_url, binding.engine_id):
        raise ActionRefused("idempotency_key_reused",
                            _("This Idempotency-Key was already used for another conversation."), status=422)
    return op


def recorded_for_key(key: str) -> BoundDelete | None:
    known = BoundDeleteKey.objects.select_related("delete").filter(key=key).first()
    return known.delete if known else None


def released_delete(binding_ref: str) -> BoundDelete | None:
    """The delete that completed and let the binding of that id go (deliberately gone once the
    engine's receipt is acknowledged); None for a binding this console never let go."""
    return BoundDelete.objects.filter(binding_ref=binding_ref, state=BoundDeleteState.COMPLETED).order_by(
        "-completed_at", "-pk").first()


def request_released_delete(done: BoundDelete, *, key: str | None) -> tuple[BoundDelete, bool]:
    """A request for a binding its completed delete `done` let go (a form or an API call sent again
    after its answer was lost, or from a page shown before): the key answers with its recorded
    outcome, as ever (422 when it was used for another conversation); a new key answers with
    `done` and is remembered for it, as the engine answers a new key for a conversation it
    deleted, and as a request joins a delete under way (`_intent`). Returns the delete and
    whether the key is new to it."""
    key = check_key(key)
    row, created = BoundDeleteKey.objects.select_related("delete").get_or_create(key=key, defaults={"delete": done})
    op = row.delete
    if (op.engine_url, op.engine_id) != (done.engine_url, done.engine_id):
        raise ActionRefused("idempotency_key_reused",
                            _("This Idempotency-Key was already used for another conversation."), status=422)
    return op, created


def _probe(binding: EngineBinding) -> str:
    """"ok", "unsupported", "unconfigured" or "unreachable": does the engine offer delete now?"""
    try:
        engine = engine_for(binding.engine_url)
    except EngineNotConfigured:
        return "unconfigured"
    engine.retries = 0
    try:
        return "ok" if engine.supports_delete() else "unsupported"
    except EngineUnsupported:
        return "unsupported"
    except EngineCredentialsRefused:  # reached, and it said so: not "cannot be reached" (r40)
        return "credentials"
    except EngineUnreachable:
        return "unreachable"
    except ActionRefused:  # a refusal of the API document itself: the delete's own answer decides
        return "ok"


def _intent(binding: EngineBinding) -> BoundDelete | None:
    """The delete a new request for this binding joins: the one under way for its conversation;
    or, when the binding is gone, the one that completed and let it go. A binding of the same
    engine conversation that exists now was made after any completed delete (the engine listed
    the conversation again: restored from a backup), so it gets a delete of its own."""
    pending = BoundDelete.objects.filter(engine_url=binding.engine_url, engine_id=binding.engine_id,
                                         state=BoundDeleteState.PENDING).first()
    if pending is not None or EngineBinding.objects.filter(pk=binding.pk).exists():
        return pending
    return BoundDelete.objects.filter(engine_url=binding.engine_url, engine_id=binding.engine_id,
                                      state=BoundDeleteState.COMPLETED).order_by("-completed_at", "-pk").first()


def request_bound_delete(binding: EngineBinding, *, key: str | None, actor) -> BoundDelete:
    key = check_key(key)
    recorded = _recorded(key, binding)
    if recorded is not None:
        return recorded
    intent = _intent(binding)
    if intent is not None:
        BoundDeleteKey.objects.get_or_create(key=key, defaults={"delete": intent})
        return intent
    probe = _probe(binding)
    if probe == "unreachable" and settings.LIFECYCLE_OFFLINE_DELETE == "refuse":
        exc = ActionRefused("engine_offline", error_text("engine_offline"), status=409)
        exc.extra = {"outcome": BoundDeleteState.UNAVAILABLE}
        raise exc
    now = timezone.now()
    public_id = new_bound_delete_id()
    fields = {
        "public_id": public_id, "key": key, "engine_key": engine_key_for(public_id),
        "binding_ref": binding.public_id, "engine_url": binding.engine_url, "engine_id": binding.engine_id,
        "owner_kind": binding.owner_kind, "owner_id": binding.owner_id, "scope": binding.scope,
        "thread_id": binding.thread_id, "requested_by": actor if getattr(actor, "is_authenticated", False) else None,
        "requested_at": now,
    }
    try:
        with transaction.atomic():
            held = EngineBinding.objects.select_for_update().filter(pk=binding.pk).first()
            if held is None:
                raise ActionRefused("not_found", _("Nothing with that id exists here."), status=404)
            if probe in ("unsupported", "unconfigured"):
                code = "engine_unsupported" if probe == "unsupported" else "engine_not_configured"
                op = BoundDelete.objects.create(**fields, state=BoundDeleteState.UNAVAILABLE, code=code,
                                                completed_at=now)
            else:
                error = {"unreachable": "engine_unreachable", "credentials": "engine_credentials_refused"}.get(probe, "")
                op = BoundDelete.objects.create(
                    **fields, binding=held, state=BoundDeleteState.PENDING,
                    waiting_on=WaitingOn.CONSOLE if probe == "credentials" else WaitingOn.ENGINE,
                    last_error=error, last_error_at=now if error else None, next_attempt_at=now,
                )
                # The request is content-free; the list's copy of the title goes now.
                EngineBinding.objects.filter(pk=held.pk).update(title="")
                # Who asked, on this console (the engine is told no user): a console fact, with
                # the engine's conversation id and the delete's, never the title.
                audit.record("conversation.delete_requested", actor=actor,
                             old={"state": "live"}, new={"state": "pending_delete", **_audit_ids(op)})
                from django_q.tasks import async_task

                async_task("remote.tasks.deliver", op.pk, q_options={"ack_failure": True})
            BoundDeleteKey.objects.create(key=key, delete=op)
    except IntegrityError:
        # A request with the same key or for the same conversation raced this one: it stands.
        recorded = _recorded(key, binding)
        if recorded is not None:
            return recorded
        intent = _intent(binding)
        if intent is None:
            raise
        BoundDeleteKey.objects.get_or_create(key=key, defaults={"delete": intent})
        return intent
    return op


# ---- the job ----------------------------------------------------------------------------------


def _eligible(op: BoundDelete, now) -> bool:
    if op.state != BoundDeleteState.PENDING:
        return False
    return not (op.lease_holder and op.lease_expires_at and op.lease_expires_at > now and holder_alive(op.lease_holder))


def take_lease(pk: int) -> BoundDelete | None:
    with transaction.atomic():
        op = BoundDelete.objects.select_for_update().filter(pk=pk).first()
        now = timezone.now()
        if op is None or not _eligible(op, now):
            return None
        op.lease_holder = holder_id()
        op.lease_expires_at = now + timedelta(seconds=lease_seconds())
        op.save(update_fields=["lease_holder", "lease_expires_at"])
    return op


def _update(op: BoundDelete, **fields) -> None:
    """Write fields while this run still holds the lease; a run that lost it stops."""
    fields.setdefault("lease_expires_at", timezone.now() + timedelta(seconds=lease_seconds()))
    changed = BoundDelete.objects.filter(pk=op.pk, lease_holder=op.lease_holder,
                                         state=BoundDeleteState.PENDING).update(**fields)
    if not changed:
        raise LeaseLost(op.public_id)
    for name, value in fields.items():
        setattr(op, name, value)


class LeaseLost(Exception):
    pass


def _audit_ids(op: BoundDelete) -> dict[str, str]:
    """What a console audit fact names of a bound delete: ids only (content-free)."""
    return {"engine_conversation": op.engine_id, "delete": op.public_id}


def _finish(op: BoundDelete, state: str, code: str, way_out: dict | None = None) -> None:
    """Refused or Unavailable on the engine's word: the binding stays, the conversation too.
    An error met on the way (a retry's reason) is no longer current."""
    with transaction.atomic():
        _update(op, state=state, code=code, waiting_on=WaitingOn.NONE, completed_at=timezone.now(),
                next_attempt_at=None, lease_holder="", lease_expires_at=None, last_error="", last_error_at=None,
                way_out=way_out)
        audit.record("conversation.delete_ended", old={"state": "pending_delete"},
                     new={"state": "live", "outcome": state, "code": code, **_audit_ids(op)})


WAY_OUT_ROWS = 100


def way_out(answer) -> dict | None:
    """The subagent rows of unknown origin an engine names in a way out, as this console keeps
    them: each with an id that can name it (lifecycle.fleet.namable_id, the engine's own rule),
    and its status and times where they are short text; at most WAY_OUT_ROWS. None when it names none (an engine's answer
    is not trusted to have the shape)."""
    rows = answer.get("ambiguous") if isinstance(answer, dict) else None
    kept = []
    for row in rows if isinstance(rows, list) else []:
        agent_id = row.get("agent_id") if isinstance(row, dict) else None
        if not fleet.namable_id(agent_id):
            continue
        kept.append({"agent_id": agent_id, **{
            key: row[key] if isinstance(row.get(key), str) and len(row[key]) <= 64 and not has_bad_text(row[key])
            else None for key in ("status", "started_at", "finished_at")}})
        if len(kept) == WAY_OUT_ROWS:
            break
    return {"ambiguous": kept} if kept else None


def _title_back(op: BoundDelete, engine: HttpEngine) -> None:
    """The engine said no: its conversation stays, and so does the binding, which gets back the
    title its request cleared (read from the engine now; failing that, the next sync brings
    it back, as it does for any binding without a delete under way)."""
    try:
        row = engine.thread(op.engine_id)
    except Exception as exc:  # best effort: the list shows the thread id until the next sync
        log.info("title of %s not read back after its refused delete: %s", op.public_id, type(exc).__name__)
        return
    from remote.sync import copied_title

    # (only an answer about this conversation: an engine that answers another's gives no title)
    title = copied_title(row.get("title")) if isinstance(row, dict) else None
    if isinstance(row, dict) and row.get("id") == op.engine_id and row.get("state") == "live" and title is not None:
        # A conversation back after a completed delete keeps no title here (see remote.sync). A
        # title longer than a binding keeps is shortened as a sync shortens it.
        EngineBinding.objects.filter(pk=op.binding_id, title="", returned_after__isnull=True).exclude(
            deletes__state=BoundDeleteState.PENDING).update(title=title)


def acknowledge(op: BoundDelete) -> None:
    """The receipt is stored: Completed, and the binding is let go, in one transaction."""
    with transaction.atomic():
        held = BoundDelete.objects.select_for_update().get(pk=op.pk)
        if held.state != BoundDeleteState.PENDING or held.receipt is None:
            return
        binding_id = held.binding_id
        now = timezone.now()
        BoundDelete.objects.filter(pk=op.pk).update(
            state=BoundDeleteState.COMPLETED, waiting_on=WaitingOn.NONE, binding=None, acknowledged_at=now,
            completed_at=now, next_attempt_at=None, lease_holder="", lease_expires_at=None, last_error="",
            last_error_at=None, receipt_next_read_at=receipts.first_read_at(held.receipt, held.receipt_at or now, now),
            physical_state=PhysicalState.PENDING,
        )
        audit.record("conversation.deleted", old={"state": "pending_delete"},
                     new={"state": "deleted", **_audit_ids(held)})
        if binding_id is not None:
            # Earlier answers for it (refused, unavailable) keep its identity, not the link.
            BoundDelete.objects.filter(binding_id=binding_id).update(binding=None)
            EngineBinding.objects.filter(pk=binding_id).delete()
    # The binding's old rows (its title) stay in the database's files: SQLite's write-ahead log
    # until a checkpoint (busy: the minute sweep tries again); PostgreSQL's table files until
    # finish_erasure. Physically pending until then (remote.physical).
    physical.checkpoint()


def _attempt(op: BoundDelete, engine: HttpEngine) -> str:
    """One step: "completed", "refused", "unavailable", "engine" (still erasing) or "retry"."""
    now = timezone.now()
    following = bool(op.engine_operation and op.engine_state == "pending")
    try:
        if following:
            view = engine.operation(op.engine_operation)  # following an erasure the engine runs
        else:
            fields = {"attempts": op.attempts + 1}  # counted before the call: a killed run counts too
            if not op.engine_key and not op.attempts:  # recorded by older code, never sent: its own key
                fields["engine_key"] = engine_key_for(op.public_id)
            _update(op, **fields)
            view = engine.request_delete(op.engine_id, key=op.engine_key or op.key, actor=None)
    except (EngineUnreachable, EngineCredentialsRefused) as exc:
        waiting = WaitingOn.CONSOLE if isinstance(exc, EngineCredentialsRefused) else WaitingOn.ENGINE
        _update(op, last_error=exc.code, last_error_at=now, waiting_on=waiting, failures=op.failures + 1,
                next_attempt_at=now + retry_delay(op.failures + 1, asked=getattr(exc, "retry_after", None)))
        return "retry"
    except ActionRefused as exc:
        # Only the engine's own refusal of the delete itself, to a request no earlier one of
        # which may have reached it, ends the delete here ("nothing was deleted" is then true).
        # The engine admitted this delete once it gave an operation to follow, and an earlier
        # request whose answer was lost may have been applied: then no answer but the
        # operation's own state ends it (DESIGN 4.2: after the intent, Pending, never an end
        # state), and the same key is sent again.
        unsupported = isinstance(exc, EngineUnsupported)
        # Sent before: in an earlier run, or within this call (its answer lost, then sent again, r60).
        sent_before = op.attempts > 1 or getattr(exc, "resent", False)
        if following or exc.status >= 500 or (unsupported and sent_before):
            forget = following and exc.status == 404 and not unsupported  # the engine does not know that operation
            _update(op, last_error="engine_bad_answer" if unsupported else "engine_error", last_error_at=now,
                    waiting_on=WaitingOn.ENGINE, failures=op.failures + 1,
                    next_attempt_at=now + retry_delay(op.failures + 1),
                    **({"engine_operation": "", "engine_state": "", "engine_step": ""} if forget else {}))
            return "retry"
        if exc.status == 422 and not op.engine_key:
            # A delete recorded before engine_key (or by a server still on older code) sent the
            # client's key, which the engine used for another conversation: that proves the
            # engine never applied this request, so it goes on with a key of this console's own
            # (r20: it ended Unavailable, and asking again with the same key did too).
            _update(op, engine_key=engine_key_for(op.public_id), next_attempt_at=now)
            return "retry"
        if unsupported:
            _finish(op, BoundDeleteState.UNAVAILABLE, "engine_unsupported")
        else:
            _finish(op, BoundDeleteState.UNAVAILABLE,
                    {404: "engine_thread_unknown", 422: "engine_key_conflict"}.get(exc.status, exc.code))
        _title_back(op, engine)  # the conversation stays, as after the engine's own refusal (r16)
        return "unavailable"
    problem = _answer_problem(op, view)
    if problem:  # about another conversation or operation, or a receipt that cannot be kept
        log.warning("bound delete %s: the engine's answer was not used (%s)", op.public_id, problem)
        _update(op, last_error="engine_bad_answer", last_error_at=now, waiting_on=WaitingOn.ENGINE,
                failures=op.failures + 1, next_attempt_at=now + retry_delay(op.failures + 1))
        return "retry"
    step = view.step if isinstance(view.step, str) and len(view.step) <= 64 else ""
    # An engine's delete that stopped retrying itself waits for the engine's operator, not for
    # this console: said as such (it read "it is erasing the conversation").
    stalled = view.state == BoundDeleteState.PENDING and view.stalled
    # When it was first seen stalled; no error, no time (r75: a time was given beside no error)
    since = ({"last_error_at": now} if op.last_error != "engine_stalled" else {}) if stalled else {"last_error_at": None}
    _update(op, engine_operation=view.id, engine_state=view.state, engine_step=step,
            last_error="engine_stalled" if stalled else "", waiting_on=WaitingOn.ENGINE, next_attempt_at=None,
            failures=0, **since)
    if view.state in (BoundDeleteState.REFUSED, BoundDeleteState.UNAVAILABLE):
        code = view.code if isinstance(view.code, str) and CODE.fullmatch(view.code) else "engine_error"
        _finish(op, view.state, code, way_out(view.way_out))
        _title_back(op, engine)
        return view.state
    if view.state != BoundDeleteState.COMPLETED:
        return "engine"
    # The engine's receipt, as it gave it; then this console acknowledges it.
    _update(op, receipt=view.data.get("receipt"), receipt_at=view.completed_at, waiting_on=WaitingOn.CONSOLE)
    faults.kill_point("remote.acknowledge")
    acknowledge(op)
    return "completed"


def _answer_problem(op: BoundDelete, view) -> str:
    """Why the engine's operation answer cannot be taken for this delete, or "": it must be
    about this conversation (and the operation it follows, once known), and a completed one
    must carry a receipt of the shape the console stores and shows."""
    if view.target != op.engine_id:
        return f"target {view.target!r}"
    if op.engine_operation and view.id != op.engine_operation:
        return f"operation {view.id!r}"
    if view.state not in ENGINE_STATES:
        return f"state {view.state[:20]!r}"
    if view.state == BoundDeleteState.COMPLETED:
        if not receipt_is_usable(view.data.get("receipt")):
            return "receipt"
        if view.completed_at is not None and view.completed_at > timezone.now() + timedelta(days=1):
            return "completed in the future"  # (r43: year 9999 overflowed its dating)
    return ""


def receipt_is_usable(receipt) -> bool:
    """A receipt the console can store and show: an object whose `stores` and `kept` (when
    present) are objects with text names and actions and whole, non-negative record and byte
    counts, each kept fact's period (`days`) one this console can date."""
    if not isinstance(receipt, dict) or not receipt:
        return False
    for part in ("stores", "kept"):
        entries = receipt.get(part, [])
        if not isinstance(entries, list):
            return False
        for entry in entries:
            if not isinstance(entry, dict):
                return False
            for key in ("records", "bytes"):
                value = entry.get(key)
                if value is not None and figure(value) is None:  # (10**330 bytes failed every page, r46)
                    return False
            if any(key in entry and not isinstance(entry[key], str) for key in ("store", "action")):
                return False
            if part == "kept" and entry.get("days") is not None and receipts.period_days(entry["days"]) is None:
                return False
    return True


def deliver(pk: int, *, budget: float = RUN_BUDGET) -> str:
    """Run a bound delete as far as it goes in `budget` seconds; "busy" when another run holds it."""
    op = take_lease(pk)
    if op is None:
        current = BoundDelete.objects.filter(pk=pk).values_list("state", flat=True).first()
        return "busy" if current == BoundDeleteState.PENDING else (current or "missing")
    started = time.monotonic()
    outcome = "pending"
    try:
        try:
            engine = engine_for(op.engine_url)
        except EngineNotConfigured:
            _finish(op, BoundDeleteState.UNAVAILABLE, "engine_not_configured")
            return BoundDeleteState.UNAVAILABLE
        while True:
            outcome = _attempt(op, engine)
            if outcome not in ("retry", "engine"):
                return outcome
            wait = 1.0 if outcome == "engine" else (op.next_attempt_at - timezone.now()).total_seconds()
            if wait > SLEEP_WITHIN_RUN or time.monotonic() - started + max(wait, 0) > budget:
                return "pending"
            time.sleep(max(wait, 0))
    except LeaseLost:
        return "busy"
    finally:
        BoundDelete.objects.filter(pk=op.pk, lease_holder=op.lease_holder).update(lease_holder="",
                                                                                  lease_expires_at=None)


def due(now=None) -> list[int]:
    now = now or timezone.now()
    from django.db.models import Q

    return list(BoundDelete.objects.filter(state=BoundDeleteState.PENDING)
                .filter(Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now))
                .order_by("requested_at").values_list("pk", flat=True))


def postpone(pk: int) -> None:
    """A run of this delete stopped on an unexpected error: record it and try again after the
    back-off, leaving the lease (and the later deletes' turn) free."""
    now = timezone.now()
    op = BoundDelete.objects.filter(pk=pk, state=BoundDeleteState.PENDING).first()
    if op is None:
        return
    BoundDelete.objects.filter(pk=pk, state=BoundDeleteState.PENDING).update(
        last_error="engine_bad_answer", last_error_at=now, lease_holder="", lease_expires_at=None,
        failures=op.failures + 1, next_attempt_at=now + retry_delay(op.failures + 1))
