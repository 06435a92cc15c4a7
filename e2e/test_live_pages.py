"""A delete whose erasure is held (no job cluster runs in these tests): the conversation page,
the Pending delete tab and the Operations list, opened while it is pending, each turn to its
completed state by themselves once the erasure runs, without a reload, keeping the focus and
the scroll, and saying what changed through a polite live region; a status read that fails
says so and clears itself once a read succeeds."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from e2e.conftest import ADMIN
from e2e.helpers import check_layout, expect_said, log_in, screenshot
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor
from lifecycle.deletion.admission import admit
from lifecycle.models import Conversation

pytestmark = pytest.mark.django_db(transaction=True)
WAIT = 15_000  # ms: the pages poll every 3 s


def held_delete():
    """A delete requested and recorded, its erasure not run (it runs when the test says)."""
    for conversation in Conversation.objects.recent().with_activity().order_by("-last_activity_at", "-pk"):
        if not conversation.is_active and admit(conversation).outcome == "admitted":
            op = request_deletion(conversation, key="held-live-pages", acting_user=None)
            conversation.refresh_from_db()
            assert conversation.state == "pending_delete" and op.state == "pending"
            return conversation, op
    raise AssertionError("the seed has no deletable conversation")


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_pages_showing_a_pending_delete_update_themselves_when_it_completes(seeded, live_server, open_page, viewport):
    conversation, op = held_delete()
    title = conversation.title
    first = open_page(viewport)
    log_in(first, live_server.url, *ADMIN)
    pages = {"conversation": first, "pending": first.context.new_page(), "operations": first.context.new_page()}
    pages["conversation"].goto(f"{live_server.url}/conversations/{conversation.public_id}/")
    pages["pending"].goto(f"{live_server.url}/conversations/?view=pending_delete")
    pages["operations"].goto(f"{live_server.url}/operations/")
    for name, page in pages.items():
        page.wait_for_load_state("load")
        page.evaluate("window.__notReloaded = true")  # gone if the page were loaded again
        check_layout(page, f"{name} while pending")

    detail, pending, operations = pages["conversation"], pages["pending"], pages["operations"]
    expect(detail.get_by_test_id("tombstone")).to_contain_text("its content is being erased")
    row = pending.locator(f"#conv-row-{conversation.public_id}")
    expect(row).to_contain_text("See progress")
    expect(pending.locator("#results-count")).to_have_text("1 conversation")
    op_row = operations.locator(f"#op-row-{op.public_id}")
    expect(op_row).to_contain_text("Pending")
    expect(op_row).to_contain_text("steps done")
    # The focus on a row's control and the place scrolled to stay where they are.
    pending.locator(f"#conv-op-{conversation.public_id}").focus()
    operations.locator(f"#op-link-{op.public_id}").focus()
    operations.evaluate("window.scrollTo(0, 60)")
    scrolled = operations.evaluate("window.scrollY")

    # A status read that gets no answer: what is shown stays, and the page says so.
    unreachable = re.compile(r"/operations/\?live=1")
    operations.route(unreachable, lambda route: route.abort())
    note = operations.get_by_test_id("live-unavailable")
    expect(note).to_contain_text("Current status unavailable", timeout=WAIT)
    expect(op_row).to_contain_text("Pending")
    operations.unroute(unreachable)
    expect(note).to_be_empty(timeout=WAIT)  # the next good read (a 204) clears it

    expect(detail.get_by_test_id("runtime-state")).to_have_text("Pending delete")
    assert executor.run_erasure(op.pk) == "completed"

    expect(detail.get_by_role("heading", level=1)).to_have_text("Deleted conversation", timeout=WAIT)
    expect(detail.get_by_test_id("runtime-state")).to_have_text("Deleted")
    expect(detail.get_by_test_id("tombstone")).to_contain_text("Deleted on")
    expect(detail.get_by_role("link", name="Erasure receipt")).to_be_visible()
    expect(detail.get_by_role("link", name="Reload the page")).to_be_visible()
    expect_said(detail, "live-announce", "The delete is complete: this conversation's content is erased.",
                timeout=WAIT)

    expect(row).to_have_attribute("data-state", "deleted", timeout=WAIT)
    expect(row).to_contain_text("Erasure receipt")
    # (naturaltime: "now", "a second ago", "N seconds ago", by how long the machine took)
    expect(row).to_contain_text(re.compile(r"Deleted\s(now|a\ssecond\sago|\d+\sseconds?\sago)"))
    expect(row).not_to_contain_text(title)
    expect(pending.locator("#results-count")).to_have_text("0 conversations")  # no longer on this tab
    expect_said(pending, "live-announce", f"Deleted: {conversation.thread_id}.", timeout=WAIT)
    assert pending.evaluate("document.activeElement.id") == f"conv-op-{conversation.public_id}"

    expect(op_row).to_have_attribute("data-state", "completed", timeout=WAIT)
    expect(op_row).to_contain_text("Completed")
    expect(op_row).not_to_contain_text("steps done")
    expect_said(operations, "live-announce", f"{conversation.thread_id}: Completed.", timeout=WAIT)
    assert operations.evaluate("document.activeElement.id") == f"op-link-{op.public_id}"
    assert operations.evaluate("window.scrollY") == scrolled

    for name, page in pages.items():
        assert page.evaluate("window.__notReloaded") is True, f"{name} was reloaded"
        # Nothing is in progress any more: no poller asks again.
        assert page.locator("#live-poll[hx-trigger]").count() == 0, name
        check_layout(page, f"{name} after the delete completed")
        screenshot(page, f"live-{name}-completed", full_page=False)


def test_the_focus_kept_through_the_update_is_not_left_under_the_sticky_bar(seeded, live_server, open_page):
    """On a phone, the control that had the focus sat just under the sticky top bar when the
    delete completed: the update added text above it and the focus, given back without
    scrolling, ended hidden under the bar. Now the least scroll that shows it is made."""
    conversation, op = held_delete()
    page = open_page("small-phone")
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/{conversation.public_id}/")
    control = page.locator("#conversation-op")
    control.focus()
    # the control just under the bar (56 px), as a reader who scrolled down to it has it (room
    # below the page's end so a short page can scroll that far)
    page.evaluate("document.body.style.paddingBottom = '1200px'")
    page.evaluate("window.scrollBy(0, document.getElementById('conversation-op').getBoundingClientRect().top - 60)")
    assert abs(page.evaluate("document.getElementById('conversation-op').getBoundingClientRect().top") - 60) < 2

    assert executor.run_erasure(op.pk) == "completed"
    expect(page.get_by_role("heading", level=1)).to_have_text("Deleted conversation", timeout=WAIT)
    expect(control).to_have_text("Erasure receipt")
    expect(control).to_be_focused()
    bar = page.evaluate("document.querySelector('.topbar').getBoundingClientRect().bottom")
    box = page.evaluate("(() => { const r = document.activeElement.getBoundingClientRect(); "
                        "return [r.top, r.bottom, innerHeight]; })()")
    assert box[0] >= bar - 1 and box[1] <= box[2], (box, bar)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_engine_conversations_update_themselves_when_a_bound_delete_completes(live_server, open_page, viewport):
    """Engine conversations (a console of a remote engine) polls its pending bound deletes: once
    the engine's receipt is acknowledged, the conversation's row goes and its delete's row says
    Completed, without a reload, said once (it had server tests only)."""
    from django.contrib.auth import get_user_model

    from tests.test_live_pages import acknowledged, pending_bound_delete

    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    binding, stays, delete = pending_bound_delete(title="")
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/engine/conversations/")
    page.evaluate("window.__notReloaded = true")
    expect(page.locator(f"#binding-row-{binding.public_id}")).to_be_visible()
    expect(page.locator(f"#bound-delete-row-{delete.public_id}")).to_have_attribute("data-state", "pending")
    check_layout(page, "engine conversations while pending")

    acknowledged(delete, binding)
    expect(page.locator(f"#bound-delete-row-{delete.public_id}")).to_have_attribute("data-state", "completed",
                                                                                    timeout=WAIT)
    expect(page.locator(f"#bound-delete-row-{delete.public_id}")).to_contain_text("Completed")
    expect(page.locator(f"#binding-row-{binding.public_id}")).to_have_count(0)
    expect(page.locator(f"#binding-row-{stays.public_id}")).to_be_visible()
    expect_said(page, "live-announce", "t-remote: Completed.", timeout=WAIT)
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#live-poll[hx-trigger]").count() == 0
    check_layout(page, "engine conversations after the delete completed")


def test_the_focus_in_a_row_that_leaves_engine_conversations_goes_to_the_row_beside_it(live_server, open_page):
    """A finished bound delete takes its conversation's row off the list: the focus that was in
    that row goes to the row beside it, not to the page's start (r136: to <body>, so the next
    Tab began again at the top)."""
    from django.contrib.auth import get_user_model

    from tests.test_live_pages import acknowledged, pending_bound_delete

    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    binding, stays, delete = pending_bound_delete(title="")
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/engine/conversations/")
    leaving = page.locator(f"#binding-row-{binding.public_id}")
    leaving.locator("a, button").first.focus()
    acknowledged(delete, binding)
    expect(leaving).to_have_count(0, timeout=WAIT)
    focused = page.evaluate("document.activeElement.closest('[data-live-row]')?.id || document.activeElement.tagName")
    assert focused == f"binding-row-{stays.public_id}", focused


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_the_focus_on_refresh_the_list_stays_there_when_another_delete_completes(seeded, live_server, open_page,
                                                                                viewport):
    """The list's "Refresh the list" has the focus when the poll brings a second change: the
    focus stays on it (r138: the note was replaced and the focus fell to <body>)."""
    held = []
    for conversation in Conversation.objects.recent().with_activity().order_by("-last_activity_at", "-pk"):
        if len(held) < 2 and not conversation.is_active and admit(conversation).outcome == "admitted":
            held.append(request_deletion(conversation, key=f"held-{len(held)}", acting_user=None))
    assert len(held) == 2
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/?view=pending_delete")
    expect(page.locator("#results-count")).to_have_text("2 conversations")
    assert executor.run_erasure(held[0].pk) == "completed"
    refresh = page.get_by_test_id("list-moved").get_by_role("link", name="Refresh the list")
    expect(refresh).to_be_visible(timeout=WAIT)
    refresh.focus()
    assert executor.run_erasure(held[1].pk) == "completed"
    expect(page.locator("#results-count")).to_have_text("0 conversations", timeout=WAIT)
    expect(page.get_by_test_id("list-moved").get_by_role("link", name="Refresh the list")).to_be_focused()


def _stalled(op) -> None:
    from lifecycle.models import DeleteOperation

    DeleteOperation.objects.filter(pk=op.pk).update(stalled_attempts=executor.MAX_STALLED, last_error="database_busy")


def _operation_page(open_page, live_server, viewport, *, who=ADMIN, stalled=True):
    """A held delete's operation page, open (stalled first unless told otherwise), and the delete."""
    _conversation, op = held_delete()
    if stalled:
        _stalled(op)
    page = open_page(viewport)
    log_in(page, live_server.url, *who)
    page.goto(f"{live_server.url}/operations/{op.public_id}/")
    page.wait_for_load_state("load")
    return page, op


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"])
def test_the_focus_on_retry_now_stays_on_the_card_when_the_delete_moves_on_under_it(seeded, live_server, open_page,
                                                                                    viewport):
    """r147: the status card was replaced under the focus (Retry now) when the delete completed
    or another admin retried it; the focus fell to the page, and the next Tab left it."""
    page, op = _operation_page(open_page, live_server, viewport)
    page.locator("#op-retry").focus()
    assert executor.run_erasure(op.pk, force=True) == "completed"
    expect(page.locator("#op-status")).to_have_attribute("data-state", "completed", timeout=WAIT)
    expect_said(page, "op-announce", "Completed", timeout=WAIT)
    settled = "() => document.activeElement && document.activeElement.id === 'op-status'"
    page.wait_for_function(settled, timeout=5_000)
    check_layout(page, "after the delete completed under the focus")


def test_a_delete_that_stops_being_retried_by_itself_is_said_and_so_is_a_retry(seeded, live_server, open_page):
    """r147: going stalled, and being retried again, changed the card without a word."""
    from e2e.conftest import MEMBER

    page, op = _operation_page(open_page, live_server, "desktop", who=MEMBER, stalled=False)
    _stalled(op)
    stalled = ("The erasure stopped several times without progress, so it is no longer retried by itself. "
               "An admin can retry it.")
    page.wait_for_function(
        "(text) => (window.__said || []).some(([id, said]) => id === 'op-announce' && said.includes(text))",
        arg=stalled, timeout=WAIT)
    executor.retry(op.pk)  # another admin's Retry now
    page.wait_for_function(
        "(text) => { const said = (window.__said || []).filter(([id]) => id === 'op-announce');"
        " return said.length >= 2 && !said[said.length - 1][1].includes(text); }",
        arg=stalled, timeout=WAIT)


def test_retry_now_says_it_started_and_gives_the_message_the_focus(seeded, live_server, open_page):
    """r147: a Retry now that went through came back with no word and the focus at the start."""
    page, op = _operation_page(open_page, live_server, "small-phone")
    page.locator("#op-retry").focus()
    page.keyboard.press("Enter")
    message = page.locator(".flash")
    expect(message).to_have_text("Retry started: the erasure goes on from the step it stopped at.")
    expect(message).to_be_focused()
    check_layout(page, "after Retry now")


def test_a_focus_that_left_the_card_is_not_pulled_back_when_the_card_changes_later(seeded, live_server, open_page):
    """r148: a read that found nothing new (204) left what it found of the focus for a later
    swap, which pulled the focus back into the card after the person had left it."""
    page, op = _operation_page(open_page, live_server, "desktop")
    page.evaluate("""() => { window.__reads = 0;
        document.body.addEventListener('htmx:beforeSwap', (e) => { if (e.detail.target.id === 'op-live') window.__reads += 1; }); }""")
    page.locator("#op-retry").focus()
    page.wait_for_function("() => window.__reads >= 1", timeout=WAIT)  # a read that found nothing new
    page.evaluate("document.activeElement.blur()")
    reads = page.evaluate("window.__reads")
    page.wait_for_function("(n) => window.__reads > n", arg=reads, timeout=WAIT)  # read again from the page
    assert executor.run_erasure(op.pk, force=True) == "completed"
    expect(page.locator("#op-status")).to_have_attribute("data-state", "completed", timeout=WAIT)
    page.wait_for_timeout(300)
    assert page.evaluate("document.activeElement === document.body")
