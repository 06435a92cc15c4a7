"""The conversation store: identity, content, runtime facts and retained facts.

A conversation's content lives in these tables and in the engine folder (see
`lifecycle.enginefs`). Every model that refers to a conversation declares a retention
class in `lifecycle.registry`; the system check in `lifecycle.checks` enforces it.
"""

from __future__ import annotations

import secrets
from datetime import datetime

from django.conf import settings
from django.db import models, transaction
from django.db.models import Exists, F, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy

from lifecycle.search import fold


def new_public_id() -> str:
    # Opaque and unguessable: a URL never reveals the raw thread id or the owner.
    return "c_" + secrets.token_hex(10)


class OwnerQuerySet(models.QuerySet):
    """An owner's name folded for the Owner finder (`search_name`, lifecycle.search), kept in
    step on every ORM write that can set the name: save() on the model, and these three."""

    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        for obj in objs:
            obj.search_name = fold(obj.name)
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, objs, fields, *args, **kwargs):
        objs, fields = list(objs), list(fields)
        if "name" in fields:
            for obj in objs:
                obj.search_name = fold(obj.name)
            fields += [] if "search_name" in fields else ["search_name"]
        return super().bulk_update(objs, fields, *args, **kwargs)

    def update(self, **kwargs):
        if "name" in kwargs and "search_name" not in kwargs:
            if not isinstance(kwargs["name"], str):
                raise TypeError("an owner's name is set as text, so its folded name can be set with it")
            kwargs["search_name"] = fold(kwargs["name"])
        return super().update(**kwargs)


class Owner(models.Model):
    """What accounts and computers share: a name, and that name folded for the Owner finder
    (case and accents ignored the same on both databases, r95)."""

    name = models.CharField(_("name"), max_length=120)
    search_name = models.TextField(null=True, blank=True, editable=False)  # fold(name); derived
    created_at = models.DateTimeField(default=timezone.now)

    objects = OwnerQuerySet.as_manager()

    class Meta:
        abstract = True
        ordering = ["name", "id"]

    def save(self, *args, **kwargs) -> None:
        self.search_name = fold(self.name)
        update_fields = kwargs.get("update_fields")
        if update_fields is not None and "name" in update_fields:
            kwargs["update_fields"] = {*update_fields, "search_name"}
        super().save(*args, **kwargs)


class Account(Owner):
    def __str__(self) -> str:
        return self.name

    @property
    def owner_key(self) -> str:
        return f"account:{self.pk}"


class Computer(Owner):
    account = models.ForeignKey(
        Account, null=True, blank=True, on_delete=models.SET_NULL, related_name="computers"
    )

    def __str__(self) -> str:
        return self.name

    @property
    def owner_key(self) -> str:
        return f"computer:{self.pk}"


class Scope(models.TextChoices):
    BOUND = "bound", _("Account-managed")
    LOCAL = "local", _("Local to a computer")


class ConversationState(models.TextChoices):
    LIVE = "live", _("Live")
    PENDING_DELETE = "pending_delete", _("Pending delete")
    DELETED = "deleted", _("Deleted")


class TurnState(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    DONE = "done", _("Done")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")
    INTERRUPTED = "interrupted", _("Interrupted")


ACTIVE_TURN_STATES = (TurnState.QUEUED, TurnState.RUNNING)


# The folded search columns, by the column each is folded from.
FOLDED = {"title": "search_title", "thread_id": "search_thread"}


class ConversationQuerySet(models.QuerySet):
    def live(self) -> ConversationQuerySet:
        return self.filter(state=ConversationState.LIVE)

    def recent(self) -> ConversationQuerySet:
        return self.live().filter(archived_at__isnull=True, closed_at__isnull=True)

    def archived(self) -> ConversationQuerySet:
        return self.live().filter(archived_at__isnull=False)

    def closed(self) -> ConversationQuerySet:
        return self.live().filter(archived_at__isnull=True, closed_at__isnull=False)

    def pending_delete(self) -> ConversationQuerySet:
        return self.filter(state=ConversationState.PENDING_DELETE)

    def deleted(self) -> ConversationQuerySet:
        """Tombstones: the identity row of a conversation whose content is erased."""
        return self.filter(state=ConversationState.DELETED)

    def inactive_since(self, moment: datetime) -> ConversationQuerySet:
        return self.filter(last_activity_at__lt=moment)

    def owned_by(self, kind: str, owner_id: int) -> ConversationQuerySet:
        if kind == "account":
            return self.filter(account_id=owner_id)
        if kind == "computer":
            return self.filter(computer_id=owner_id)
        return self.none()

    def search(self, text: str) -> ConversationQuerySet:
        """Title or thread id contains the text, ignoring case, accents and invisible characters
        (`lifecycle.search`).

        Only a live conversation's title is searched: from its delete intent on the title is
        content being erased, not shown (`Conversation.shown_title`), so it finds nothing.
        """
        folded = fold(text)
        if not folded:
            return self
        return self.filter(Q(search_title__contains=folded, state=ConversationState.LIVE)
                           | Q(search_thread__contains=folded))

    # Every write path that can set a title or thread id keeps the folded columns in step:
    # save() on the model, and these three on the queryset (bulk writes skip save()).
    def bulk_create(self, objs, *args, **kwargs):
        objs = list(objs)
        for obj in objs:
            obj.fold_for_search()
        return super().bulk_create(objs, *args, **kwargs)

    def bulk_update(self, objs, fields, *args, **kwargs):
        objs, fields = list(objs), list(fields)
        for obj in objs:
            obj.fold_for_search()
        fields += [FOLDED[f] for f in FOLDED if f in fields and FOLDED[f] not in fields]
        return super().bulk_update(objs, fields, *args, **kwargs)

    def update(self, **kwargs):
        computed = []
        for source, folded in FOLDED.items():
            if source in kwargs and folded not in kwargs:
                if isinstance(kwargs[source], str):
                    kwargs[folded] = fold(kwargs[source])  # one statement: title and its fold together
                else:
                    computed.append(source)  # an expression: fold what it stored
        if not computed:
            return super().update(**kwargs)
        with transaction.atomic(using=self.db):
            pks = list(self.values_list("pk", flat=True))
            count = super().update(**kwargs)
            Conversation.refresh_search_columns(pks, using=self.db)
        return count

    def with_activity(self) -> ConversationQuerySet:
        running = Turn.objects.filter(conversation=OuterRef("pk"), state__in=ACTIVE_TURN_STATES)
        return self.annotate(is_active=Exists(running))

    def with_delete_operation(self) -> ConversationQuerySet:
        """`delete_op`: the public id of the conversation's delete intent, if it has one;
        `deleted_at`: when that delete completed (None while it is pending)."""
        intent = DeleteOperation.objects.filter(conversation=OuterRef("pk"), state__in=INTENT_STATES)
        return self.annotate(delete_op=Subquery(intent.values("public_id")[:1]),
                             deleted_at=Subquery(intent.values("completed_at")[:1]))


class Conversation(models.Model):
    """One conversation, identified by (owner, scope, raw thread id).

    The row itself is the identity; after a delete it stays as the tombstone (no title,
    no content), so its public id keeps answering lookups.
    """

    public_id = models.CharField(max_length=32, unique=True, default=new_public_id, editable=False)
    account = models.ForeignKey(
        Account, null=True, blank=True, on_delete=models.PROTECT, related_name="conversations"
    )
    computer = models.ForeignKey(
        Computer, null=True, blank=True, on_delete=models.PROTECT, related_name="conversations"
    )
    scope = models.CharField(max_length=8, choices=Scope.choices)
    thread_id = models.CharField(_("thread id"), max_length=128)
    title = models.CharField(_("title"), max_length=300, blank=True)
    # Title and thread id folded for search (lifecycle.search); derived, never edited. The
    # folded title is conversation content like the title, and is erased with it.
    search_title = models.TextField(null=True, blank=True, editable=False)
    search_thread = models.TextField(null=True, blank=True, editable=False)
    state = models.CharField(
        max_length=16, choices=ConversationState.choices, default=ConversationState.LIVE
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_activity_at = models.DateTimeField(default=timezone.now)
    archived_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    # When it last moved between the list's tabs (archived, unarchived, closed, resumed, its
    # delete asked for or completed): a list paged from before that moment counts it as changed
    # instead of missing it on a page already read (lifecycle.paging).
    view_changed_at = models.DateTimeField(null=True, blank=True, db_index=True)

    objects = ConversationQuerySet.as_manager()

    class Meta:
        ordering = ["-last_activity_at", "-id"]
        constraints = [
            models.CheckConstraint(
                name="conversation_owner_matches_scope",
                condition=(
                    Q(scope="bound", account__isnull=False, computer__isnull=True)
                    | Q(scope="local", computer__isnull=False, account__isnull=True)
                ),
            ),
            models.UniqueConstraint(
                fields=["account", "thread_id"],
                condition=Q(account__isnull=False),
                name="conversation_unique_thread_per_account",
            ),
            models.UniqueConstraint(
                fields=["computer", "thread_id"],
                condition=Q(computer__isnull=False),
                name="conversation_unique_thread_per_computer",
            ),
            models.CheckConstraint(
                name="conversation_state_valid",
                condition=Q(state__in=["live", "pending_delete", "deleted"]),
            ),
        ]
        indexes = [
            models.Index(fields=["state", "-last_activity_at", "-id"], name="conv_state_activity_idx"),
            models.Index(fields=["last_activity_at"], name="conv_activity_idx"),
            # The Deleted tab's order, newest deletion first (lifecycle.paging.listing): without it
            # every page sorted every tombstone, and tombstones only pile up (r18).
            models.Index(Coalesce("view_changed_at", "last_activity_at").desc(), F("id").desc(),
                         condition=Q(state="deleted"), name="conv_deleted_order_idx"),
        ]

    def __str__(self) -> str:
        return self.shown_title or self.thread_id

    def save(self, *args, **kwargs) -> None:
        self.fold_for_search()
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, *(FOLDED[f] for f in FOLDED if f in update_fields)}
        super().save(*args, **kwargs)

    @property
    def shown_title(self) -> str:
        """The title, while the conversation is live. From its delete intent on, the title is
        content being erased ("its content is being erased", the pages say): it is not shown
        or served, and the conversation goes by its thread id, like its tombstone."""
        return self.title if self.state == ConversationState.LIVE else ""

    def fold_for_search(self) -> None:
        self.search_title, self.search_thread = fold(self.title), fold(self.thread_id)

    @classmethod
    def refresh_search_columns(cls, pks, *, using: str = "default", batch: int = 500) -> None:
        """Fold the stored title and thread id of these conversations again."""
        pks = list(pks)
        for start in range(0, len(pks), batch):
            rows = list(
                cls.objects.using(using).filter(pk__in=pks[start:start + batch]).only("pk", "title", "thread_id")
            )
            for row in rows:
                row.fold_for_search()
            models.QuerySet(cls, using=using).bulk_update(rows, list(FOLDED.values()))

    @property
    def owner(self) -> Account | Computer:
        return self.account if self.scope == Scope.BOUND else self.computer  # type: ignore[return-value]

    @property
    def owner_kind(self) -> str:
        return "account" if self.scope == Scope.BOUND else "computer"

    @property
    def owner_id(self) -> int:
        return self.account_id if self.scope == Scope.BOUND else self.computer_id  # type: ignore[return-value]

    @property
    def storage_key(self) -> str:
        """The folder name under the engine home. Raw thread ids collide across owners."""
        return self.public_id


class Turn(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turns")
    seq = models.PositiveIntegerField()
    state = models.CharField(max_length=12, choices=TurnState.choices, default=TurnState.DONE)
    started_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="turn_unique_seq"),
        ]
        indexes = [
            # "Is it active?" is asked for every listed conversation; only a few turns are
            # queued or running at any time, so this index stays tiny.
            models.Index(
                fields=["conversation"], name="turn_active_idx", condition=Q(state__in=["queued", "running"])
            ),
        ]


class Role(models.TextChoices):
    USER = "user", _("User")
    ASSISTANT = "assistant", _("Assistant")
    TOOL = "tool", _("Tool")


class ToolKind(models.TextChoices):
    SHELL = "shell", _("Shell")
    READ_FILE = "read_file", _("Read file")
    EDIT_FILE = "edit_file", _("Edit file")
    SEARCH = "search", _("Search")
    HTTP = "http", _("Web request")
    GENERIC = "generic", _("Tool")
    PLAN = "plan", _("Plan")
    TODO = "todo", _("To-do list")
    SUBAGENT_TASK = "subagent_task", _("Subagent task")
    BACKGROUND_WORK = "background_work", _("Background work")
    MONITOR = "monitor", _("Monitor")


class ItemStatus(models.TextChoices):
    PENDING = "pending", _("Pending")
    RUNNING = "running", _("Running")
    COMPLETED = "completed", _("Completed")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class CanonicalJSONField(models.JSONField):
    """A JSONField that stores the canonical form (compact, sorted keys, UTF-8 without
    escapes) on every engine, so `payload_bytes` is the stored size: Django's default
    writes `\\uXXXX` escapes on SQLite (six bytes for a three-byte character)."""

    def __init__(self, *args, **kwargs):
        from retention.reducer import CanonicalEncoder

        kwargs["encoder"] = CanonicalEncoder
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs.pop("encoder", None)
        return name, path, args, kwargs


class Item(models.Model):
    """A message in a conversation. Tool items carry a kind, a status and a JSON payload.

    `payload_bytes` is the stored size of the payload and `removable_bytes` what the tool
    payload reducer would remove from it; both are computed when the item is written, so
    analysis is a SUM over an index and cleanup walks primary-key batches.
    """

    id = models.BigAutoField(primary_key=True)
    # No index of its own: item_unique_seq (conversation, seq) serves every lookup by
    # conversation, and the next seq is read backwards on it (see append_item).
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="items", db_index=False)
    turn = models.ForeignKey(Turn, null=True, blank=True, on_delete=models.SET_NULL, related_name="items")
    seq = models.PositiveBigIntegerField()
    role = models.CharField(max_length=12, choices=Role.choices)
    tool_kind = models.CharField(max_length=20, choices=ToolKind.choices, blank=True)
    tool_call_id = models.CharField(max_length=80, blank=True)
    status = models.CharField(max_length=12, choices=ItemStatus.choices, blank=True)
    title = models.CharField(max_length=300, blank=True)
    content = models.TextField(blank=True)
    payload = CanonicalJSONField(null=True, blank=True)
    payload_bytes = models.PositiveIntegerField(default=0)
    removable_bytes = models.PositiveIntegerField(default=0)
    # The reducer's skip reason, stored when the item is written ("" when it is eligible
    # or is not a tool item), so analysis counts skips by reason without reading payloads.
    payload_skip = models.CharField(max_length=16, blank=True, default="", db_default="")
    # Set when tool payload cleanup removed this item's details; never cleared.
    details_removed_at = models.DateTimeField(null=True, blank=True)
    # What cleanup would write into the marker besides its time (the removed fields and the
    # size of their values, canonical JSON), stored with the payload it describes and the
    # same revision; NULL when nothing would be removed, or for kinds reduced in Python.
    # With it cleanup rewrites the row in SQL without reading the payload.
    removal_plan = models.TextField(null=True, blank=True)
    revision = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    # The Idempotency-Key the runtime appended it with, if any: a retry with the same key
    # answers with this item instead of appending it twice (lifecycle.actions.append_item).
    client_key = models.CharField(max_length=200, null=True, blank=True, editable=False)
    # A digest of the append the key came with (its role, kind, call id, status, title, text and
    # payload as sent): a retry must send the same request; later updates do not change it. ""
    # when no key was sent, for items appended before it was kept, and once cleanup removed the
    # item's details (no trace of the removed payload stays); then the retry is compared with
    # what the item still holds (role, kind, call id, text).
    client_key_digest = models.CharField(max_length=64, blank=True, default="", db_default="", editable=False)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="item_unique_seq"),
            models.UniqueConstraint(fields=["conversation", "client_key"], condition=Q(client_key__isnull=False),
                                    name="item_one_per_client_key"),
            models.CheckConstraint(
                name="item_tool_fields_only_on_tool_items",
                condition=Q(role="tool") | Q(tool_kind="", payload__isnull=True),
            ),
        ]
        indexes = [
            # Analysis: SUM(removable_bytes) per conversation without touching payloads; cleanup:
            # the next removable items after its (conversation, item) cursor, a range of this
            # index however large the conversation, and their sizes for its byte budget.
            models.Index(
                fields=["conversation", "id", "removable_bytes", "payload_bytes"],
                name="item_removable_keyset_idx",
                condition=Q(removable_bytes__gt=0),
            ),
            # Analysis: skipped tool items per conversation and reason, without payloads.
            models.Index(
                fields=["conversation", "payload_skip"],
                name="item_payload_skip_idx",
                condition=~Q(payload_skip=""),
            ),
        ]


class Goal(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="goals")
    text = models.TextField()
    status = models.CharField(max_length=16, default="open")
    created_at = models.DateTimeField(default=timezone.now)


class MailEnvelope(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="mail")
    sender = models.CharField(max_length=200)
    recipient = models.CharField(max_length=200)
    subject = models.CharField(max_length=300)
    body = models.TextField()
    sent_at = models.DateTimeField(default=timezone.now)


class SessionDocument(models.Model):
    conversation = models.ForeignKey(
        Conversation, on_delete=models.CASCADE, related_name="session_documents"
    )
    name = models.CharField(max_length=200)
    document = models.JSONField()
    saved_at = models.DateTimeField(default=timezone.now)


class BranchJournalEntry(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="branch_journal")
    seq = models.PositiveIntegerField()
    branch = models.CharField(max_length=80)
    entry = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)


class Checkpoint(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="checkpoints")
    label = models.CharField(max_length=200)
    snapshot = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)


class RecoveryKind(models.TextChoices):
    PRE_IMPORT_ARCHIVE = "pre_import_archive", _("Pre-import archive")
    RECOVERY_SNAPSHOT = "recovery_snapshot", _("Recovery snapshot")


class RecoveryMaterial(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="recovery_material")
    kind = models.CharField(max_length=24, choices=RecoveryKind.choices)
    body = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)


class OperationOutcome(models.TextChoices):
    APPLIED = "applied", _("Applied")
    REJECTED = "rejected", _("Rejected")
    SUPERSEDED = "superseded", _("Superseded")


class OperationBinding(models.Model):
    """Binds a turn operation to the conversation, for idempotent retry.

    On delete it compacts to operation id, target id, timestamp and outcome.
    """

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="operation_bindings")
    operation_id = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    outcome = models.CharField(max_length=12, choices=OperationOutcome.choices)
    created_at = models.DateTimeField(default=timezone.now)
    request = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["conversation", "operation_id"], name="binding_unique_op"),
        ]


class HistoryReceipt(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="history_receipts")
    operation_id = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    outcome = models.CharField(max_length=12, choices=OperationOutcome.choices)
    created_at = models.DateTimeField(default=timezone.now)
    detail = models.JSONField(null=True, blank=True)


class SharedLink(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="shared_links")
    token = models.CharField(max_length=64, unique=True)
    publisher = models.CharField(max_length=80)
    publisher_supports_revoke = models.BooleanField(default=True)
    published_at = models.DateTimeField(default=timezone.now)
    revoked_at = models.DateTimeField(null=True, blank=True)


class Export(models.Model):
    # Retain-detach: on delete the file stays where the user saved it; only the link goes.
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="exports"
    )
    path = models.CharField(max_length=500)
    size_bytes = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)


class WorkspaceFile(models.Model):
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="workspace_files"
    )
    path = models.CharField(max_length=500)
    size_bytes = models.PositiveBigIntegerField(default=0)
    written_at = models.DateTimeField(default=timezone.now)


class MemoryScope(models.TextChoices):
    PROJECT = "project", _("Project memory")
    LEARNED = "learned", _("Learned memory")


class MemoryEntry(models.Model):
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="memory_entries"
    )
    scope = models.CharField(max_length=12, choices=MemoryScope.choices)
    text = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)


class UsageFact(models.Model):
    """Content-free metering: token counts only."""

    conversation = models.ForeignKey(Conversation, on_delete=models.PROTECT, related_name="usage_facts")
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["recorded_at"], name="usage_recorded_idx")]


class BillingFact(models.Model):
    conversation = models.ForeignKey(Conversation, on_delete=models.PROTECT, related_name="billing_facts")
    amount_minor = models.BigIntegerField()
    currency = models.CharField(max_length=3, default="USD")
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["recorded_at"], name="billing_recorded_idx")]


class AuditFact(models.Model):
    """Who did what, when, with old and new values; never conversation content."""

    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_facts"
    )
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    action = models.CharField(max_length=64)
    old_value = models.JSONField(null=True, blank=True)
    new_value = models.JSONField(null=True, blank=True)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [
            models.Index(fields=["recorded_at"], name="audit_recorded_idx"),
            # The hourly expiry of the console's own facts (no conversation) finds the due ones
            # here, and none without reading any row (lifecycle.actions.expire_facts).
            models.Index(fields=["conversation", "recorded_at"], name="audit_console_recorded_idx",
                         condition=Q(conversation__isnull=True)),
        ]


class ClaimKind(models.TextChoices):
    APPROVAL = "approval", _("Pending approval")
    USER_INPUT = "user_input", _("Pending user input")
    DYNAMIC_TOOL = "dynamic_tool", _("Dynamic tool")
    SHELL_JOB = "shell_job", _("Live shell job")
    TASK = "task", _("Task ownership")
    AUTOMATION = "automation", _("Automation ownership")


class RuntimeClaimQuerySet(models.QuerySet):
    def open(self) -> RuntimeClaimQuerySet:
        return self.filter(resolved_at__isnull=True)


class RuntimeClaim(models.Model):
    """Live runtime work that ties a conversation down (what delete admission checks)."""

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="runtime_claims")
    kind = models.CharField(max_length=16, choices=ClaimKind.choices)
    label = models.CharField(max_length=300, blank=True)
    opened_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = RuntimeClaimQuerySet.as_manager()

    class Meta:
        indexes = [models.Index(fields=["conversation", "resolved_at"], name="claim_open_idx")]


class ProcessLease(models.Model):
    """The engine process lease that Close releases."""

    conversation = models.OneToOneField(Conversation, on_delete=models.CASCADE, related_name="lease")
    holder = models.CharField(max_length=120)
    workers = models.PositiveSmallIntegerField(default=1)
    acquired_at = models.DateTimeField(default=timezone.now)


class EngineFolderMark(models.Model):
    """The id in the mark of the engine folder this database uses (a singleton, id 1); see
    lifecycle.engine_folder."""

    folder_id = models.CharField(max_length=32)
    marked_at = models.DateTimeField(default=timezone.now)
    # Where the database that recorded the mark was (retention.backups.database_key): a copy of
    # it elsewhere (restored into another database, the file moved) carries the same row, and
    # must not take the folder for its own while the original may still erase in it.
    database_key = models.CharField(max_length=32, blank=True, default="")
    # The keys this database had before (a copy that took the folder over keeps its original's):
    # their backups hold its content too (retention.backups.own_keys).
    origin_keys = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"engine folder {self.folder_id}"


class SubagentResolution(models.Model):
    """A resolution of a subagent row under way (lifecycle.actions.resolve_subagent): committed
    before the fleet files change, removed in the commit that records its audit fact. One left
    behind is a resolution cut short (a killed process) after the files may have changed: the
    retry and the every-minute recovery finish it and record its fact. Holds no content: the
    row's agent id, the action, the conversation's public id and who asked."""

    agent_id = models.CharField(max_length=256, unique=True)
    action = models.CharField(max_length=16)
    conversation_public_id = models.CharField(max_length=32, blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    made_at = models.DateTimeField(default=timezone.now)


class RetainedFactsPolicy(models.Model):
    """How long content-free facts are kept after a delete (a singleton, id 1)."""

    audit_days = models.PositiveIntegerField(default=365)
    usage_days = models.PositiveIntegerField(default=400)
    billing_days = models.PositiveIntegerField(default=2555)
    revision = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(default=timezone.now)

    MIN_DAYS = 1
    MAX_DAYS = 3650

    class Meta:
        constraints = [
            models.CheckConstraint(name="facts_policy_singleton", condition=Q(id=1)),
        ]

    @classmethod
    def load(cls) -> RetainedFactsPolicy:
        """The stored policy, or the defaults unsaved: reading never writes (a member's page
        view; the row is made at migrate time and by the first save)."""
        return cls.objects.filter(id=1).first() or cls(id=1)


# ---- Delete operations -------------------------------------------------------------------
# What a delete leaves behind is content-free: who asked, when, for which target, what
# happened, and per store how many records and bytes went. See lifecycle/deletion/__init__.py.


def new_operation_id() -> str:
    return "op_" + secrets.token_hex(10)


class DeleteState(models.TextChoices):
    PENDING = "pending", pgettext_lazy("operation state", "Pending")
    COMPLETED = "completed", pgettext_lazy("operation state", "Completed")
    REFUSED = "refused", pgettext_lazy("operation state", "Refused")
    UNAVAILABLE = "unavailable", pgettext_lazy("operation state", "Unavailable")


# The only moves a delete operation makes; refusals and completions are final.
DELETE_TRANSITIONS: dict[str, frozenset[str]] = {
    DeleteState.PENDING: frozenset({DeleteState.COMPLETED}),
    DeleteState.COMPLETED: frozenset(),
    DeleteState.REFUSED: frozenset(),
    DeleteState.UNAVAILABLE: frozenset(),
}
INTENT_STATES = (DeleteState.PENDING, DeleteState.COMPLETED)


class PhysicalState(models.TextChoices):
    NOT_APPLICABLE = "", _("Not applicable")
    PENDING = "pending", _("Physically pending")
    ERASED = "erased", _("Physically erased")


class DeleteOperationQuerySet(models.QuerySet):
    def intents(self) -> DeleteOperationQuerySet:
        return self.filter(state__in=INTENT_STATES)

    def outstanding(self) -> DeleteOperationQuerySet:
        return self.filter(state=DeleteState.PENDING)


class DeleteOperation(models.Model):
    """One request to delete one conversation, and what came of it.

    Refused and Unavailable operations are only the remembered answer to an operation key:
    no intent, no fence, the target stays writable. Pending and Completed ones are the
    intent: committed before any erasure, never rolled back.
    """

    public_id = models.CharField(max_length=32, unique=True, default=new_operation_id, editable=False)
    conversation = models.ForeignKey(Conversation, on_delete=models.PROTECT, related_name="delete_operations")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    requested_at = models.DateTimeField(default=timezone.now)
    state = models.CharField(max_length=12, choices=DeleteState.choices)
    reason = models.CharField(max_length=64, blank=True)
    reasons = models.JSONField(default=list, blank=True)
    step = models.CharField(max_length=64, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    stalled_attempts = models.PositiveIntegerField(default=0)
    lease_holder = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    receipt = models.JSONField(null=True, blank=True)
    touched_tables = models.JSONField(default=list, blank=True)
    physical_state = models.CharField(max_length=8, choices=PhysicalState.choices, default="", blank=True)
    physically_erased_at = models.DateTimeField(null=True, blank=True)
    verified_at = models.DateTimeField(null=True, blank=True)
    verified_physical_at = models.DateTimeField(null=True, blank=True)

    objects = DeleteOperationQuerySet.as_manager()

    class Meta:
        ordering = ["-requested_at", "-id"]
        constraints = [
            models.CheckConstraint(
                name="delete_operation_state_valid",
                condition=Q(state__in=["pending", "completed", "refused", "unavailable"]),
            ),
            # One intent per conversation, whatever the races: a second request joins it.
            models.UniqueConstraint(
                fields=["conversation"], condition=Q(state__in=["pending", "completed"]),
                name="delete_operation_one_intent",
            ),
        ]
        indexes = [
            models.Index(fields=["state", "next_attempt_at"], name="delete_op_outstanding_idx",
                         condition=Q(state="pending")),
            # The Operations list and GET /v1/operations page by this key (operation_paging).
            models.Index(fields=["requested_at", "id"], name="delete_op_requested_idx"),
            # Their tabs (one state) by the same key: SQLite took the facts expiry's partial index
            # for the Completed tab and sorted every completed delete for a page of 50 (r142).
            models.Index(fields=["state", "requested_at", "id"], name="delete_op_state_requested_idx"),
            # The hourly facts expiry: completed deletes older than a period, read from the
            # index alone (lifecycle.actions.expire_facts.due_deletes).
            models.Index(fields=["state", "completed_at", "conversation"], name="delete_op_completed_idx",
                         condition=Q(state="completed")),
            # Who asked is forgotten the audit period after the request (expire_facts): the
            # operations that still name someone, by when they were asked.
            models.Index(fields=["requested_at"], name="delete_op_requester_idx",
                         condition=Q(requested_by__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.public_id

    @property
    def is_intent(self) -> bool:
        return self.state in INTENT_STATES


class OperationKey(models.Model):
    """An `Idempotency-Key` and the operation it answers with, ever after."""

    key = models.CharField(max_length=200, unique=True)
    operation = models.ForeignKey(DeleteOperation, on_delete=models.CASCADE, related_name="keys")
    created_at = models.DateTimeField(default=timezone.now)


class StepState(models.TextChoices):
    PENDING = "pending", _("Waiting")
    MEASURED = "measured", _("In progress")
    DONE = "done", _("Done")


class DeleteStep(models.Model):
    """One store's part of an erasure. `records` and `bytes` are measured (and committed)
    before anything in the store is erased, so a resumed step keeps the exact figures."""

    operation = models.ForeignKey(DeleteOperation, on_delete=models.CASCADE, related_name="steps")
    key = models.CharField(max_length=64)
    position = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=10, choices=StepState.choices, default=StepState.PENDING)
    records = models.PositiveBigIntegerField(default=0)
    bytes = models.PositiveBigIntegerField(default=0)
    detail = models.JSONField(default=dict, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["operation", "position"]
        constraints = [models.UniqueConstraint(fields=["operation", "key"], name="delete_step_unique")]


class DeletionFence(models.Model):
    """The database fence: a conversation with a row here takes no more content.

    A table of its own (not the operation table, not a column of the conversation) because
    SQLite refuses to rebuild a table that other tables' triggers read: this one never
    changes shape, so migrations of the content tables stay possible (they only need to
    reinstall the triggers, see lifecycle.fence.install_fence_triggers).
    """

    conversation_id = models.BigIntegerField(primary_key=True)
    operation_id = models.BigIntegerField()
    created_at = models.DateTimeField(default=timezone.now)


class ErasureFingerprint(models.Model):
    """Keyed fingerprints of sampled content windows, for the physical residue scan.

    Holds no content: a random per-operation key and keyed digests of 64-byte windows (and
    of their 32-byte slices, for the aligned scan). Short, guessable content could be
    confirmed against them, so they are dropped once a clean physical verification is
    recorded, and by the hourly facts expiry a week after the delete at the latest
    (`lifecycle.registry.FINGERPRINT_DAYS`).
    """

    operation = models.OneToOneField(DeleteOperation, on_delete=models.CASCADE, related_name="fingerprint")
    # The deleted conversation (its tombstone): the registry counts and lists them per conversation.
    conversation = models.ForeignKey(Conversation, null=True, on_delete=models.CASCADE, related_name="+")
    secret = models.BinaryField()
    windows = models.BinaryField()
    grams = models.BinaryField()
    window_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
