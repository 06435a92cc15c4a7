"""Phones: the save bar never covers the field being edited (nor its focus ring), the bottom
bars never cover the footer's selects, the bar is slimmer at 320 px, and focus rings and
field borders reach 3:1 contrast in light mode."""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, VIEWPORTS
from e2e.helpers import assert_save_bar_covers_nothing, log_in, open_nav

pytestmark = pytest.mark.django_db(transaction=True)
PHONES = pytest.mark.parametrize("viewport", ["phone", "small-phone"], ids=["390", "320"])
RING = 5  # the focus outline (3 px) and its offset (2 px) are part of what must stay visible

_CLEARANCE = """(barSelector) => {
  const el = document.activeElement, box = el.getBoundingClientRect();
  const bar = document.querySelector(barSelector).getBoundingClientRect();
  const top = document.querySelector(".topbar").getBoundingClientRect();
  const vv = window.visualViewport;
  return {id: el.id, top: box.top, bottom: box.bottom, barTop: bar.top, barHeight: bar.height,
          headerBottom: top.bottom, viewportBottom: vv ? vv.offsetTop + vv.height : innerHeight};
}"""


def clearance(page: Page, bar: str = "#save-bar") -> dict:
    return page.evaluate(_CLEARANCE, bar)


def assert_clear(found: dict, field: str) -> None:
    assert found["id"] == field, found
    assert found["bottom"] + RING <= found["barTop"] + 0.5, f"the bar covers the focused field: {found}"
    assert found["top"] - RING >= found["headerBottom"] - 0.5, f"the top bar covers the focused field: {found}"
    assert found["barTop"] + found["barHeight"] <= found["viewportBottom"] + 0.5, found


def clear_soon(page: Page, field: str, seconds: float = 5.0) -> None:
    """assert_clear once the page has settled (the bar's move, the resize's scroll): checked
    after each of the browser's frames until it holds, failing with the last finding after
    `seconds`; a fixed wait would pass or fail by how loaded the machine is."""
    deadline = time.monotonic() + seconds
    while True:
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")
        try:
            assert_clear(clearance(page), field)
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise


def tap_near_the_bottom(page: Page, field_id: str) -> None:
    """Scroll the field to just above the bar at the bottom (the navigation, or the save bar
    once there are changes) and tap it there, as a thumb would; a Playwright click would
    first scroll it somewhere comfortable."""
    page.wait_for_load_state("load")
    expect(page.locator(f"#{field_id}")).to_be_attached()
    page.evaluate(
        """(id) => {
          const save = document.getElementById("save-bar");
          const bottom = (save && !save.hidden ? save : document.querySelector(".phonenav")).getBoundingClientRect();
          const box = document.getElementById(id).getBoundingClientRect();
          // Its lower edge a little under the bar (the ring is hidden), its upper half in view.
          window.scrollBy(0, box.bottom - bottom.top - 10);
        }""",
        field_id,
    )
    box = page.locator(f"#{field_id}").bounding_box()
    page.mouse.click(box["x"] + 12, box["y"] + 10)


@PHONES
def test_the_save_bar_never_covers_the_field_being_typed_in(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    expect(page.get_by_role("heading", level=1)).to_have_text("Data & storage")

    for field in ("id_billing_days", "id_usage_days", "id_audit_days"):
        tap_near_the_bottom(page, field)
        expect(page.locator(f"#{field}")).to_be_focused()
        page.keyboard.press("End")
        page.keyboard.type("7")
        expect(page.locator("#save-bar")).to_be_visible()
        clear_soon(page, field)  # once the bar has settled in

    # The on-screen keyboard opens: the visible area shrinks to about half the screen.
    size = VIEWPORTS[viewport]
    page.set_viewport_size({"width": size["width"], "height": size["height"] // 2})
    clear_soon(page, "id_audit_days")
    page.keyboard.type("1")
    assert_clear(clearance(page), "id_audit_days")
    # Tab onwards through the card: each field in turn is kept clear.
    page.keyboard.press("Tab")
    assert_clear(clearance(page), "id_usage_days")
    page.set_viewport_size(size)


@PHONES
def test_the_bottom_bars_never_cover_the_footer_selects(seeded, live_server, open_page, viewport):
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    for select in ("language-foot", "timezone-foot"):
        # Reached with the keyboard from the top of the page ...
        page.evaluate("window.scrollTo(0, 0)")
        page.locator(f"#{select}").focus()
        assert_clear(clearance(page, ".phonenav"), select)
        # ... and at the very bottom of the page.
        page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
        box = page.locator(f"#{select}").bounding_box()
        nav = page.locator(".phonenav").bounding_box()
        assert box["y"] + box["height"] + RING <= nav["y"], (box, nav)

    # With unsaved changes the save bar takes the bottom edge; the footer still clears it,
    # also when a failed save makes the bar taller.
    open_nav(page, "Data & storage")
    page.get_by_label("Audit facts, days").fill("0")
    expect(page.locator("#save-bar")).to_be_visible()
    page.locator("#language-foot").focus()
    assert_clear(clearance(page), "language-foot")
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.locator("#save-bar .save-bar-status")).to_have_text(re.compile("not saved"))
    assert_save_bar_covers_nothing(page)


def test_the_save_bar_is_slimmer_on_the_smallest_phones(seeded, live_server, open_page):
    heights = {}
    for viewport in ("phone", "small-phone"):
        page = open_page(viewport)
        log_in(page, live_server.url, *ADMIN)
        open_nav(page, "Data & storage")
        page.get_by_label("Audit facts, days").fill("366")
        expect(page.locator("#save-bar")).to_be_visible()
        heights[viewport] = page.locator("#save-bar").bounding_box()["height"]
        for button in ("Save", "Discard"):
            box = page.locator("#save-bar").get_by_role("button", name=button).bounding_box()
            assert box["height"] >= 43.5 and box["width"] >= 43.5
    assert heights["small-phone"] <= 96 < heights["phone"], heights


def _luminance(rgb: tuple[float, float, float]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    def parse(css: str) -> tuple[float, float, float]:
        parts = css[css.index("(") + 1 : css.index(")")].replace(",", " ").split()
        return float(parts[0]), float(parts[1]), float(parts[2])

    high, low = sorted((_luminance(parse(a)), _luminance(parse(b))), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_focus_rings_and_field_borders_reach_three_to_one_in_light_mode(seeded, live_server, open_page):
    page = open_page("phone", color_scheme="light")
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    page.get_by_label("Audit facts, days").focus()
    page.keyboard.press("Tab")  # keyboard focus, so :focus-visible applies
    colours = page.evaluate("""() => {
        const field = document.activeElement, card = field.closest('.card');
        return {ring: getComputedStyle(field).outlineColor, ringWidth: getComputedStyle(field).outlineWidth,
                border: getComputedStyle(field).borderTopColor, card: getComputedStyle(card).backgroundColor,
                page: getComputedStyle(document.body).backgroundColor};
    }""")
    assert colours["ringWidth"] == "3px"
    for background in (colours["card"], colours["page"]):
        assert contrast(colours["ring"], background) >= 3, colours
        assert contrast(colours["border"], background) >= 3, colours



_IN_VIEW = """(id) => {
  const box = document.getElementById(id).getBoundingClientRect();
  const label = document.querySelector(`label[for="${id}"]`);  // its label too (r56: half under the bar)
  const first = label ? Math.min(label.getBoundingClientRect().top, box.top) : box.top;
  const top = document.querySelector(".topbar").getBoundingClientRect();
  const vv = window.visualViewport, bottom = vv ? vv.offsetTop + vv.height : innerHeight;
  return first - 5 >= top.bottom - 0.5 && box.bottom + 5 <= bottom + 0.5;
}"""


def in_view_soon(page: Page, field: str, seconds: float = 5.0) -> None:
    """The field with its label and focus ring between the top bar and the visible area's bottom edge,
    checked after each frame until it holds (the resize's scroll comes a frame or two later)."""
    deadline = time.monotonic() + seconds
    while not page.evaluate(_IN_VIEW, field):
        assert time.monotonic() < deadline, (field, page.locator(f"#{field}").bounding_box())
        page.evaluate("() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))")


@PHONES
def test_a_field_typed_in_stays_in_view_with_the_keyboard_open(seeded, live_server, open_page, viewport):
    """The list's search with the on-screen keyboard open (the visible area shrunk to 300 px):
    the field stays in view below the top bar, the bottom navigation steps aside, and the list
    under the search starts in view; off the field the navigation is back."""
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/conversations/")
    expect(page.locator(".phonenav")).to_be_visible()
    page.locator("#q").focus()
    size = VIEWPORTS[viewport]
    page.set_viewport_size({"width": size["width"], "height": 300})
    expect(page.locator(".phonenav")).to_be_hidden()
    in_view_soon(page, "q")
    page.keyboard.type("a")
    expect(page).to_have_url(re.compile(r"q=a"))
    in_view_soon(page, "q")
    count = page.locator("#results-count").bounding_box()
    assert count["y"] + count["height"] <= 300, count  # what the search changes is in view
    page.locator("#q").blur()
    expect(page.locator(".phonenav")).to_be_visible()
    page.set_viewport_size(size)


_LARGE_TEXT = "() => { document.documentElement.style.fontSize = '200%'; document.body.style.fontSize = '32px'; }"
_SETTLED = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


@pytest.mark.parametrize("lang", ["en", "es"])
def test_with_the_text_twice_as_large_every_bottom_tab_is_on_the_screen_and_nothing_hides_under_the_bars(
        seeded, live_server, open_page, lang):
    """r152: at 200% text the bottom bar's Settings tab was past the screen's right edge (its
    words kept whole, its tab not shrinking), the only way to Data & storage on a phone; the top
    bar grew to 107 px under a scroll padding of 72."""
    page = open_page("small-phone")
    log_in(page, live_server.url, *ADMIN)
    if lang == "es":
        page.locator("#language-foot").select_option("es")
        expect(page.locator("html")).to_have_attribute("lang", "es")
    page.evaluate(_LARGE_TEXT)
    page.evaluate(_SETTLED)
    tabs = page.locator(".phonenav .navlink")
    expect(tabs).to_have_count(3)
    for n in range(3):
        box = tabs.nth(n).bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 320.5, (n, box)
        assert box["height"] >= 43.5 and box["width"] >= 43.5, (n, box)
    assert page.evaluate("document.documentElement.scrollWidth") <= 320
    bars = page.evaluate("""() => ({top: document.querySelector('.topbar').offsetHeight,
        nav: document.querySelector('.phonenav').getBoundingClientRect().top,
        padding: parseFloat(getComputedStyle(document.documentElement).scrollPaddingTop)})""")
    assert bars["top"] > 72 and bars["padding"] >= bars["top"] + 8, bars
    # The page's last control clears the (now taller) bottom bar at the very bottom
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    page.evaluate(_SETTLED)
    last = page.locator("#timezone-foot").bounding_box()
    nav = page.locator(".phonenav").bounding_box()
    assert last["y"] + last["height"] + RING <= nav["y"], (last, nav)
    # A tap on the third tab takes the admin to the settings
    tabs.nth(2).click()
    expect(page).to_have_url(re.compile(r"/settings/"))


_LINES = """(el) => { const r = document.createRange(); r.selectNodeContents(el);
  return new Set([...r.getClientRects()].map(b => Math.round(b.top))).size; }"""


@pytest.mark.parametrize("text", ["100%", "200%"])
def test_held_sideways_with_the_keyboard_open_the_field_being_typed_in_stays_clear(
        seeded, live_server, open_page, text):
    """r152: at 640 px wide (the phone rules) the compact save bar stacked its buttons under its
    words (82 px) and the sticky top bar took 56 more: in a 640x160 visible area the field being
    typed in was under the bar. The bar keeps one row when it fits, and with a text field focused
    on a short screen the top bar scrolls away."""
    page = open_page({"width": 640, "height": 700})
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    if text != "100%":
        page.evaluate(_LARGE_TEXT)
    for field in ("id_age_value", "id_audit_days"):
        page.set_viewport_size({"width": 640, "height": 700})
        page.locator(f"#{field}").focus()
        page.keyboard.press("End")
        page.keyboard.type("3")
        expect(page.locator("#save-bar")).to_be_visible()
        page.set_viewport_size({"width": 640, "height": 160})
        clear_soon(page, field)
        if text == "100%":
            assert page.locator("#save-bar").bounding_box()["height"] < 72, page.locator("#save-bar").bounding_box()  # one row (two: 82)
        for button in ("Save", "Discard"):
            found = page.locator("#save-bar").get_by_role("button", name=button)
            box = found.bounding_box()
            assert box["height"] >= 43.5 and box["width"] >= 43.5 and box["y"] + box["height"] <= 160.5, box
            assert found.evaluate(_LINES) == 1, button  # its word whole (r155: "Discar" / "d")
        page.locator("#save-bar").get_by_role("button", name="Discard").click()
        expect(page.locator("#save-bar")).to_be_hidden()
    # Without a focused text field the top bar is sticky again
    page.locator("h1").click()
    assert page.evaluate("getComputedStyle(document.querySelector('.topbar')).position") == "sticky"


def test_a_side_menu_taller_than_the_screen_scrolls_with_the_page(seeded, live_server, open_page):
    """r152: at 844x390 the sticky side menu (394 px) kept its time zone below the screen's edge
    until the page's very end."""
    page = open_page({"width": 844, "height": 390})
    log_in(page, live_server.url, *ADMIN)
    open_nav(page, "Data & storage")
    page.evaluate(_SETTLED)
    assert page.evaluate("getComputedStyle(document.querySelector('.sidenav')).position") == "static"
    page.locator("#timezone-nav").scroll_into_view_if_needed()
    box = page.locator("#timezone-nav").bounding_box()
    assert box["y"] >= 0 and box["y"] + box["height"] <= 390.5, box
    page.set_viewport_size({"width": 1280, "height": 800})
    page.evaluate(_SETTLED)
    assert page.evaluate("getComputedStyle(document.querySelector('.sidenav')).position") == "sticky"
