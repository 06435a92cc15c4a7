"""When the session ends mid-edit nothing is lost: the draft stays, the bar says why, and
after signing in again in another tab Save works. The list never shows the login page
inside itself."""

from __future__ import annotations

import re

import pytest
from django.contrib.sessions.models import Session
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, MEMBER
from e2e.helpers import assert_save_bar_covers_nothing, check_layout, log_in, open_nav
from lifecycle.models import RetainedFactsPolicy

pytestmark = pytest.mark.django_db(transaction=True)
ENDED = "Your session ended, so nothing was saved. Your changes are still here: sign in again in a new tab, then press Save."


def sign_in_in_the_new_tab(page: Page, link) -> None:
    """Follow the page's "Sign in again (new tab)" link and sign in there as the admin; the new
    tab comes back to Data & storage and is closed."""
    with page.context.expect_page() as opened:
        link.click()
    login = opened.value
    login.get_by_label("Username").fill(ADMIN[0])
    login.get_by_label("Password").fill(ADMIN[1])
    login.get_by_role("button", name="Sign in").click()
    expect(login.get_by_role("heading", level=1)).to_have_text("Data & storage")
    login.close()


def bar(page: Page):
    return page.locator("#save-bar")


@pytest.mark.parametrize(
    ("how", "viewport"), [("session row deleted", "phone"), ("signed out in another tab", "small-phone")],
    ids=["expired-390", "signed-out-320"],
)
def test_a_draft_survives_the_end_of_the_session_and_saves_after_signing_in(
    seeded, live_server, open_page, how, viewport
):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    before = RetainedFactsPolicy.load()
    page.get_by_label("Audit facts, days").fill("500")
    page.get_by_label("Automatic cleanup").check()
    page.get_by_label("Continue without backup").check()  # required when turning cleanup on, never preselected

    if how == "session row deleted":
        Session.objects.all().delete()
    else:
        other = page.context.new_page()
        other.goto(f"{live_server.url}/conversations/")
        other.get_by_role("button", name="Sign out").click()
        expect(other).to_have_url(re.compile(r"/accounts/login/"))
        other.close()

    bar(page).get_by_role("button", name="Save").click()

    # Nothing saved, nothing lost: the draft is on screen and the bar explains.
    expect(bar(page).locator(".save-bar-status")).to_have_text(ENDED)
    expect(page.locator("#save-bar-live")).to_have_text(ENDED)
    expect(page.get_by_label("Audit facts, days")).to_have_value("500")
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()
    expect(page.locator("#facts-card")).to_be_visible()
    expect(page.locator("#tool-card")).to_be_visible()
    expect(page).to_have_url(f"{live_server.url}/settings/system/data-storage/")
    stored = RetainedFactsPolicy.load()
    assert (stored.audit_days, stored.revision) == (before.audit_days, before.revision)
    sign_in = bar(page).get_by_role("link", name="Sign in again (new tab)")
    expect(sign_in).to_be_visible()
    expect(sign_in).to_have_attribute("target", "_blank")
    check_layout(page)
    assert_save_bar_covers_nothing(page)

    # Sign in again in a new tab, as the link offers ...
    sign_in_in_the_new_tab(page, sign_in)

    # ... and Save in the first tab saves the draft that was kept.
    page.bring_to_front()
    bar(page).get_by_role("button", name="Save").click()
    expect(bar(page)).to_be_hidden()
    # The focus went from the bar to the first card's confirmation, which is what is read
    expect(page.locator(".card [role=status]").first).to_be_focused()
    stored = RetainedFactsPolicy.load()
    assert (stored.audit_days, stored.revision) == (500, before.revision + 1)
    from retention.models import ToolPayloadPolicy

    assert ToolPayloadPolicy.load().enabled is True


def test_after_the_session_ended_a_key_in_one_card_keeps_the_other_waiting_and_saves_after_signing_in(
    seeded, live_server, open_page
):
    """Enter and Escape act on one card. Escape in one card hid the sign-in link while the
    other's draft still could not be saved, and the next save, after signing in again, was
    refused; a card saved then left the bar saying the session had ended (r43)."""
    from retention.models import ToolPayloadPolicy

    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    facts, tool = RetainedFactsPolicy.load(), ToolPayloadPolicy.load()
    audit, number = page.get_by_label("Audit facts, days"), page.get_by_label("Number")
    audit.fill("371")
    number.fill(str(tool.age_value + 1))
    Session.objects.all().delete()
    audit.press("Enter")
    expect(bar(page).locator(".save-bar-status")).to_have_text(ENDED)
    number.press("Escape")  # the cleanup card's draft goes; the facts draft still waits
    expect(number).to_have_value(str(tool.age_value))
    expect(bar(page).locator(".save-bar-status")).to_have_text(ENDED)
    expect(bar(page).get_by_role("link", name="Sign in again (new tab)")).to_be_visible()

    other = page.context.new_page()
    log_in(other, live_server.url, *ADMIN)
    other.close()
    page.bring_to_front()
    number.fill(str(tool.age_value + 2))
    audit.press("Enter")  # saves the facts card, on the first try
    expect(page.locator("#facts-card [role=status]")).to_have_text(re.compile("saved", re.I))
    assert (RetainedFactsPolicy.load().audit_days, RetainedFactsPolicy.load().revision) == (371, facts.revision + 1)
    # The bar, up for the cleanup card's draft, no longer says the session ended.
    expect(bar(page)).to_be_visible()
    expect(bar(page).locator(".save-bar-status")).not_to_have_text(ENDED)
    expect(bar(page).get_by_role("link", name="Sign in again (new tab)")).to_be_hidden()
    assert ToolPayloadPolicy.load().revision == tool.revision


ACTION_ENDED = ("Your session ended, so nothing was done. Your changes are still here: sign in again in a new tab, "
                "then press the button again.")


def analyses():
    from retention.models import ToolPayloadOperation

    return list(ToolPayloadOperation.objects.filter(kind="analysis").values_list("age_value", "age_unit"))


def test_analyze_after_the_session_ended_keeps_the_draft_and_says_nothing_was_done(seeded, live_server, open_page):
    """r76: Analyze savings sends the period being edited. Signed out, its 401 sent the page to
    the login page: the browser's leave-page prompt, then the saved period on the way back (or,
    staying, nothing said at all). Now the page stays, says why beside the button, keeps the
    draft, and after signing in again in a new tab the same press analyzes the draft."""
    page = open_page("small-phone")
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.type), dialog.dismiss()))
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    page.get_by_label("Number").fill("5")
    page.get_by_label("Unit").select_option("weeks")
    other = page.context.new_page()
    other.goto(f"{live_server.url}/conversations/")
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(re.compile(r"/accounts/login/"))
    other.close()

    page.get_by_role("button", name="Analyze savings").click()

    error = page.locator("#tool-action-error")
    expect(error).to_contain_text(ACTION_ENDED)
    expect(page).to_have_url(f"{live_server.url}/settings/system/data-storage/")
    expect(page.get_by_label("Number")).to_have_value("5")
    expect(page.get_by_label("Unit")).to_have_value("weeks")
    assert dialogs == [] and analyses() == []
    sign_in = error.get_by_role("link", name="Sign in again (new tab)")
    expect(sign_in).to_have_attribute("target", "_blank")
    expect(sign_in).to_be_focused()  # r80: earlier in the page than the button pressed; the focus goes to it
    assert sign_in.bounding_box()["height"] >= 44  # a thumb's target on the phone
    check_layout(page)

    sign_in_in_the_new_tab(page, sign_in)

    page.bring_to_front()
    page.get_by_role("button", name="Analyze savings").click()  # the page's token is renewed first
    expect(page.locator("#tool-analysis")).not_to_have_attribute("data-state", "not_analyzed")
    expect(error).not_to_contain_text(ACTION_ENDED)
    for _ in range(50):
        if analyses():
            break
        page.wait_for_timeout(100)
    assert analyses() == [(5, "weeks")] and dialogs == []
    expect(page.get_by_label("Number")).to_have_value("5")


def test_an_action_pressed_after_signing_in_again_elsewhere_says_so_then_works(seeded, live_server, open_page):
    """Signed out and in again in another tab before pressing: the page's token is the old
    session's and is refused (403). It said 'Lethe could not be reached', and every press
    failed the same way until a reload lost the draft."""
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    page.get_by_label("Number").fill("7")
    page.get_by_label("Unit").select_option("weeks")
    Session.objects.all().delete()
    other = page.context.new_page()
    log_in(other, live_server.url, *ADMIN)
    other.close()
    page.bring_to_front()

    page.get_by_role("button", name="Analyze savings").click()
    error = page.locator("#tool-action-error")
    expect(error).to_have_text("You signed in again since this page was loaded, so nothing was done. "
                               "Press the button again.")
    assert analyses() == []
    page.get_by_role("button", name="Analyze savings").click()
    expect(error).to_have_text("")
    for _ in range(50):
        if analyses():
            break
        page.wait_for_timeout(100)
    assert analyses() == [(7, "weeks")]


def test_after_the_session_ended_the_status_poll_is_no_action_and_a_double_press_sends_one(
        seeded, live_server, open_page):
    """r77: the card's status poll was taken for an action: every poll renewed the token and
    wrote the alert again (focus on its sign-in link lost every second); and two presses while
    the token renewed sent two analyses, the second refused "nothing new was started"."""
    page = open_page("small-phone")
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    page.get_by_label("Number").fill("5")
    page.get_by_label("Unit").select_option("weeks")
    page.get_by_role("button", name="Analyze savings").click()  # queued (no job cluster here): the card polls
    for _ in range(50):
        if analyses():
            break
        page.wait_for_timeout(100)
    assert analyses() == [(5, "weeks")]
    page.get_by_label("Number").fill("6")  # a draft again
    Session.objects.all().delete()
    page.get_by_role("button", name="Analyze savings").click()
    error = page.locator("#tool-action-error")
    expect(error).to_contain_text(ACTION_ENDED)
    page.evaluate("""() => { window.__writes = 0; new MutationObserver(() => window.__writes++)
        .observe(document.getElementById('tool-action-error'), {childList: true, subtree: true}); }""")
    sign_in = error.get_by_role("link", name="Sign in again (new tab)")
    sign_in.focus()
    page.wait_for_timeout(3500)  # several polls
    expect(sign_in).to_be_focused()
    assert page.evaluate("window.__writes") == 0
    from django.utils import timezone

    from retention.models import ToolPayloadOperation

    # The first analysis ends (as a worker would end it): one operation at a time lets the next in
    ToolPayloadOperation.objects.filter(kind="analysis").update(state="cancelled", finished_at=timezone.now(), slot=None)
    asked = []
    page.on("request", lambda r: asked.append(r.url) if r.method == "POST" and "/analyze/" in r.url else None)
    sign_in_in_the_new_tab(page, sign_in)
    page.bring_to_front()
    page.get_by_role("button", name="Analyze savings").evaluate("b => { b.click(); setTimeout(() => b.click(), 30); }")
    for _ in range(50):
        if len(analyses()) == 2:
            break
        page.wait_for_timeout(100)
    page.wait_for_timeout(500)
    assert sorted(analyses()) == [(5, "weeks"), (6, "weeks")] and len(asked) == 1, (asked, error.inner_text(), page.locator("#tool-status-note").inner_text())
    expect(error).not_to_contain_text("nothing new was started")
    expect(error).not_to_contain_text(ACTION_ENDED)


def test_signing_in_as_someone_else_still_saves_nothing(seeded, live_server, open_page):
    """The other tab signs in as a member: the admin's draft stays unsaved and explained."""
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    page.get_by_label("Audit facts, days").fill("501")
    Session.objects.all().delete()
    other = page.context.new_page()
    log_in(other, live_server.url, *MEMBER)
    other.close()

    bar(page).get_by_role("button", name="Save").click()

    expect(bar(page).locator(".save-bar-status")).to_have_text(ENDED)
    expect(page.get_by_label("Audit facts, days")).to_have_value("501")
    check_layout(page)
    assert RetainedFactsPolicy.load().audit_days != 501


def test_the_list_sends_a_signed_out_search_to_the_login_page(seeded, live_server, open_page):
    page = open_page("desktop")
    log_in(page, live_server.url, *MEMBER)
    Session.objects.all().delete()

    page.get_by_label("Search").fill("draft")
    page.get_by_label("Search").press("Enter")

    # The whole page goes to sign in (and comes back to the search), never the login form
    # inside the results.
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/conversations/%3Fview%3Drecent.*q%3Ddraft"))
    expect(page.get_by_role("heading", name="Sign in to Lethe")).to_be_visible()
    expect(page.locator("#results")).to_have_count(0)
    page.get_by_label("Username").fill(MEMBER[0])
    page.get_by_label("Password").fill(MEMBER[1])
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(re.compile(r"/conversations/\?view=recent.*q=draft"))
    expect(page.get_by_label("Search")).to_have_value("draft")


def test_an_admin_made_a_member_mid_edit_is_told_so_not_that_the_session_ended(seeded, live_server, open_page):
    """The session is alive but its user is no longer an admin: the save is refused 403 for
    who is signed in, and the bar says only admins can change these settings (signing in again
    would not help), keeps the draft, and saves nothing."""
    from django.contrib.auth import get_user_model

    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    before = RetainedFactsPolicy.load()
    page.get_by_label("Audit facts, days").fill("123")
    get_user_model().objects.filter(username=ADMIN[0]).update(is_staff=False, is_superuser=False)
    bar(page).get_by_role("button", name="Save").click()
    said = "Only admins can change these settings, so nothing was saved."
    expect(bar(page).locator(".save-bar-status")).to_have_text(said)
    expect(page.locator("#save-bar-live")).to_have_text(said)
    expect(bar(page).get_by_role("link", name="Sign in again (new tab)")).to_be_hidden()
    expect(page.get_by_label("Audit facts, days")).to_have_value("123")
    stored = RetainedFactsPolicy.load()
    assert (stored.audit_days, stored.revision) == (before.audit_days, before.revision)
