"""Paging the conversation list by a snapshot, so nothing vanishes while it changes.

A list in activity order moves while someone pages through it: a conversation that gets a
new item jumps to the top. Paged by offset or by a plain keyset, it then lands on a page
the reader has already passed and is never shown to them. So the list is paged against a
snapshot:

- The first page fixes `as_of`, the moment the reading started (now, or the newest
  activity stored if that is later). Every later page carries it in its cursor.
- A page lists the conversations whose activity is at or before `as_of`, in activity
  order, after (or, going back, before) the cursor's key `(last_activity_at, pk)`. Their
  order cannot change while the reader pages, so each is listed exactly once. The Deleted
  tab (`view=deleted`) lists tombstones by when they were deleted instead (`listing`): the
  moment a tombstone entered the tab, which no later change moves either.
- Conversations whose activity is after `as_of` (they changed or are new since the reading
  started), and those that moved between the list's tabs after it (unarchived, resumed:
  `view_changed_at`), are left out of the pages and reported apart: their count and the
  first few, with a way to start again. A conversation that gets a new item, or comes back
  into the tab, mid-way therefore shows up in that notice on every later page instead of on
  none (its place may be on a page already read).
- A write stamps its moment before it commits, so one that commits after a page was read can
  carry a moment at or before `as_of` and land ahead of where the reader is, unseen and not
  after `as_of` (r91: a conversation vanished from the API's pages with nothing counted). So
  a cursor also carries how many snapshot rows were ahead of its row when its page was read
  (`ahead`, from counts taken before the rows were read), and the next page counts them
  again (going forward or back): any more than that came in late, and are counted with the
  changed ones from then on (`late`, carried by every later cursor). A row that left the
  snapshot meanwhile is a changed one already. One that left the list's filters instead
  (archived, closed or deleted while the list is Recent; no longer running for `active`) is in
  neither count: if one such row ahead of the reader's place leaves between two pages while a
  late one comes in ahead of it, the two cancel out and the late one goes uncounted (r92; both
  in one interval between two pages).

The console list and `GET /v1/threads` both page with `snapshot_page`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.db.models import Max, Q, QuerySet
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from lifecycle.models import Conversation

MAX_CURSOR_CHARS = 200
MAX_LATE = 10**9  # (a cursor's count stays one its decoding reads back: r92)
ACTIVITY = "last_activity_at"
DELETION = "listed_at"  # the Deleted tab's key: when the conversation entered it (`listing`)


class InvalidCursor(ValueError):
    pass


def list_scope(*filters: object) -> str:
    """A short digest of what a list lists (its kind and filters), carried by its cursors: a
    cursor from another list (another tab, state, owner or search) positions between that
    list's rows and would skip some of this one's, so it is refused (r16)."""
    text = "\x1f".join("" if part is None else str(part) for part in filters)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Cursor:
    """Where a page starts: the snapshot moment and the key of the row next to the page
    (`activity`: the row's moment in the list's order, its last activity or its deletion).

    `backward` means the page lists the rows just before the key (the Previous page)."""

    as_of: datetime
    activity: datetime
    pk: int
    backward: bool = False
    scope: str = ""  # the list it was handed out by (`list_scope`)
    ahead: int = -1  # snapshot rows ahead of its row when handed out (-1: not known, a v3 cursor)
    late: int = 0  # rows found come in late ahead of earlier pages' rows (see the module's note)

    def encode(self) -> str:
        return encode_token("v4", self.scope, self.as_of.isoformat(), "b" if self.backward else "f",
                            self.activity.isoformat(), str(self.pk), str(self.ahead) if self.ahead >= 0 else "n",
                            str(self.late))

    @classmethod
    def decode(cls, token: str, scope: str) -> Cursor:
        """The cursor, if it was handed out by the list `scope` names; else InvalidCursor. A v3
        cursor (handed out before `ahead` was) still reads."""
        fields = token_fields(token, (6, 8))
        version, given, as_of, direction, activity, pk = fields[:6]
        if (version, len(fields)) not in (("v3", 6), ("v4", 8)) or direction not in ("f", "b") or given != scope:
            raise InvalidCursor(token)
        ahead, late = (-1 if fields[6] == "n" else token_pk(fields[6]), token_pk(fields[7])) if version == "v4" else (-1, 0)
        if late > MAX_LATE:
            raise InvalidCursor(token)
        return cls(as_of=token_moment(as_of), activity=token_moment(activity), pk=token_pk(pk),
                   backward=direction == "b", scope=scope, ahead=ahead, late=late)


def encode_token(*fields: str) -> str:
    """A cursor token: the fields `|`-joined, in URL-safe base64 without padding."""
    return base64.urlsafe_b64encode("|".join(fields).encode()).decode().rstrip("=")


def token_fields(token: str, count: int | tuple[int, ...]) -> list[str]:
    """The `count` fields of a cursor token (URL-safe base64 of `|`-joined text); `count` may
    name the numbers of fields each version has."""
    if not token or len(token) > MAX_CURSOR_CHARS or not token.isascii():
        raise InvalidCursor(token)
    try:
        fields = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("ascii").split("|")
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidCursor(token) from None
    if len(fields) not in (count if isinstance(count, tuple) else (count,)):
        raise InvalidCursor(token)
    return fields


def token_moment(text: str) -> datetime:
    """A cursor's moment: with an offset, in UTC, within the years a database holds."""
    try:
        moment = parse_datetime(text)
    except ValueError:
        raise InvalidCursor(text) from None
    if moment is None or timezone.is_naive(moment):
        raise InvalidCursor(text)
    try:  # an offset that puts it outside the years a database holds (0001-01-01T00:00+23:59)
        return moment.astimezone(UTC)
    except (OverflowError, ValueError):
        raise InvalidCursor(text) from None


def token_pk(text: str) -> int:
    if not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise InvalidCursor(text)
    return int(text)


@dataclass
class SnapshotPage:
    rows: list[Conversation]
    as_of: datetime
    size: int
    before: int = 0  # snapshot rows ahead of this page
    after: int = 0  # snapshot rows behind it
    changed: int = 0  # matching rows whose activity is after as_of
    changed_rows: list[Conversation] = field(default_factory=list)
    key: str = ACTIVITY  # the rows' order: newest first by this moment, then by pk
    scope: str = ""  # the list's `list_scope`, carried by its cursors
    newer: int = -1  # snapshot rows ahead of the first row, as counted before the rows were read
    late: int = 0  # rows come in late ahead of pages already read (in `changed` too)

    @property
    def next(self) -> Cursor | None:
        if not self.after or not self.rows:
            return None
        last = self.rows[-1]
        ahead = self.newer + len(self.rows) - 1 if self.newer >= 0 else -1
        return Cursor(self.as_of, getattr(last, self.key), last.pk, scope=self.scope, ahead=ahead, late=self.late)

    @property
    def previous(self) -> Cursor | None:
        if not self.before or not self.rows:
            return None
        first = self.rows[0]
        return Cursor(self.as_of, getattr(first, self.key), first.pk, backward=True, scope=self.scope,
                      ahead=self.newer, late=self.late)

    @property
    def number(self) -> int:
        return -(-self.before // self.size) + 1

    @property
    def pages(self) -> int:
        return self.number + -(-self.after // self.size)

    @property
    def changed_more(self) -> int:
        return self.changed - len(self.changed_rows)

    @property
    def total(self) -> int:
        """Every matching conversation now: the snapshot's and the changed ones."""
        return self.before + len(self.rows) + self.after + self.changed


def listing(queryset: QuerySet[Conversation], view: str | None) -> tuple[QuerySet[Conversation], str]:
    """The list's rows and the moment they are ordered by (newest first): the Deleted tab's
    tombstones by when each was deleted (the completion sets `view_changed_at`; one deleted
    before that column existed by its last activity), every other list by last activity."""
    if view == "deleted":
        return queryset.annotate(**{DELETION: Coalesce("view_changed_at", "last_activity_at")}), DELETION
    return queryset, ACTIVITY


def _order(key: str) -> tuple[str, str]:
    return f"-{key}", "-pk"


def _newer(field: str, key: tuple[datetime, int]) -> Q:
    return Q(**{f"{field}__gt": key[0]}) | Q(**{field: key[0], "pk__gt": key[1]})


def _older(field: str, key: tuple[datetime, int]) -> Q:
    return Q(**{f"{field}__lt": key[0]}) | Q(**{field: key[0], "pk__lt": key[1]})


def snapshot_moment() -> datetime:
    """Now, or the newest stored activity or tab change when that is later (a clock behind
    the data must not leave rows outside every snapshot)."""
    newest = Conversation.objects.aggregate(a=Max("last_activity_at"), v=Max("view_changed_at"))
    return max([timezone.now(), *(moment for moment in newest.values() if moment is not None)])


def _in_snapshot(queryset: QuerySet[Conversation], as_of: datetime, key: str = ACTIVITY) -> QuerySet[Conversation]:
    if key == DELETION:
        # A tombstone's moment is its deletion, after its last activity: the same rows, by the
        # expression the Deleted tab's index holds (r20: SQLite sorted every tombstone by
        # another index when the filter named last_activity_at)
        return queryset.filter(**{f"{DELETION}__lte": as_of})
    return queryset.filter(last_activity_at__lte=as_of).exclude(view_changed_at__gt=as_of)


def _changed_after(queryset: QuerySet[Conversation], as_of: datetime) -> QuerySet[Conversation]:
    return queryset.filter(Q(last_activity_at__gt=as_of) | Q(view_changed_at__gt=as_of))


def snapshot_page(
    queryset: QuerySet[Conversation],
    cursor: Cursor | None,
    size: int,
    *,
    count: bool = True,
    changed_sample: int = 0,
    key: str = ACTIVITY,
    scope: str = "",
) -> SnapshotPage:
    """One page of `queryset` (already filtered) against the cursor's snapshot, newest first
    by `key` (a moment each row has: its last activity, or as `listing` names it).

    With `count=False` only what the next cursor needs is computed (the API); otherwise the
    counts for "page N of M" and the changed-since notice as well (the console)."""
    as_of = cursor.as_of if cursor else snapshot_moment()
    snapshot = _in_snapshot(queryset, as_of, key)
    order = _order(key)
    late = cursor.late if cursor else 0
    # The rows ahead of the cursor's row, counted before the page's rows are read (a row that
    # comes in between is then found on the next page, never counted in without being seen)
    ahead = snapshot.filter(_newer(key, (cursor.activity, cursor.pk))).count() if cursor else 0
    if cursor is None:
        rows = list(snapshot.order_by(*order)[: size + 1])
    elif cursor.backward:
        rows = list(snapshot.filter(_newer(key, (cursor.activity, cursor.pk))).order_by(key, "pk")[: size + 1])
        rows.reverse()
    else:
        rows = list(snapshot.filter(_older(key, (cursor.activity, cursor.pk))).order_by(*order)[: size + 1])
    if cursor is not None and cursor.ahead >= 0:
        # Going back too (r92: Previous then Next took a late row into the counts unnoticed)
        late += max(0, ahead - cursor.ahead)
    late = min(late, MAX_LATE)
    backward = cursor is not None and cursor.backward
    more = len(rows) > size
    shown = rows[-size:] if backward else rows[:size]
    if cursor is None:
        newer = 0
    elif backward:
        newer = max(0, ahead - len(shown))  # the page is the rows nearest ahead of the cursor's
    else:
        newer = ahead + 1  # and the cursor's row itself (if it left, it is a changed one)
    page = SnapshotPage(rows=shown, as_of=as_of, size=size, key=key, scope=scope, newer=newer, late=late)
    if not count:
        # Without counts, `before` and `after` only say whether there is anything there.
        page.before, page.after = (int(more), 1) if backward else (int(cursor is not None), int(more))
        return page
    if cursor is not None and not page.rows:
        # Every row this page would list has left the list since the page was linked (the
        # last one on the last page archived, say): show the snapshot's nearest page instead,
        # its last going forward, its first going back, so the reader is never left on an
        # empty page with rows still behind it and nothing to reach them by.
        if backward:
            page.rows = list(snapshot.order_by(*order)[:size])
        else:
            page.rows = list(snapshot.order_by(key, "pk")[:size])[::-1]
        page.newer = -1  # (rows the reader may have seen: no count to go by from here)
    if page.rows:
        first = (getattr(page.rows[0], key), page.rows[0].pk)
        last = (getattr(page.rows[-1], key), page.rows[-1].pk)
    elif cursor is not None:
        first = last = (cursor.activity, cursor.pk)
    else:
        first = last = None
    if first is not None:
        # The first page has nothing ahead of it, and nothing newer than the moment it fixed.
        page.before = snapshot.filter(_newer(key, first)).count() if cursor else 0
        page.after = snapshot.filter(_older(key, last)).count()
    if cursor is None:
        return page
    page.changed = changed_since(queryset, as_of) + page.late
    if page.changed and changed_sample:
        page.changed_rows = list(_changed_after(queryset, as_of).order_by(*order)[:changed_sample])
    return page


def changed_since(queryset: QuerySet[Conversation], as_of: datetime) -> int:
    """How many of these conversations changed, were added or came into the tab after the
    snapshot moment."""
    return _changed_after(queryset, as_of).count()
