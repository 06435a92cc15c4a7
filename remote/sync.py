"""Bindings from an engine: one per conversation it holds, under that conversation's owner."""

from __future__ import annotations

import itertools
import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.utils import timezone
from django.utils.translation import gettext_lazy

from console.api import MAX_WHOLE_NUMBER, check_tree
from lifecycle import faults
from lifecycle.engine.http import MAX_ANSWER_DEPTH, EngineBadAnswer, engine_text
from lifecycle.errors import ActionRefused
from lifecycle.item_payload import has_bad_text
from lifecycle.moments import read_moment
from lifecycle.transcript import preview
from remote.delivery import engine_for
from remote.models import BoundDelete, BoundDeleteState, EngineBinding, EngineRead

PAGE = 200
log = logging.getLogger(__name__)


MAX_PAGES = 100_000  # 20 million conversations: past that, an engine that never ends its list
# The list is read again from the start while its last page says conversations changed since
# it began (`changed_since_start`: new activity, archived, closed...; a paged list leaves them
# out), at most this many times in all; what changes after that waits for the next sync.
PASSES = 3
OWNER_KINDS = ("account", "computer")
# A delete acknowledged less than this before a page was asked for may have been erasing while
# the engine wrote the page (the page is stale, not a restore); covers clocks of other hosts.
CLOCK_MARGIN = timedelta(seconds=60)

# Why a read of the engine's conversations failed. A read is not retried on its own: the
# hourly job (remote.tasks.read_engines) reads again, or an admin (Read from the engine) or an
# operator (sync_bindings) asks sooner.
READ_ERRORS = {
    "engine_unreachable": gettext_lazy("The engine cannot be reached (no connection, a timeout, or its answer "
                                       "was lost). Read again when it is back."),
    "engine_credentials_refused": gettext_lazy("The engine refused this console's token. An operator must set a "
                                               "valid ENGINE_TOKEN, then read again."),
    "engine_bad_answer": gettext_lazy("The engine's answer could not be used (not in the form expected, or one "
                                      "owner's thread listed under two conversations). Nothing was taken from "
                                      "that answer; read again later."),
    "engine_error": gettext_lazy("The engine answered with an error. Read again later."),
    "engine_unsupported": gettext_lazy("The engine does not offer the list of conversations at this address (an "
                                       "older engine, or ENGINE_URL with a wrong path)."),
}
EMPTY_PAGES = 3  # pages in a row with no conversation but a next cursor: a list that never ends


def failed_read_text(exc: ActionRefused) -> str:
    """What the button and sync_bindings say of a failed read: why (`failure_words`), then what
    the pages read before it wrote, which is kept (the counts that `refresh` puts on its error):
    "nothing was read" was said after earlier pages were written (r63), and an engine's own
    refusal of a later page said nothing of them (r64)."""
    from django.utils.translation import gettext, ngettext

    words = failure_words(exc.code, exc.message)
    kept = getattr(exc, "kept", None)
    if kept is None:
        return words
    if not any(kept.values()):
        return words + " " + gettext("Nothing was read.")
    return words + " " + gettext("The pages read before it are kept (%(created)s, %(updated)s, %(returned)s).") % {
        "created": ngettext("%(count)s new conversation", "%(count)s new conversations",
                            kept["created"]) % {"count": kept["created"]},
        "updated": ngettext("%(count)s brought up to date", "%(count)s brought up to date",
                            kept["updated"]) % {"count": kept["updated"]},
        "returned": ngettext("%(count)s back after a completed delete", "%(count)s back after a completed delete",
                             kept["returned"]) % {"count": kept["returned"]},
    }


def read_text(counts: dict) -> str:
    """What a whole read did, each count's words agreeing with it (r137: "1 nuevas")."""
    from django.utils.translation import gettext, ngettext

    return gettext("Read the engine's conversations: %(created)s, %(updated)s.") % {
        "created": ngettext("%(count)s new", "%(count)s new", counts["created"]) % {"count": counts["created"]},
        "updated": ngettext("%(count)s already listed and brought up to date",
                            "%(count)s already listed and brought up to date",
                            counts["updated"]) % {"count": counts["updated"]},
    }


def failure_words(code: str, message: str) -> str:
    """Why a read failed: a read's words for the engine's failures, a delete's for the other
    engine_ codes, the engine's own words for a refusal of its own (or, when it gave none, words
    of this console's, in the reader's language: r71, they were stored in the reader's)."""
    from remote.delivery import error_text

    if code == UNFINISHED:
        return str(_UNFINISHED_WORDS)
    if code.startswith("engine_"):
        return str(READ_ERRORS[code]) if code in READ_ERRORS else error_text(code)
    return message or engine_text("")


UNFINISHED = "read_unfinished"
_UNFINISHED_WORDS = gettext_lazy("It was stopped before the end of the engine's list (its job's time limit, or "
                                 "its process ended).")


def configured_engines() -> list[str]:
    """The engines this console reads: ENGINE_URL's (stored as ""), then each other one in
    ENGINE_TOKENS, by URL."""
    return ([""] if settings.ENGINE_URL else []) + sorted(
        url for url in settings.ENGINE_TOKENS if url != settings.ENGINE_URL.rstrip("/"))


def configured_reads() -> list[EngineRead]:
    """The read record of each configured engine, an unsaved empty one for an engine not read
    yet; a failing one has `words`, why."""
    urls = configured_engines()
    stored = {read.engine_url: read for read in EngineRead.objects.filter(engine_url__in=urls)}
    reads = [stored.get(url) or EngineRead(engine_url=url) for url in urls]
    for read in reads:
        read.shown_state = read.state
        read.shown_code = (read.error_code if read.shown_state == "failed" else
                           UNFINISHED if read.shown_state == "unfinished" else "")
        read.shown_at = read.failed_at if read.shown_state == "failed" else read.started_at
        read.words = failure_words(read.shown_code, read.error_message) if read.shown_code else ""
        read.left_out, read.left_out_named = left_out(read.rejected)
        read.left_out_words = rejected_text(read.left_out_named, read.left_out) if read.left_out else ""
    return reads


def left_out(stored: Any) -> tuple[int, list[dict[str, str | None]]]:
    """How many rows the last whole read left out, and those it named, from EngineRead.rejected;
    (0, []) for none or for a value not in the form written (never a server error)."""
    if not isinstance(stored, dict) or type(stored.get("count")) is not int or stored["count"] <= 0:
        return 0, []
    named = [{"id": row.get("id") if isinstance(row.get("id"), str) else None, "field": row["field"]}
             for row in stored.get("named") or [] if isinstance(row, dict) and isinstance(row.get("field"), str)]
    return stored["count"], named[:NAMED_REJECTED]


TITLE_CHARS = 300  # EngineBinding.title
ENGINE_ID_CHARS = 32
NAMED_REJECTED = 20  # conversations a read names as not taken (any more are counted)
FIELD_NAME_CHARS = 64  # a field of a row named as not taken: longer names are said as "row"


class RejectedRow(Exception):
    """One row of the engine's list that is not a conversation this console can take: the read
    names it (`engine_id`, when it has one this console can show; else None) with the field
    that is not what a conversation's is, and goes on with the other rows."""

    def __init__(self, engine_id: str | None, field: str) -> None:
        super().__init__(field)
        self.engine_id, self.field = engine_id, field


def _row(row: Any) -> dict:
    """The fields a binding takes from one of the engine's rows, checked; RejectedRow when the
    row is not a conversation this console can keep (naming the field that is not).

    A title longer than a binding keeps is shortened as a preview is (`preview`: never inside
    a character as a reader sees it), not refused: an engine on SQLite, which does not enforce
    a column's length, can hold one a runtime wrote (r123: one such title stopped every sync)."""
    if not isinstance(row, dict):
        raise RejectedRow(None, "row")
    engine_id = row.get("id")
    shown = (engine_id if isinstance(engine_id, str) and 0 < len(engine_id) <= ENGINE_ID_CHARS
             and engine_id.isprintable() else None)
    try:
        # A NUL fails PostgreSQL's writes and a lone surrogate every page that shows it: the
        # answer's own check leaves the rows to this one (HttpEngine.threads).
        check_tree(row, max_depth=MAX_ANSWER_DEPTH - 2)
    except ValueError:
        # (a field named as the engine wrote its name, when that name can be shown as it is: the
        # names are kept with the read record, and shown on the list and in the API)
        raise RejectedRow(shown, next((key for key, value in row.items()
                                       if not has_bad_text(key) and has_bad_text(value)
                                       and key.isprintable() and len(key) <= FIELD_NAME_CHARS), "row")) from None

    def text(name: str, longest: int) -> str:
        value = row.get(name)
        if not isinstance(value, str) or len(value) > longest:
            raise RejectedRow(shown, name)
        return value

    if not text("id", ENGINE_ID_CHARS):
        raise RejectedRow(None, "id")
    owner = row.get("owner")
    owner_id = owner.get("id") if isinstance(owner, dict) else None
    # (an owner id the API can filter on: a larger one was stored and could not be listed, r62)
    if (not isinstance(owner, dict) or owner.get("kind") not in OWNER_KINDS or type(owner_id) is not int
            or not 0 <= owner_id <= MAX_WHOLE_NUMBER):
        raise RejectedRow(shown, "owner")
    fields = {"engine_id": engine_id, "owner_kind": owner["kind"], "owner_id": owner_id,
              "scope": text("scope", 8), "thread_id": text("thread_id", 128), "engine_state": text("state", 16)}
    title = row.get("title") or ""
    if not isinstance(title, str):
        raise RejectedRow(shown, "title")
    fields["title"] = preview(title, TITLE_CHARS)[0]
    activity = row.get("last_activity_at")
    try:
        fields["last_activity_at"] = read_moment(activity) if activity else None
    except (TypeError, ValueError):
        fields["last_activity_at"] = None
    if activity and fields["last_activity_at"] is None:
        raise RejectedRow(shown, "last_activity_at")
    return fields


def copied_title(value: Any) -> str | None:
    """A title of the engine's as a binding keeps it (see `_row`), None when it is not text."""
    return preview(value, TITLE_CHARS)[0] if isinstance(value, str) and not has_bad_text(value) else None


def refresh(engine_url: str = "") -> dict[str, Any]:
    """Read every conversation the engine holds and keep the bindings in step.

    New live conversations get a binding; known ones get the engine's title, state and
    activity (a binding with a delete under way keeps its title cleared, checked in the very
    statement that writes the title, so a delete requested while the sync runs keeps it
    cleared too). Nothing is removed here: only an acknowledged receipt lets a binding go.

    A conversation whose bound delete completed gets no binding from a page asked for before
    (or about when) that delete was acknowledged: the page was read while it was erased. One
    the engine still lists as live in a page asked for later is back on the engine (restored
    from a backup): it gets a binding marked `returned_after` that delete, without its title
    (the delete erased this console's copy, and a sync does not bring it back), so the list
    says it came back and a delete of it is a new one.

    Each page is checked before any of it is written. A row that is not a conversation this
    console can keep (`_row`) is left out, and the read goes on with the others: the result
    counts such rows (`rejected`) and names the first NAMED_REJECTED of them
    (`rejected_conversations`: the engine's id, or None when it gave none this console can
    show, and the field not taken). A list that repeats a cursor, never ends, or hands out
    pages with nothing on them one after another (EMPTY_PAGES) stops the sync,
    EngineBadAnswer, with the pages before it kept. A list whose last page says
    conversations changed while it was read is read again (PASSES); each conversation is
    counted once.
    """
    engine_url = engine_url.rstrip("/")
    if engine_url == settings.ENGINE_URL.rstrip("/"):
        engine_url = ""  # ENGINE_URL's bindings are stored without it: one binding per conversation
    engine = engine_for(engine_url)
    counts = {"created": 0, "updated": 0, "returned": 0}
    made: set[str] = set()  # engine ids given a binding by this sync
    updated: set[str] = set()  # engine ids whose binding this sync brought up to date
    rejected = Rejected()
    now = timezone.now()
    _record(engine_url, now, began=True)  # a read stopped before its end is known by this (r71)
    try:
        for _pass in range(PASSES):
            if not _one_pass(engine, engine_url, now, counts, made, updated, rejected):
                break
    except ActionRefused as exc:
        exc.kept = {**counts, "updated": len(updated)}  # what the pages before the failure wrote
        _record(engine_url, now, exc)
        raise
    _record(engine_url, now, rejected=rejected)
    counts["updated"] = len(updated)
    if rejected.count:
        # (ids and field names only: never a title, which is content)
        log.warning("the read of the engine %s left out %d row(s) that are not conversations it can keep: %s",
                    engine_url or "at ENGINE_URL", rejected.count,
                    ", ".join(f"{row['id'] or 'a row without an id'} ({row['field']})" for row in rejected.named))
    return {**counts, "rejected": rejected.count, "rejected_conversations": rejected.named}


class Rejected:
    """The rows the latest reading of the list left out (each reading reads all of it, so one
    left out by an earlier reading and taken by a later one is not counted): how many, and the
    first NAMED_REJECTED by the engine's id (None when it gave none this console can show) with
    the field not taken."""

    count: int
    named: list[dict[str, str | None]]

    def __init__(self) -> None:
        self.begin_pass()

    def begin_pass(self) -> None:
        self.count, self.named = 0, []

    def add(self, exc: RejectedRow) -> None:
        self.count += 1
        if len(self.named) < NAMED_REJECTED:
            self.named.append({"id": exc.engine_id, "field": exc.field})


def rejected_text(named: list[dict[str, str | None]], count: int) -> str:
    """The rows a read left out, in words: each named one by its id and the field not taken
    ("c_1 (title)"), one without an id as such, then how many more (`count`: all of them)."""
    from django.utils.translation import gettext, ngettext

    words = [f"{row['id']} ({row['field']})" if row["id"] is not None else gettext("a row without an id")
             for row in named]
    if count > len(named):
        more = count - len(named)
        words.append(ngettext("%(more)s more", "%(more)s more", more) % {"more": more})
    return ", ".join(words)


def _record(engine_url: str, at, failure: ActionRefused | None = None, *, began: bool = False,
            rejected: Rejected | None = None) -> None:
    """The read that began at `at` into the engine's EngineRead row: its start (`began`), then
    its end, whole (with the rows it left out, `rejected`) or failed; what a read that began
    before the one recorded (two at once) says changes nothing of it."""
    with transaction.atomic():
        row, _made = EngineRead.objects.select_for_update().get_or_create(engine_url=engine_url)
        if began:
            if row.started_at is None or at > row.started_at:
                row.started_at = row.active_at = at
                row.save(update_fields=["started_at", "active_at"])
        elif failure is None:
            if row.read_at is None or at > row.read_at:
                row.read_at = at
                row.rejected = {"count": rejected.count, "named": rejected.named} if rejected and rejected.count else None
                row.save(update_fields=["read_at", "rejected"])
        elif row.failed_at is None or at > row.failed_at:
            row.failed_at, row.error_code = at, failure.code
            # The engine's own words, when it gave some (not this console's placeholder for none)
            said = (getattr(failure, "answer", None) or {}).get("message") if not failure.code.startswith(
                "engine_") else None
            row.error_message = engine_text(said)[:500] if isinstance(said, str) and said.strip() else ""
            row.save(update_fields=["failed_at", "error_code", "error_message"])


def _one_pass(engine, engine_url: str, now, counts: dict[str, int], made: set[str], updated: set[str],
              rejected: Rejected) -> int:
    """Read the engine's list once, page by page, into the bindings; how many conversations its
    last page says changed since the first (they were left out)."""
    cursor = None
    seen: set[str] = set()
    empty = 0
    rejected.begin_pass()
    for pages_read in itertools.count(1):
        asked_at = timezone.now()
        page = engine.threads(view="all", limit=PAGE, cursor=cursor)
        results = page.get("results") if isinstance(page, dict) else None
        if not isinstance(results, list):
            raise EngineBadAnswer("not a page of conversations")
        rows = []
        for result in results:
            try:
                rows.append(_row(result))
            except RejectedRow as exc:
                rejected.add(exc)  # named, and left out: the other conversations are taken
        # The page's cursor checked before any of the page is written, as its rows are: a failed
        # read says nothing was taken from the answer that failed it (r64: a repeated cursor's page
        # was written and counted first).
        cursor = page.get("next")
        if cursor:
            if not isinstance(cursor, str) or cursor in seen:
                raise EngineBadAnswer("a repeated cursor")
            empty = 0 if results else empty + 1
            if empty >= EMPTY_PAGES:  # new cursors with nothing on them: it would go on for MAX_PAGES
                raise EngineBadAnswer("empty pages without end")
            if pages_read >= MAX_PAGES:
                raise EngineBadAnswer("a list without end")
            seen.add(cursor)
        for again in (False, True):
            counts_before, made_before, updated_before = dict(counts), set(made), set(updated)
            try:
                _write_page(rows, engine_url, now, asked_at, counts, made, updated)
                # a sign of life: a long read is not taken for one that stopped (EngineRead.state)
                EngineRead.objects.filter(engine_url=engine_url).update(active_at=timezone.now())
                faults.kill_point("remote.read-page")  # crash tests: a page written, the read not ended
                break
            except IntegrityError:
                counts.update(counts_before)  # the page wrote nothing: neither do its counts
                made.intersection_update(made_before)
                updated.intersection_update(updated_before)
                if _twins(rows, engine_url):
                    # One owner's thread id under two of the engine's conversations (on this page,
                    # or against a binding kept from before: an engine rebuilt with new ids, or
                    # another engine at ENGINE_URL): a 500 every time the engine listed it (r62).
                    raise EngineBadAnswer("one owner's thread id under two conversations") from None
                if again:
                    raise
                # Another sync wrote the same conversations meanwhile (r63: that was blamed on the
                # engine): this page once more, over what it wrote.
        if not cursor:
            changed = page.get("changed_since_start")
            return changed if isinstance(changed, int) and not isinstance(changed, bool) and changed > 0 else 0


def _write_page(rows: list[dict], engine_url: str, now, asked_at, counts: dict[str, int], made: set[str],
                updated: set[str]) -> None:
    """One page of the engine's list into the bindings, in one transaction."""
    with transaction.atomic():
        for fields in map(dict, rows):  # (copies: a page is written again after a concurrent sync)
            engine_id = fields.pop("engine_id")
            title = "" if fields["engine_state"] != "live" else fields.pop("title")
            fields.pop("title", None)
            pending = BoundDelete.objects.filter(engine_url=engine_url, engine_id=OuterRef("engine_id"),
                                                 state=BoundDeleteState.PENDING)
            untitled = Q(Exists(pending)) | Q(returned_after__isnull=False)
            # Deleted on the engine by other means: the title this statement clears keeps its old
            # bytes in the database's files until they are erased (remote.physical). (A live
            # conversation whose title is now empty was not deleted: nothing is said of it, r77.)
            # The condition reads the row as it was before the statement.
            pending_since = F("copy_pending_since")
            if fields["engine_state"] != "live":
                pending_since = Case(When(~Q(title=""), then=Value(timezone.now())), default=F("copy_pending_since"))
            if EngineBinding.objects.filter(engine_url=engine_url, engine_id=engine_id).update(
                **fields, synced_at=now, title=Case(When(untitled, then=Value("")), default=Value(title)),
                copy_pending_since=pending_since,
            ):
                if engine_id not in made:
                    updated.add(engine_id)
            elif fields["engine_state"] == "live":
                # No binding: never had one, or its delete let it go (read after this
                # statement's update found none, so an acknowledgement is seen here).
                deletes = BoundDelete.objects.filter(engine_url=engine_url, engine_id=engine_id)
                if deletes.filter(state=BoundDeleteState.PENDING).exists():
                    continue
                last = deletes.filter(state=BoundDeleteState.COMPLETED).order_by("-acknowledged_at", "-pk").first()
                if last is None:
                    EngineBinding.objects.create(engine_url=engine_url, engine_id=engine_id, title=title,
                                                 synced_at=now, **fields)
                    made.add(engine_id)
                    counts["created"] += 1
                elif last.acknowledged_at < asked_at - CLOCK_MARGIN:
                    EngineBinding.objects.create(engine_url=engine_url, engine_id=engine_id, title="",
                                                 synced_at=now, returned_after=last, **fields)
                    made.add(engine_id)
                    counts["returned"] += 1


def _twins(rows: list[dict], engine_url: str) -> bool:
    """Whether the page puts one owner's thread id under two conversations, on the page itself or
    against a binding of another conversation kept from before."""
    firsts: dict[tuple, str] = {}
    for row in rows:
        key = (row["owner_kind"], row["owner_id"], row["thread_id"])
        if firsts.setdefault(key, row["engine_id"]) != row["engine_id"]:
            return True
    return any(EngineBinding.objects.filter(engine_url=engine_url, owner_kind=kind, owner_id=owner_id,
                                            thread_id=thread_id).exclude(engine_id=engine_id).exists()
               for (kind, owner_id, thread_id), engine_id in firsts.items())

