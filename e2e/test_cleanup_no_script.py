"""Data & storage without the page's script, and its restore commands on a 320 px phone.

The job cluster's work is done in the test thread (`drain`, as in test_tool_cleanup.py)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from e2e.conftest import ADMIN
from e2e.helpers import check_layout, log_in
from e2e.test_tool_cleanup import data, drain  # noqa: F401 (data: a fixture)
from retention.models import ToolPayloadOperation, ToolPayloadPolicy

pytestmark = pytest.mark.django_db(transaction=True)
PATH = "/settings/system/data-storage/"

# Each word of each command box sits on one line: the box wraps at spaces only.
_SPLIT_WORDS = """
() => {
  const split = [];
  const walker = document.createTreeWalker(document.getElementById("backups"), NodeFilter.SHOW_TEXT);
  for (let text = walker.nextNode(); text; text = walker.nextNode()) {
    if (!text.parentElement.closest("code.command")) continue;
    for (const match of text.data.matchAll(/\\S+/g)) {
      const range = document.createRange();
      range.setStart(text, match.index);
      range.setEnd(text, match.index + match[0].length);
      const lines = new Set(Array.from(range.getClientRects(), (r) => Math.round(r.top)));
      if (lines.size > 1) split.push(match[0]);
    }
  }
  return split;
}
"""


def test_analyze_without_the_script_keeps_the_period_and_marks_the_estimate(data, live_server, open_page):  # noqa: F811
    page = open_page("desktop", java_script_enabled=False)
    log_in(page, live_server.url, *ADMIN)
    page.goto(live_server.url + PATH)
    page.get_by_label("Number").fill("5")
    page.get_by_label("Unit").select_option("weeks")
    page.get_by_role("button", name="Analyze savings").click()
    expect(page).to_have_url(live_server.url + PATH)
    # The page loaded afresh shows the period the analysis is for, as a draft: nothing saved
    expect(page.get_by_label("Number")).to_have_value("5")
    expect(page.get_by_label("Unit")).to_have_value("weeks")
    expect(page.get_by_test_id("draft-note")).to_contain_text("a period of 3 months")
    expect(page.get_by_test_id("analysis")).to_have_attribute("data-state", "running")
    op = ToolPayloadOperation.objects.get()
    assert (op.kind, op.age_value, op.age_unit) == ("analysis", 5, "weeks")
    policy = ToolPayloadPolicy.load()
    assert (policy.age_value, policy.age_unit, policy.revision) == (3, "months", 1)
    drain()
    # Reloaded: the saved period in the field, and the server says the estimate is for another
    page.reload()
    expect(page.get_by_label("Number")).to_have_value("3")
    expect(page.get_by_test_id("draft-note")).to_have_count(0)
    expect(page.get_by_test_id("analysis")).to_have_attribute("data-state", "completed")
    expect(page.get_by_test_id("analysis")).to_contain_text("for 5 weeks")
    expect(page.get_by_test_id("analysis-draft-stale")).to_be_visible()
    expect(page.get_by_test_id("analysis-draft-stale")).to_have_text(
        "This estimate is for other settings than the ones above. Analyze again to see theirs.")


@pytest.mark.parametrize("language", ["en", "es"])
def test_the_restore_commands_fit_a_320_px_phone_as_code(data, live_server, open_page, language):  # noqa: F811
    from retention.backups import create_backup

    create_backup()
    page = open_page("small-phone")
    log_in(page, live_server.url, *ADMIN)
    page.set_extra_http_headers({"Accept-Language": language})
    page.goto(live_server.url + PATH)
    page.wait_for_load_state("load")
    restore = page.get_by_test_id("restore-text")
    expect(restore).to_be_visible()
    commands = restore.locator("code.command")
    expect(commands.last).to_have_text("manage.py verify_erasure --all")
    assert "`" not in restore.inner_text()
    check_layout(page, f"backups at 320 px ({language})")
    assert page.evaluate(_SPLIT_WORDS) == []
    for n in range(commands.count()):
        box, card = commands.nth(n).bounding_box(), page.locator("#backups").bounding_box()
        assert box["x"] >= card["x"] and box["x"] + box["width"] <= card["x"] + card["width"]


def test_a_draft_analyzed_before_the_script_ran_is_unsaved_at_once_and_discard_goes_back(
        data, live_server, open_page):  # noqa: F811
    """Analyze pressed before the page's script loaded (a slow phone) leaves a draft in the
    fields: the Save/Discard bar showed only after a further edit, since the draft was what the
    server rendered. It is unsaved from the start now, and Discard brings back what is saved."""
    from django.urls import reverse

    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    page.goto(live_server.url + PATH)
    token = page.locator("#tool-form input[name=csrfmiddlewaretoken]").input_value()
    revision = page.locator("#id_tool_revision").input_value()
    # The form sent as a browser without the script sends it (no htmx header), its answer not followed
    answer = page.request.post(live_server.url + reverse("retention:cleanup-analyze"), max_redirects=0, form={
        "csrfmiddlewaretoken": token, "revision": revision, "age_value": "5", "age_unit": "weeks"})
    assert answer.status in (302, 303), answer.status
    page.goto(live_server.url + PATH)  # where it led, with the script
    expect(page.get_by_test_id("draft-note")).to_be_visible()
    expect(page.get_by_label("Number")).to_have_value("5")
    bar = page.locator("#save-bar")
    expect(bar).to_be_visible()
    expect(bar.locator(".save-bar-which")).to_have_text("Tool payload cleanup")
    bar.get_by_role("button", name="Discard").click()
    expect(page.get_by_label("Number")).to_have_value("3")
    expect(page.get_by_label("Unit")).to_have_value("months")
    expect(bar).to_be_hidden()
    policy = ToolPayloadPolicy.load()
    assert (policy.age_value, policy.age_unit, policy.revision) == (3, "months", 1)
