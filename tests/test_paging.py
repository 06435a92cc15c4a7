"""Paging the conversation list while conversations change: nothing vanishes, nothing repeats."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from lifecycle import views
from lifecycle.models import Conversation, DeleteOperation
from lifecycle.paging import Cursor, InvalidCursor, list_scope, snapshot_page
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}
SIZE = 5


@pytest.fixture
def listed(monkeypatch, db) -> list[Conversation]:
    """Seventeen idle conversations, one minute apart, newest first; pages of five."""
    monkeypatch.setattr(views, "PAGE_SIZE", SIZE)
    account = factories.make_account()
    return [factories.make_conversation(account, title=f"Conv {n:02d}", days_idle=n / 1440 + 1) for n in range(17)]


def get(client, url: str) -> str:
    response = client.get("/conversations/" + url, **HX)
    assert response.status_code == 200
    return response.content.decode()


def titles(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'<span class="conv-title"><bdi>(.*?)</bdi></span>', page)]


def link(page: str, which: str) -> str | None:
    found = re.search(rf'href="([^"]+)"[^>]*data-pager="{which}"', page)
    return html.unescape(found.group(1)) if found else None


def changed_note(page: str) -> list[str]:
    note = re.search(r'data-testid="changed-note">(.*?)</div>', page, re.S)
    return [html.unescape(t) for t in re.findall(r'<a href="/conversations/[^"]+"><bdi>(.*?)</bdi></a>', note.group(1))] if note else []


def walk(client, first: str) -> list[list[str]]:
    """Every page from the first by the Next links, as lists of titles."""
    pages, page = [titles(first)], first
    while link(page, "next"):
        page = get(client, link(page, "next"))
        pages.append(titles(page))
    return pages


def test_it_pages_every_conversation_exactly_once(member_client, listed):
    first = get(member_client, "")
    pages = walk(member_client, first)
    assert [len(p) for p in pages] == [5, 5, 5, 2]
    assert sum(pages, []) == [c.title for c in listed]
    assert "Page 1 of 4" in first


def test_a_conversation_that_changes_mid_way_is_shown_in_the_notice_not_lost(member_client, listed):
    first = get(member_client, "")
    assert titles(first) == [c.title for c in listed[:5]]
    second = get(member_client, link(first, "next"))

    # Someone writes to a conversation that page 3 would have listed, and another is added.
    mover = listed[12]
    factories.add_message(mover, content="new activity")
    newcomer = factories.make_conversation(factories.make_account("Other"), title="Brand new")

    third = get(member_client, link(second, "next"))
    rest = walk(member_client, third)
    seen = titles(first) + titles(second) + sum(rest, [])
    # Each conversation that existed is either on a page or named in the notice; none twice.
    assert len(seen) == len(set(seen))
    assert set(seen) | set(changed_note(third)) == {c.title for c in listed} | {"Brand new"}
    assert mover.title not in seen
    assert changed_note(third) == ["Brand new", mover.title]
    assert "2 conversations changed or were added after you opened this list" in third
    # The pages did not shift: page three starts where page two ended.
    assert titles(third) == [c.title for c in listed[10:16] if c != mover]

    # Starting again shows the changed ones in their new place, at the top.
    fresh = get(member_client, html.unescape(re.search(r'href="([^"]+)"[^>]*data-pager="refresh"', third).group(1)))
    assert titles(fresh)[:2] == ["Brand new", mover.title]
    assert changed_note(fresh) == []
    assert newcomer.pk


def test_a_change_on_a_page_already_read_does_not_shift_the_next_pages(member_client, listed):
    first = get(member_client, "")
    factories.add_message(listed[0], content="bump")  # already seen on page one
    factories.add_message(listed[3], content="bump")
    second = get(member_client, link(first, "next"))
    assert titles(second) == [c.title for c in listed[5:10]]
    assert changed_note(second) == [listed[3].title, listed[0].title]


def test_previous_goes_back_to_the_same_rows(member_client, listed):
    first = get(member_client, "")
    second = get(member_client, link(first, "next"))
    third = get(member_client, link(second, "next"))
    back = get(member_client, link(third, "previous"))
    assert titles(back) == titles(second) and "Page 2 of 4" in back
    back = get(member_client, link(back, "previous"))
    assert titles(back) == titles(first) and "Page 1 of 4" in back
    assert link(back, "previous") is None


def test_a_page_whose_rows_all_left_shows_the_nearest_page_with_true_counts(member_client, listed):
    """17 conversations in pages of 5: the fourth page holds two. Both are archived after the
    link to it was given: the link shows the last page there is (the third), counted truly,
    with a way back, instead of an empty page counting one too few and no pager."""
    pages = [get(member_client, "")]
    while link(pages[-1], "next"):
        pages.append(get(member_client, link(pages[-1], "next")))
    assert len(pages) == 4 and titles(pages[3]) == ["Conv 15", "Conv 16"]
    last_link = link(pages[2], "next")
    Conversation.objects.filter(title__in=["Conv 15", "Conv 16"]).update(archived_at=timezone.now())
    page = get(member_client, last_link)
    assert titles(page) == [c.title for c in listed[10:15]]
    assert "15 conversations" in page and "Page 3 of 3" in page and "No conversations match" not in page
    assert link(page, "next") is None
    back = get(member_client, link(page, "previous"))
    assert titles(back) == [c.title for c in listed[5:10]] and "Page 2 of 3" in back
    # Going back to a first page whose rows all left: the first page there is now.
    first_link = link(back, "previous")
    Conversation.objects.filter(title__in=[c.title for c in listed[:5]]).update(archived_at=timezone.now())
    page = get(member_client, first_link)
    assert titles(page) == [c.title for c in listed[5:10]]
    assert "10 conversations" in page and "Page 1 of 2" in page and link(page, "previous") is None


def test_a_damaged_cursor_starts_again_from_the_top(member_client, listed):
    first = titles(get(member_client, ""))
    for cursor in ("garbage", "é", "x" * 500, Cursor(timezone.now(), timezone.now(), 1).encode()[:-3] + "!!!"):
        assert titles(get(member_client, f"?cursor={cursor}")) == first


def test_the_cursor_round_trips_and_refuses_anything_else():
    now = timezone.now()
    cursor = Cursor(as_of=now, activity=now - timedelta(hours=1), pk=42, backward=True, scope="abc", ahead=7, late=2)
    assert Cursor.decode(cursor.encode(), "abc") == cursor
    unknown = Cursor(as_of=now, activity=now, pk=1, scope="abc")  # no count of the rows ahead
    assert Cursor.decode(unknown.encode(), "abc") == unknown and unknown.ahead == -1
    with pytest.raises(InvalidCursor):  # handed out by another list
        Cursor.decode(cursor.encode(), "abd")
    import base64

    def forged(raw: str) -> str:
        return base64.urlsafe_b64encode(raw.encode()).decode()

    for bad in (
        "", "not base64 at all", "x" * 300,
        forged("v2|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|1"),  # before lists were named
        forged("v3|s|2026-01-01T00:00:00|f|2026-01-01T00:00:00+00:00|1"),  # naive moment
        forged("v3|s|2026-01-01T00:00:00+00:00|x|2026-01-01T00:00:00+00:00|1"),
        forged("v3|s|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|²"),
        forged("v3|s|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|" + "9" * 30),
        forged("v3|s|yesterday|f|2026-01-01T00:00:00+00:00|1"),
        forged("v3|s|a|b"),
        forged("v4|s|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|1"),  # v4 without its counts
        forged("v4|s|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|1|-1|0"),
        forged("v4|s|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|1|3|x"),
        forged("v3|s|2026-01-01T00:00:00+00:00|f|2026-01-01T00:00:00+00:00|1|3|0"),
    ):
        with pytest.raises(InvalidCursor):
            Cursor.decode(bad, "s")


def test_the_api_form_needs_no_counts(listed):
    qs = Conversation.objects.recent()
    first = snapshot_page(qs, None, SIZE, count=False)
    assert [c.title for c in first.rows] == [c.title for c in listed[:5]]
    factories.add_message(listed[7])
    second = snapshot_page(qs, first.next, SIZE, count=False)
    assert [c.title for c in second.rows] == [c.title for c in listed[5:11] if c != listed[7]]
    assert second.next is not None and second.as_of == first.as_of


def test_a_clock_behind_the_data_still_lists_every_row(member_client, listed):
    # A conversation stamped in the future (another host's clock) is on the first page.
    ahead = factories.make_conversation(title="From a fast clock")
    Conversation.objects.filter(pk=ahead.pk).update(last_activity_at=timezone.now() + timedelta(minutes=10))
    first = get(member_client, "")
    assert titles(first)[0] == "From a fast clock"
    assert changed_note(first) == []


def test_the_api_pages_against_the_same_snapshot(member_client, listed):
    def fetch(query: str) -> dict:
        response = member_client.get("/v1/threads?" + query, **HOST)
        assert response.status_code == 200, response.content
        return response.json()

    first = fetch("limit=5")
    assert [r["title"] for r in first["results"]] == [c.title for c in listed[:5]]
    assert first["changed_since_start"] == 0 and first["as_of"].endswith("Z")
    factories.add_message(listed[7], content="moved")
    second = fetch(f"limit=5&cursor={first['next']}")
    assert [r["title"] for r in second["results"]] == [c.title for c in listed[5:11] if c != listed[7]]
    assert second["changed_since_start"] == 1 and second["as_of"] == first["as_of"]
    rest = []
    cursor = second["next"]
    while cursor:
        page = fetch(f"limit=5&cursor={cursor}")
        rest += [r["title"] for r in page["results"]]
        cursor = page["next"]
    seen = [r["title"] for r in first["results"] + second["results"]] + rest
    assert sorted(seen + [listed[7].title]) == sorted(c.title for c in listed)
    assert fetch("limit=5")["results"][0]["title"] == listed[7].title


def _late_commit(conversation: Conversation, as_of: str | timezone.datetime) -> None:
    """What a write that stamped its moment before the reading started, and committed after a
    page was read, looks like to the reader: the row moves up to a moment at or before as_of."""
    moment = as_of if not isinstance(as_of, str) else timezone.datetime.fromisoformat(as_of.replace("Z", "+00:00"))
    Conversation.objects.filter(pk=conversation.pk).update(last_activity_at=moment - timedelta(milliseconds=1))


def test_a_write_committed_after_a_page_with_a_moment_before_the_reading_is_counted_not_lost(member_client, listed):
    """r91: a write stamps its moment before it commits. Committed after the first page was
    read, with a moment before as_of, its conversation moved ahead of the pages still to come
    and was on none of them, while changed_since_start stayed 0."""
    def fetch(query: str) -> dict:
        response = member_client.get("/v1/threads?" + query, **HOST)
        assert response.status_code == 200, response.content
        return response.json()

    first = fetch("limit=5")
    _late_commit(listed[16], first["as_of"])  # the oldest: on the last page, had it not moved
    pages, cursor = [first], first["next"]
    while cursor:
        pages.append(fetch(f"limit=5&cursor={cursor}"))
        cursor = pages[-1]["next"]
    seen = [r["title"] for page in pages for r in page["results"]]
    assert listed[16].title not in seen and len(seen) == len(set(seen)) == 16
    assert [page["changed_since_start"] for page in pages] == [0] + [1] * (len(pages) - 1)
    # Late on a later page: counted from the page after it on, with what came before
    first = fetch("limit=5")
    second = fetch(f"limit=5&cursor={first['next']}")
    assert second["changed_since_start"] == 0
    _late_commit(listed[15], first["as_of"])
    third = fetch(f"limit=5&cursor={second['next']}")
    assert third["changed_since_start"] == 1 and listed[15].title not in [r["title"] for r in third["results"]]
    fourth = fetch(f"limit=5&cursor={third['next']}")
    assert fourth["changed_since_start"] == 1 and fourth["next"] is None


def test_the_console_list_counts_a_late_write_too(member_client, listed):
    first = get(member_client, "")
    as_of = snapshot_page(Conversation.objects.recent(), None, SIZE).as_of
    _late_commit(listed[12], as_of)
    second = get(member_client, link(first, "next"))
    rest = walk(member_client, second)
    seen = titles(first) + sum(rest, [])
    assert listed[12].title not in seen and len(seen) == 16
    assert "1 conversation changed or was added after you opened this list" in second


def test_a_late_write_found_on_the_way_back_is_counted_from_then_on(member_client, listed):
    """r92: Previous then Next took a late row into the counts unnoticed."""
    pages = [get(member_client, "")]
    for _ in range(2):
        pages.append(get(member_client, link(pages[-1], "next")))
    as_of = snapshot_page(Conversation.objects.recent(), None, SIZE).as_of
    Conversation.objects.filter(pk=listed[16].pk).update(last_activity_at=min(
        listed[2].last_activity_at + timedelta(seconds=1), as_of))  # into page one's range, late
    back = get(member_client, link(pages[-1], "previous"))
    assert "1 conversation changed or was added after you opened this list" in back
    forward = get(member_client, link(back, "next"))
    assert "1 conversation changed or was added after you opened this list" in forward
    assert listed[16].title not in titles(back) + titles(forward)


def test_a_forged_count_of_late_rows_is_no_cursor(listed):
    """r92: a forged `late` of 18 digits made the next cursor one of 19, which the server refused."""
    qs = Conversation.objects.recent()
    first = snapshot_page(qs, None, SIZE, count=False)
    import dataclasses

    forged = dataclasses.replace(first.next, late=10**9)
    second = snapshot_page(qs, Cursor.decode(forged.encode(), first.next.scope), SIZE, count=False)
    assert second.late == 10**9 and Cursor.decode(second.next.encode(), first.next.scope).late == 10**9
    with pytest.raises(InvalidCursor):
        Cursor.decode(dataclasses.replace(first.next, late=10**9 + 1).encode(), first.next.scope)


def test_a_cursor_handed_out_before_it_counted_rows_ahead_still_reads(listed):
    """A v3 cursor (no count of the rows ahead): read as before, nothing counted late."""
    qs = Conversation.objects.recent()
    first = snapshot_page(qs, None, SIZE, count=False)
    old = Cursor(first.as_of, first.next.activity, first.next.pk, scope=first.next.scope)
    token = old.encode().encode()
    import base64

    raw = base64.urlsafe_b64decode(token + b"=" * (-len(token) % 4)).decode().split("|")
    v3 = base64.urlsafe_b64encode("|".join(["v3", *raw[1:6]]).encode()).decode().rstrip("=")
    decoded = Cursor.decode(v3, first.next.scope)
    assert (decoded.ahead, decoded.late) == (-1, 0)
    second = snapshot_page(qs, decoded, SIZE, count=False)
    assert [c.title for c in second.rows] == [c.title for c in listed[5:10]] and second.late == 0


def test_the_api_refuses_cursors_it_did_not_give(member_client, listed):
    import base64

    old_style = base64.urlsafe_b64encode(f"{timezone.now().isoformat()}|3".encode()).decode()
    backward = Cursor(timezone.now(), timezone.now(), 3, backward=True).encode()
    for cursor in (old_style, backward, "%%%", "x" * 199):
        response = member_client.get(f"/v1/threads?cursor={cursor}", **HOST)
        assert (response.status_code, response.json()["code"]) == (400, "invalid_cursor"), cursor


@pytest.mark.django_db
@pytest.mark.parametrize(("as_of", "activity"), [
    ("9999-12-31T23:59:59-23:59", "2020-01-01T00:00:00+00:00"),
    ("2020-01-01T00:00:00+00:00", "0001-01-01T00:00:00+23:59"),
])
def test_a_cursor_with_a_time_outside_the_years_a_database_holds_is_invalid(admin_client, member_client,
                                                                              as_of, activity):
    import base64

    factories.make_conversation(title="Only")
    scope = list_scope("api", None, None, None, None, None, None, None)
    token = base64.urlsafe_b64encode("|".join(("v3", scope, as_of, "f", activity, "1")).encode()).decode().rstrip("=")
    api = member_client.get(f"/v1/threads?cursor={token}", HTTP_HOST="127.0.0.1")
    assert api.status_code == 400 and api.json()["code"] == "invalid_cursor"
    page = admin_client.get(f"/conversations/?cursor={token}", HTTP_HOST="127.0.0.1")
    assert page.status_code == 200 and "Only" in page.content.decode()  # from the top again


def test_a_conversation_that_comes_back_into_the_tab_mid_way_is_counted_not_lost(member_client, listed, admin_user):
    """Unarchived (or resumed) after the first page was read, a conversation whose place is on
    that page would be on no page and counted nowhere: it is in the changed notice instead,
    in the console and in GET /v1/threads."""
    from lifecycle.actions.set_archived import set_archived
    from lifecycle.actions.set_closed import set_closed

    back, resumed = listed[2], listed[3]
    set_archived(back, archived=True, acting_user=admin_user)
    set_closed(resumed, closed=True, acting_user=admin_user)
    first = get(member_client, "")
    assert back.title not in titles(first) and resumed.title not in titles(first)
    set_archived(back, archived=False, acting_user=admin_user)
    set_closed(resumed, closed=False, acting_user=admin_user)
    pages = walk(member_client, first)
    seen = [t for page in pages for t in page]
    assert back.title not in seen and resumed.title not in seen
    last = get(member_client, link(first, "next"))
    assert sorted(changed_note(last)) == sorted([back.title, resumed.title])
    assert "2 conversations changed or were added after you opened this list" in last
    # The API: the same snapshot rule, the same count.
    api = member_client.get("/v1/threads?view=recent&limit=5", **HOST).json()
    set_archived(back, archived=True, acting_user=admin_user)
    set_archived(back, archived=False, acting_user=admin_user)
    found, cursor, changed = [], api["next"], 0
    found += [t["title"] for t in api["results"]]
    while cursor:
        page = member_client.get(f"/v1/threads?view=recent&limit=5&cursor={cursor}", **HOST).json()
        found += [t["title"] for t in page["results"]]
        cursor, changed = page["next"], page["changed_since_start"]
    assert changed == 1 and found.count(back.title) <= 1
    assert set(found) | {back.title} == {c.title for c in listed}


def test_the_deleted_tab_lists_tombstones_newest_deletion_first_each_once(member_client, monkeypatch, admin_user):
    """The Deleted tab was ordered by each tombstone's last activity (from before its delete):
    the delete just done could be on the last page. It lists by deletion now, newest first, in
    pages (console and API), and a tombstone deleted after the list was opened is counted apart."""
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    account = factories.make_account()
    # Deleted in the reverse of their activity order: the most idle one deleted last.
    conversations = [factories.make_conversation(account, thread_id=f"t-{n}", days_idle=n + 1) for n in range(5)]
    base = timezone.now() - timedelta(hours=1)
    for n, conversation in enumerate(conversations):
        op = request_deletion(conversation, key=f"order-{n}", acting_user=admin_user)
        assert executor.run_erasure(op.pk) == "completed"
        # the completions one minute apart, t-0 first (the completion sets both moments)
        moment = base + timedelta(minutes=n)
        Conversation.objects.filter(pk=conversation.pk).update(view_changed_at=moment)
        DeleteOperation.objects.filter(pk=op.pk).update(completed_at=moment)
    newest_first = ["t-4", "t-3", "t-2", "t-1", "t-0"]

    def tids(page: str) -> list[str]:
        return re.findall(r'<span class="conv-title"><bdi>(t-\d)</bdi></span>', page)

    first = get(member_client, "?view=deleted")
    pages = [tids(first)]
    page = first
    while link(page, "next"):
        page = get(member_client, link(page, "next"))
        pages.append(tids(page))
    assert pages == [["t-4", "t-3"], ["t-2", "t-1"], ["t-0"]]
    assert tids(get(member_client, link(page, "previous"))) == ["t-2", "t-1"]

    listed, cursor = [], ""
    while True:
        answer = member_client.get(f"/v1/threads?view=deleted&limit=2{cursor}", **HOST).json()
        listed += [r["thread_id"] for r in answer["results"]]
        if not answer["next"]:
            break
        if len(listed) == 2:  # one more deleted mid-way: counted apart, never listed twice
            late = factories.make_conversation(account, thread_id="t-late", days_idle=30)
            op = request_deletion(late, key="order-late", acting_user=admin_user)
            assert executor.run_erasure(op.pk) == "completed"
        cursor = f"&cursor={answer['next']}"
    assert listed == newest_first and answer["changed_since_start"] == 1
    assert [r["thread_id"] for r in member_client.get("/v1/threads?view=deleted&limit=2", **HOST).json()["results"]] \
        == ["t-late", "t-4"]
    # Every other list keeps activity order (the least idle first).
    assert [r["thread_id"] for r in member_client.get("/v1/threads?view=all&limit=10", **HOST).json()["results"]] \
        == ["t-0", "t-1", "t-2", "t-3", "t-4", "t-late"]


def test_a_cursor_of_another_list_is_refused_not_used_to_skip_rows(member_client, listed):
    """r16: a `next` from one tab, owner or search used on another positioned that list between
    its own rows: rows were silently skipped. The API refuses it; the console starts again."""
    pending = factories.make_conversation(title="Pending one", days_idle=0.5)
    from lifecycle.actions.request_deletion import request_deletion

    request_deletion(pending, key="foreign-cursor", acting_user=None)
    factories.make_conversation(title="Also pending", days_idle=0.6)
    request_deletion(Conversation.objects.get(title="Also pending"), key="foreign-cursor-2", acting_user=None)
    foreign = member_client.get("/v1/threads?view=pending_delete&limit=1", **HOST).json()["next"]
    assert foreign
    for query in ("view=recent", "", "view=pending_delete&q=x", "view=pending_delete&archived=false"):
        answer = member_client.get(f"/v1/threads?{query}&limit=200&cursor={foreign}", **HOST)
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor"), query
        assert "handed out for other filters" in answer.json()["message"]
        spanish = member_client.get(f"/v1/threads?{query}&limit=200&cursor={foreign}", **HOST,
                                    HTTP_ACCEPT_LANGUAGE="es").json()["message"]
        assert spanish != answer.json()["message"]
    same = member_client.get(f"/v1/threads?view=pending_delete&limit=1&cursor={foreign}", **HOST)
    assert same.status_code == 200 and len(same.json()["results"]) == 1
    # The console: a cursor of the Pending delete tab on Recent lists Recent from the top.
    console_next = link(get(member_client, "?view=pending_delete"), "next")
    assert console_next is None  # one page there; take the Recent tab's own second page instead
    recent_next = link(get(member_client, ""), "next")
    cursor = recent_next.split("cursor=", 1)[1]
    assert titles(get(member_client, f"?view=archived&cursor={cursor}")) == []
    assert titles(get(member_client, f"?cursor={cursor}")) == [c.title for c in listed[5:10]]
    assert titles(get(member_client, f"?q=Conv&cursor={cursor}")) == [c.title for c in listed[:5]]
