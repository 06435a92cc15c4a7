"""One user's requests racing each other (r133): an answer that lands after the user moved on
(another tab, another page of the list, Back, another owner picked, another action's answer)
never writes its address over the page shown nor loses its words.

A slow answer is made with page.route: the request is held, or fetched from Lethe at once and
handed to the page later (as test_history.py's quick Backs do)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from e2e.conftest import ADMIN, VIEWPORTS
from e2e.helpers import log_in, settle
from lifecycle.enginefs import EngineHome
from lifecycle.models import Account, Conversation
from lifecycle.seeding import Seeder

pytestmark = pytest.mark.django_db(transaction=True)
WIDE_AND_PHONE = pytest.mark.parametrize("viewport", ["desktop", "phone"], ids=lambda v: str(VIEWPORTS[v]["width"]))


def list_state(page) -> dict:
    return page.evaluate("""() => ({url: location.pathname + location.search,
      tab: document.querySelector('input[name=view]:checked').value,
      count: document.querySelector('#results-count').textContent.trim(),
      q: document.querySelector('#q').value})""")


def admin_on_list(open_page, live_server, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/")
    return page


def given_up(page, pattern: str) -> list[str]:
    """The requests the page gave up (aborted) whose address matches `pattern`, as they come."""
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url) if re.search(pattern, request.url) else None)
    return failed


def hold_list_answers(page, pattern: str) -> tuple[list, list]:
    """List requests matching `pattern` are held (Back's restores pass): (held routes, given up urls)."""
    held: list = []
    page.route(re.compile(pattern),
               lambda r: r.continue_() if r.request.headers.get("hx-history-restore-request") else held.append(r))
    return held, given_up(page, pattern)


@WIDE_AND_PHONE
def test_a_tab_answer_landing_after_back_does_not_rename_the_page(seeded, live_server, open_page, viewport):
    """Closed picked (its answer slow), then Back: the restored page keeps its own address (the
    late answer pushed ?view=closed over the restored Recent list, and lost Forward)."""
    page = admin_on_list(open_page, live_server, viewport)
    page.locator("label.tab", has_text="Archived").click()
    expect(page).to_have_url(re.compile("view=archived"))
    held, failed = hold_list_answers(page, r"view=closed")
    page.locator("label.tab", has_text="Closed").click()
    settle(page, lambda: held)
    page.go_back()
    expect(page).to_have_url(re.compile(r"/conversations/$"))
    recent = Conversation.objects.recent().count()
    expect(page.locator("#results-count")).to_have_text(f"{recent} conversations")
    settle(page, lambda: failed)
    assert failed, "the tab's request was not given up"
    held[0].continue_()  # were it still wanted, its answer would land now
    page.wait_for_timeout(500)
    state = list_state(page)
    assert (state["url"], state["tab"], state["count"]) == ("/conversations/", "recent", f"{recent} conversations")
    page.go_forward()  # Forward still leads to the tab left
    expect(page).to_have_url(re.compile("view=archived"))
    expect(page.locator("#results-count")).to_have_text(f"{Conversation.objects.archived().count()} conversations")


def test_a_search_answer_landing_after_back_does_not_rename_the_page(seeded, live_server, open_page):
    page = admin_on_list(open_page, live_server, "phone")
    page.locator("label.tab", has_text="Archived").click()
    expect(page).to_have_url(re.compile("view=archived"))
    held, failed = hold_list_answers(page, r"q=review")
    page.get_by_label("Search").fill("review")
    settle(page, lambda: held)
    page.go_back()
    expect(page).to_have_url(re.compile(r"/conversations/$"))
    settle(page, lambda: failed)
    assert failed, "the search's request was not given up"
    held[0].continue_()
    page.wait_for_timeout(500)
    state = list_state(page)
    assert (state["url"], state["tab"], state["q"]) == ("/conversations/", "recent", ""), state


def test_a_page_answer_landing_after_a_tab_does_not_rename_the_page(seeded, live_server, open_page, settings):
    """Next pressed (its answer slow), then Closed picked: the late page 2 of Recent pushed its
    address while the Closed list and tab stayed shown."""
    Seeder(seed=2, anchor=timezone.now(), messages=2, home=EngineHome(settings.ENGINE_HOME)).run(30)
    page = admin_on_list(open_page, live_server, "desktop")
    held = []
    page.route(re.compile(r"cursor="), lambda r: held.append(r))
    failed = given_up(page, r"cursor=")
    page.locator(".pager a[data-pager=next]").click()
    settle(page, lambda: held)
    page.locator("label.tab", has_text="Closed").click()
    expect(page).to_have_url(re.compile("view=closed"))
    closed = Conversation.objects.closed().count()
    expect(page.locator("#results-count")).to_have_text(re.compile(rf"^{closed} conversations?$"))
    settle(page, lambda: failed)
    assert failed, "the page link's request was not given up"
    held[0].continue_()
    page.wait_for_timeout(500)
    state = list_state(page)
    assert "view=closed" in state["url"] and "cursor" not in state["url"] and state["tab"] == "closed", state


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_search_given_up_for_a_page_link_is_asked_again_on_enter(seeded, live_server, open_page, settings,
                                                                   viewport):
    """Typed "review" (its answer slow), then Next on the list still shown: the search is given
    up, and Enter in the box then asks for it (r136: the query counted as asked, so Enter did
    nothing while the box said "review" over the unfiltered list)."""
    Seeder(seed=2, anchor=timezone.now(), messages=2, home=EngineHome(settings.ENGINE_HOME)).run(30)
    page = admin_on_list(open_page, live_server, viewport)
    held = []
    page.route(re.compile(r"q=review"), lambda r: held.append(r) if not held else r.continue_())
    failed = given_up(page, r"q=review")
    page.get_by_label("Search").fill("review")
    settle(page, lambda: held)
    page.locator(".pager a[data-pager=next]").click()
    settle(page, lambda: failed)
    assert failed, "the search was not given up"
    expect(page).to_have_url(re.compile("cursor="))
    page.get_by_label("Search").press("Enter")
    expect(page).to_have_url(re.compile(r"q=review"))
    found = Conversation.objects.recent().search("review").count()
    expect(page.locator("#results-count")).to_have_text(re.compile(rf"^{found} conversations?$"))


def test_the_owner_list_keeps_the_owner_picked_while_a_find_was_on_its_way(seeded, live_server, open_page):
    """Past 100 owners, "Find an owner" narrows the Owner list. A name typed (its answer slow),
    then an owner picked: the narrowed options landed saying "All owners" over that owner's list."""
    for i in range(110):
        Account.objects.create(name=f"Zeta Org {i:03d}")
    owner = Conversation.objects.recent().filter(account__isnull=False).first().account
    page = admin_on_list(open_page, live_server, "desktop")
    held = []
    page.route(re.compile(r"owner_options=1"), lambda r: held.append(r) if not held else r.continue_())
    page.locator("#owner-find").fill("zeta")
    settle(page, lambda: held)
    page.select_option("#owner", label=owner.name)
    expect(page).to_have_url(re.compile(rf"owner=account%3A{owner.pk}"))
    held[0].continue_()  # the answer asked for with no owner picked: asked for again, with this one
    expect(page.locator("#owner option", has_text="Zeta Org 000")).to_have_count(1)  # narrowed as typed
    expect(page.locator("#owner")).to_have_value(f"account:{owner.pk}")
    state = list_state(page)
    assert f"owner=account%3A{owner.pk}" in state["url"]


def test_a_tab_whose_request_failed_can_be_picked_again(seeded, live_server, open_page):
    """The Closed tab's request fails: the page says so and the tab goes back to the list shown,
    so picking Closed again asks again (it stayed picked, and picking it sent nothing)."""
    page = admin_on_list(open_page, live_server, "phone")
    mode = {"fail": True}
    sent = []

    def handle(route):
        sent.append(route.request.url)
        route.abort() if mode["fail"] else route.continue_()

    page.route(re.compile(r"view=closed"), handle)
    page.locator("label.tab", has_text="Closed").click()
    expect(page.get_by_test_id("results-error")).to_be_visible()
    expect(page.locator("label.tab", has_text="Recent").locator("input")).to_be_checked()
    mode["fail"] = False
    page.locator("label.tab", has_text="Closed").click()
    closed = Conversation.objects.closed().count()
    expect(page.locator("#results-count")).to_have_text(re.compile(rf"^{closed} conversations?$"))
    expect(page.get_by_test_id("results-error")).to_be_hidden()
    assert len(sent) == 2, sent


def analyze_then_compact(open_page, live_server, viewport="desktop"):
    """Analyze savings pressed, then Compact database, both requests held: (page, analyze, compact)."""
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/settings/system/data-storage/")
    held = []
    page.route(re.compile(r"/(compact|tool-payload-cleanup/analyze)/$"), lambda r: held.append(r))
    page.click("button.analyze-btn")
    page.click("#compact-now")
    settle(page, lambda: len(held) == 2)
    analyze = next(r for r in held if "analyze" in r.request.url)
    compact = next(r for r in held if "compact" in r.request.url)
    return page, analyze, compact


@pytest.mark.parametrize("how", ["network", "proxy"])
def test_compact_whose_answer_is_lost_after_analyze_replaced_its_form_says_so(seeded, live_server, open_page, how):
    """The compact form left the page (Analyze's answer replaced it), then the compact's answer
    was lost, or a proxy answered for Lethe: the page says so beside Compact database, as it does
    while the form is there (r136: nothing was said)."""
    page, analyze, compact = analyze_then_compact(open_page, live_server)
    analyze.fulfill(response=analyze.fetch())
    expect(page.locator("#cancel-analysis")).to_be_visible()
    if how == "network":
        compact.abort()
    else:
        compact.fulfill(status=502, content_type="text/html", body="<html><body><h1>Bad Gateway</h1></body></html>")
    # Nothing reached Lethe: the status read again shows no compaction, and the page says so.
    expect(page.get_by_test_id("compact-error")).to_contain_text("did not go through", timeout=15000)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_compact_answered_session_ended_after_its_form_left_says_so_and_stays(seeded, live_server, open_page,
                                                                             viewport):
    """The compact form left the page (Analyze's answer replaced it), then the session ended and
    Compact's answer said so (401, with a redirect to sign in): the page stays, with the words
    it says when the form is there (r138: it went to the sign-in page, or asked to leave a draft
    and then said it could not tell whether the request went through)."""
    from django.contrib.sessions.models import Session

    page, analyze, compact = analyze_then_compact(open_page, live_server, viewport)
    analyze.fulfill(response=analyze.fetch())
    expect(page.locator("#cancel-analysis")).to_be_visible()
    Session.objects.all().delete()
    answer = compact.fetch()
    assert answer.status == 401
    compact.fulfill(response=answer)
    expect(page.get_by_test_id("compact-error")).to_contain_text("Your session ended, so nothing was done.")
    assert page.url.endswith("/settings/system/data-storage/"), page.url


def test_compact_refused_while_analyze_was_answering_says_so(seeded, live_server, open_page):
    """Analyze savings, then Compact database before Analyze's answer: Lethe refuses the compact
    (one operation at a time), and its words showed nowhere: Analyze's answer had replaced the
    compact form, and the refusal's regions were looked for in that form's old copy."""
    page, analyze, compact = analyze_then_compact(open_page, live_server)
    answers = analyze.fetch(), compact.fetch()
    assert [a.status for a in answers] == [202, 409]
    analyze.fulfill(response=answers[0])
    expect(page.locator("#cancel-analysis")).to_be_visible()
    compact.fulfill(response=answers[1])
    expect(page.get_by_test_id("compact-error")).to_contain_text("one operation runs at a time, so nothing new was "
                                                                 "started")
