"""Settings > API tokens in Chromium at every size: create (shown once), revoke after a
confirmation page (no dialog), members see their own tokens read-only."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from console.models import ApiToken, hash_token
from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import check_layout, log_in, open_nav, screenshot

pytestmark = pytest.mark.django_db(transaction=True)


@ALL_VIEWPORTS
def test_an_admin_creates_and_revokes_a_token(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "API tokens")
    expect(page.get_by_role("heading", name="API tokens", level=1)).to_be_visible()
    expect(page.get_by_text("No API tokens yet.")).to_be_visible()
    check_layout(page, "api tokens, empty")

    page.get_by_label("Name").fill("Nightly export script with a rather long name")
    page.get_by_label("Expires after (days)").fill("30")
    page.get_by_role("button", name="Create token").click()
    shown = page.get_by_label("New API token")
    expect(shown).to_be_visible()
    # The outcome has the focus (and is read out), as after any other action.
    expect(page.locator("section.token-once")).to_be_focused()
    raw = shown.input_value()
    assert ApiToken.objects.get().key_hash == hash_token(raw)
    check_layout(page, "api tokens, new token shown")
    screenshot(page, "api-tokens-created")

    page.get_by_role("link", name="Revoke Nightly export script with a rather long name").click()
    expect(page.get_by_role("heading", name="Revoke “Nightly export script with a rather long name”?")).to_be_visible()
    check_layout(page, "revoke confirmation")
    page.get_by_role("button", name="Revoke token").click()
    expect(page.get_by_test_id("token-revoked")).to_contain_text("is revoked")
    expect(page.get_by_test_id("token-revoked")).to_be_focused()
    expect(page.get_by_label("New API token")).to_have_count(0)  # never shown again
    expect(page.locator(".token-row .badge")).to_have_text("Revoked")
    check_layout(page, "api tokens, revoked")
    assert ApiToken.objects.get().revoked_at is not None


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_a_member_sees_tokens_read_only(seeded, live_server, open_page, viewport):
    admin = ApiToken.objects.model.user.field.related_model.objects.get(username=ADMIN[0])
    ApiToken.issue(admin, name="Admin's script")
    member = ApiToken.objects.model.user.field.related_model.objects.get(username=MEMBER[0])
    ApiToken.issue(member, name="Member's export")
    page = open_page(viewport)
    log_in(page, live_server.url, *MEMBER)
    open_nav(page, "API tokens")
    expect(page.get_by_text("Member's export")).to_be_visible()
    expect(page.get_by_text("Admin's script")).to_have_count(0)  # another user's token is not shown
    expect(page.get_by_text("Only your own tokens are shown. Only admins can create or revoke them.")).to_be_visible()
    expect(page.get_by_role("button", name="Create token")).to_have_count(0)
    expect(page.get_by_role("link", name="Revoke")).to_have_count(0)
    check_layout(page, "api tokens, member")


def test_with_the_keyboard_open_the_focused_outcome_shows_above_the_bottom_bar(seeded, live_server, open_page):
    """320x300 (a phone with its keyboard open), in Spanish, keyboard only: the token created and
    the token revoked have the focus, and their first lines show above the fixed bottom
    navigation (r66: the revoked message was focused 11 px above it, its text hidden under it)."""
    page = open_page({"width": 320, "height": 300})
    log_in(page, live_server.url, *ADMIN)
    page.context.add_cookies([{"name": "django_language", "value": "es", "url": live_server.url}])
    page.goto(f"{live_server.url}/settings/api-tokens/")
    page.get_by_label("Nombre").focus()
    page.keyboard.type("Exportación nocturna")
    page.keyboard.press("Tab")
    page.keyboard.type("30")
    with page.expect_navigation(wait_until="load"):
        page.keyboard.press("Enter")

    def clear_of_the_bar(focused) -> None:
        expect(focused).to_be_focused()
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        box, bar = focused.bounding_box(), page.locator(".phonenav").bounding_box()
        assert box["y"] >= 0 and box["y"] + min(box["height"], 40) <= bar["y"], (box, bar)

    clear_of_the_bar(page.locator("section.token-once"))
    page.get_by_role("link", name="Revocar Exportación nocturna").focus()
    with page.expect_navigation(wait_until="load"):
        page.keyboard.press("Enter")
    page.get_by_role("button", name="Revocar token").focus()
    with page.expect_navigation(wait_until="load"):
        page.keyboard.press("Enter")
    clear_of_the_bar(page.get_by_test_id("token-revoked"))
    assert ApiToken.objects.get().revoked_at is not None


def _create_form(page, live_server, name: str):
    open_nav(page, "API tokens")
    page.wait_for_load_state("load")
    page.get_by_label("Name").fill(name)
    page.get_by_label("Expires after (days)").fill("30")
    return page.get_by_role("button", name="Create token")


def _middle(locator) -> tuple[float, float]:
    box = locator.bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def test_a_second_tap_on_create_token_sends_nothing_and_the_token_is_shown(seeded, live_server, open_page):
    """A slow network: the first POST reached the server (the token exists) but its answer is
    held. A double click, then another tap while waiting: the page sent the form twice and showed
    the second answer (a 409), so the token, shown only in the first, was lost."""
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    button = _create_form(page, live_server, "Phone app")
    posts, held = [], []

    def slow(route):
        if route.request.method != "POST":
            route.continue_()
            return
        posts.append(route.request.post_data)
        held.append((route, route.fetch()))  # the server answers now; the browser gets it later

    page.route("**/settings/api-tokens/", slow)
    # The page says when its button turns disabled (asking the page itself would wait for the
    # navigation under way).
    said = []
    page.on("console", lambda message: said.append(message.text))
    page.evaluate("""() => {
      const button = document.querySelector("form[data-submit-once] button[type=submit]");
      new MutationObserver(() => console.log("disabled=" + button.disabled)).observe(button, {attributes: true});
    }""")
    x, y = _middle(button)
    # Taps go by the mouse: a locator waits for the navigation under way to finish.
    page.mouse.dblclick(x, y)
    page.wait_for_timeout(500)
    page.mouse.click(x, y)  # a later tap, the answer still on its way
    page.wait_for_timeout(500)
    assert len(posts) == 1 and ApiToken.objects.count() == 1
    assert "disabled=true" in said
    route, answer = held[0]
    route.fulfill(response=answer)
    shown = page.get_by_label("New API token")
    expect(shown).to_be_visible()
    assert ApiToken.objects.get().key_hash == hash_token(shown.input_value())
    expect(page.get_by_test_id("token-form-resent")).to_have_count(0)
    # The new page's form sends again (its own number): the guard is per page.
    expect(page.get_by_role("button", name="Create token")).to_be_enabled()
    assert len(posts) == 1


def test_without_javascript_a_resent_form_names_its_token_and_offers_the_revoke(seeded, live_server, open_page):
    """Without the page's script a double click sends the form twice. The second answer is
    the one shown: it names the token the first one made (never its value), says to revoke it
    if the value was not copied, and the Revoke there works."""
    page = open_page("desktop", java_script_enabled=False)
    log_in(page, live_server.url, *ADMIN)
    button = _create_form(page, live_server, "Phone app")
    first = []

    def race(route):
        if route.request.method != "POST":
            route.continue_()
        elif not first:
            first.append((route, route.fetch()))  # made the token; its answer never arrives
        else:
            route.continue_()

    page.route("**/settings/api-tokens/", race)
    x, y = _middle(button)
    page.mouse.click(x, y)
    page.wait_for_timeout(500)
    page.mouse.click(x, y)  # the first answer still on its way
    notice = page.get_by_test_id("token-form-resent")
    expect(notice).to_be_visible()
    token = ApiToken.objects.get()
    raw = re.search(r'id="new-token"[^>]*value="(lethe_[^"]+)"', first[0][1].text())[1]
    assert token.key_hash == hash_token(raw)
    expect(notice).to_contain_text(f"Its first submission created the token “Phone app” ({token.prefix}…) at ")
    expect(notice).to_contain_text("If you did not copy the value, revoke this token and create a new one.")
    assert raw not in page.content()
    notice.get_by_role("link", name="Revoke Phone app").click()
    page.get_by_role("button", name="Revoke token").click()
    expect(page.get_by_test_id("token-revoked")).to_contain_text("is revoked")
    assert ApiToken.objects.get().revoked_at is not None
