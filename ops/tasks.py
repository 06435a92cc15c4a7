"""Jobs of the ops app."""

from __future__ import annotations


def heartbeat() -> None:
    """Runs every minute on whichever cluster takes it; finishing it is the beat (ops.jobs
    records every finished job, and /readyz asks when one last finished)."""
