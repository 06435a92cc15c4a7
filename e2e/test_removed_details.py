"""A conversation whose tool details cleanup removed: the row says when, keeps its summary,
offers no output to load, and the page stays whole at desktop and 320 px."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from playwright.sync_api import expect

from e2e.conftest import MEMBER
from e2e.helpers import (
    check_layout,
    conversation_with_long_output,
    log_in,
    open_from_list,
    reduce_tool_item,
)
from lifecycle.models import Item
from retention.reducer import MARKER_KEY, Skip

pytestmark = pytest.mark.django_db(transaction=True)
REMOVED_AT = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_removed_tool_row_shows_the_date_and_the_kept_summary(seeded, live_server, open_page, viewport):
    conversation, item = conversation_with_long_output()
    reduced = reduce_tool_item(item, REMOVED_AT)
    others = conversation.items.count()
    page = open_page(viewport)
    log_in(page, live_server.url, *MEMBER)
    open_from_list(page, conversation)

    row = page.locator(f"#item-{item.pk}")
    row.scroll_into_view_if_needed()
    expect(row.get_by_test_id("details-removed")).to_contain_text("Tool details removed on March 2, 2026")
    expect(row.locator(".tool-kind")).to_have_text(item.get_tool_kind_display())
    expect(row.locator(".tool-title")).to_have_text(item.title)
    kept = [v for k, v in reduced.payload.items() if k != MARKER_KEY and isinstance(v, str) and v]
    assert kept, "the reduced payload keeps a summary"
    expect(row.locator(".summary")).to_contain_text(kept[0][:40])
    expect(row.get_by_role("link", name="Show full output", exact=False)).to_have_count(0)
    expect(row.locator(".output")).to_have_count(0)
    # The rest of the transcript is unchanged and the page does not scroll sideways.
    expect(page.locator("section.transcript .msg").first).to_be_visible()
    check_layout(page, f"removed details at {viewport}")

    page.reload()
    expect(page.locator(f"#item-{item.pk}").get_by_test_id("details-removed")).to_be_visible()
    # The database holds the reduced row, not the output.
    stored = Item.objects.get(pk=item.pk)
    assert (stored.payload_skip, stored.removable_bytes, stored.details_removed_at) == (Skip.ALREADY_REMOVED, 0, REMOVED_AT)
    assert stored.payload == reduced.payload and conversation.items.count() == others

    # The output page, opened directly, says the details are gone.
    response = page.goto(f"{live_server.url}/conversations/{conversation.public_id}/items/{item.pk}/output/")
    assert response.status == 410
    expect(page.get_by_test_id("details-removed")).to_contain_text("Tool details removed on March 2, 2026")
    check_layout(page, f"removed output page at {viewport}")
