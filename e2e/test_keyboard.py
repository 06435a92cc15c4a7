"""Keyboard and screen-reader use: the focus stays where the person was or moves to what
changed (never to the top of the page), changes are announced through live regions that
exist and are not hidden, and the chosen tab is marked by more than its colour."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import conversation_with_long_output, log_in, open_from_list, open_nav
from lifecycle.models import Account, Conversation, RetainedFactsPolicy, Scope
from lifecycle.transcript import item_rows
from retention.models import ToolPayloadPolicy
from tests.factories import add_message

pytestmark = pytest.mark.django_db(transaction=True)

_FOCUS = """() => {
  const el = document.activeElement;
  if (!el || el === document.body) return "body";
  return el.id ? "#" + el.id : el.tagName.toLowerCase() + "." + Array.from(el.classList).join(".");
}"""


def focused(page: Page) -> str:
    return page.evaluate(_FOCUS)


def expect_focus(page: Page, selector: str) -> None:
    expect(page.locator(selector)).to_be_focused()


def open_data_storage(page: Page, base_url: str) -> None:
    log_in(page, base_url, *ADMIN)
    open_nav(page, "Data & storage")
    expect(page.get_by_role("heading", level=1)).to_have_text("Data & storage")
    page.wait_for_load_state("load")  # the page's script runs at the end of parsing


def live_text(page: Page, region: str) -> str:
    """What a polite live region says now; the region itself must be exposed (not hidden)."""
    hidden = page.evaluate(
        "(id) => { const el = document.getElementById(id); return !el || !!el.closest('[hidden]'); }", region
    )
    assert not hidden, f"#{region} is missing or inside a hidden container"
    return page.locator(f"#{region}").text_content()


# ---- Save bar ----------------------------------------------------------------


def test_save_and_discard_keep_the_focus_and_are_announced(seeded, live_server, open_page):
    page = open_page("desktop")
    open_data_storage(page, live_server.url)
    audit = page.get_by_label("Audit facts, days")
    before = RetainedFactsPolicy.load()

    # Save from the keyboard: Tab to the bar's Save button and press Enter.
    audit.fill("400")
    save = page.locator("#save-bar").get_by_role("button", name="Save")
    save.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#save-bar")).to_be_hidden()
    # The focus moved to the result (the card's confirmation), not to the top of the page;
    # that is what is read, once: the bar's live region says nothing more (r19).
    expect(page.locator("#facts-card [role=status]")).to_be_focused()
    expect(page.locator("#facts-card [role=status]")).not_to_be_empty()
    assert live_text(page, "save-bar-live") == ""
    assert RetainedFactsPolicy.load().audit_days == 400

    # Discard with the button: the value returns and the focus goes back to that card.
    audit = page.get_by_label("Audit facts, days")
    audit.fill("401")
    page.locator("#save-bar").get_by_role("button", name="Discard").focus()
    page.keyboard.press("Enter")
    expect(audit).to_have_value("400")
    expect(page.locator("#facts-card")).to_be_focused()
    expect(page.locator("#save-bar-live")).to_have_text("Changes discarded.")

    # Escape in the field discards too, and the focus stays in the field.
    audit.fill("402")
    expect(page.locator("#save-bar")).to_be_visible()
    audit.press("Escape")
    expect(audit).to_have_value("400")
    expect(page.locator("#save-bar")).to_be_hidden()
    expect(audit).to_be_focused()
    # Escape on the bar itself works the same.
    audit.fill("403")
    page.locator("#save-bar").get_by_role("button", name="Discard").focus()
    page.keyboard.press("Escape")
    expect(audit).to_have_value("400")
    stored = RetainedFactsPolicy.load()
    assert (stored.audit_days, stored.revision) == (400, before.revision + 1)

    # Enter in a field saves its card; the card is redrawn and the focus is back in the field.
    audit.fill("404")
    audit.press("Enter")
    expect(page.locator("#save-bar-live")).to_have_text("Changes saved.")
    expect(page.get_by_label("Audit facts, days")).to_be_focused()
    assert RetainedFactsPolicy.load().audit_days == 404


@pytest.mark.parametrize("size", ["desktop", "phone"])
def test_a_key_pressed_in_one_card_saves_or_discards_that_card_only(seeded, live_server, open_page, size):
    """Enter in a card saves that card, Escape in it discards that card: the other card's draft
    stays a draft (r39: Enter in a retention period also saved the cleanup card's draft, which
    switched cleanup on without a backup). The bar's own Save and Discard act on every card."""
    page = open_page(size)
    open_data_storage(page, live_server.url)
    tool, facts = ToolPayloadPolicy.load(), RetainedFactsPolicy.load()
    number, audit = page.get_by_label("Number"), page.get_by_label("Audit facts, days")
    number.fill(str(tool.age_value + 1))
    audit.fill(str(facts.audit_days + 1))
    audit.press("Enter")
    expect(page.locator("#facts-card [role=status]")).to_have_text(re.compile(r"saved", re.I))
    assert RetainedFactsPolicy.load().audit_days == facts.audit_days + 1
    stored = ToolPayloadPolicy.load()
    assert (stored.age_value, stored.revision) == (tool.age_value, tool.revision)  # not saved
    expect(number).to_have_value(str(tool.age_value + 1))  # still the draft, the bar still up
    expect(page.locator("#save-bar")).to_be_visible()

    audit = page.get_by_label("Audit facts, days")
    audit.fill(str(facts.audit_days + 2))
    number.press("Escape")  # the cleanup card only
    expect(number).to_have_value(str(tool.age_value))
    expect(audit).to_have_value(str(facts.audit_days + 2))
    expect(page.locator("#save-bar")).to_be_visible()
    number.fill(str(tool.age_value + 3))
    audit.press("Escape")  # the facts card only
    expect(audit).to_have_value(str(facts.audit_days + 1))
    expect(number).to_have_value(str(tool.age_value + 3))
    number.press("Enter")
    expect(page.locator("#save-bar")).to_be_hidden()
    stored = ToolPayloadPolicy.load()
    assert (stored.age_value, stored.revision) == (tool.age_value + 3, tool.revision + 1)
    assert RetainedFactsPolicy.load().audit_days == facts.audit_days + 1


def test_a_failed_card_is_announced_and_its_outline_clears_on_discard(seeded, live_server, open_page):
    page = open_page("phone")
    open_data_storage(page, live_server.url)
    audit = page.get_by_label("Audit facts, days")
    audit.fill("0")
    page.locator("#save-bar").get_by_role("button", name="Save").click()

    card = page.locator("#facts-card")
    expect(card).to_have_class(re.compile(r"\bhas-error\b"))
    expect(page.locator("#save-bar-live")).to_have_text("Some changes were not saved. Check the highlighted card.")
    assert live_text(page, "save-bar-live").startswith("Some changes were not saved.")
    expect(page.get_by_label("Audit facts, days")).to_be_focused()

    page.keyboard.press("Escape")

    expect(card).not_to_have_class(re.compile(r"\bhas-error\b"))
    expect(page.get_by_label("Audit facts, days")).to_have_value(str(RetainedFactsPolicy.load().audit_days))
    expect(card.locator(".field-error")).to_have_count(0)
    expect(page.get_by_label("Audit facts, days")).not_to_have_attribute("aria-invalid", "true")
    expect(page.locator("#save-bar")).to_be_hidden()
    outline = card.evaluate("c => getComputedStyle(c).borderColor + ' ' + getComputedStyle(c).boxShadow")
    fresh = page.locator("#tool-card").evaluate("c => getComputedStyle(c).borderColor + ' ' + getComputedStyle(c).boxShadow")
    assert outline == fresh  # looks like any other card again


# ---- Conversation list -------------------------------------------------------


def test_tabs_and_search_keep_the_focus_and_announce_the_count(seeded, live_server, open_page):
    page = open_page("desktop")
    log_in(page, live_server.url, *MEMBER)
    expect(page.locator("#results")).not_to_have_attribute("aria-live", re.compile(".*"))

    recent = page.locator("label.tab", has_text="Recent").locator("input")
    recent.focus()
    page.keyboard.press("ArrowRight")  # radio group: the arrow moves to Archived and picks it

    archived = page.locator("label.tab", has_text="Archived").locator("input")
    expect(archived).to_be_checked()
    expect(archived).to_be_focused()
    n = Conversation.objects.archived().count()
    expect(page.locator("#results .count")).to_have_text(f"{n} conversations")
    expect(page.locator("#results-status")).to_have_text(f"{n} conversations")
    assert live_text(page, "results-status") == f"{n} conversations"
    expect(archived).to_be_focused()

    search = page.get_by_label("Search")
    search.focus()
    search.press_sequentially("draft")
    matches = Conversation.objects.archived().search("draft").count()
    word = "conversation" if matches == 1 else "conversations"
    expect(page.locator("#results-status")).to_have_text(f"{matches} {word}")
    expect(search).to_be_focused()
    # Briefly: the announcement clears itself so it does not linger.
    expect(page.locator("#results-status")).to_have_text("", timeout=10_000)


def test_paging_moves_the_focus_to_the_new_page(seeded, live_server, open_page):
    account = Account.objects.get(name="Northwind Labs")
    now = timezone.now()
    Conversation.objects.bulk_create(
        Conversation(scope=Scope.BOUND, account=account, thread_id=f"thr_kbd_{n:03d}", title=f"Keyboard page {n:02d}",
                     created_at=now - timedelta(days=900), last_activity_at=now - timedelta(days=800 + n))
        for n in range(12)
    )
    page = open_page("phone")
    log_in(page, live_server.url, *ADMIN)
    following = page.locator(".pager").get_by_role("link", name="Next")
    following.focus()
    page.keyboard.press("Enter")

    expect(page.locator(".pager")).to_contain_text("Page 2 of 2")
    expect(page.locator("#results-count")).to_be_focused()
    expect(page.locator("#results-status")).to_have_text("Page 2 of 2")
    # The new page's top is on screen, below the sticky top bar.
    top = page.locator("#results-count").bounding_box()["y"]
    header = page.locator(".topbar").bounding_box()
    assert header["y"] + header["height"] <= top < page.viewport_size["height"] / 2

    page.locator(".pager").get_by_role("link", name="Previous").focus()
    page.keyboard.press("Enter")
    expect(page.locator(".pager")).to_contain_text("Page 1 of 2")
    expect(page.locator("#results-count")).to_be_focused()


@ALL_VIEWPORTS
def test_show_full_output_moves_the_focus_to_the_output_with_its_start_in_view(
        seeded, live_server, open_page, viewport):
    conversation, item = conversation_with_long_output()
    page = open_page(viewport)
    log_in(page, live_server.url, *MEMBER)
    open_from_list(page, conversation)
    row = page.locator(f"#item-{item.pk}")
    row.get_by_role("link", name=re.compile("Show full output")).focus()
    page.keyboard.press("Enter")

    pre = row.locator(".output pre")
    expect(pre).to_have_text(item_rows([item], full=True)[0].output.strip())
    expect(pre).to_be_focused()
    assert focused(page) != "body"
    # The output's first line is on screen, below the top bar (a phone's browser centred the
    # tall output on focus: its start was thousands of pixels above the screen).
    top = pre.evaluate("el => el.getBoundingClientRect().top")
    header = page.locator(".topbar").bounding_box()
    assert header["y"] + header["height"] - 1 <= top < page.viewport_size["height"] * 0.8, top


def test_the_chosen_tab_is_marked_by_more_than_colour(seeded, live_server, open_page):
    for options in ({}, {"forced_colors": "active"}):
        page = open_page("desktop", **options)
        log_in(page, live_server.url, *MEMBER)
        page.locator("label.tab", has_text="Closed").click()
        expect(page.locator("label.tab", has_text="Closed").locator("input")).to_be_checked()
        styles = page.locator("label.tab").evaluate_all("""tabs => tabs.map(t => {
            const s = getComputedStyle(t), mark = getComputedStyle(t, '::before');
            return {mark: mark.content !== 'none' && mark.borderRightWidth !== '0px', weight: s.fontWeight,
                    background: s.backgroundColor};
        })""")
        names = page.locator("label.tab").all_inner_texts()
        index = [n.strip() for n in names].index("Closed")
        chosen, others = styles[index], styles[:index] + styles[index + 1:]
        assert [s["mark"] for s in styles] == [i == index for i in range(len(styles))], (options, styles)
        assert all(s["weight"] != chosen["weight"] for s in others), (options, styles)
        # In forced-colors mode the system colours still set it apart (Highlight, not Canvas).
        assert all(s["background"] != chosen["background"] for s in others), (options, styles)


def test_the_language_select_waits_for_an_explicit_choice(seeded, live_server, open_page):
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    select = page.locator(".sidenav select[name=language]")
    select.focus()
    page.keyboard.press("ArrowDown")  # moves the value of a closed select at once

    expect(select).to_have_value("es")
    page.wait_for_timeout(500)
    expect(page.locator("html")).to_have_attribute("lang", "en")  # nothing happened yet
    change = page.locator(".sidenav .language-switch").get_by_role("button", name="Change")
    expect(change).to_be_visible()

    page.keyboard.press("Enter")  # the explicit choice

    expect(page.locator("html")).to_have_attribute("lang", "es")
    expect(page.get_by_role("heading", level=1)).to_have_text("Conversaciones")


def test_the_breadcrumb_links_lead_up_the_settings(seeded, live_server, open_page):
    page = open_page("desktop")
    open_data_storage(page, live_server.url)
    crumbs = page.get_by_role("navigation", name="Breadcrumb")
    expect(crumbs.get_by_role("link")).to_have_text(["Settings", "System", "Data & storage"])
    expect(crumbs.get_by_role("link", name="Data & storage")).to_have_attribute("aria-current", "page")
    crumbs.get_by_role("link", name="Settings").click()
    expect(page).to_have_url(f"{live_server.url}/settings/system/data-storage/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Data & storage")


def test_show_later_messages_moves_the_focus_to_the_first_new_message(seeded, live_server, open_page):
    conversation = Conversation.objects.recent().order_by("-last_activity_at").first()
    have = conversation.items.count()
    for n in range(55 - have):
        add_message(conversation, content=f"filler message {n}")
    page = open_page("small-phone")
    log_in(page, live_server.url, *MEMBER)
    open_from_list(page, conversation)
    later = page.get_by_role("link", name="Show later messages")
    later.focus()
    page.keyboard.press("Enter")

    first_new = conversation.items.order_by("seq")[50]
    expect(page.locator(f"#item-{first_new.pk}")).to_be_focused()
    expect(page.get_by_role("link", name="Show later messages")).to_have_count(0)


def test_after_a_row_action_the_focus_starts_at_its_outcome(seeded, live_server, open_page):
    page = open_page("desktop")
    log_in(page, live_server.url, *ADMIN)
    first = page.locator("#results .conv").first
    title = first.locator(".conv-title").inner_text()
    archive = first.get_by_role("button", name=re.compile("^Archive"))
    archive.focus()
    page.keyboard.press("Enter")
    flash = page.locator(".flash")
    expect(flash).to_contain_text("Archived: hidden from Recent.")
    expect(flash).to_be_focused()  # not the top of the page: the next Tab goes on into the content
    assert Conversation.objects.get(title=title).archived_at is not None
