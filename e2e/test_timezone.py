"""Times in the viewer's zone: the browser's by default, or one they pick (also without
JavaScript), named on absolute times."""

from __future__ import annotations

import re
import zoneinfo

import pytest
from django.template.defaultfilters import date as format_date
from django.utils import timezone
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import check_layout, log_in, open_from_list
from lifecycle.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)


def shown_in(moment, zone: str) -> str:
    """How the page writes this moment in that zone: "Nov. 30, 2026, 7:42 p.m. JST"."""
    with timezone.override(zoneinfo.ZoneInfo(zone)):
        local = timezone.localtime(moment)
        return f"{format_date(local, 'DATETIME_FORMAT')} {format_date(local, 'T')}"


def last_activity(page: Page):
    return page.locator(".status-card dt", has_text="Last activity").locator("xpath=following-sibling::dd")


def newest() -> Conversation:
    return Conversation.objects.recent().order_by("-last_activity_at", "-pk").first()


@ALL_VIEWPORTS
def test_it_shows_times_in_the_browsers_zone(seeded, live_server, open_page, viewport):
    page = open_page(viewport, timezone_id="Asia/Tokyo")
    log_in(page, live_server.url, *MEMBER)
    conversation = newest()
    title = page.locator("#results time").first
    expect(title).to_have_attribute("title", shown_in(conversation.last_activity_at, "Asia/Tokyo"))
    assert shown_in(conversation.last_activity_at, "Asia/Tokyo").endswith(" JST")
    expect(page.locator("select[name=timezone]").filter(visible=True)).to_have_value("")
    expect(page.locator("select[name=timezone]").filter(visible=True).locator("option:checked")).to_have_text(
        "Asia/Tokyo (automatic)"
    )

    open_from_list(page, conversation)
    expect(last_activity(page)).to_have_text(shown_in(conversation.last_activity_at, "Asia/Tokyo"))
    expect(page.locator("section.transcript .msg-head time").first).to_have_text(re.compile(r" JST$"))
    check_layout(page)


def test_a_picked_zone_applies_everywhere_and_automatic_returns(seeded, live_server, open_page):
    page = open_page("phone", timezone_id="Asia/Tokyo")
    log_in(page, live_server.url, *ADMIN)
    conversation = newest()
    open_from_list(page, conversation)
    zone = page.locator("#timezone-foot")
    zone.select_option("America/Sao_Paulo")  # a pointer choice applies at once

    expect(last_activity(page)).to_have_text(shown_in(conversation.last_activity_at, "America/Sao_Paulo"))
    expect(page.locator("#timezone-foot")).to_have_value("America/Sao_Paulo")
    page.goto(f"{live_server.url}/conversations/")
    expect(page.locator("#results time").first).to_have_attribute(
        "title", shown_in(conversation.last_activity_at, "America/Sao_Paulo")
    )

    page.locator("#timezone-foot").select_option("")
    expect(page.locator("#timezone-foot")).to_have_value("")
    expect(page.locator("#results time").first).to_have_attribute(
        "title", shown_in(conversation.last_activity_at, "Asia/Tokyo")
    )


def test_picking_a_zone_works_without_javascript(seeded, live_server, open_page):
    page = open_page("desktop", java_script_enabled=False)
    log_in(page, live_server.url, *MEMBER)
    conversation = newest()
    # No script reported a zone, so times are in UTC, and say so.
    expect(page.locator("#results time").first).to_have_attribute("title", shown_in(conversation.last_activity_at, "UTC"))
    switch = page.locator(".sidenav .timezone-switch")
    switch.get_by_label("Time zone").select_option("Europe/Madrid")
    switch.get_by_role("button", name="Change").click()

    expect(page.locator(".sidenav select[name=timezone]")).to_have_value("Europe/Madrid")
    expect(page.locator("#results time").first).to_have_attribute(
        "title", shown_in(conversation.last_activity_at, "Europe/Madrid")
    )
