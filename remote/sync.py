"""Bindings from an engine: one per conversation it holds, under that conversation's owner."""

from __future__ import annotations

import itertools
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.utils import timezone
from django.utils.translation import gettext_lazy

from console.api import MAX_WHOLE_NUMBER
from lifecycle import faults
from lifecycle.engine.http import EngineBadAnswer, engine_text
from lifecycle.errors import ActionRefused
from lifecycle.moments import read_moment
from remote.delivery import engine_for
from remote.models import BoundDelete, BoundDeleteState, EngineBinding, EngineRead

PAGE = 200


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
    from django.utils.translation import gettext

    words = failure_words(exc.code, exc.message)
    kept = getattr(exc, "kept", None)
    if kept is None:
        return words
    if not any(kept.values()):
        return words + " " + gettext("Nothing was read.")
    return words + " " + gettext("The pages read before it are kept (%(created)s new conversations, %(updated)s "
                                 "brought up to date, %(returned)s back after a completed delete).") % kept


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
    return reads


def _row(row) -> dict:
    """The fields a binding takes from one of the engine's rows, checked; EngineBadAnswer when
    the row is not one (nothing of the page is written then)."""
    try:
        owner = row["owner"]
        fields = {
            "engine_id": row["id"], "owner_kind": owner["kind"], "owner_id": owner["id"], "scope": row["scope"],
            "thread_id": row["thread_id"], "engine_state": row["state"], "title": row.get("title") or "",
        }
        activity = row.get("last_activity_at")
        fields["last_activity_at"] = read_moment(activity) if activity else None
    except (KeyError, TypeError, ValueError):
        raise EngineBadAnswer("not a conversation") from None
    texts = ("engine_id", "scope", "thread_id", "engine_state", "title")
    if (not all(isinstance(fields[name], str) for name in texts) or not fields["engine_id"]
            or fields["owner_kind"] not in OWNER_KINDS or isinstance(fields["owner_id"], bool)
            # (an owner id the API can filter on: a larger one was stored and could not be listed, r62)
            or not isinstance(fields["owner_id"], int) or not 0 <= fields["owner_id"] <= MAX_WHOLE_NUMBER
            or len(fields["scope"]) > 8 or len(fields["engine_state"]) > 16 or len(fields["title"]) > 300
            or len(fields["thread_id"]) > 128 or len(fields["engine_id"]) > 32
            or (activity and fields["last_activity_at"] is None)):
        raise EngineBadAnswer("not a conversation")
    return fields


def refresh(engine_url: str = "") -> dict[str, int]:
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

    Each page is checked whole before any of it is written (a page with a row that is not a
    conversation stops the sync, EngineBadAnswer, with the pages before it kept), and a list
    that repeats a cursor, never ends, or hands out pages with nothing on them one after
    another (EMPTY_PAGES) stops it the same way. A list whose last page says
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
    now = timezone.now()
    _record(engine_url, now, began=True)  # a read stopped before its end is known by this (r71)
    try:
        for _pass in range(PASSES):
            if not _one_pass(engine, engine_url, now, counts, made, updated):
                break
    except ActionRefused as exc:
        exc.kept = {**counts, "updated": len(updated)}  # what the pages before the failure wrote
        _record(engine_url, now, exc)
        raise
    _record(engine_url, now)
    counts["updated"] = len(updated)
    return counts


def _record(engine_url: str, at, failure: ActionRefused | None = None, *, began: bool = False) -> None:
    """The read that began at `at` into the engine's EngineRead row: its start (`began`), then
    its end, whole or failed; what a read that began before the one recorded (two at once) says
    changes nothing of it."""
    with transaction.atomic():
        row, _made = EngineRead.objects.select_for_update().get_or_create(engine_url=engine_url)
        if began:
            if row.started_at is None or at > row.started_at:
                row.started_at = row.active_at = at
                row.save(update_fields=["started_at", "active_at"])
        elif failure is None:
            if row.read_at is None or at > row.read_at:
                row.read_at = at
                row.save(update_fields=["read_at"])
        elif row.failed_at is None or at > row.failed_at:
            row.failed_at, row.error_code = at, failure.code
            # The engine's own words, when it gave some (not this console's placeholder for none)
            said = (getattr(failure, "answer", None) or {}).get("message") if not failure.code.startswith(
                "engine_") else None
            row.error_message = engine_text(said)[:500] if isinstance(said, str) and said.strip() else ""
            row.save(update_fields=["failed_at", "error_code", "error_message"])


def _one_pass(engine, engine_url: str, now, counts: dict[str, int], made: set[str], updated: set[str]) -> int:
    """Read the engine's list once, page by page, into the bindings; how many conversations its
    last page says changed since the first (they were left out)."""
    cursor = None
    seen: set[str] = set()
    empty = 0
    for pages_read in itertools.count(1):
        asked_at = timezone.now()
        page = engine.threads(view="all", limit=PAGE, cursor=cursor)
        results = page.get("results") if isinstance(page, dict) else None
        if not isinstance(results, list):
            raise EngineBadAnswer("not a page of conversations")
        rows = [_row(row) for row in results]
        # The page's cursor checked before any of the page is written, as its rows are: a failed
        # read says nothing was taken from the answer that failed it (r64: a repeated cursor's page
        # was written and counted first).
        cursor = page.get("next")
        if cursor:
            if not isinstance(cursor, str) or cursor in seen:
                raise EngineBadAnswer("a repeated cursor")
            empty = 0 if rows else empty + 1
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

