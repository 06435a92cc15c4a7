"""Background jobs of the retention app. Each takes ids (or nothing), re-reads state and is
safe to run twice: django-q2 delivers at least once."""

from __future__ import annotations

from django.utils import timezone

from lifecycle.enginefs import EngineHome
from retention.models import StorageSnapshot


def measure_engine_folder() -> dict[str, int]:
    files, size = EngineHome().usage()
    StorageSnapshot.objects.update_or_create(
        id=1, defaults={"engine_files": files, "engine_bytes": size, "measured_at": timezone.now()}
    )
    return {"files": files, "bytes": size}
