"""Delete in the browser: preview, cancel, confirm, Pending then Completed, the tombstone;
row actions, the way out of an unavailable delete, and the layout of every new screen."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from e2e.conftest import ADMIN, MEMBER
from e2e.helpers import (
    check_layout,
    confirm_refused_as_changed,
    expect_said,
    log_in,
    open_from_list,
    open_nav,
    screenshot,
)
from lifecycle.deletion import executor
from lifecycle.deletion.admission import admit
from lifecycle.models import Conversation, DeleteOperation
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def deletable() -> Conversation:
    """A Recent conversation that a delete would admit now (idle, no open work, no ambiguity)."""
    for conversation in Conversation.objects.recent().with_activity().order_by("-last_activity_at", "-pk"):
        if not conversation.is_active and admit(conversation).outcome == "admitted":
            return conversation
    raise AssertionError("the seed has no deletable conversation")


def unavailable() -> Conversation:
    for conversation in Conversation.objects.recent().order_by("-last_activity_at", "-pk"):
        if admit(conversation).reasons == ["conversation_child_ownership_ambiguous"]:
            return conversation
    raise AssertionError("the seed has no conversation overlapping the legacy subagent row")


@pytest.mark.parametrize("viewport", ["desktop", "phone"])
def test_it_previews_cancels_confirms_and_shows_pending_then_completed(seeded, live_server, open_page, viewport):
    conversation = deletable()
    title = conversation.title
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/?q={title}")
    open_from_list(page, conversation)

    page.get_by_role("link", name="Delete…").click()
    expect(page.get_by_role("heading", level=1)).to_have_text(f"Delete “{title}”?")
    expect(page.get_by_role("heading", name="Erased for good")).to_be_visible()
    expect(page.locator(".preview-group").first).to_contain_text("Messages and tool calls")
    expect(page.get_by_text("Provider-retained inputs: Provider retention follows provider terms.")).to_be_visible()
    check_layout(page, "delete preview")
    screenshot(page, "delete-preview")
    page.get_by_role("link", name="Cancel").click()
    expect(page).to_have_url(re.compile(rf"/conversations/{conversation.public_id}/$"))
    conversation.refresh_from_db()
    assert conversation.state == "live" and not DeleteOperation.objects.exists()

    page.get_by_role("link", name="Delete…").click()
    page.get_by_role("button", name="Delete for good").click()
    expect(page).to_have_url(re.compile(r"/operations/op_[0-9a-f]{20}/$"))
    status = page.locator("#op-status")
    expect(status).to_have_attribute("data-state", "pending")
    expect(status).to_contain_text("Pending")
    expect(page.get_by_test_id("op-step")).to_contain_text("Step 0 of")
    check_layout(page, "operation pending")
    screenshot(page, "operation-pending")

    # The job cluster's work, done here: the page polls and turns to Completed by itself.
    op = DeleteOperation.objects.get()
    assert executor.run_erasure(op.pk) == "completed"
    expect(status).to_have_attribute("data-state", "completed", timeout=15_000)
    expect(status).to_contain_text("Completed")
    # Said in a few words: the live region beside the card, not the card with its whole receipt
    expect_said(page, "op-announce", "Completed")
    assert page.locator("[aria-live] [data-testid=receipt]").count() == 0
    expect(page.get_by_test_id("receipt")).to_contain_text("Messages and tool calls")
    expect(page.get_by_test_id("physical")).to_contain_text("Physically erased")
    check_layout(page, "operation completed")
    screenshot(page, "operation-completed")

    assert title not in page.content()  # the operation page never showed the title it erases
    page.get_by_role("link", name=conversation.thread_id).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Deleted conversation")
    expect(page.get_by_test_id("tombstone")).to_contain_text("its content is erased")
    expect(page.locator("section.transcript")).to_contain_text("The transcript is erased")
    assert title not in page.content()
    check_layout(page, "tombstone")
    screenshot(page, "tombstone")
    page.get_by_role("link", name="Erasure receipt").click()
    expect(page.get_by_test_id("receipt")).to_contain_text("Messages and tool calls")


def test_small_phone_row_actions_way_out_and_operations(seeded, live_server, open_page):
    page = open_page("small-phone")
    log_in(page, live_server.url, *ADMIN)
    check_layout(page, "conversation list with row actions")
    screenshot(page, "conversations-row-actions", full_page=False)
    first = page.locator("#results .conv").first
    expect(first.get_by_role("button", name=re.compile("^Archive"))).to_be_visible()

    conversation = unavailable()
    page.goto(f"{live_server.url}/conversations/{conversation.public_id}/delete/")
    expect(page.get_by_test_id("delete-not-admitted")).to_contain_text("Delete is unavailable")
    expect(page.get_by_role("button", name="Delete for good")).to_have_count(0)
    check_layout(page, "unavailable delete with the way out")
    screenshot(page, "delete-unavailable")
    page.get_by_role("button", name="Clear this row").first.click()
    expect(page.get_by_text("The subagent row was cleared.")).to_be_visible()
    expect(page.get_by_role("button", name="Delete for good")).to_be_visible()

    open_nav(page, "Operations")
    expect(page.get_by_role("heading", name="Operations", level=1)).to_be_visible()
    check_layout(page, "operations")


def test_the_way_out_clears_rows_whose_ids_hold_a_line_break_a_tab_or_an_override(seeded, live_server, open_page):
    """r123: one rule names rows, and what the page lists its forms can send back as the file
    holds it: a browser sends a form's line break as CR LF (and a NUL as U+FFFD), so the forms
    send the id percent-encoded. Each row is cleared by its own "Clear this row", in Chromium."""
    from lifecycle import fleet
    from lifecycle.models import AuditFact

    conversation = unavailable()
    home = fleet.EngineHome()
    ids = ["sa_\ttab", "sa\nbreak", "sa\r\ncrlf", "sa_\u202eevil2"]
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [*rows, *({
        "agent_id": agent_id, "status": "completed", "delivery": "settled",
        "started_at": conversation.created_at.isoformat()} for agent_id in ids)])
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/{conversation.public_id}/delete/")
    rows = page.locator(".way-out-row")
    expect(rows).to_have_count(5)  # the demo's row and these four
    expect(page.get_by_text("cannot be read")).to_have_count(0)
    expect(rows.nth(2)).to_contain_text("sa[U+000A]break")
    for left in range(4, -1, -1):
        rows.first.get_by_role("button", name="Clear this row").click()
        expect(page.get_by_text("The subagent row was cleared.")).to_be_visible()
        expect(rows).to_have_count(left)
    expect(page.get_by_role("button", name="Delete for good")).to_be_visible()
    cleared = set(AuditFact.objects.filter(action="subagent.cleared").values_list("new_value__agent_id", flat=True))
    assert set(ids) < cleared and len(cleared) == 5  # each as the file held it, and the demo's row
    assert not [r for path in fleet.fleet_files(home) for r in fleet.read_rows(path) if fleet.origin_of(r) is None]


def test_members_see_the_lifecycle_read_only(seeded, live_server, open_page):
    conversation = deletable()
    page = open_page("phone")
    log_in(page, live_server.url, *MEMBER)
    expect(page.locator("#results .row-actions").first).to_contain_text("admins only")
    page.goto(f"{live_server.url}/conversations/{conversation.public_id}/delete/")
    expect(page.get_by_text("Deleting is for admins only.")).to_be_visible()
    expect(page.get_by_role("button", name="Delete for good")).to_have_count(0)
    check_layout(page, "member delete preview")


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_operations_page_by_keyboard_lists_each_operation_once_while_more_are_requested(
    seeded, live_server, open_page, viewport
):
    # 26 refused deletes a minute apart (refused ones are only the remembered answer: no fence).
    start = timezone.now() - timedelta(days=2)
    DeleteOperation.objects.all().delete()
    ops = [
        DeleteOperation.objects.create(conversation=c, state="refused", reason="conversation_busy",
                                       requested_at=start + timedelta(minutes=i))
        for i, c in enumerate(factories.make_conversation() for _ in range(26))
    ]
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Operations")
    expect(page.get_by_role("heading", name="Operations", level=1)).to_be_visible()
    rows = page.locator("#deletes-h ~ .op-list .op-row")
    expect(rows).to_have_count(25)
    pager = page.get_by_role("navigation", name="Pages")
    expect(pager.get_by_role("link", name="Previous")).to_have_count(0)
    check_layout(page, "operations, first of two pages")
    screenshot(page, "operations-pages")
    # One more is requested while the first page is read: the second page still holds only
    # the oldest one, not the first page's last row again.
    DeleteOperation.objects.create(conversation=factories.make_conversation(), state="refused",
                                   reason="conversation_busy", requested_at=timezone.now())
    next_link = pager.get_by_role("link", name="Next")
    next_link.focus()
    page.keyboard.press("Enter")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(ops[0].public_id)
    expect(pager.get_by_role("link", name="Next")).to_have_count(0)
    previous = pager.get_by_role("link", name="Previous")
    previous.focus()
    page.keyboard.press("Enter")
    expect(rows).to_have_count(25)
    expect(rows.first).to_contain_text(ops[-1].public_id)
    expect(rows.last).to_contain_text(ops[1].public_id)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_a_receipt_says_when_its_kept_facts_expired(seeded, live_server, open_page, viewport):
    from lifecycle.actions.expire_facts import expire_facts
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.models import UsageFact

    conversation = deletable()
    UsageFact.objects.create(conversation=conversation, input_tokens=3, output_tokens=4)
    op = request_deletion(conversation, key="e2e-expired", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    DeleteOperation.objects.filter(pk=op.pk).update(completed_at=timezone.now() - timedelta(days=3000))
    expire_facts()
    assert not UsageFact.objects.filter(conversation=conversation).exists()
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/operations/{op.public_id}/")
    kept = page.locator('[data-testid="receipt-kept"] li')
    expect(kept.filter(has_text="Usage and metering")).to_have_text(
        re.compile(r"\d+ records?, removed on .* when (its|their) period ran out"))
    # The erasure check's fingerprints went too, a week after the delete.
    expect(kept.filter(has_text="Erasure check fingerprints")).to_have_text(
        re.compile(r"1 record, removed on .* when its period ran out"))
    check_layout(page, "receipt with expired facts")
    screenshot(page, "receipt-facts-expired")


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_an_operations_page_whose_rows_all_changed_says_so_and_leads_back(seeded, live_server, open_page, viewport):
    start = timezone.now() - timedelta(days=2)
    DeleteOperation.objects.all().delete()
    ops = [DeleteOperation.objects.create(conversation=factories.make_conversation(), state="refused",
                                          reason="conversation_busy", requested_at=start + timedelta(minutes=i))
           for i in range(26)]
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/operations/?state=refused")
    page.get_by_role("navigation", name="Pages").get_by_role("link", name="Next").click()
    expect(page.locator("#deletes-h ~ .op-list .op-row")).to_have_count(1)
    # The one row on it leaves the filter before the page is read again.
    DeleteOperation.objects.filter(pk=ops[0].pk).update(state="unavailable")
    page.reload()
    expect(page.get_by_text("No operations on this page any more")).to_be_visible()
    check_layout(page, "operations page whose rows changed")
    screenshot(page, "operations-page-changed")
    back = page.get_by_role("link", name="Show the newest")
    back.focus()
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{live_server.url}/operations/?state=refused")
    expect(page.locator("#deletes-h ~ .op-list .op-row")).to_have_count(25)


@pytest.mark.parametrize("viewport", [{"width": 390, "height": 300}, {"width": 320, "height": 300}],
                         ids=["390x300", "320x300"])
def test_a_confirmation_refused_as_changed_starts_at_its_message_on_a_short_phone(
        seeded, live_server, open_page, viewport):
    """The conversation grew after its delete page was shown: the confirmation is refused (409)
    and the page comes back with the preview as it is now. On a phone with its keyboard open the
    focus starts at the refusal, in view between the bars (r105: it stayed on the page's body,
    the message under the bottom navigation), and the next Tab goes on past it, into the page."""
    conversation = deletable()
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/{conversation.public_id}/delete/")
    page.wait_for_load_state("load")
    factories.add_message(conversation, content="late")
    confirm_refused_as_changed(page, ".alert-error")
    assert not DeleteOperation.objects.exists() and Conversation.objects.get(pk=conversation.pk).state == "live"
