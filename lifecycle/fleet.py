"""The subagent fleet file as the lifecycle sees it: strict reads, fenced writes, compaction.

`state/subagents.v1.json` is one workspace-wide snapshot with rows for many conversations;
`legacy-state/subagents.v1.json` is its legacy copy. A row names its conversation through
`origin.conversation` (the public id); legacy rows may have no origin at all.

- Reads are strict: a missing file is an empty fleet, but a file that does not parse (or
  is not `{"agents": [...]}`) raises `FleetUnreadable`. It is never taken for empty, since
  "no rows of this conversation" would then be a lie the erasure acts on.
- Every fleet write in Lethe goes through `update_fleet` here (tests check there is no
  other caller of `EngineHome.update_fleet`). It drops rows whose origin conversation is
  fenced, under the fleet lock, after the caller's change: a late or stale snapshot write
  cannot bring a deleted conversation's rows back, and other rows are written as given.
- A delete's intent reads (admission) and measures (the receipt) the fleet files under
  their locks and commits before releasing them (`locked_files`), so no write slips in
  between: the receipt counts exactly the rows the fence and the erasure then remove.
  Lock order everywhere: database first, then the fleet lock, then the legacy file's.
- Erasure compacts a conversation's rows out of a file under that file's lock, leaving
  every other row as it was.
- Lethe's engine keeps every kind of child record (agents, workers, follow-ups, resume
  targets, coordination entries) as a row of `agents`. A file that names a conversation in
  another entry of its own (`named_outside_rows`: written by another runtime) holds records
  a delete cannot erase knowingly: the delete is Unavailable until they are removed, and the
  erasure check names them (r128: they stayed, and the check said clean).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from json.decoder import scanstring
from pathlib import Path
from typing import Any

from django.utils.dateparse import parse_datetime

from lifecycle.enginefs import (
    EngineHome,
    UnreadableEngineFile,
    _fleet_document,
    _fleet_document_seen,
    _fleet_rows,
    _fleet_rows_seen,
    _parse_fleet,
    _read_fleet_file,
    remove_regular,
)
from lifecycle.fence import refusal
from lifecycle.item_payload import has_bad_text
from lifecycle.models import Conversation, ConversationState

Row = dict[str, Any]
UNSETTLED_STATUSES = ("running", "queued")


# The engine folder's own strict reading: a file that exists but is not a fleet raises it.
FleetUnreadable = UnreadableEngineFile


def read_rows(path: Path, *, cached: bool = False) -> list[Row]:
    """The rows of a fleet file; [] when it does not exist, FleetUnreadable when it is not one.

    `cached`: for reads that change nothing (pages, lists, checks), the last parse of an
    unchanged file is reused (rows shared: not to be changed)."""
    return _fleet_rows_seen(path) if cached else _fleet_rows(path)


PUBLIC_ID = re.compile(r"c_[0-9a-f]{20}")  # a conversation's public id (models.new_public_id)


def named_outside_rows(path: Path, public_id: str, *, cached: bool = False) -> list[str]:
    """The entries of a fleet file besides its rows (`agents`) and `version` that hold records
    of the conversation, by name; [] when the file does not exist, FleetUnreadable when it is
    not a fleet. Read as parsed JSON (an id written with `\\uXXXX` escapes is the same id).

    A record is the conversation's when it says so, at any depth: an object whose origin is the
    conversation (as a row's), or an entry keyed by its public id. One whose origin or key is
    another conversation is that one's, though its text quotes the id (r130: it held this
    delete back). Anything else that names the id (a key or a text holding it, an origin
    without a conversation) cannot be attributed, so it counts: never guessed at (r131)."""
    document = _fleet_document_seen(path) if cached else _fleet_document(path)
    return sorted(key for key, value in document.items()
                  if key not in ("version", "agents") and _holds_records_of({key: value}, public_id))


def _owner(record: dict) -> str | None:
    """The conversation a record says it is of: its origin's conversation when that is a public
    id; None for none, null, "" or anything else ("unknown", "legacy:c_...": r132)."""
    origin = record.get("origin")
    owner = origin.get("conversation") if isinstance(origin, dict) else None
    return owner if isinstance(owner, str) and PUBLIC_ID.fullmatch(owner) else None


def _holds_records_of(section: Any, public_id: str) -> bool:
    """Whether the conversation's records, or text naming it that no other conversation owns,
    are in `section` (walked without recursion: a file nested as deep as JSON allows is read
    as any other). Inside another conversation's record or entry, only a record of this one
    nested there counts (r132: the walk stopped at the other's, and missed it); the id is
    matched whatever its case."""
    pending: list[tuple[Any, bool]] = [(section, False)]  # (node, inside another conversation's)
    while pending:
        node, others = pending.pop()
        if isinstance(node, str):
            if not others and public_id in node.lower():
                return True
        elif isinstance(node, list):
            pending.extend((item, others) for item in node)
        elif isinstance(node, dict):
            owner = _owner(node)
            if owner == public_id:
                return True
            inside = others or owner is not None
            for key, value in node.items():
                folded = key.lower()
                if folded == public_id:
                    return True
                if not inside and public_id in folded and not PUBLIC_ID.fullmatch(folded):
                    return True
                pending.append((value, inside or PUBLIC_ID.fullmatch(folded) is not None))
    return False


def fleet_files(home: EngineHome) -> list[Path]:
    return [home.fleet_path, home.legacy_fleet_path]


def origin_of(row: Row) -> str | None:
    """The conversation a row is of; None when its origin names none: no origin, null, "",
    "unknown", an id in capitals or in another form (r150: such a row was taken for another
    conversation's, so it neither stayed the delete as ambiguous nor was compacted, and the
    check said clean while it held the conversation's prompt). The same rule as records
    outside the rows (`_owner`)."""
    return _owner(row)


# The longest agent id a row can be named by: it goes in an address (the API's, a remote
# engine's), percent-encoded, and a server takes request lines of about 4 KB (256 characters of
# four UTF-8 bytes each, encoded, take 3 KB).
AGENT_ID_MAX = 256


def namable_id(value: Any) -> bool:
    """Whether a row's agent id can name the row, the one rule of every place that lists rows or
    takes an id to resolve one (the delete's preview and admission, the operation's way out, the
    API, the command, the screen's forms): text, not empty (an address has no room for
    nothing), at most AGENT_ID_MAX characters, no NUL (PostgreSQL cannot hold it, and a
    browser sends a form's NUL back as U+FFFD) and no lone surrogate (not UTF-8: no address,
    form or terminal carries it). Any other character is the runtime's to write: a tab, a line
    break, a direction mark (shown written out; the forms send the id percent-encoded, and the
    API's address takes any of them). A row whose id is not such one is a row the state file
    does not describe usably: it needs repair."""
    return isinstance(value, str) and 0 < len(value) <= AGENT_ID_MAX and not has_bad_text(value)


def is_unsettled(row: Row) -> bool:
    """Running, queued, or finished with its completion not yet delivered."""
    return row.get("status") in UNSETTLED_STATUSES or row.get("delivery") != "settled"


def _moment(value: Any) -> datetime | None:
    """An aware time, or None (no time, a time without an offset, or not a real date: a row
    with such a start counts as one whose start is unknown)."""
    try:
        moment = parse_datetime(value) if isinstance(value, str) else None
    except ValueError:  # "2020-02-30T10:00:00Z": the right shape, not a date
        return None
    return moment if moment is not None and moment.tzinfo is not None else None


def shown_row(row: Row) -> dict[str, Any]:
    """A row of unknown origin as the API and the pages give it: its id, and its status and
    times where they are text; anything else there (a number, NaN, an object: a runtime wrote the
    file) is left out, so the engine API never sends what is not JSON (r46: a NaN status went out
    as is, and a console of this engine refused its whole Operations list)."""
    return {"agent_id": row.get("agent_id"), "status": row.get("status") if isinstance(row.get("status"), str) else None,
            **{key: _shown_time(row.get(key)) for key in ("started_at", "finished_at")}}


def _shown_time(value: Any) -> str | None:
    """A row's time as every time the API gives (UTC, "Z") when it is one; other text as written."""
    moment = _moment(value)
    if moment is not None:
        return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return value if isinstance(value, str) else None


def overlaps(row: Row, conversation: Conversation) -> bool:
    """Whether a row's lifetime overlaps the conversation's (its creation to its last activity:
    a child is started while its conversation is active). An unknown start overlaps."""
    start, end = _moment(row.get("started_at")), _moment(row.get("finished_at"))
    if start is None:
        return True
    return start <= conversation.last_activity_at and (end is None or end >= conversation.created_at)


def children(rows: Iterable[Row], conversation: Conversation) -> list[Row]:
    return [r for r in rows if origin_of(r) == conversation.public_id]


def names(row: Row, public_id: str) -> bool:
    """Whether a row of unknown origin names the conversation: its id (in any case) in its text,
    as a record's origin nested in it, or as a key (`_holds_records_of`, the rule for records
    outside the rows). r154: an origin of "C_<ID IN CAPITALS>" or "legacy:c_..." on a row that
    began after the conversation's last activity was neither compacted nor ambiguous, and
    stayed after a delete that the check called clean."""
    return origin_of(row) is None and _holds_records_of(row, public_id)


def ambiguous(rows: Iterable[Row], conversation: Conversation) -> list[Row]:
    """Rows of unknown origin whose lifetime overlaps the conversation's, or that name it:
    never guessed at."""
    return [r for r in rows if origin_of(r) is None
            and (overlaps(r, conversation) or _holds_records_of(r, conversation.public_id))]


def named_rows(rows: Iterable[Row], conversation: Conversation) -> list[Row]:
    """The conversation's rows and the rows of unknown origin that name it: what must be gone
    once it is deleted (the erasure check)."""
    return [r for r in rows if origin_of(r) == conversation.public_id or names(r, conversation.public_id)]


_ANY_ID = re.compile(r"c_[0-9a-f]{20}", re.IGNORECASE)


def _named_ids(row: Row) -> set[str]:
    """The conversation ids a row of unknown origin may name (a superset: `names` decides)."""
    return {found.lower() for found in _ANY_ID.findall(json.dumps(row))} if origin_of(row) is None else set()


def way_out(rows: Iterable[Row], conversation: Conversation) -> tuple[list[dict[str, Any]], bool]:
    """The rows of unknown origin overlapping the conversation that an admin can attribute or
    clear, once per id as the API and the pages give them (shown_row), and whether any of them
    cannot be named (namable_id): the delete's admission, its preview and its operation's way
    out all read them here (r123: the operation listed an id with a lone surrogate, and its
    pages failed; the preview took a direction mark for a row to repair)."""
    shown: dict[str, dict[str, Any]] = {}
    unnamable = False
    for row in ambiguous(rows, conversation):
        agent = row.get("agent_id")
        if not namable_id(agent):
            unnamable = True
        elif agent not in shown:
            shown[agent] = shown_row(row)
    return list(shown.values()), unnamable


def all_rows(home: EngineHome, *, cached: bool = False) -> list[tuple[Path, Row]]:
    return [(path, row) for path in fleet_files(home) for row in read_rows(path, cached=cached)]


# ---- Writes ---------------------------------------------------------------------------------


def fenced_origins(origins: set[str]) -> set[str]:
    if not origins:
        return set()
    return set(
        Conversation.objects.filter(public_id__in=origins)
        .exclude(state=ConversationState.LIVE)
        .values_list("public_id", flat=True)
    )


def _fenced_row(row: Row, fenced: set[str]) -> bool:
    origin = origin_of(row)
    if origin is not None:
        return origin in fenced
    return any(names(row, public_id) for public_id in _named_ids(row) & fenced)


def _without_fenced(rows: list[Row]) -> list[Row]:
    """The rows but those of fenced conversations. (A row of unknown origin that names one is
    kept as it is: it may be another conversation's, whose rows no write drops unseen; a new one
    is refused by `put_row`, one there before stays the delete as ambiguous, and the erasure
    check names one found after.)"""
    fenced = fenced_origins({o for r in rows if (o := origin_of(r))})
    return [r for r in rows if origin_of(r) not in fenced] if fenced else rows


def update_file(home: EngineHome, path: Path, change: Callable[[list[Row]], list[Row]]) -> list[Row]:
    """Read-modify-write of one fleet file under its lock, strictly, with the fence applied."""

    with home.guarded(path) as folder:
        document = _fleet_document(path)  # strict: an unreadable file is never overwritten
        rows = _without_fenced(change(list(document["agents"])))
        updated = {**document, "version": document.get("version", 1), "agents": rows}
        home._replace(folder, path, json.dumps(updated, indent=1, sort_keys=True).encode())  # lock held above
        return rows


def update_fleet(change: Callable[[list[Row]], list[Row]], *, home: EngineHome | None = None) -> list[Row]:
    """The fleet write path: the caller's change, then rows of fenced conversations dropped."""
    home = home or EngineHome()
    return update_file(home, home.fleet_path, change)


def write_snapshot(rows: list[Row], *, home: EngineHome | None = None) -> list[Row]:
    """The engine's debounced whole-fleet snapshot. A stale one is written as given, except
    that a fenced conversation's rows never come back."""
    return update_fleet(lambda _current: list(rows), home=home)


def put_row(row: Row, *, home: EngineHome | None = None) -> list[Row]:
    """Add or replace one agent's row. A row of a fenced conversation is refused.

    The fence is read under the fleet lock, which a delete's intent holds until it commits.
    """
    agent_id = row.get("agent_id")
    origin = origin_of(row)
    candidates = {origin} if origin is not None else _named_ids(row)

    def change(rows: list[Row]) -> list[Row]:
        fenced = fenced_origins(candidates)
        if fenced and _fenced_row(row, fenced):
            states = set(Conversation.objects.filter(public_id__in=fenced).values_list("state", flat=True))
            # the words of the state it is in: deleted, or being deleted (r156: "being deleted" always)
            raise refusal(ConversationState.DELETED if states == {ConversationState.DELETED}
                          else ConversationState.PENDING_DELETE)
        return [r for r in rows if r.get("agent_id") != agent_id] + [row]

    return update_fleet(change, home=home)


@contextlib.contextmanager
def locked_files(home: EngineHome) -> Iterator[None]:
    """Hold the locks of both fleet files (always in this order)."""
    with home.locked(home.lock_for(home.fleet_path)), home.locked(home.lock_for(home.legacy_fleet_path)):
        yield


def check_locks_writable(home: EngineHome) -> None:
    """Raise the OSError `locked_files` would meet on a read-only disk, writing nothing."""
    for path in (home.fleet_path, home.legacy_fleet_path):
        home.check_lock_writable(home.lock_for(path))


def compact(home: EngineHome, path: Path, public_id: str) -> list[Row]:
    """Remove this conversation's rows from one fleet file; returns the removed rows."""
    removed: list[Row] = []

    def change(rows: list[Row]) -> list[Row]:
        removed[:] = [r for r in rows if origin_of(r) == public_id]
        return [r for r in rows if origin_of(r) != public_id]

    # A temporary a killed writer left beside the file may hold this conversation's rows (it was
    # never renamed in, so nothing reads it, but its bytes are there): removed under the lock.
    with home.locked(home.lock_for(path)):
        for stale in home.stale_temporaries(path):
            remove_regular(stale)
    # The fence keeps new rows of this conversation out, so a read that finds none is final.
    if not children(read_rows(path), _Target(public_id)):
        return []
    update_file(home, path, change)
    return removed


class _Target:
    def __init__(self, public_id: str) -> None:
        self.public_id = public_id


# ---- Rows as the file holds them (the receipt's bytes, the erasure check's samples) ----------


@dataclass(frozen=True)
class StoredRow:
    """A fleet row with its text as the file holds it, from its opening brace to its closing
    one: a runtime may have written it as raw UTF-8, with `\\uXXXX` escapes, in any layout."""

    row: Row
    text: str
    codec: str  # the file's encoding, as `json.loads` detects it (without its byte order mark)

    @property
    def size(self) -> int:
        """The bytes the row takes in the file."""
        return len(self.text.encode(self.codec, "surrogatepass"))


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")  # what JSON calls white space, as `json` skips it


def stored_children(path: Path, public_id: str) -> list[StoredRow]:
    """This conversation's rows of a fleet file, each with its text as the file holds it; []
    when the file does not exist, FleetUnreadable when it is not a fleet."""
    read = _read_fleet_file(path)
    if read is None:
        return []
    data = read[0]
    rows = _parse_fleet(path, data)["agents"]  # strict, as every read
    encoding = json.detect_encoding(data)  # as json.loads decodes bytes
    text = data.decode(encoding, "surrogatepass")
    codec = {"utf-8-sig": "utf-8", "utf-16": "utf-16-le" if data[:2] == b"\xff\xfe" else "utf-16-be",
             "utf-32": "utf-32-le" if data[:2] == b"\xff\xfe" else "utf-32-be"}.get(encoding, encoding)
    return [StoredRow(row, text[start:end], codec) for row, (start, end) in zip(rows, _row_spans(text), strict=True)
            if origin_of(row) == public_id]


def _row_spans(text: str) -> list[tuple[int, int]]:
    """Where each row of a fleet document lies in its text (which `json.loads` has read as a
    fleet): the elements of its "agents" array (the last one, as `json.loads` keeps it)."""
    spans: list[tuple[int, int]] = []

    def skip(at: int) -> int:
        return _SPACE.match(text, at).end()

    at = skip(skip(0) + 1)  # past "{"
    while text[at] == '"':
        key, at = scanstring(text, at + 1)
        at = skip(skip(at) + 1)  # past ":"
        if key == "agents" and text[at] == "[":
            spans, at = [], skip(at + 1)
            while text[at] != "]":
                _row, end = _DECODER.raw_decode(text, at)
                spans.append((at, end))
                at = skip(end)
                at = skip(at + 1) if text[at] == "," else at
            at += 1
        else:
            _value, at = _DECODER.raw_decode(text, at)
        at = skip(at)
        at = skip(at + 1) if text[at] == "," else at
    return spans


def row_bytes(rows: Iterable[StoredRow]) -> int:
    """The bytes these rows take in their file, as it holds them (not as Lethe would write them)."""
    return sum(stored.size for stored in rows)


def row_values(stored: StoredRow) -> list[bytes]:
    """The row's string values, for sampling, in each form a file may hold them: as this file
    holds them (quotes and escapes included), escaped to ASCII (`\\uXXXX`, as Lethe writes the
    fleet) and as raw UTF-8 (as JSON allows and most runtimes write). A copy of the file made
    before Lethe rewrote it, or by another writer, holds another form than the file does now."""
    out: list[bytes] = []

    def add(value: bytes) -> None:
        if value not in out:
            out.append(value)

    for literal in _value_literals(stored.text):
        add(literal.encode(stored.codec, "surrogatepass"))
        value = scanstring(literal, 1)[0]
        add(json.dumps(value).encode())
        add(json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return out


def _value_literals(text: str) -> Iterator[str]:
    """The string values in a row's JSON text as written there (keys are left out)."""
    at = text.find('"')
    while at >= 0:
        _value, end = scanstring(text, at + 1)
        after = _SPACE.match(text, end).end()
        if text[after:after + 1] != ":":
            yield text[at:end]
        at = text.find('"', end)
