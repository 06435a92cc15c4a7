"""Times read from text another process wrote: an engine's answers and the receipts it gives.

Such a time is shown in the viewer's zone (up to 14 hours either way) and has retention
periods (up to a hundred years) added to it; a time near the ends of the calendar (year 1, year
9999) overflows both, and no engine deleted anything then. So a time is taken only between
EARLIEST and LATEST; one given without a zone is taken as UTC, as every time of the engine API
is written (r45: a zone-less time, now compared and shown as UTC, overflowed the Operations page
in some zones; year 1 overflowed storing a completed delete)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils.dateparse import parse_datetime

EARLIEST = datetime(1970, 1, 2, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def read_moment(value: str | None) -> datetime | None:
    """The time in `value`, aware; None for no text or text that is not written as a time;
    ValueError for a date that does not exist or lies outside [EARLIEST, LATEST], TypeError
    for a value that is not text."""
    moment = parse_datetime(value) if value else None
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not EARLIEST <= moment <= LATEST:
        raise ValueError("a time outside the calendar this console shows")
    return moment
