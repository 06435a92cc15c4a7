"""Storage insight: what the daily measurement found, kept in snapshot tables.

Pages read these rows; they never measure. Rows name conversations, accounts and computers
by id only and hold byte counts, never content, so an erased conversation leaves no text
here (its size row is simply no longer shown, and the next measurement drops it).
"""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models import Q
from django.utils import timezone

HISTORY_DAYS = 400
# A request still waiting this long is taken as lost (the job failed, or the queue was cleared).
REQUEST_STALE = timedelta(minutes=15)


class Measurement(models.Model):
    """The last measurement's totals and when one was asked for (a singleton, id 1)."""

    measured_at = models.DateTimeField(null=True, blank=True)
    requested_at = models.DateTimeField(null=True, blank=True)
    database_bytes = models.PositiveBigIntegerField(default=0)
    engine_bytes = models.PositiveBigIntegerField(default=0)
    engine_files = models.PositiveBigIntegerField(default=0)
    # Engine bytes outside any conversation's folders (the fleet file, locks of shared state,
    # folders of conversations this database does not know).
    unattributed_engine_bytes = models.PositiveBigIntegerField(default=0)
    # The engine folder was missing (or not a folder) when measured: its figures are not a size.
    engine_missing = models.BooleanField(default=False, db_default=False)
    # Folders and files in it that could not be read: the engine figures count only the rest.
    engine_unreadable = models.PositiveIntegerField(default=0, db_default=0)
    text_bytes = models.PositiveBigIntegerField(default=0)
    payload_bytes = models.PositiveBigIntegerField(default=0)
    removable_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.CheckConstraint(name="insight_measurement_singleton", condition=Q(id=1))]

    @classmethod
    def load(cls) -> Measurement:
        obj, _created = cls.objects.get_or_create(id=1)
        return obj

    @property
    def pending(self) -> bool:
        """A requested measurement has not finished yet."""
        return self.requested_at is not None and (self.measured_at is None or self.requested_at > self.measured_at)

    @property
    def request_lost(self) -> bool:
        """The requested measurement has not finished after REQUEST_STALE: it failed or was lost."""
        return self.pending and timezone.now() - self.requested_at >= REQUEST_STALE


class ConversationSize(models.Model):
    conversation_id = models.BigIntegerField(unique=True)
    db_bytes = models.PositiveBigIntegerField(default=0)
    engine_bytes = models.PositiveBigIntegerField(default=0)
    total_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["-total_bytes"], name="insight_conv_total_idx")]


class OwnerKind(models.TextChoices):
    ACCOUNT = "account"
    COMPUTER = "computer"


class OwnerSize(models.Model):
    kind = models.CharField(max_length=8, choices=OwnerKind.choices)
    owner_id = models.BigIntegerField()
    conversations = models.PositiveIntegerField(default=0)
    db_bytes = models.PositiveBigIntegerField(default=0)
    engine_bytes = models.PositiveBigIntegerField(default=0)
    total_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "owner_id"], name="insight_owner_unique")]
        indexes = [models.Index(fields=["kind", "-total_bytes"], name="insight_owner_total_idx")]


class ToolKindSize(models.Model):
    tool_kind = models.CharField(max_length=20, unique=True)
    items = models.PositiveBigIntegerField(default=0)
    payload_bytes = models.PositiveBigIntegerField(default=0)
    removable_bytes = models.PositiveBigIntegerField(default=0)


class DailySize(models.Model):
    """One row per UTC day; a second measurement on the same day replaces that day's figures."""

    day = models.DateField(unique=True)
    measured_at = models.DateTimeField()
    database_bytes = models.PositiveBigIntegerField(default=0)
    engine_bytes = models.PositiveBigIntegerField(default=0)
    payload_bytes = models.PositiveBigIntegerField(default=0)
    removable_bytes = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["day"]
