"""The conversation list: tabs, owner switch, search and pages, all updated in place by htmx."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import check_layout, expect_said, log_in, screenshot
from lifecycle.models import Account, Computer, Conversation, Scope
from tests.factories import add_message

pytestmark = pytest.mark.django_db(transaction=True)


def count_text(n: int) -> str:
    return f"{n} conversation" if n == 1 else f"{n} conversations"


def in_list_order(queryset) -> list[str]:
    return [c.title for c in queryset.order_by("-last_activity_at", "-pk")]


def expect_listed(page: Page, queryset) -> None:
    """The results show exactly these conversations, newest first (waits for the swap)."""
    expect(page.locator("#results .count")).to_have_text(count_text(queryset.count()))
    expect(page.locator("#results .conv-title")).to_have_text(in_list_order(queryset))


def signed_in_list(open_page, viewport: str, base_url: str, who=ADMIN) -> tuple[Page, object]:
    """A signed-in page showing the Recent list, and that list's queryset."""
    page = open_page(viewport)
    log_in(page, base_url, *who)
    everyone = Conversation.objects.recent()
    expect_listed(page, everyone)
    return page, everyone


def tab(page: Page, name: str):
    return page.locator("label.tab", has_text=name)


@ALL_VIEWPORTS
def test_it_switches_between_recent_archived_and_closed(seeded, live_server, open_page, viewport):
    page, _recent = signed_in_list(open_page, viewport, live_server.url, MEMBER)

    for key, name in [("archived", "Archived"), ("closed", "Closed"), ("recent", "Recent")]:
        tab(page, name).click()

        expect_listed(page, getattr(Conversation.objects, key)())
        expect(page).to_have_url(re.compile(rf"/conversations/\?view={key}(&|$)"))
        expect(tab(page, name).locator("input")).to_be_checked()
        # Exactly one tab looks selected: the one just chosen.
        colors = page.locator("label.tab").evaluate_all(
            "tabs => tabs.map(t => getComputedStyle(t).backgroundColor)"
        )
        chosen = ["Recent", "Archived", "Closed"].index(name)
        others = {color for i, color in enumerate(colors) if i != chosen}
        assert len(others) == 1 and colors[chosen] not in others, colors

    tab(page, "Archived").click()
    expect_listed(page, Conversation.objects.archived())
    expect(page.locator("#results .conv").first.locator(".badge", has_text="Archived")).to_be_visible()


@ALL_VIEWPORTS
def test_it_filters_by_owner(seeded, live_server, open_page, viewport):
    page, everyone = signed_in_list(open_page, viewport, live_server.url)

    for owner in [Account.objects.get(name="Harbor Analytics"), Computer.objects.get(name="build-box")]:
        kind = "account" if isinstance(owner, Account) else "computer"
        theirs = Conversation.objects.recent().owned_by(kind, owner.pk)
        assert 0 < theirs.count() < everyone.count()

        page.get_by_label("Owner").select_option(label=owner.name)

        expect_listed(page, theirs)
        expect(page).to_have_url(re.compile(rf"owner={kind}%3A{owner.pk}"))
        # Every row shown says it belongs to that owner.
        scope = "Account" if kind == "account" else "Local"
        badges = page.locator("#results .conv .badge-" + (Scope.BOUND if kind == "account" else Scope.LOCAL))
        expect(badges).to_have_text([f"{scope} · {owner.name}"] * theirs.count())

    page.get_by_label("Owner").select_option(label="All owners")
    expect_listed(page, everyone)


@ALL_VIEWPORTS
def test_it_narrows_the_list_by_searching(seeded, live_server, open_page, viewport):
    page, everyone = signed_in_list(open_page, viewport, live_server.url)
    search = page.get_by_label("Search")

    search.press_sequentially("draft")

    matches = Conversation.objects.recent().search("draft")
    assert 0 < matches.count() < everyone.count()
    expect_listed(page, matches)
    expect(page).to_have_url(re.compile(r"q=draft"))
    assert all("draft" in title.lower() for title in in_list_order(matches))

    search.clear()
    search.press_sequentially("no such conversation")
    expect(page.locator("#results .empty")).to_have_text("No conversations match.")
    expect(page.locator("#results .count")).to_have_text(count_text(0))

    # A thread id works too.
    thread = Conversation.objects.recent().order_by("pk").last().thread_id
    search.clear()
    search.press_sequentially(thread)
    expect_listed(page, Conversation.objects.recent().search(thread))
    expect(page.locator("#results .tid", has_text=thread).first).to_be_visible()


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_one_query_asks_the_server_once(seeded, live_server, open_page, viewport):
    """Typing then Enter at once, typing and waiting, a cleared box, a tab, a tab picked while
    typing: one list request each, none for Enter on the query shown, and none repeated after it (a late repeat of the Enter's request replaced the list
    under a click); after going back, the filters match the restored list and a query is asked even if it
    was the last one asked."""
    page, everyone = signed_in_list(open_page, viewport, live_server.url)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if r.headers.get("hx-request") else None)
    search = page.get_by_label("Search")

    search.fill("draft")  # one input event: no partial query can settle on a slow machine
    search.press("Enter")  # within the 300 ms (or after: the same query is not asked again)
    expect_listed(page, Conversation.objects.recent().search("draft"))
    page.wait_for_timeout(800)  # past any delayed trigger
    assert [re.sub(r"^.*\?", "", url) for url in asked] == ["view=recent&owner=&q=draft"]

    search.press_sequentially("s")  # typing alone: one request once the typing settles
    expect_listed(page, Conversation.objects.recent().search("drafts"))
    search.press("Enter")  # the query the list shows: not asked again
    page.wait_for_timeout(800)
    assert [re.sub(r"^.*\?", "", url) for url in asked] == ["view=recent&owner=&q=draft", "view=recent&owner=&q=drafts"]

    search.clear()
    expect_listed(page, everyone)
    page.locator("label.tab", has_text="Archived").click()
    expect_listed(page, Conversation.objects.archived())
    page.wait_for_timeout(800)
    assert [re.sub(r"^.*\?", "", url) for url in asked][2:] == ["view=recent&owner=&q=", "view=archived&owner=&q="]

    # Back to the list of another query, then the query asked last typed again: asked again.
    search.fill("draft")
    search.press("Enter")
    expect_listed(page, Conversation.objects.archived().search("draft"))
    page.go_back()
    expect_listed(page, Conversation.objects.archived())
    # The filters say what the restored list is (the cached markup had Recent and no query)
    expect(page.locator("label.tab", has_text="Archived").locator("input")).to_be_checked()
    expect(search).to_have_value("")
    search.fill("draft")
    expect_listed(page, Conversation.objects.archived().search("draft"))

    # A tab picked before the typing settles: one request, with the query typed so far.
    page.wait_for_timeout(800)
    asked.clear()
    # Typed and picked in one task: under load a real click can land after the 300 ms.
    search.evaluate("""box => {
        box.value += "s";
        box.dispatchEvent(new Event("input", {bubbles: true}));
        box.form.querySelector("input[name=view][value=recent]").click();
    }""")
    expect_listed(page, Conversation.objects.recent().search("drafts"))
    page.wait_for_timeout(800)
    assert [re.sub(r"^.*\?", "", url) for url in asked] == ["view=recent&owner=&q=drafts"]


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_it_pages_through_a_long_list(seeded, live_server, open_page, viewport):
    account = Account.objects.get(name="Northwind Labs")
    now = timezone.now()
    Conversation.objects.bulk_create(
        Conversation(scope=Scope.BOUND, account=account, thread_id=f"thr_page_{n:03d}",
                     title=f"Older planning note {n:02d}", created_at=now - timedelta(days=800 + n),
                     last_activity_at=now - timedelta(days=700 + n))
        for n in range(30)
    )
    everyone = in_list_order(Conversation.objects.recent())
    assert len(everyone) > 25
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    expect(page.locator("#results .count")).to_have_text(count_text(len(everyone)))
    expect(page.locator("#results .conv-title")).to_have_text(everyone[:25])
    expect(page.locator(".pager")).to_contain_text("Page 1 of 2")

    page.locator(".pager").get_by_role("link", name="Next").click()

    expect(page.locator(".pager")).to_contain_text("Page 2 of 2")
    expect(page).to_have_url(re.compile(r"cursor="))
    expect(page.locator("#results .conv-title")).to_have_text(everyone[25:])
    assert everyone[-1] == "Older planning note 29"  # the oldest comes last

    page.locator(".pager").get_by_role("link", name="Previous").click()
    expect(page.locator(".pager")).to_contain_text("Page 1 of 2")
    expect(page.locator("#results .conv-title")).to_have_text(everyone[:25])


@ALL_VIEWPORTS
def test_paging_keeps_its_order_and_names_what_changed(seeded, live_server, open_page, viewport):
    account = Account.objects.get(name="Northwind Labs")
    now = timezone.now()
    Conversation.objects.bulk_create(
        Conversation(scope=Scope.BOUND, account=account, thread_id=f"thr_snap_{n:03d}",
                     title=f"Snapshot note {n:02d}", created_at=now - timedelta(days=900),
                     last_activity_at=now - timedelta(days=700 + n))
        for n in range(30)
    )
    everyone = in_list_order(Conversation.objects.recent())
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    expect(page.locator("#results .conv-title")).to_have_text(everyone[:25])

    # While the first page is read, a conversation the second page would list gets a message.
    mover = Conversation.objects.get(title=everyone[30])
    add_message(mover, content="a late reply")
    page.locator(".pager").get_by_role("link", name="Next").click()

    expect(page.locator(".pager")).to_contain_text("Page 2 of 2")
    expect(page.locator("#results .conv-title")).to_have_text([t for t in everyone[25:] if t != mover.title])
    note = page.get_by_test_id("changed-note")
    expect(note).to_contain_text("1 conversation changed or was added after you opened this list")
    expect(note.get_by_role("link", name=mover.title)).to_have_attribute(
        "href", f"/conversations/{mover.public_id}/"
    )
    check_layout(page, "list with the changed notice")

    note.get_by_role("link", name="Refresh the list").click()
    expect(page.locator("#results .conv-title").first).to_have_text(mover.title)
    expect(page.get_by_test_id("changed-note")).to_have_count(0)
    expect(page.locator("#results-count")).to_be_focused()


@pytest.mark.parametrize(("how", "viewport"),
                         [("no-answer", "desktop"), ("no-answer", "phone"), ("proxy-502", "small-phone")])
def test_a_list_request_that_fails_says_so_and_enter_asks_again(seeded, live_server, open_page, how, viewport):
    page, _ = signed_in_list(open_page, viewport, live_server.url)
    count = page.locator("#results .count")
    everything = Conversation.objects.recent()
    expect(count).to_have_text(count_text(everything.count()))

    def fail(route):
        if route.request.headers.get("hx-request"):
            if how == "no-answer":
                route.abort()
            else:
                route.fulfill(status=502, content_type="text/html", body="<html><body>Bad gateway</body></html>")
        else:
            route.continue_()

    page.route(re.compile(r".*/conversations/\?.*"), fail)
    box = page.get_by_label("Search")
    box.fill("test")
    error = page.get_by_test_id("results-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("The list below is the one shown before")
    expect(count).to_have_text(count_text(everything.count()))  # the old list, said to be the old one
    check_layout(page, "list error")
    screenshot(page, f"conversation-list-error-{how}", full_page=False)
    page.unroute(re.compile(r".*/conversations/\?.*"))
    box.press("Enter")  # the same query: asked again, since it was never shown
    expect(count).to_have_text(count_text(everything.search("test").count()))
    expect(error).to_be_hidden()


def test_past_a_hundred_owners_an_owner_is_found_by_typing_part_of_its_name(seeded, live_server, open_page,
                                                                             monkeypatch):
    """r78: every owner was an option of the Owner list; past OWNER_CHOICES, "Find an owner"
    narrows it as a name is typed, by keyboard, on a 320 px phone with the keyboard open."""
    from lifecycle import views

    monkeypatch.setattr(views, "OWNER_CHOICES", 3)
    page = open_page({"width": 320, "height": 420})
    log_in(page, live_server.url, *ADMIN)
    owner = Computer.objects.get(name="build-box")
    theirs = Conversation.objects.recent().owned_by("computer", owner.pk)
    finder = page.get_by_label("Find an owner")
    expect(page.locator("#owner option:not([value=''])")).to_have_count(3)
    page.evaluate("window.__note = document.getElementById('owner-find-note')")
    finder.focus()
    page.keyboard.type("BUILD")
    expect(page.locator("#owner option:not([value=''])")).to_have_text(["build-box"])
    found = "1 owner has “BUILD” in its name."
    expect(page.locator("#owner-find-note")).to_have_text(found)
    # Said, once (r105: each answer replaced the whole live region, and a region put in the page
    # with its words is not read out): the same region stays, only its words change.
    expect_said(page, "owner-find-note", found)
    assert page.evaluate("window.__note === document.getElementById('owner-find-note')")
    # One swap writes the region in two steps (its new words in, then the old out), each recorded.
    notes = [" ".join(text.split()) for region, text in page.evaluate("window.__said") if region == "owner-find-note"]
    assert [text for n, text in enumerate(notes) if text == found and (n == 0 or notes[n - 1] != text)] == [found], notes
    expect(page.locator("#results .count")).to_have_text(count_text(Conversation.objects.recent().count()))  # not yet
    page.keyboard.press("Shift+Tab")  # back to the Owner list, and pick it by keyboard
    expect(page.get_by_label("Owner", exact=True)).to_be_focused()
    page.get_by_label("Owner", exact=True).select_option(label="build-box")
    expect_listed(page, theirs)
    expect(page.get_by_label("Owner", exact=True)).to_have_value(f"computer:{owner.pk}")
    check_layout(page)
