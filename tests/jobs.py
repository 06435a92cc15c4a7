"""Jobs the tests queue on a real cluster (importable by the `qcluster` subprocess)."""

from __future__ import annotations

import logging

logger = logging.getLogger("lethe.tests")
SECRET = "do-not-log-this-7c1f"


def work_on(operation_id: int) -> int:
    logger.info("working")
    return operation_id


def explode() -> None:
    raise RuntimeError(f"refused the row holding {SECRET}")


def pause(seconds: float) -> float:
    """Keeps a worker busy (the tests kill it mid-job)."""
    import time

    time.sleep(seconds)
    return seconds
