"""What the browser tests do again and again: sign in, check a phone layout, screenshot."""

from __future__ import annotations

import re
from pathlib import Path

from playwright.sync_api import Page, expect

from lifecycle.models import Conversation, Item, Role
from lifecycle.transcript import item_rows

SCREENSHOTS = Path(__file__).resolve().parent / "screenshots"
TOUCH = 44  # px, the smallest comfortable touch target

INTERACTIVE = "a, button, select, input, label.tab, label.switch"


def log_in(page: Page, base_url: str, username: str, password: str) -> None:
    """Sign in through the real login form and land on the conversation list."""
    page.goto(f"{base_url}/accounts/login/")
    expect(page.get_by_role("heading", name="Sign in to Lethe")).to_be_visible()
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page).to_have_url(f"{base_url}/conversations/")
    expect(page.get_by_role("heading", name="Conversations", level=1)).to_be_visible()
    page.wait_for_load_state("load")  # the page's script (run at the end of parsing) is in place


def screenshot(page: Page, name: str, *, full_page: bool = True) -> Path:
    """e2e/screenshots/<name>-<width>.png: the whole page from the top, or what the screen shows now."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}-{page.viewport_size['width']}.png"
    if full_page:
        page.evaluate("window.scrollTo(0, 0)")  # sticky bars are drawn where the scroll leaves them
    page.screenshot(path=str(path), full_page=full_page)
    return path


_LAYOUT_PROBE = """
(selector) => {
  const describe = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (el.classList.length) s += "." + Array.from(el.classList).join(".");
    const text = (el.innerText || el.value || el.getAttribute("aria-label") || "").trim().slice(0, 40);
    return text ? `${s} "${text}"` : s;
  };
  const shown = (el) => {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) return false;
    if (getComputedStyle(el).visibility === "hidden") return false;
    // Off-screen on purpose (the skip link until it has focus): nobody sees or taps it.
    return r.right > 0 && r.bottom > -window.scrollY;
  };

  const doc = document.documentElement;
  const overflow = { scrollWidth: doc.scrollWidth, innerWidth: window.innerWidth };

  const small = [];
  const seen = new Set();
  for (const el of document.querySelectorAll(selector)) {
    if (el.matches("input[type=hidden]")) continue;
    let target = el;
    if (el.matches("input[type=checkbox], input[type=radio]")) {
      // A small box is fine when its whole label is the touch target.
      target = el.closest("label") || el;
    }
    if (seen.has(target) || !shown(target)) continue;
    seen.add(target);
    const r = target.getBoundingClientRect();
    // Sub-pixel layout can land a 44px box on 43.99.
    if (r.width < 43.5 || r.height < 43.5) {
      small.push(`${describe(target)} ${r.width.toFixed(1)}x${r.height.toFixed(1)}`);
    }
  }

  const scrollers = [];
  for (const el of document.querySelectorAll("body *")) {
    const style = getComputedStyle(el);
    const scrollsY = /(auto|scroll)/.test(style.overflowY) && el.scrollHeight > el.clientHeight;
    const scrollsX = /(auto|scroll)/.test(style.overflowX) && el.scrollWidth > el.clientWidth;
    if (scrollsX || scrollsY) {
      scrollers.push(`${describe(el)} (${scrollsX ? "x" : ""}${scrollsY ? "y" : ""})`);
    }
  }
  return { overflow, small, scrollers };
}
"""


def check_layout(page: Page, where: str = "") -> None:
    """No sideways scrolling and the document as the one scroller; on phones also
    touch-sized controls (at desktop width a mouse is assumed)."""
    where = where or page.url
    page.wait_for_load_state("load")  # a navigation in flight has no body to measure yet
    found = page.evaluate(_LAYOUT_PROBE, INTERACTIVE)
    overflow = found["overflow"]
    assert overflow["scrollWidth"] <= overflow["innerWidth"], f"{where}: page scrolls sideways: {overflow}"
    assert found["scrollers"] == [], f"{where}: elements that scroll inside the page:\n" + "\n".join(
        found["scrollers"]
    )
    if page.viewport_size["width"] < 768:
        assert found["small"] == [], f"{where}: controls smaller than 44x44 px:\n" + "\n".join(found["small"])


SETTINGS_PAGES = ("Data & storage", "API tokens")


def nav_link(page: Page, name: str):
    """The main navigation link a person can see: the sidebar on desktop, the bottom bar on phones."""
    return page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).filter(visible=True)


def open_nav(page: Page, name: str) -> None:
    """Go to a main page the way a person would. On phones the bottom bar has one Settings
    entry (it opens Data & storage); the settings pages link to each other."""
    if page.viewport_size["width"] < 768 and name in SETTINGS_PAGES:
        _follow(page, nav_link(page, "Settings"))
        expect(page.get_by_role("heading", level=1)).to_have_text("Data & storage")
        if name != "Data & storage":
            _follow(page, page.get_by_role("navigation", name="Settings pages").get_by_role("link", name=name))
        return
    _follow(page, nav_link(page, name))


def _follow(page: Page, link) -> None:
    """Click a link and return once the new page's scripts have run. The fields are on screen
    before the deferred page script is, so a key pressed at once on a loaded machine went to
    the browser's own form submission (a CI failure: Enter posted the form without the page's
    handling of an ended session)."""
    with page.expect_navigation(wait_until="domcontentloaded"):
        link.click()


_COVERED_BY_BAR = """
(selector) => {
  window.scrollTo(0, document.documentElement.scrollHeight);
  const bar = document.getElementById("save-bar").getBoundingClientRect();
  const covered = [];
  for (const el of document.querySelectorAll(selector)) {
    if (el.closest("#save-bar") || el.matches("input[type=hidden]")) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.bottom > bar.top && r.top < bar.bottom) covered.push(`${el.tagName.toLowerCase()}#${el.id} top=${r.top} bar=${bar.top}`);
  }
  return covered;
}
"""


def assert_save_bar_covers_nothing(page: Page) -> None:
    """Scrolled to the very bottom, no control of the page sits under the fixed save bar."""
    covered = page.evaluate(_COVERED_BY_BAR, INTERACTIVE)
    assert covered == [], "controls hidden under the save bar:\n" + "\n".join(covered)


_FOCUS_BETWEEN_BARS = """
() => {
  const el = document.activeElement;
  const r = el.getBoundingClientRect();
  const shown = (bar) => bar && getComputedStyle(bar).display !== "none" ? bar.getBoundingClientRect() : null;
  const top = shown(document.querySelector(".topbar")), nav = shown(document.querySelector(".phonenav"));
  return {focus: `${el.tagName.toLowerCase()}#${el.id}.${el.className}`, top: r.top, bottom: r.bottom,
          above: top ? top.bottom : 0, below: nav ? nav.top : innerHeight};
}
"""


def assert_focus_between_bars(page: Page) -> None:
    """The focused element is in what is visible: below the sticky top bar, above the phone's
    fixed bottom navigation (when shown) and the screen's end. A tall one (a message of many
    lines on a short screen) shows its start, its first lines (88 px, as lethe.js's focusQuiet)."""
    box = page.evaluate(_FOCUS_BETWEEN_BARS)
    start_end = min(box["bottom"], box["top"] + 88)
    assert box["top"] >= box["above"] - 0.5 and start_end <= box["below"] + 0.5, f"focus out of view: {box}"


_NEXT_AFTER = """
(selector) => {
  const refusal = document.querySelector(selector), a = document.activeElement;
  return {follows: !!(refusal.compareDocumentPosition(a) & Node.DOCUMENT_POSITION_FOLLOWING),
          inMain: !!a.closest("main"), text: a.textContent.trim()};
}
"""


def confirm_refused_as_changed(page: Page, refusal_selector: str) -> None:
    """Confirm a delete by keyboard whose preview no longer holds: 409, the refusal's message
    has the focus, in view between the bars, and the next Tab goes on into the page after it."""
    page.get_by_role("button", name="Delete for good").focus()
    with page.expect_navigation() as answer:
        page.keyboard.press("Enter")
    assert answer.value.status == 409
    page.wait_for_load_state("load")
    refusal = page.locator(refusal_selector)
    expect(refusal).to_contain_text("changed after the page was shown")
    expect(refusal).to_be_focused()
    assert_focus_between_bars(page)
    page.keyboard.press("Tab")
    after = page.evaluate(_NEXT_AFTER, refusal_selector)
    assert after["follows"] and after["inMain"], after


def conversation_with_long_output(*, deletable: bool = False) -> tuple[Conversation, Item]:
    """The newest recent conversation that has a tool row whose output is cut short (with
    `deletable`, one a delete request would admit now)."""
    from lifecycle.deletion.admission import admit

    for conversation in Conversation.objects.recent().with_activity().order_by("-last_activity_at", "-pk"):
        if deletable and (conversation.is_active or admit(conversation).outcome != "admitted"):
            continue
        for item in conversation.items.filter(role=Role.TOOL).order_by("seq"):
            if item_rows([item])[0].truncated:
                return conversation, item
    raise AssertionError("the seed has no truncated tool output")


def open_from_list(page: Page, conversation: Conversation) -> None:
    """Open the conversation from the list (one click: the list is not replaced again after a
    search, see test_one_query_asks_the_server_once)."""
    link = page.locator("#results .conv-title").filter(has_text=re.compile(rf"^{re.escape(conversation.title)}$"))
    link.click()
    expect(page).to_have_url(re.compile(rf"/conversations/{conversation.public_id}/$"))
    expect(page.get_by_role("heading", level=1)).to_have_text(conversation.title)
    page.wait_for_load_state("load")  # htmx and the page's script (deferred) are in place


def reduce_tool_item(item: Item, removed_at=None) -> Item:
    """Write what tool payload cleanup writes for one item (the reducer's `reduce_item_row`)."""
    from django.utils import timezone

    from retention.reducer import reduce_item_row

    row = reduce_item_row(item, removed_at=removed_at or timezone.now())
    assert row is not None, f"item {item.pk} has nothing to remove"
    assert Item.objects.filter(pk=item.pk, revision=item.revision).update(**row) == 1
    return Item.objects.get(pk=item.pk)


def expect_said(page: Page, region_id: str, text: str, timeout: float = 10_000) -> None:
    """The live region `region_id` said `text` at some time since the page loaded (from the record
    e2e.conftest keeps: the region itself is cleared 6 s after it speaks)."""
    page.wait_for_function(
        "([id, text]) => (window.__said || []).some(([said_in, said]) =>"
        " said_in === id && said.replace(/\\s+/g, ' ').trim() === text)",
        arg=[region_id, text], timeout=timeout)


def settle(page, done, tries=50):
    """Lets the page run (and Playwright hand over its events) until done() holds or 5 s pass."""
    for _ in range(tries):
        if done():
            return
        page.wait_for_timeout(100)
