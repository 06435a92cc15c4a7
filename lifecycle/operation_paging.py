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

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from lifecycle.paging import (
    MAX_CURSOR_CHARS,
    InvalidCursor,
    encode_token,
    list_scope,
    token_fields,
    token_moment,
    token_pk,
)

MAX_OFFSET = 1_000_000
ORDER = ("-requested_at", "-pk")


@dataclass(frozen=True)
class OperationCursor:
    """The key of the row next to a page; `backward`: the page lists the rows just newer."""

    requested_at: datetime
    pk: int
    backward: bool = False
    scope: str = ""  # the list it was handed out by: its state filter (`scope_of`)

    def encode(self) -> str:
        return encode_token("o2", self.scope, "b" if self.backward else "f", self.requested_at.isoformat(),
                            str(self.pk))

    @classmethod
    def decode(cls, token: str, scope: str) -> OperationCursor:
        """The cursor, if it was handed out by the list `scope` names (a cursor of another
        state's list would skip rows of this one); else InvalidCursor."""
        version, given, direction, moment, pk = token_fields(token, 5)
        if version != "o2" or direction not in ("f", "b") or given != scope:
            raise InvalidCursor(token)
        return cls(requested_at=token_moment(moment), pk=token_pk(pk), backward=direction == "b", scope=scope)


class OffsetTooLarge(InvalidCursor):
    """A legacy offset past MAX_OFFSET (published with the parameter): pages go on by `next`."""


def scope_of(state: str | None) -> str:
    """The operations list's `list_scope`: its state filter."""
    return list_scope("operations", state or "")


def parse_position(position: str | None, scope: str) -> OperationCursor | int:
    """A cursor of this list, or a legacy offset (digits only); anything else is InvalidCursor."""
    if position is None or position == "":
        return 0
    if not position.isascii() or len(position) > MAX_CURSOR_CHARS:
        raise InvalidCursor(position)
    if position.isdigit():
        offset = int(position)
        if offset > MAX_OFFSET:
            raise OffsetTooLarge(position)
        return offset
    return OperationCursor.decode(position, scope)


@dataclass
class OperationSlice:
    rows: list
    next: str | None
    previous: str | None


def _newer(row) -> Q:
    return Q(requested_at__gt=row.requested_at) | Q(requested_at=row.requested_at, pk__gt=row.pk)


def _older(row) -> Q:
    return Q(requested_at__lt=row.requested_at) | Q(requested_at=row.requested_at, pk__lt=row.pk)


def operation_slice(queryset: QuerySet, position: OperationCursor | int, size: int, scope: str) -> OperationSlice:
    """One page of `queryset` (already filtered; `scope` says by what), with the positions of
    its neighbours."""
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
        next=OperationCursor(last.requested_at, last.pk, scope=scope).encode() if more_older else None,
        previous=(OperationCursor(first.requested_at, first.pk, backward=True, scope=scope).encode()
                  if more_newer else None),
    )
