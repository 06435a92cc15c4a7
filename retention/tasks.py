"""Background jobs of the retention app. Each takes ids (or nothing), re-reads state and is
safe to run twice: django-q2 delivers at least once."""

from __future__ import annotations

import logging

from django.utils import timezone

from lifecycle.enginefs import EngineHome
from ops.logs import os_error
from retention.models import StorageSnapshot

log = logging.getLogger(__name__)


def measure_engine_folder() -> dict[str, int]:
    """The engine folder's size for Data & storage and /metrics. A folder that is missing, or
    holds folders or files that cannot be read, is not measured: the last size stays, with
    the time it was measured (never a smaller figure shown as current)."""
    home = EngineHome()
    problems: list[OSError] = []
    files, size = home.usage(problems)
    if problems or not home.root.is_dir():
        log.warning("engine folder not measured: %s", os_error(problems[0]) if problems else "missing or not a folder")
        return {"files": files, "bytes": size, "unreadable": len(problems) or 1}
    StorageSnapshot.objects.update_or_create(
        id=1, defaults={"engine_files": files, "engine_bytes": size, "measured_at": timezone.now()}
    )
    return {"files": files, "bytes": size}
