"""Browser tests: real Chromium against pytest-django's live server.

One browser for the whole session; each test gets fresh contexts (own cookies) at the
viewport it asks for, a freshly seeded database and its own engine folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import Browser, Page, expect

from lifecycle.enginefs import EngineHome
from lifecycle.seeding import Seeder

# Playwright's sync API runs an event loop in this thread; the ORM calls the tests
# make between browser steps are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
# Engine processes of the browser tests take their own ports (tests/remote_engine.py).
os.environ["LETHE_TEST_PORT_LANE"] = "e2e"

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]

VIEWPORTS = {
    "desktop": {"width": 1280, "height": 800},
    "phone": {"width": 390, "height": 844},
    "small-phone": {"width": 320, "height": 640},
}
ALL_VIEWPORTS = pytest.mark.parametrize("viewport", list(VIEWPORTS), ids=lambda v: str(VIEWPORTS[v]["width"]))

ADMIN = ("admin", "admin-pass-e2e")
MEMBER = ("member", "member-pass-e2e")

expect.set_options(timeout=10_000)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.nodeid.startswith("e2e/"):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix):
    """The browser suite's own folder for its test database and backups (tests/database_folder.py)."""
    from django.conf import settings
    from django.db import connections

    from tests.database_folder import own_test_folder

    with own_test_folder(connections["default"].settings_dict, settings.VAR_DIR):
        yield


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {**browser_type_launch_args, "headless": True, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(autouse=True)
def installed_settings_rows(request):
    """The settings rows migrate makes, back after the flush that ends each browser test."""
    if request.node.get_closest_marker("django_db") is None and not (
            {"live_server", "transactional_db"} & set(request.fixturenames)):
        return
    request.getfixturevalue("transactional_db")
    from lifecycle.models import RetainedFactsPolicy
    from retention.models import ToolPayloadPolicy

    RetainedFactsPolicy.objects.get_or_create(id=1)
    ToolPayloadPolicy.objects.get_or_create(id=1)


@dataclass
class Seeded:
    conversations: int
    items: int


@pytest.fixture
def seeded(settings, tmp_path) -> Seeded:
    """The demo data in both stores, plus an admin and a member with known passwords."""
    home = tmp_path / "engine"
    home.mkdir()
    settings.ENGINE_HOME = home
    report = Seeder(seed=1, anchor=timezone.now(), messages=20, home=EngineHome(home)).run(24)
    users = get_user_model()
    users.objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    users.objects.create_user(MEMBER[0], password=MEMBER[1], is_staff=False)
    return Seeded(conversations=report.conversations, items=report.items)


# Every text a live region (aria-live polite or assertive, not hidden) was given, as [its id,
# the text], in window.__said: a region clears itself 6 s after it speaks (lethe.js), which a
# check on a loaded machine could come after (r61); e2e.helpers.expect_said reads this record.
RECORD_SAID = """
(() => {
  window.__said = [];
  // Only what a screen reader would read out: a polite or assertive region, not hidden (r63: a
  // region set to aria-live="off", or hidden, passed as if it had spoken).
  const heard = (region) => {
    if (!["polite", "assertive"].includes(region.getAttribute("aria-live"))) return false;
    if (region.closest("[hidden], [aria-hidden=true]")) return false;
    const style = getComputedStyle(region);
    return style.display !== "none" && style.visibility !== "hidden";
  };
  new MutationObserver((records) => {
    for (const record of records) {
      const node = record.target.nodeType === 1 ? record.target : record.target.parentElement;
      const region = node && node.closest ? node.closest("[aria-live]") : null;
      if (!region || !region.textContent || !heard(region)) continue;
      window.__said.push([region.id, region.textContent]);
    }
  }).observe(document, {childList: true, characterData: true, subtree: true});
})();
"""


@pytest.fixture
def open_page(browser: Browser) -> Iterator[Callable[..., Page]]:
    """open_page("phone") -> a page in a fresh context at that viewport (or at a size given as
    {"width": ..., "height": ...}); keyword arguments
    go to the context (timezone_id, color_scheme, forced_colors, java_script_enabled...)."""
    contexts = []

    def make(viewport: str | dict, **options) -> Page:
        # Not is_mobile: mobile emulation zooms out to fit wide content, which would
        # hide exactly the horizontal overflow the phone checks look for.
        size = VIEWPORTS[viewport] if isinstance(viewport, str) else viewport
        context = browser.new_context(viewport=size, locale="en-US", **options)
        context.add_init_script(RECORD_SAID)
        contexts.append(context)
        return context.new_page()

    yield make
    for context in contexts:
        context.close()
