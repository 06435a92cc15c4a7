"""Settings > System > Data & storage: one Save/Discard bar for two independent cards."""

from __future__ import annotations

import re

import pytest
from django.db.models import F
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, ALL_VIEWPORTS, MEMBER
from e2e.helpers import (
    assert_save_bar_covers_nothing,
    check_layout,
    log_in,
    open_nav,
)
from lifecycle.models import RetainedFactsPolicy
from retention.models import ToolPayloadOperation, ToolPayloadPolicy

pytestmark = pytest.mark.django_db(transaction=True)

NOT_SAVED = "Some changes were not saved. Check the highlighted card."


def open_data_storage(page: Page, base_url: str, who: tuple[str, str]) -> None:
    log_in(page, base_url, *who)
    open_nav(page, "Data & storage")
    expect(page).to_have_url(f"{base_url}/settings/system/data-storage/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Data & storage")
    # The heading shows while the page still parses; the page's script (the save bar, its
    # keys) runs at the end of parsing, before "load". A key pressed earlier meets the
    # script-free form, which has tests of its own.
    page.wait_for_load_state("load")


def bar(page: Page):
    return page.locator("#save-bar")


def facts_policy() -> RetainedFactsPolicy:
    return RetainedFactsPolicy.objects.get(id=1)


def tool_policy() -> ToolPayloadPolicy:
    return ToolPayloadPolicy.objects.get(id=1)


@pytest.fixture
def policies(seeded):
    """Both singletons as they stand before the test (the defaults)."""
    return ToolPayloadPolicy.load(), RetainedFactsPolicy.load()


@ALL_VIEWPORTS
def test_it_shows_the_save_bar_for_an_edit_and_discards_it(policies, live_server, open_page, viewport):
    _tool, facts = policies
    page = open_page(viewport)
    open_data_storage(page, live_server.url, ADMIN)
    audit = page.get_by_label("Audit facts, days")
    expect(audit).to_have_value(str(facts.audit_days))
    expect(bar(page)).to_be_hidden()

    audit.fill("500")

    expect(bar(page)).to_be_visible()
    expect(bar(page).locator(".save-bar-status")).to_have_text("Unsaved changes")
    expect(bar(page).locator(".save-bar-which")).to_have_text("Retained facts")
    if viewport != "desktop":
        expect(page.locator(".phonenav")).to_be_hidden()  # the bar takes the bottom edge
    check_layout(page)
    assert_save_bar_covers_nothing(page)

    bar(page).get_by_role("button", name="Discard").click()

    expect(audit).to_have_value(str(facts.audit_days))
    expect(bar(page)).to_be_hidden()
    if viewport != "desktop":
        expect(page.locator(".phonenav")).to_be_visible()
    stored = facts_policy()
    assert (stored.audit_days, stored.revision) == (facts.audit_days, facts.revision)

    # Changing a value and changing it back is no change at all.
    audit.fill("366")
    expect(bar(page)).to_be_visible()
    audit.fill(str(facts.audit_days))
    expect(bar(page)).to_be_hidden()


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_it_saves_both_cards_from_one_bar(policies, live_server, open_page, viewport):
    tool, facts = policies
    assert not tool.enabled
    page = open_page(viewport)
    open_data_storage(page, live_server.url, ADMIN)

    page.get_by_label("Automatic cleanup").check()
    page.get_by_label("Continue without backup").check()  # required when turning cleanup on, never preselected
    page.get_by_label("Number").fill("6")
    page.get_by_label("Unit").select_option("weeks")
    page.get_by_label("Audit facts, days").fill("500")
    page.get_by_label("Usage and metering, days").fill("450")

    expect(bar(page).locator(".save-bar-which")).to_have_text("Tool payload cleanup · Retained facts")
    bar(page).get_by_role("button", name="Save").click()

    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    expect(page.get_by_role("status").filter(has_text="Retention periods saved.")).to_be_visible()
    expect(bar(page)).to_be_hidden()
    stored_tool = tool_policy()
    assert (stored_tool.enabled, stored_tool.age_value, stored_tool.age_unit) == (True, 6, "weeks")
    assert stored_tool.revision == tool.revision + 1
    stored_facts = facts_policy()
    assert (stored_facts.audit_days, stored_facts.usage_days, stored_facts.billing_days) == (
        500, 450, facts.billing_days,
    )
    assert stored_facts.revision == facts.revision + 1

    # What was saved is what the page shows after a reload.
    page.reload()
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()
    expect(page.get_by_label("Number")).to_have_value("6")
    expect(page.get_by_label("Unit")).to_have_value("weeks")
    expect(page.get_by_label("Audit facts, days")).to_have_value("500")
    expect(page.get_by_label("Usage and metering, days")).to_have_value("450")
    expect(bar(page)).to_be_hidden()


@ALL_VIEWPORTS
def test_it_saves_the_valid_card_and_holds_back_the_invalid_one(policies, live_server, open_page, viewport):
    tool, facts = policies
    page = open_page(viewport)
    open_data_storage(page, live_server.url, ADMIN)

    page.get_by_label("Audit facts, days").fill("0")
    page.get_by_label("Number").fill("8")
    bar(page).get_by_role("button", name="Save").click()

    # The tool card saved ...
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    expect(page.get_by_label("Number")).to_have_value("8")
    # ... the facts card did not, and says why, next to the field.
    audit = page.get_by_label("Audit facts, days")
    expect(audit).to_have_value("0")
    expect(audit).to_have_attribute("aria-invalid", "true")
    error = page.locator("#facts-card .field-error")
    expect(error).to_be_visible()
    expect(error).to_have_text(re.compile(r"greater than or equal to 1"))
    expect(audit).to_have_accessible_description(re.compile(r"greater than or equal to 1"))
    expect(page.get_by_role("status").filter(has_text="Retention periods saved.")).to_have_count(0)
    # The failing card is marked and the field that needs fixing has the focus.
    expect(page.locator("#facts-card")).to_have_class(re.compile(r"\bhas-error\b"))
    expect(page.locator("#tool-card")).not_to_have_class(re.compile(r"\bhas-error\b"))
    expect(audit).to_be_focused()
    # The bar stays, names the card still unsaved, and says some changes failed.
    expect(bar(page)).to_be_visible()
    expect(bar(page).locator(".save-bar-status")).to_have_text(NOT_SAVED)
    expect(bar(page).locator(".save-bar-which")).to_have_text("Retained facts")
    check_layout(page)
    assert_save_bar_covers_nothing(page)

    stored_tool = tool_policy()
    assert (stored_tool.age_value, stored_tool.revision) == (8, tool.revision + 1)
    stored_facts = facts_policy()
    assert (stored_facts.audit_days, stored_facts.revision) == (facts.audit_days, facts.revision)

    # Correcting the value and saving again saves just that card.
    audit.fill("30")
    expect(bar(page).locator(".save-bar-status")).to_have_text("Unsaved changes")
    bar(page).get_by_role("button", name="Save").click()

    expect(page.get_by_role("status").filter(has_text="Retention periods saved.")).to_be_visible()
    expect(bar(page)).to_be_hidden()
    expect(page.locator("#facts-card .field-error")).to_have_count(0)
    assert facts_policy().audit_days == 30
    assert tool_policy().revision == tool.revision + 1  # not saved twice


def test_it_warns_before_leaving_with_unsaved_changes(policies, live_server, open_page):
    _tool, facts = policies
    page = open_page("desktop")
    open_data_storage(page, live_server.url, ADMIN)
    dialogs = []

    def stay(dialog):
        dialogs.append(dialog.type)
        dialog.dismiss()

    page.on("dialog", stay)
    audit = page.get_by_label("Audit facts, days")
    audit.click()  # a real click: browsers only warn after the person interacted
    audit.fill("500")
    expect(bar(page)).to_be_visible()

    with page.expect_event("dialog"):
        page.close(run_before_unload=True)

    assert dialogs == ["beforeunload"]
    assert not page.is_closed()  # staying keeps the edit
    expect(audit).to_have_value("500")
    assert facts_policy().audit_days == facts.audit_days

    # Once saved, leaving asks nothing.
    bar(page).get_by_role("button", name="Save").click()
    expect(bar(page)).to_be_hidden()
    with page.expect_event("close"):
        page.close(run_before_unload=True)
    assert dialogs == ["beforeunload"]
    assert facts_policy().audit_days == 500


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_back_to_the_page_shows_what_is_saved_not_a_draft_left_behind(policies, live_server, open_page, viewport):
    """r121: leaving with a draft (the warning accepted) and coming Back brought the draft back
    in the fields with the bar hidden and the form's revision current: the page said the
    draft was saved, and the next save, of another field, wrote it over another admin's save."""
    tool, facts = policies
    page = open_page(viewport)
    open_data_storage(page, live_server.url, ADMIN)
    page.on("dialog", lambda dialog: dialog.accept())
    audit = page.get_by_label("Audit facts, days")
    audit.click()  # a real click: browsers only warn after the person interacted
    audit.fill("14")
    page.get_by_label("Automatic cleanup").check()
    page.get_by_label("Unit").select_option("weeks")
    expect(bar(page)).to_be_visible()
    # Another admin saves meanwhile.
    RetainedFactsPolicy.objects.filter(id=1).update(audit_days=500, revision=F("revision") + 1)

    page.goto(f"{live_server.url}/operations/")  # (on phones the save bar takes the nav's place)
    expect(page.get_by_role("heading", level=1)).to_have_text("Operations")
    page.go_back()
    expect(page).to_have_url(f"{live_server.url}/settings/system/data-storage/")
    page.wait_for_load_state("load")

    expect(audit).to_have_value("500")
    expect(page.get_by_label("Automatic cleanup")).not_to_be_checked()
    expect(page.get_by_label("Unit")).to_have_value(tool.age_unit)
    expect(bar(page)).to_be_hidden()
    page.get_by_label("Usage and metering, days").fill("401")
    expect(bar(page).locator(".save-bar-which")).to_have_text("Retained facts")
    bar(page).get_by_role("button", name="Save").click()

    expect(page.get_by_role("status").filter(has_text="Retention periods saved.")).to_be_visible()
    stored = facts_policy()
    assert (stored.audit_days, stored.usage_days, stored.revision) == (500, 401, facts.revision + 2)
    stored_tool = tool_policy()
    assert (stored_tool.enabled, stored_tool.age_unit, stored_tool.revision) == (
        tool.enabled, tool.age_unit, tool.revision,
    )


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_it_shows_members_the_settings_read_only(policies, live_server, open_page, viewport):
    tool, facts = policies
    page = open_page(viewport)
    open_data_storage(page, live_server.url, MEMBER)

    expect(page.get_by_text("You can see these settings. Only admins can change them.")).to_be_visible()
    controls = page.locator("form[data-contributor] input:not([type=hidden]), form[data-contributor] select")
    expect(controls).to_have_count(6)
    for control in controls.all():
        expect(control).to_be_disabled()
    expect(page.get_by_label("Audit facts, days")).to_have_value(str(facts.audit_days))
    expect(page.locator("form[data-contributor] .note", has_text="Admins only.")).to_have_count(2)
    expect(page.locator("#save-bar")).to_have_count(0)
    expect(page.get_by_role("button", name=re.compile("Save"))).to_have_count(0)
    check_layout(page)
    assert tool_policy().revision == tool.revision and facts_policy().revision == facts.revision


def test_a_change_typed_before_the_script_ran_still_gets_the_save_bar(seeded, live_server, open_page):
    """On a slow phone a person can type before the page's script has run; the bar must still
    offer to save (and warn before leaving), not take the typed value as the saved one."""
    import time as _time

    page = open_page("phone")
    log_in(page, live_server.url, *ADMIN)
    held = []

    def hold_script(route):
        held.append(route)

    page.route("**/js/lethe*.js", hold_script)
    page.goto(f"{live_server.url}/settings/system/data-storage/", wait_until="commit")
    field = page.get_by_label("Audit facts, days")
    field.wait_for()
    deadline = _time.monotonic() + 10
    while not held and _time.monotonic() < deadline:
        page.wait_for_timeout(50)
    assert held, "the script request was not seen"
    field.fill("366")  # typed while the script is held back
    held[0].continue_()
    page.wait_for_load_state("load")
    expect(page.locator("#save-bar")).to_be_visible()
    expect(page.locator("#save-bar .save-bar-which")).to_contain_text("Retained facts")
    page.locator("#save-bar").get_by_role("button", name="Discard").click()
    expect(field).to_have_value("365")
    expect(page.locator("#save-bar")).to_be_hidden()


def test_enter_on_a_checkbox_or_a_radio_saves_like_in_a_text_field(policies, live_server, open_page):
    tool, _facts = policies
    page = open_page("desktop")
    open_data_storage(page, live_server.url, ADMIN)
    page.get_by_label("Automatic cleanup").focus()
    page.keyboard.press("Space")
    page.keyboard.press("Enter")  # the choice is missing: refused, and the focus goes to it
    expect(bar(page).locator(".save-bar-status")).to_have_text(NOT_SAVED)
    choice = page.get_by_label("Create backup (recommended)")
    expect(choice).to_be_focused()
    page.keyboard.press("Space")
    page.keyboard.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    stored = tool_policy()
    assert (stored.enabled, stored.backup_choice, stored.revision) == (True, "create", tool.revision + 1)


@pytest.mark.parametrize("script", [True, False], ids=["script", "no-script"])
def test_enter_in_the_period_saves_the_card_and_does_not_analyze(policies, live_server, open_page, script):
    # The Analyze savings button sits next to the period, but Enter in a field saves its card
    # (the form's first button is a hidden Save), with or without the page's script.
    tool, _facts = policies
    page = open_page("desktop", java_script_enabled=script)
    open_data_storage(page, live_server.url, ADMIN)
    number = page.get_by_label("Number")
    number.fill(str(tool.age_value + 2))
    number.press("Enter")
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    stored = tool_policy()
    assert (stored.age_value, stored.revision) == (tool.age_value + 2, tool.revision + 1)
    assert not ToolPayloadOperation.objects.exists()  # no analysis was asked for
    if script:
        expect(page.get_by_label("Number")).to_be_focused()
    else:
        expect(page).to_have_url(f"{live_server.url}/settings/system/data-storage/")


_IN_CLEAR_VIEW = """
(field) => {
  const ids = (field.getAttribute("aria-describedby") || field.closest("fieldset")?.getAttribute("aria-describedby") || "").split(/\\s+/);
  const message = ids.map((id) => document.getElementById(id)).find((el) => el && el.matches(".field-error"));
  const box = (el) => { const r = el.getBoundingClientRect(); return [Math.round(r.top), Math.round(r.bottom)]; };
  return {
    top: Math.round(document.querySelector(".topbar").getBoundingClientRect().bottom),
    bottom: Math.round(document.getElementById("save-bar").getBoundingClientRect().top),
    field: box(field), message: message ? box(message) : null,
  };
}
"""


@pytest.mark.parametrize("size", [(320, 400), (390, 844)], ids=["320x400", "390x844"])
@pytest.mark.parametrize("case", ["period", "backup-choice", "audit-days"])
def test_a_refused_field_and_its_message_show_between_the_top_bar_and_the_save_bar(
        policies, live_server, open_page, size, case):
    tool, facts = policies
    page = open_page({"width": size[0], "height": size[1]})
    log_in(page, live_server.url, *ADMIN)
    # In Spanish, where the longer copy makes the cards taller than the screen.
    page.context.add_cookies([{"name": "django_language", "value": "es", "url": live_server.url}])
    page.goto(f"{live_server.url}/settings/system/data-storage/")
    expect(page.locator("html")).to_have_attribute("lang", "es")
    page.wait_for_load_state("load")
    if case == "period":
        field = page.locator("#id_age_value")
        field.fill("999")
    elif case == "backup-choice":
        page.locator("#id_enabled").check()
        field = page.locator("input[name=backup_choice]").first
    else:
        field = page.locator("#id_audit_days")
        field.fill("99999")
    page.keyboard.press("Enter")

    expect(bar(page).locator(".save-bar-status")).to_have_text(re.compile("no se guardaron"))
    expect(field).to_be_focused()
    expect(field).to_have_attribute("aria-invalid", "true")
    page.wait_for_timeout(300)  # any scrolling done
    seen = field.evaluate(_IN_CLEAR_VIEW)
    assert seen["message"] is not None, seen
    for top, bottom in (seen["field"], seen["message"]):
        assert seen["top"] <= top and bottom <= seen["bottom"], seen
    stored_tool, stored_facts = tool_policy(), facts_policy()
    assert (stored_tool.revision, stored_tool.enabled, stored_tool.age_value) == (tool.revision, tool.enabled, tool.age_value)
    assert (stored_facts.revision, stored_facts.audit_days) == (facts.revision, facts.audit_days)


_BOXES = """
(field) => {
  const box = (el) => { if (!el) return null; const r = el.getBoundingClientRect(); return [Math.round(r.top), Math.round(r.bottom)]; };
  const ids = (field.getAttribute("aria-describedby") || "").split(/\\s+/).filter(Boolean);
  const message = ids.map((id) => document.getElementById(id)).find((el) => el && el.matches(".field-error"));
  return {
    top: box(document.querySelector(".topbar"))[1], bar: box(document.getElementById("save-bar")),
    screen: window.innerHeight, field: box(field), message: box(message),
  };
}
"""


def assert_clear_of_the_bars(page: Page, field, *, with_message: bool) -> None:
    """The field (and its error) between the sticky top bar and the save bar, the bar on screen."""
    page.wait_for_timeout(300)  # any scrolling done
    seen = field.evaluate(_BOXES)
    assert seen["bar"][1] <= seen["screen"], seen
    shown = [seen["field"]] + ([seen["message"]] if with_message else [])
    assert not with_message or seen["message"] is not None, seen
    for top, bottom in shown:
        assert seen["top"] <= top and bottom <= seen["bar"][0], seen


# (English, Spanish): what the bar says in full, and in a few words when it is compact.
_REFUSED = {"en": ("Some changes were not saved. Check the highlighted card.", "Some changes were not saved."),
            "es": ("Algunos cambios no se guardaron. Los detalles están en la tarjeta resaltada.",
                   "Algunos cambios no se guardaron.")}
_ENDED = {"en": ("Your session ended, so nothing was saved. Your changes are still here: sign in again in a new tab, then press Save.",
                 "Session ended: nothing was saved."),
          "es": ("La sesión terminó, así que no se guardó nada. Los cambios siguen aquí: inicie sesión de nuevo en otra "
                 "pestaña y después pulse Guardar.", "Sin sesión: no se guardó nada.")}


@pytest.mark.parametrize("lang", ["en", "es"])
@pytest.mark.parametrize("size", [(320, 300), (320, 640), (1280, 800)], ids=["320x300", "320x640", "1280"])
def test_with_the_keyboard_open_the_save_bar_leaves_the_field_and_its_error_in_view(
        policies, live_server, open_page, size, lang):
    """320x300 is a phone with the on-screen keyboard open: an edit, a refused save and a save
    after the session ended each keep the field being edited (and its error) between the top
    bar and the save bar, which is compact there; taller screens keep the full bar."""
    tool, facts = policies
    page = open_page({"width": size[0], "height": size[1]})
    log_in(page, live_server.url, *ADMIN)
    page.context.add_cookies([{"name": "django_language", "value": lang, "url": live_server.url}])
    page.goto(f"{live_server.url}/settings/system/data-storage/")
    expect(page.locator("html")).to_have_attribute("lang", lang)
    page.wait_for_load_state("load")
    compact = size[1] < 480
    status, short = bar(page).locator(".save-bar-status"), bar(page).locator(".save-bar-short")

    # 1. An edit: the bar appears under the field.
    period = page.locator("#id_age_value")
    period.fill(str(tool.age_value + 1))
    expect(bar(page)).to_be_visible()
    expect(period).to_be_focused()
    assert_clear_of_the_bars(page, period, with_message=False)

    # 2. A refused save: the field and its error, right under it, both in view.
    period.fill("0")
    period.press("Enter")
    full, few = _REFUSED[lang]
    expect(status).to_have_text(full)
    expect(period).to_be_focused()
    expect(period).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#age-error")).to_be_visible()
    assert_clear_of_the_bars(page, period, with_message=True)
    if compact:
        expect(short).to_have_text(few)
        expect(short).to_be_visible()
        expect(bar(page)).to_have_class(re.compile(r"\bis-compact\b"))
    else:
        expect(short).to_be_hidden()
        expect(bar(page).locator(".save-bar-which")).to_be_visible()
    # The full sentence is what the bar holds for screen readers and what was announced.
    expect(page.locator("#save-bar-live")).to_have_text(full)
    period.press("Escape")
    expect(bar(page)).to_be_hidden()

    # 3. A save after the session ended elsewhere.
    usage = page.locator("#id_usage_days")
    usage.fill(str(facts.usage_days + 1))
    other = page.context.new_page()
    other.goto(f"{live_server.url}/conversations/")
    other.locator("form[action='/accounts/logout/'] button").click()
    expect(other).to_have_url(re.compile(r"/accounts/login/"))
    other.close()
    page.bring_to_front()
    usage.focus()
    usage.press("Enter")
    full, few = _ENDED[lang]
    expect(status).to_have_text(full)
    expect(usage).to_be_focused()
    expect(bar(page).locator(".save-bar-signin")).to_be_visible()
    assert_clear_of_the_bars(page, usage, with_message=False)
    if compact:
        expect(short).to_have_text(few)
        expect(short).to_be_visible()
        # Its few words on one line in both languages: the bar (words, sign-in link, buttons)
        # leaves more than half of the visible height to the page (Spanish took two lines, 50%).
        assert bar(page).bounding_box()["height"] <= 0.45 * size[1], bar(page).bounding_box()
    else:
        expect(status).to_be_visible()

    stored_tool, stored_facts = tool_policy(), facts_policy()
    assert (stored_tool.revision, stored_tool.age_value) == (tool.revision, tool.age_value)
    assert (stored_facts.revision, stored_facts.usage_days) == (facts.revision, facts.usage_days)
