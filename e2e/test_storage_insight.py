"""Data & storage > Storage: the measured sizes, the chart and Measure now, at 1280 and 320 px."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, MEMBER
from e2e.helpers import check_layout, log_in, open_nav
from insight.models import ConversationSize, DailySize, Measurement
from insight.tasks import measure_storage

pytestmark = pytest.mark.django_db(transaction=True)
WIDTHS = pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])


def measured_history() -> None:
    """A month of earlier days, then a real measurement of the seeded data for today."""
    today = timezone.now().date()
    DailySize.objects.bulk_create([
        DailySize(day=today - timedelta(days=n), measured_at=timezone.now(), database_bytes=4_000_000 - 50_000 * n,
                  engine_bytes=900_000 - 10_000 * n, payload_bytes=2_000_000 - 30_000 * n)
        for n in range(1, 31)])
    measure_storage()


def open_storage(page: Page, base: str, who: tuple[str, str]):
    log_in(page, base, *who)
    open_nav(page, "Data & storage")
    section = page.locator("#storage-insight")
    expect(section.get_by_role("heading", name="Storage", level=2)).to_be_visible()
    page.wait_for_load_state("load")  # the page's script runs at the end of parsing
    return section


@WIDTHS
def test_an_admin_sees_the_sizes_and_measures_now(seeded, live_server, open_page, viewport):
    measured_history()
    page = open_page(viewport)
    section = open_storage(page, live_server.url, ADMIN)
    expect(section.get_by_test_id("insight-status")).to_contain_text("Measured")
    chart = section.get_by_role("img", name="Storage size per day")
    expect(chart).to_be_visible()
    assert chart.locator("circle").count() == 31 * 3
    box = chart.bounding_box()
    assert box["width"] <= page.viewport_size["width"] and box["height"] >= 100
    largest = section.get_by_test_id("largest-conversations").get_by_role("link")
    expect(largest).to_have_count(min(20, ConversationSize.objects.count()))
    kinds = section.get_by_test_id("tool-kinds").get_by_role("link")
    assert kinds.count() >= 1
    for n in range(kinds.count()):
        assert kinds.nth(n).get_attribute("href") == "/settings/system/data-storage/#tool-card"
    expect(page.locator("#tool-card")).to_have_count(1)  # the links land on the cleanup card
    check_layout(page, f"storage insight {viewport}")

    section.get_by_role("button", name="Measure now").click()
    expect(page).to_have_url(re.compile(r"/settings/system/data-storage/$"))
    expect(page.locator("#storage-insight").get_by_test_id("insight-pending")).to_be_visible()
    # Said where the focus starts, as after any other action (r66: the focus was lost to the page).
    expect(page.locator(".flash")).to_be_focused()
    expect(page.locator(".flash")).to_contain_text("Measurement requested")
    assert OrmQ.objects.count() == 1 and Measurement.objects.get().pending
    check_layout(page, f"storage insight pending {viewport}")

    top = ConversationSize.objects.order_by("-total_bytes", "conversation_id").first()
    page.locator("#storage-insight").get_by_test_id("largest-conversations").get_by_role("link").first.click()
    from lifecycle.models import Conversation

    expect(page).to_have_url(re.compile(rf"/conversations/{Conversation.objects.get(pk=top.conversation_id).public_id}/delete/$"))


@WIDTHS
def test_a_member_sees_it_read_only(seeded, live_server, open_page, viewport):
    measured_history()
    page = open_page(viewport)
    section = open_storage(page, live_server.url, MEMBER)
    expect(section.get_by_role("button", name="Measure now")).to_have_count(0)
    expect(section.get_by_test_id("largest-conversations").get_by_role("link").first).to_be_visible()
    check_layout(page, f"storage insight member {viewport}")


@WIDTHS
def test_before_the_first_measurement_it_says_so(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    section = open_storage(page, live_server.url, ADMIN)
    expect(section.get_by_test_id("insight-status")).to_have_text(
        "Not measured yet. A background job measures storage once a day.")
    expect(section.get_by_role("img")).to_have_count(0)
    check_layout(page, f"storage insight unmeasured {viewport}")


@WIDTHS
def test_an_incomplete_measurement_and_a_lost_request_are_said_so(seeded, live_server, open_page, viewport):
    """What the page says when the engine folder could not all be read and a requested
    measurement did not finish: never a current figure it does not have."""
    from e2e.helpers import screenshot

    measured_history()
    now = timezone.now()
    Measurement.objects.filter(pk=1).update(engine_unreadable=2, requested_at=now - timedelta(hours=2),
                                            measured_at=now - timedelta(hours=3))
    page = open_page(viewport)
    section = open_storage(page, live_server.url, ADMIN)
    expect(section.get_by_test_id("insight-engine")).to_contain_text(
        "Incomplete: 2 folders or files could not be read")
    expect(section.get_by_test_id("insight-pending")).to_contain_text("did not finish")
    check_layout(page, f"storage insight incomplete {viewport}")
    section.get_by_test_id("insight-totals").scroll_into_view_if_needed()
    screenshot(page, "storage-insight-incomplete", full_page=False)
    Measurement.objects.filter(pk=1).update(engine_missing=True, engine_unreadable=0)
    page.reload()
    expect(page.locator("#storage-insight").get_by_test_id("insight-engine")).to_contain_text(
        "Not found when measured")
