"""Paging delete operations by their request moment, so none repeats or goes missing.

Operations are listed newest first, by `(requested_at, pk)`, a key that never changes once an
operation exists. A page starts after (or, going back, before) the key of the row next to
it, so an operation requested while someone pages lands ahead of the first page instead of
pushing a row already shown onto the next page, and one that leaves a state filter (a
pending delete completing) takes no other row's place with it. Paging by offset did both.

A position is what the previous page handed out (`next` or `previous`), or, for clients
written against the offset contract, a whole number of rows to skip: that positions the
first page they ask for, and the pages after it are keyed as above.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Q, QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_datetime

MAX_POSITION_CHARS = 200
MAX_OFFSET = 1_000_000
ORDER = ("-requested_at", "-pk")


class InvalidPosition(ValueError):
    pass


@dataclass(frozen=True)
class OperationCursor:
    """The key of the row next to a page; `backward`: the page lists the rows just newer."""

    requested_at: datetime
    pk: int
    backward: bool = False

    def encode(self) -> str:
        raw = "|".join(("o1", "b" if self.backward else "f", self.requested_at.isoformat(), str(self.pk)))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> OperationCursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii")
            version, direction, moment, pk = raw.split("|")
            when = parse_datetime(moment)
        except (ValueError, binascii.Error, UnicodeDecodeError):
            raise InvalidPosition(token) from None
        if (
            version != "o1"
            or direction not in ("f", "b")
            or when is None
            or timezone.is_naive(when)
            or not (pk.isascii() and pk.isdigit() and len(pk) <= 18)
        ):
            raise InvalidPosition(token)
        try:  # an offset that puts the moment outside the years a database holds
            when = when.astimezone(UTC)
        except (OverflowError, ValueError):
            raise InvalidPosition(token) from None
        return cls(requested_at=when, pk=int(pk), backward=direction == "b")


def parse_position(position: str | None) -> OperationCursor | int:
    """A cursor, or a legacy offset (digits only); anything else is InvalidPosition."""
    if position is None or position == "":
        return 0
    if not position.isascii() or len(position) > MAX_POSITION_CHARS:
        raise InvalidPosition(position)
    if position.isdigit():
        offset = int(position)
        if offset > MAX_OFFSET:
            raise InvalidPosition(position)
        return offset
    return OperationCursor.decode(position)


@dataclass
class OperationSlice:
    rows: list
    next: str | None
    previous: str | None


def _newer(row) -> Q:
    return Q(requested_at__gt=row.requested_at) | Q(requested_at=row.requested_at, pk__gt=row.pk)


def _older(row) -> Q:
    return Q(requested_at__lt=row.requested_at) | Q(requested_at=row.requested_at, pk__lt=row.pk)


def operation_slice(queryset: QuerySet, position: OperationCursor | int, size: int) -> OperationSlice:
    """One page of `queryset` (already filtered), with the positions of its neighbours."""
    if isinstance(position, int):
        rows = list(queryset.order_by(*ORDER)[position:position + size + 1])
        more_older, rows = len(rows) > size, rows[:size]
        more_newer = position > 0 and bool(rows) and queryset.filter(_newer(rows[0])).exists()
    elif position.backward:
        key = OperationCursor(position.requested_at, position.pk)
        rows = list(queryset.filter(_newer(key)).order_by("requested_at", "pk")[: size + 1])
        more_newer, rows = len(rows) > size, rows[:size]
        rows.reverse()
        more_older = bool(rows) and queryset.filter(_older(rows[-1])).exists()
    else:
        rows = list(queryset.filter(_older(position)).order_by(*ORDER)[: size + 1])
        more_older, rows = len(rows) > size, rows[:size]
        more_newer = bool(rows) and queryset.filter(_newer(rows[0])).exists()
    if not rows:
        return OperationSlice(rows=[], next=None, previous=None)
    first, last = rows[0], rows[-1]
    return OperationSlice(
        rows=rows,
        next=OperationCursor(last.requested_at, last.pk).encode() if more_older else None,
        previous=OperationCursor(first.requested_at, first.pk, backward=True).encode() if more_newer else None,
    )
