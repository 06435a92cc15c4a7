"""The lifecycle screens when the engine at ENGINE_URL cannot be reached: a page that says
so (503), at 1280 and 320 px, and a way on by keyboard alone."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from e2e.conftest import ADMIN
from e2e.helpers import check_layout, log_in, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_page_that_asks_the_engine_says_it_cannot_be_reached(seeded, live_server, open_page, settings, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = "http://127.0.0.1:9", "t" * 40, 0
    settings.ENGINE_CONNECT_TIMEOUT = settings.ENGINE_READ_TIMEOUT = 0.5
    # The Operations list says it in place and still lists this console's own operations.
    response = page.goto(f"{live_server.url}/operations/")
    assert response.status == 503
    expect(page.get_by_test_id("engine-error")).to_contain_text("delete operations cannot be listed now")
    expect(page.get_by_role("heading", name="Tool payload cleanup", level=2)).to_be_visible()
    check_layout(page, f"operations, engine unreachable {viewport}")
    screenshot(page, "operations-engine-unreachable")
    # An operation's own page has nothing to show without it: the page says so, with a way on.
    response = page.goto(f"{live_server.url}/operations/op_11111111111111111111/")
    assert response.status == 503
    expect(page.get_by_role("heading", name="The engine cannot be reached", level=1)).to_be_visible()
    expect(page.get_by_text("Nothing was changed here. Reload the page to try again.")).to_be_visible()
    check_layout(page, f"engine unreachable {viewport}")
    screenshot(page, "engine-unreachable")
    settings.ENGINE_URL = ""  # the engine is back: the way on leads somewhere that answers
    link = page.get_by_role("link", name="Go to conversations")
    for _ in range(40):  # keyboard alone: Tab until the link has the focus, then Enter
        page.keyboard.press("Tab")
        if link.evaluate("element => element === document.activeElement"):
            break
    else:
        pytest.fail("the link never took the focus by Tab")
    page.keyboard.press("Enter")
    expect(page).to_have_url(re.compile(r"/conversations/$"))
