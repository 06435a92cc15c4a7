"""Asking for a storage measurement now (admins, from Data & storage)."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from django_q.tasks import async_task

from insight.models import REQUEST_STALE, Measurement
from insight.schedules import FUNC


def request_measurement() -> bool:
    """Queue one measurement; False when one already waits. The job and the request commit together."""
    with transaction.atomic():
        Measurement.objects.get_or_create(id=1)
        measurement = Measurement.objects.select_for_update().get(id=1)
        now = timezone.now()
        if measurement.pending and now - measurement.requested_at < REQUEST_STALE:
            return False
        Measurement.objects.filter(pk=1).update(requested_at=now)
        async_task(FUNC, task_name=f"measure-storage-{now:%Y%m%dT%H%M%S%f}")
    return True
