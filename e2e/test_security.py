"""The Content-Security-Policy holds in a real browser: the main pages and their htmx
interactions run with no violation reported, and the scripts still do their work."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN
from e2e.helpers import conversation_with_long_output, log_in, open_from_list, open_nav

pytestmark = pytest.mark.django_db(transaction=True)

RECORD_VIOLATIONS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${e.sourceFile}:${e.lineNumber}`);
});
"""


def watch(page: Page) -> list[str]:
    """Every CSP violation the browser reports, from the console and from the DOM event."""
    seen: list[str] = []
    page.on("console", lambda m: seen.append(m.text) if "Content Security Policy" in m.text else None)
    page.add_init_script(RECORD_VIOLATIONS)
    return seen


def violations(page: Page, seen: list[str]) -> list[str]:
    return seen + page.evaluate("window.__csp || []")


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_the_main_pages_run_without_a_csp_violation(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    seen = watch(page)
    errors: list[str] = []  # any other error the browser reports: a file that failed to load (r96: the icon)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    base = live_server.url

    page.goto(f"{base}/accounts/login/")
    assert page.evaluate("document.documentElement.classList.contains('js')")  # boot.js ran
    assert violations(page, seen) == []

    log_in(page, base, *ADMIN)
    assert page.evaluate("typeof window.htmx") == "object"
    page.get_by_role("searchbox").fill("a")
    page.get_by_role("searchbox").press("Enter")
    # Wait for the search's answer: htmx updates the address and swaps the list in one step.
    # A click on the list before that was once lost (the page stayed on the list).
    expect(page).to_have_url(re.compile(r"[?&]q=a(&|$)"))
    expect(page.locator("#results")).to_be_visible()
    assert violations(page, seen) == []

    conversation, tool_item = conversation_with_long_output()
    open_from_list(page, conversation)
    row = page.locator(f"#item-{tool_item.pk}")
    row.get_by_role("link", name="Show full output").click()  # an htmx swap
    expect(row.get_by_role("link", name="Show full output")).to_have_count(0)
    assert violations(page, seen) == []

    open_nav(page, "Data & storage")
    expect(page.get_by_role("heading", name="Retained facts")).to_be_visible()
    page.get_by_label("Billing facts, days").fill("3000")
    expect(page.locator("#save-bar")).to_be_visible()  # lethe.js runs under the policy
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.get_by_text("Retention periods saved.")).to_be_visible()
    assert violations(page, seen) == []

    open_nav(page, "API tokens")
    page.get_by_label("Name").fill("CSP check")
    page.get_by_role("button", name="Create token").click()
    expect(page.get_by_label("New API token")).to_be_visible()
    assert violations(page, seen) == []
    assert errors == []


def test_the_server_error_page_is_styled_within_the_policy(seeded, live_server, open_page, monkeypatch):
    """A real 500 through the whole stack: the page's style comes from a file, so the policy
    (no inline style) leaves it styled and reports nothing."""
    from lifecycle import views
    from lifecycle.models import Conversation

    page = open_page("small-phone")
    seen = watch(page)
    log_in(page, live_server.url, *ADMIN)
    conversation = Conversation.objects.exclude(state="deleted").first()

    def broken(items, **kwargs):
        raise RuntimeError("a fault for the test")

    monkeypatch.setattr(views, "item_rows", broken)
    response = page.goto(f"{live_server.url}/conversations/{conversation.public_id}/")
    assert response is not None and response.status == 500
    expect(page.get_by_role("heading", name="Something went wrong")).to_be_visible()
    assert page.evaluate("getComputedStyle(document.querySelector('main')).maxWidth") == "512px"
    assert page.evaluate("getComputedStyle(document.body).paddingTop") == "24px"
    assert violations(page, seen) == []
