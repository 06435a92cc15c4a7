"""The installation-wide tool payload cleanup policy (a singleton, id 1), and the operations
that analyze, back up, clean up and compact under it (one at a time, whoever starts it)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy


class AgeUnit(models.TextChoices):
    WEEKS = "weeks", _("Weeks")
    MONTHS = "months", _("Months")


AGE_LIMITS = {AgeUnit.WEEKS: (1, 520), AgeUnit.MONTHS: (1, 120)}


class PreparationState(models.TextChoices):
    NONE = "none", _("Not prepared")
    PREPARING = "preparing", _("Preparing")
    READY = "ready", _("Ready")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


class BackupChoice(models.TextChoices):
    CREATE = "create", _("Create backup")
    SKIP = "skip", _("Continue without backup")


class ToolPayloadPolicy(models.Model):
    enabled = models.BooleanField(default=False)
    age_value = models.PositiveIntegerField(default=3)
    age_unit = models.CharField(max_length=8, choices=AgeUnit.choices, default=AgeUnit.MONTHS)
    revision = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Preparation before the first cleanup under this choice (AC-TPR-002.1/002.2). The
    # strings are checked when read: an unknown one fails closed (nothing runs).
    backup_choice = models.CharField(max_length=8, blank=True, default="", db_default="")
    preparation_state = models.CharField(max_length=12, default=PreparationState.NONE, db_default=PreparationState.NONE)
    # A stored message (retention.errors: a msgid, or a msgid with its details as JSON)
    preparation_error = models.TextField(blank=True, default="", db_default="")
    backup_receipt_name = models.CharField(max_length=200, blank=True, default="", db_default="")
    # The admin whose save made the first run under it due at once (cleanup turned on, its
    # period shortened): the daily check that starts that run credits it to them (r137: it read
    # "started by the daily schedule"). Any other save clears it, and so does that check.
    woken_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    woken_by_name = models.CharField(max_length=150, blank=True, default="", db_default="")  # kept if the user goes (r139)

    class Meta:
        constraints = [
            models.CheckConstraint(name="tool_policy_singleton", condition=Q(id=1)),
            models.CheckConstraint(
                name="tool_policy_age_in_range",
                condition=(
                    Q(age_unit="weeks", age_value__gte=1, age_value__lte=520)
                    | Q(age_unit="months", age_value__gte=1, age_value__lte=120)
                ),
            ),
        ]

    @classmethod
    def load(cls) -> ToolPayloadPolicy:
        """The stored policy, or the defaults unsaved: reading never writes (a member's page
        view, a status poll; the row is made at migrate time and by the first save)."""
        return cls.objects.filter(id=1).first() or cls(id=1)


class StorageSnapshot(models.Model):
    """The engine folder's size, measured by a background job (a singleton, id 1).

    Walking the folder can take long on a large installation, so pages show the last
    measurement instead of walking it per request.
    """

    engine_files = models.PositiveBigIntegerField(default=0)
    engine_bytes = models.PositiveBigIntegerField(default=0)
    measured_at = models.DateTimeField(null=True, blank=True)
    # PostgreSQL's reusable space, measured from the pages (retention.storage)
    reusable_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    reusable_measured_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(name="storage_snapshot_singleton", condition=Q(id=1))]

    @classmethod
    def load(cls) -> StorageSnapshot:
        """The last measurement, or an empty one unsaved (reading never writes)."""
        return cls.objects.filter(id=1).first() or cls(id=1)


class OperationKind(models.TextChoices):
    ANALYSIS = "analysis", _("Analysis")
    BACKUP = "backup", _("Backup")
    CLEANUP = "cleanup", _("Cleanup")
    COMPACT = "compact", pgettext_lazy("operation kind", "Compact database")


class OperationState(models.TextChoices):
    QUEUED = "queued", _("Queued")
    RUNNING = "running", _("Running")
    SUCCEEDED = "succeeded", _("Completed")
    PARTIAL = "partial", _("Partial")
    FAILED = "failed", _("Failed")
    CANCELLED = "cancelled", _("Cancelled")


OPEN_STATES = (OperationState.QUEUED, OperationState.RUNNING)
SLOT = "busy"


class ToolPayloadOperation(models.Model):
    """One analysis, backup, cleanup or compaction, its progress and its figures.

    `slot` is "busy" while the operation is queued or running and NULL afterwards; its unique
    constraint makes "one operation at a time, whoever starts it" a rule of the database.
    The cursor (conversation id, item id) and the counters are committed together with each
    cleanup batch, so a killed worker resumes where the last commit left off.
    """

    kind = models.CharField(max_length=10)
    state = models.CharField(max_length=10, default=OperationState.QUEUED)
    slot = models.CharField(max_length=8, null=True, blank=True, default=SLOT)
    policy_revision = models.PositiveIntegerField(default=0)
    age_value = models.PositiveIntegerField(null=True, blank=True)
    age_unit = models.CharField(max_length=8, blank=True, default="")
    cutoff = models.DateTimeField(null=True, blank=True)
    # Cleanup: when its totals were counted; it takes only conversations eligible then
    counted_at = models.DateTimeField(null=True, blank=True)
    # Cleanup: the newest item id when it counted; it takes no item written after (None: any)
    last_item = models.BigIntegerField(null=True, blank=True)
    # figures
    scanned = models.PositiveBigIntegerField(default=0)
    eligible_conversations = models.PositiveBigIntegerField(default=0)
    eligible_messages = models.PositiveBigIntegerField(default=0)
    removed_messages = models.PositiveBigIntegerField(default=0)
    payload_bytes = models.PositiveBigIntegerField(default=0)
    skipped_json = models.TextField(default="{}")
    # resumable position and progress
    cursor_conversation = models.BigIntegerField(default=0)
    cursor_item = models.BigIntegerField(default=0)
    progress_done = models.PositiveBigIntegerField(default=0)
    progress_total = models.PositiveBigIntegerField(default=0)
    # who, when, liveness. The username is kept beside the user, whose deletion empties
    # `started_by`; an empty name is the daily schedule (the one starter without a user).
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    started_by_name = models.CharField(max_length=150, blank=True, default="", db_default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    lease = models.CharField(max_length=32, blank=True, default="")
    attempts = models.PositiveIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    stale = models.BooleanField(default=False)
    then_cleanup = models.BooleanField(default=False)
    error_code = models.CharField(max_length=40, blank=True, default="")
    error_message = models.TextField(blank=True, default="", db_default="")  # a stored message, as preparation_error
    # backup receipt
    backup_name = models.CharField(max_length=200, blank=True, default="")
    backup_sha256 = models.CharField(max_length=64, blank=True, default="")
    backup_size = models.PositiveBigIntegerField(null=True, blank=True)
    # compaction
    before_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    after_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    before_reusable_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    after_reusable_bytes = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["slot"], name="tool_op_one_at_a_time", condition=Q(slot__isnull=False)
            ),
            models.CheckConstraint(name="tool_op_slot_value", condition=Q(slot__isnull=True) | Q(slot=SLOT)),
        ]
        indexes = [models.Index(fields=["kind", "-id"], name="tool_op_kind_idx")]

    def __str__(self) -> str:
        return f"{self.kind} #{self.pk} ({self.state})"

    @property
    def starter(self) -> str:
        """Who started it: the user's username (the one kept when the user was deleted since),
        or "schedule"."""
        if self.started_by_id and self.started_by:
            return self.started_by.get_username()
        return self.started_by_name or "schedule"

    @property
    def by_schedule(self) -> bool:
        """Started by the daily schedule, not by a user (one whose username is "schedule" too)."""
        return not self.started_by_id and not self.started_by_name

