"""The console's side of conversations that live on a remote engine.

`EngineBinding` is the runtime binding: the owner-scoped cleanup identity of one conversation
on one engine (engine, owner, scope, raw thread id, the engine's conversation id). It is
what lets this console ask that engine to erase that conversation, so it is kept until the
engine's receipt is acknowledged: a `BoundDelete` holds it with PROTECT, and only the
acknowledgement (one transaction with Completed) lets it go.

`BoundDelete` is the console's record of one request to delete a bound conversation: the
operation key the engine is called with, which side it waits on, attempts, the next retry,
the last error, and in the end the engine's receipt, as the engine gave it. Once completed,
`physical_state` says whether this console's own old copy of the conversation's title (the
binding's rows, cleared and deleted) is still in its database's files (remote.physical).

A conversation the engine lists again after its delete completed here (the engine was
restored from a backup) gets a new binding marked `returned_after` that delete: listed
without its title, and deleted again by a new bound delete, never answered with the old one.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from lifecycle.models import PhysicalState


def new_binding_id() -> str:
    return "b_" + secrets.token_hex(10)


def new_bound_delete_id() -> str:
    return "bd_" + secrets.token_hex(10)


def engine_key_for(public_id: str) -> str:
    """The operation key a bound delete calls the engine with: named by this console's delete
    (random, so no other console's and no client's), the same on every retry."""
    return f"lethe-console-{public_id}"


class OwnerKind(models.TextChoices):
    ACCOUNT = "account", _("Account")
    COMPUTER = "computer", _("Computer")


class EngineBinding(models.Model):
    public_id = models.CharField(max_length=32, unique=True, default=new_binding_id, editable=False)
    # Blank: the engine at ENGINE_URL. Otherwise the URL of the engine the conversation lives on
    # (a computer's own engine, for its local-only conversations).
    engine_url = models.CharField(max_length=300, blank=True)
    engine_id = models.CharField(max_length=32)
    owner_kind = models.CharField(max_length=8, choices=OwnerKind.choices)
    owner_id = models.PositiveBigIntegerField()
    scope = models.CharField(max_length=8)
    thread_id = models.CharField(max_length=128)
    # A copy of the engine's title for the list; cleared as soon as a delete is requested.
    title = models.CharField(max_length=300, blank=True)
    engine_state = models.CharField(max_length=16, blank=True)
    last_activity_at = models.DateTimeField(null=True, blank=True)
    synced_at = models.DateTimeField(default=timezone.now)
    # The completed delete of this conversation that the engine listed it again after (it was
    # restored there): no title is copied, and a delete of it is a new one.
    returned_after = models.ForeignKey("BoundDelete", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="+")
    # When a read found the conversation deleted on the engine by other means (another console,
    # the engine itself) and cleared the title copied here: the old title is still in this
    # database's files until a checkpoint (SQLite) or finish_erasure (PostgreSQL); then None
    # again (remote.physical). A delete made through this console is followed by its BoundDelete.
    copy_pending_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-last_activity_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["engine_url", "engine_id"], name="binding_one_per_engine_thread"),
            # Equal raw thread ids under different owners are different conversations.
            models.UniqueConstraint(fields=["engine_url", "owner_kind", "owner_id", "thread_id"],
                                    name="binding_one_per_owner_thread"),
        ]
        indexes = [models.Index(fields=["owner_kind", "owner_id"], name="binding_owner_idx")]

    def __str__(self) -> str:
        return self.public_id


class BoundDeleteState(models.TextChoices):
    PENDING = "pending", pgettext_lazy("operation state", "Pending")
    COMPLETED = "completed", pgettext_lazy("operation state", "Completed")
    REFUSED = "refused", pgettext_lazy("operation state", "Refused")
    UNAVAILABLE = "unavailable", pgettext_lazy("operation state", "Unavailable")


class WaitingOn(models.TextChoices):
    NONE = "", _("Nothing")
    ENGINE = "engine", _("The engine")
    CONSOLE = "console", _("This console")


class BoundDelete(models.Model):
    public_id = models.CharField(max_length=32, unique=True, default=new_bound_delete_id, editable=False)
    key = models.CharField(max_length=200, unique=True)
    # The operation key the engine is called with: this console's own (`engine_key_for`), never
    # a client's key, which the engine may know for another conversation (asked of it directly,
    # or through another console). "" on a delete recorded before it existed (or by a server
    # still running older code: hence the database default), which sends `key` as it did.
    engine_key = models.CharField(max_length=200, blank=True, default="", db_default="")
    binding = models.ForeignKey(EngineBinding, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="deletes")
    # The binding's identity, kept after the binding is released (content-free).
    binding_ref = models.CharField(max_length=32)
    engine_url = models.CharField(max_length=300, blank=True)
    engine_id = models.CharField(max_length=32)
    owner_kind = models.CharField(max_length=8, choices=OwnerKind.choices)
    owner_id = models.PositiveBigIntegerField()
    scope = models.CharField(max_length=8)
    thread_id = models.CharField(max_length=128)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+")
    requested_at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=12, choices=BoundDeleteState.choices)
    code = models.CharField(max_length=64, blank=True)
    waiting_on = models.CharField(max_length=8, choices=WaitingOn.choices, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Calls in a row that met no usable answer (no answer, one not used, an error): the wait
    # before the next doubles with them, and the engine's usable answer resets them. `attempts`
    # counts only the delete's own requests, so following an accepted erasure never waited
    # longer (r60). A database default too, for a server still running older code.
    failures = models.PositiveIntegerField(default=0, db_default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=64, blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    lease_holder = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    engine_operation = models.CharField(max_length=32, blank=True)
    engine_state = models.CharField(max_length=12, blank=True)
    engine_step = models.CharField(max_length=64, blank=True)
    receipt = models.JSONField(null=True, blank=True)
    receipt_at = models.DateTimeField(null=True, blank=True)
    # The engine's receipt is read again while it keeps facts that expire (remote.receipts):
    # when it was last read, and when it is to be read next (None: nothing left to expire).
    receipt_read_at = models.DateTimeField(null=True, blank=True)
    receipt_next_read_at = models.DateTimeField(null=True, blank=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    # Completed: this console's copy of the title, gone from its rows, is still in its database's
    # files (pending) until a checkpoint (SQLite) or finish_erasure (PostgreSQL) removes it.
    # A database default too: a server still running older code inserts without it (remote 0005);
    # a Completed one with "" was acknowledged by such a server and is pending (remote.physical).
    physical_state = models.CharField(max_length=8, choices=PhysicalState.choices, default="", db_default="",
                                      blank=True)
    physically_erased_at = models.DateTimeField(null=True, blank=True)
    # Refused or Unavailable while subagent rows of unknown origin on the engine overlap the conversation:
    # those rows as the engine named them ({"ambiguous": [{agent_id, status, started_at,
    # finished_at}]}, checked: remote.delivery.way_out), so the page can say which to resolve there.
    way_out = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.CheckConstraint(name="bound_delete_state_valid",
                                   condition=Q(state__in=["pending", "completed", "refused", "unavailable"])),
            # Completed only with the engine's receipt, acknowledged, and the binding let go.
            models.CheckConstraint(
                name="bound_delete_completed_has_receipt",
                condition=~Q(state="completed") | Q(receipt__isnull=False, acknowledged_at__isnull=False,
                                                    binding__isnull=True),
            ),
            # One delete under way per conversation. Completed ones may be several: a conversation
            # restored on its engine after its delete is deleted again.
            models.UniqueConstraint(fields=["engine_url", "engine_id"], condition=Q(state="pending"),
                                    name="bound_delete_one_pending"),
        ]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="bound_delete_due_idx"),
            models.Index(fields=["receipt_next_read_at"], name="bound_delete_reread_idx",
                         condition=Q(receipt_next_read_at__isnull=False)),
            # Who asked is forgotten the audit period after the request (remote.tasks.hourly).
            models.Index(fields=["requested_at"], name="bound_delete_requester_idx",
                         condition=Q(requested_by__isnull=False)),
            # The delete that let a binding go, found by its id (delivery.released_delete: a form or
            # an API request sent again after the binding is gone).
            models.Index(fields=["binding_ref", "state"], name="bound_delete_released_idx"),
        ]

    def __str__(self) -> str:
        return self.public_id


class BoundDeleteKey(models.Model):
    """Every operation key a bound delete answers to: the first one and any later request's key
    for the same conversation (the engine is called with the delete's own `engine_key`)."""

    key = models.CharField(max_length=200, unique=True)
    delete = models.ForeignKey(BoundDelete, on_delete=models.CASCADE, related_name="keys")
    created_at = models.DateTimeField(default=timezone.now)


class EngineRead(models.Model):
    """The last reads of one engine's list of conversations (`remote.sync.refresh`: the hourly
    job, Read from the engine, `sync_bindings`, the API), so the list can say that the latest
    read failed and why, rather than only how old its rows are. One row per engine, written when
    a read begins and when it ends; content-free (an engine's own refusal words, at most 500
    characters)."""

    # Blank: the engine at ENGINE_URL, as a binding's engine_url.
    engine_url = models.CharField(max_length=300, blank=True, unique=True)
    # When the latest read began, and the last sign of life of a read under way (its start, each
    # page it wrote): one that began and never ended (its job's time limit, a kill) is told apart
    # from one still running by how long it has been quiet (r71: such a read was not recorded;
    # r73: a long read started by the button was said to have stopped while it ran).
    started_at = models.DateTimeField(null=True, blank=True)
    active_at = models.DateTimeField(null=True, blank=True)
    # When the last read that went through the whole list began (its bindings' synced_at).
    read_at = models.DateTimeField(null=True, blank=True)
    # When the last failed read began, and why: an engine_ code, or the engine's own refusal
    # (its code and words). Shown while no whole read began after it.
    failed_at = models.DateTimeField(null=True, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.CharField(max_length=500, blank=True)
    # The rows the last whole read left out (not conversations this console can keep):
    # {"count": n, "named": [{"id": engine id or None, "field": the field not taken}, ...]}, the
    # first NAMED_REJECTED named; None when it took every row. Ids and field names only (the
    # hourly read's were only logged: the list said "as the engine listed them" without them).
    rejected = models.JSONField(null=True, blank=True)

    def __str__(self) -> str:
        return self.engine_url or "ENGINE_URL"

    @property
    def state(self) -> str:
        """How the latest read went: never (none began), ok, failed, reading (under way), or
        unfinished (it never ended, and no read has shown a sign of life for longer than reading
        one page may take)."""
        latest = max(filter(None, (self.started_at, self.read_at, self.failed_at)), default=None)
        if latest is None:
            return "never"
        if self.read_at == latest:
            return "ok"
        if self.failed_at == latest:
            return "failed"
        alive = max(filter(None, (self.active_at, latest)))
        return "reading" if alive > timezone.now() - quiet_limit() else "unfinished"


def quiet_limit():
    """Longer than a read under way goes without a sign of life: the longest one page of the
    engine's list may take (each try's connect and read time limits), and a margin. Read when
    asked (tests change the settings)."""
    from datetime import timedelta

    page = (settings.ENGINE_CONNECT_TIMEOUT + settings.ENGINE_READ_TIMEOUT) * (settings.ENGINE_RETRIES + 1)
    return timedelta(seconds=page + 60)
