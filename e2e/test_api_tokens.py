"""Settings > API tokens in Chromium at every size: create (shown once), revoke after a
confirmation page (no dialog), members see their own tokens read-only."""

from __future__ import annotations

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
