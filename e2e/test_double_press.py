"""A button pressed twice before its answer arrives (a double tap on a slow network, r122): its
form goes once, and the page shows the answer to that one press. The forms of plain POST actions
say data-submit-once (lethe.js): a second press while the first is on its way is dropped.

The slow network: Playwright's route sends each POST on to Lethe at once (route.fetch) and hands
its answer to the page only after SLOW seconds; the second press comes 150 ms after the first,
from the page still shown.
"""

from __future__ import annotations

import contextlib
import re
import time

import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, Route, expect

from e2e.conftest import ADMIN, VIEWPORTS
from e2e.helpers import log_in, open_from_list
from lifecycle.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)

NARROW_AND_WIDE = pytest.mark.parametrize("viewport", ["desktop", "small-phone"],
                                          ids=lambda v: str(VIEWPORTS[v]["width"]))
SLOW = 0.6  # seconds the answer takes to reach the page


def slow_answers(page: Page, pattern: str) -> list[str]:
    """Each request to `pattern` reaches Lethe at once and its answer reaches the page SLOW s
    later; returns the POSTs the page sent (page.on("request"), whatever became of them)."""
    posts = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)

    def handle(route: Route) -> None:
        answer = route.fetch(max_redirects=0)
        time.sleep(SLOW)
        # The page may have gone on to a second press's request (without the guard).
        with contextlib.suppress(PlaywrightError):
            route.fulfill(response=answer)

    page.route(pattern, handle)
    return posts


def press_twice(page: Page, button) -> None:
    """Two presses 150 ms apart, from the page as it is (the second before the first's answer)."""
    button.evaluate("(b) => { b.click(); setTimeout(() => b.click(), 150); }")


def listed_for_an_admin(open_page, live_server, viewport: str) -> tuple[Conversation, Page]:
    """A live conversation, and an admin's page on the conversation list searched for it."""
    conversation = Conversation.objects.recent().order_by("-last_activity_at", "-pk").first()
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/?q={conversation.title}")
    page.wait_for_load_state("load")
    return conversation, page


def assert_one_press_taken(page: Page, posts: list, said: str, not_said: str) -> None:
    """The first press's own answer is shown, never the second's "already", and one request went."""
    expect(page.locator(".flash")).to_contain_text(said)
    expect(page.get_by_text(not_said)).to_have_count(0)
    page.wait_for_timeout(int(SLOW * 1000))  # a second request would have been sent by now
    assert len(posts) == 1, posts


@NARROW_AND_WIDE
def test_close_pressed_twice_goes_once_and_shows_its_own_answer(seeded, live_server, open_page, viewport):
    conversation, page = listed_for_an_admin(open_page, live_server, viewport)
    open_from_list(page, conversation)
    posts = slow_answers(page, f"**/conversations/{conversation.public_id}/close/")

    close = page.locator("#lifecycle-actions").get_by_role("button", name="Close")
    press_twice(page, close)

    assert_one_press_taken(page, posts, "Closed: no turn runs in it and no process holds it until it is resumed.",
                           "It was already closed: nothing changed.")
    expect(page.locator("#lifecycle-actions").get_by_role("button", name="Resume")).to_be_enabled()
    conversation.refresh_from_db()
    assert conversation.closed_at is not None

    # Back to the page the press was made on: its buttons work again.
    page.go_back()
    expect(page).to_have_url(re.compile(rf"/conversations/{conversation.public_id}/$"))
    for button in page.locator("#lifecycle-actions form button").all():
        expect(button).to_be_enabled()


@NARROW_AND_WIDE
def test_archive_pressed_twice_on_the_list_goes_once_and_shows_its_own_answer(seeded, live_server, open_page, viewport):
    conversation, page = listed_for_an_admin(open_page, live_server, viewport)
    posts = slow_answers(page, f"**/conversations/{conversation.public_id}/archive/")

    row = page.locator("#results .conv").filter(has_text=conversation.title).first
    press_twice(page, row.get_by_role("button", name=re.compile("^Archive")))

    assert_one_press_taken(page, posts, "Archived: hidden from Recent.", "It was already archived: nothing changed.")
    conversation.refresh_from_db()
    assert conversation.archived_at is not None


def test_archive_pressed_twice_on_the_conversation_goes_once(seeded, live_server, open_page):
    conversation, page = listed_for_an_admin(open_page, live_server, "desktop")
    open_from_list(page, conversation)
    posts = slow_answers(page, f"**/conversations/{conversation.public_id}/archive/")

    press_twice(page, page.locator("#lifecycle-actions").get_by_role("button", name="Archive"))

    assert_one_press_taken(page, posts, "Archived: hidden from Recent.", "It was already archived: nothing changed.")
    conversation.refresh_from_db()
    assert conversation.archived_at is not None

