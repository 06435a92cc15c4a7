"""Storage figures on /metrics, read at scrape time (see ops.metrics)."""

from __future__ import annotations

from ops.metrics import gauge
from retention.models import StorageSnapshot


def _snapshot() -> StorageSnapshot | None:
    return StorageSnapshot.objects.filter(measured_at__isnull=False).first()


@gauge("lethe_engine_folder_bytes", "Bytes of the files in the engine folder (their contents, not the disk blocks "
       "they take) at the last background measurement.")
def engine_folder_bytes() -> int:
    snapshot = _snapshot()
    return snapshot.engine_bytes if snapshot else 0


@gauge("lethe_engine_folder_files", "Files in the engine folder at the last background measurement.")
def engine_folder_files() -> int:
    snapshot = _snapshot()
    return snapshot.engine_files if snapshot else 0


@gauge("lethe_engine_folder_measured_timestamp_seconds",
       "When the engine folder was last measured (Unix time; 0 before the first measurement).")
def engine_folder_measured() -> float:
    snapshot = _snapshot()
    return snapshot.measured_at.timestamp() if snapshot else 0.0
