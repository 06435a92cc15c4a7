"""The remote app's recurring jobs, created by name after every migrate under the database-wide
lock every schedule creator of Lethe takes (console.schedules.ensure_named), duplicates healed."""

from __future__ import annotations

from console.schedules import ensure_named

SCHEDULES = {
    "remote-deliver": {"func": "remote.tasks.sweep", "minutes": 1},
    # The engine's receipts that keep facts that expire, read again (remote.receipts), and
    # the requesters of bound deletes forgotten after the audit period.
    "remote-hourly": {"func": "remote.tasks.hourly", "minutes": 60},
    # Each configured engine's list of conversations, read into the bindings (remote.sync).
    "remote-read-engines": {"func": "remote.tasks.read_engines", "minutes": 60},
}


def ensure_schedules(**kwargs) -> None:
    ensure_named(SCHEDULES)
