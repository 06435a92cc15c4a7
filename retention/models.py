"""The installation-wide tool payload cleanup policy (a singleton, id 1)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _


class AgeUnit(models.TextChoices):
    WEEKS = "weeks", _("Weeks")
    MONTHS = "months", _("Months")


AGE_LIMITS = {AgeUnit.WEEKS: (1, 520), AgeUnit.MONTHS: (1, 120)}


class ToolPayloadPolicy(models.Model):
    enabled = models.BooleanField(default=False)
    age_value = models.PositiveIntegerField(default=3)
    age_unit = models.CharField(max_length=8, choices=AgeUnit.choices, default=AgeUnit.MONTHS)
    revision = models.PositiveIntegerField(default=1)
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

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
        obj, _created = cls.objects.get_or_create(id=1)
        return obj


class StorageSnapshot(models.Model):
    """The engine folder's size, measured by a background job (a singleton, id 1).

    Walking the folder can take long on a large installation, so pages show the last
    measurement instead of walking it per request.
    """

    engine_files = models.PositiveBigIntegerField(default=0)
    engine_bytes = models.PositiveBigIntegerField(default=0)
    measured_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.CheckConstraint(name="storage_snapshot_singleton", condition=Q(id=1))]

    @classmethod
    def load(cls) -> StorageSnapshot:
        obj, _created = cls.objects.get_or_create(id=1)
        return obj
