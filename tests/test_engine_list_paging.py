"""Engine conversations: every conversation and every delete of an owner is reachable, page
by page, counted truly (the list stopped at 500 conversations and 50 deletes, unsaid)."""

from __future__ import annotations

import html
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from remote import views
from remote.models import BoundDelete, EngineBinding

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def pages(client, first: str, pager: str) -> list[str]:
    """Every page from `first` by the pager's Next links, as texts."""
    texts, url = [], first
    while url:
        page = client.get(url, **HOST).content.decode()
        texts.append(page)
        found = re.search(rf'href="([^"]+)" data-pager="{pager}"', page)
        url = "/engine/conversations/" + html.unescape(found.group(1)).split("#")[0] if found else None
    return texts


def test_every_conversation_and_delete_of_an_owner_is_reachable(monkeypatch, admin_client):
    monkeypatch.setattr(views, "PAGE_SIZE", 20)
    monkeypatch.setattr(views, "DELETES_PAGE_SIZE", 5)
    now = timezone.now()
    EngineBinding.objects.bulk_create([
        EngineBinding(engine_id=f"c_{n:020d}", owner_kind="account", owner_id=9, scope="bound", thread_id=f"t{n}",
                      title=f"Conversation {n}", engine_state="live", last_activity_at=now - timedelta(minutes=n))
        for n in range(47)
    ])
    BoundDelete.objects.bulk_create([
        BoundDelete(key=f"k{n}", binding_ref=f"b_{n}", engine_id=f"c_{n + 100:020d}", owner_kind="account",
                    owner_id=9, scope="bound", thread_id=f"gone{n}", state="refused", code="engine_refused",
                    requested_at=now - timedelta(minutes=n))
        for n in range(12)
    ])
    texts = pages(admin_client, "/engine/conversations/?owner=account:9", "next")
    listed = [thread for text in texts for thread in re.findall(r'data-thread="([^"]+)"', text)]
    assert sorted(listed) == sorted(f"t{n}" for n in range(47)) and len(listed) == 47
    assert len(texts) == 3 and all("47 conversations" in t for t in texts)
    assert "Page 1 of 3" in texts[0] and "Page 3 of 3" in texts[2]
    texts = pages(admin_client, "/engine/conversations/?owner=account:9", "deletes-next")
    page_one = admin_client.get("/engine/conversations/?owner=account:9", **HOST).content.decode()
    assert "12 deletes, the most recent first" in page_one
    threads = []
    for text in texts:
        threads += re.findall(r'<code class="tid"><bdi>(gone\d+)</bdi></code>', text)
    assert threads == [f"gone{n}" for n in range(12)] and len(texts) == 3
    # A page number that is not one: the first page; past the last: the last.
    for asked, shown in (("abc", "Page 1 of 3"), ("٣", "Page 1 of 3"), ("0", "Page 1 of 3"), ("99", "Page 3 of 3")):
        page = admin_client.get(f"/engine/conversations/?owner=account:9&page={asked}", **HOST)
        assert page.status_code == 200 and shown in page.content.decode(), asked


def test_the_api_pages_every_binding_of_an_owner(admin_client):
    """GET /api/v1/bindings: pages by `limit` with a `next` cursor to the last binding (it
    stopped at 500, unsaid); a binding made mid-way comes on a later page; cursors it did not give
    are refused."""
    EngineBinding.objects.bulk_create([
        EngineBinding(engine_id=f"c_{n:020d}", owner_kind="account", owner_id=9, scope="bound", thread_id=f"t{n}",
                      engine_state="live") for n in range(7)
    ])
    seen, url, pages = [], "/api/v1/bindings?owner_kind=account&owner_id=9&limit=3", 0
    while url:
        answer = admin_client.get(url, **HOST)
        assert answer.status_code == 200
        body = answer.json()
        seen += [b["thread_id"] for b in body["results"]]
        pages += 1
        if pages == 2:  # listed by the engine while the client pages: on a later page, not lost
            EngineBinding.objects.create(engine_id="c_" + "9" * 20, owner_kind="account", owner_id=9, scope="bound",
                                         thread_id="late", engine_state="live")
        url = f"/api/v1/bindings?owner_kind=account&owner_id=9&limit=3&cursor={body['next']}" if body["next"] else None
    assert seen == [f"t{n}" for n in range(7)] + ["late"] and pages == 3
    for bad in ("x", "YjF8eA", "djJ8MQ", "b1"):
        answer = admin_client.get(f"/api/v1/bindings?owner_kind=account&owner_id=9&cursor={bad}", **HOST)
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor"), bad
        # the words of every list's cursor (r153: "The cursor is not valid." here only)
        assert answer.json()["message"].startswith("The cursor is not valid for this list: it was handed out"), bad
    for bad in ("0", "201", "x"):
        answer = admin_client.get(f"/api/v1/bindings?limit={bad}", **HOST)
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_limit"), bad


def test_the_api_refuses_a_cursor_it_did_not_give_also_while_no_binding_exists(admin_client):
    """With no owner named and no binding yet (an embedded engine, or before the first sync)
    the list answered 200 to any cursor: it is read before the list is, as on every listing."""
    for query in ("cursor=zzz", "cursor=YjF8eA", "owner_kind=account&owner_id=1&cursor=zzz"):
        answer = admin_client.get(f"/api/v1/bindings?{query}", **HOST)
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor"), query
    assert admin_client.get("/api/v1/bindings", **HOST).json() == {"owner": None, "results": [], "next": None, "reads": []}


def test_a_cursor_of_another_owners_list_is_refused_and_an_omitted_owner_is_the_cursors(admin_client):
    """r16: a `next` of one owner's list used on another's skipped that owner's bindings."""
    EngineBinding.objects.bulk_create([
        EngineBinding(engine_id=f"c_{owner}{n:019d}", owner_kind=kind, owner_id=owner, scope="bound",
                      thread_id=f"{kind}{owner}-{n}", engine_state="live")
        for kind, owner in (("account", 1), ("account", 2)) for n in range(3)
    ])
    foreign = admin_client.get("/api/v1/bindings?owner_kind=account&owner_id=2&limit=1", **HOST).json()["next"]
    answer = admin_client.get(f"/api/v1/bindings?owner_kind=account&owner_id=1&cursor={foreign}", **HOST)
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor")
    # Without an owner, the pages go on with the owner the cursor was handed out for
    body = admin_client.get(f"/api/v1/bindings?cursor={foreign}", **HOST).json()
    assert body["owner"] == {"kind": "account", "id": 2}
    assert [b["thread_id"] for b in body["results"]] == ["account2-1", "account2-2"]
