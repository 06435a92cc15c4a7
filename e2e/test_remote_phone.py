"""A bound delete on a phone: the engine is down, the delete shows Pending and waits for the
engine; the engine starts, and the same page turns Completed by itself, with the receipt.

Real parts: a second Lethe process as the engine (tests.remote_engine), this console's
live server, its own django-q2 cluster as a subprocess, and Chromium at a phone viewport.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from e2e.conftest import ADMIN
from e2e.helpers import check_layout, confirm_refused_as_changed, expect_said, log_in, screenshot
from remote.models import BoundDelete, EngineBinding
from remote.sync import refresh
from tests.remote_engine import ROOT, running_engine
from tests.test_erasure_crash import stop_group
from tests.test_jobs import database_url
from tests.test_remote_delete_screens import RECEIPT, bound, completed

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def engine():
    with running_engine({"phone": {"thread_id": "t-phone", "title": "Phone delete"},
                         "twin": {"thread_id": "t-phone", "owner": "computer", "title": "Same id, other owner"}},
                        "lethe-remote-e2e-") as process:
        yield process


def test_a_bound_delete_on_a_phone_is_pending_while_the_engine_is_down_then_completed(
        engine, live_server, open_page, settings, tmp_path):
    settings.ENGINE_URL, settings.ENGINE_TOKEN = engine.url, engine.token
    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    refresh("")
    account = f"account:{engine.seeded['account']}"
    engine.stop()
    (tmp_path / "console-engine").mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "Q_WORKERS": "1", "ENGINE_URL": engine.url, "ENGINE_TOKEN": engine.token, "REMOTE_RETRY_SECONDS": "4",
           "REMOTE_RETRY_MAX_SECONDS": "4", "ENGINE_HOME": str(tmp_path / "console-engine")}
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        page = open_page("phone")
        log_in(page, live_server.url, *ADMIN)
        page.get_by_role("link", name="Engine conversations").click()
        page.get_by_label("Owner").select_option(account)
        page.get_by_role("button", name="Show").click()
        row = page.locator("[data-thread='t-phone']")
        expect(row).to_have_count(1)  # one owner at a time: the computer's t-phone is not listed here
        check_layout(page, "engine conversations")
        row.get_by_role("link", name="Delete").click()
        expect(page.get_by_role("button", name="Delete for good")).to_be_visible()
        check_layout(page, "bound delete confirmation")
        page.get_by_role("button", name="Delete for good").click()
        status = page.locator("#op-status")
        expect(status).to_have_attribute("data-state", "pending")
        page.evaluate("""() => {  // what the live region says, each time it says something
          window.said = [];
          const region = document.getElementById("op-announce");
          new MutationObserver(() => { if (region.textContent) window.said.push(region.textContent); })
            .observe(region, {childList: true, characterData: true, subtree: true});
        }""")
        # Until the cluster started above is seen running, the page truly says the delete waits on
        # this console (r-CI: its start alone took more than a minute on a loaded machine).
        expect(page.get_by_test_id("op-waiting")).to_contain_text("Waiting on: the engine", timeout=240_000)
        # The job cluster started above makes the first attempt: on a loaded machine its start
        # alone took more than a minute. Each failed attempt is due again 4 s later (two of the
        # page's polls); a job run retries for RUN_BUDGET, then the minute sweep takes it.
        deadline = time.monotonic() + 240
        while not BoundDelete.objects.filter(attempts__gt=0).exists():
            assert time.monotonic() < deadline, "the job cluster made no attempt in 4 minutes"
            time.sleep(0.2)
        expect(page.get_by_test_id("op-waiting")).to_contain_text("next retry:", timeout=90_000)
        retry = page.get_by_test_id("op-waiting").inner_text()
        expect(page.get_by_test_id("op-waiting")).not_to_have_text(retry, timeout=90_000)  # retried: swapped again
        said = page.evaluate("window.said")
        assert len(said) == len(set(said)), said  # the same words are not said again at each retry
        assert all("next retry" not in words and "engineWaiting" not in words for words in said), said
        expect(page.get_by_text("Completed")).to_have_count(0)
        check_layout(page, "bound delete pending")
        op = BoundDelete.objects.get()
        assert op.state == "pending" and EngineBinding.objects.filter(pk=op.binding_id).exists()
        assert engine.conversation(engine.seeded["threads"]["phone"])["state"] == "live"

        engine.start()
        # the engine's own cluster starts and erases, then this console's next sweep reads it
        expect(status).to_have_attribute("data-state", "completed", timeout=240_000)
        expect(page.get_by_test_id("op-state")).to_have_text("Completed")
        expect_said(page, "op-announce", "Completed")
        expect(page.get_by_test_id("receipt")).to_contain_text("Messages and tool calls")
        expect(page.get_by_test_id("receipt")).not_to_contain_text("lifecycle.")
        check_layout(page, "bound delete completed")
    finally:
        stop_group(cluster)
    op.refresh_from_db()
    assert op.state == "completed" and op.binding_id is None and op.receipt is not None
    assert engine.conversation(engine.seeded["threads"]["phone"])["state"] == "deleted"
    assert engine.conversation(engine.seeded["threads"]["twin"])["state"] == "live"


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_the_bound_confirmation_and_receipt_say_what_is_kept_by_name(live_server, open_page, settings, viewport):
    settings.ENGINE_URL = ""  # no engine to ask: the confirmation states the rules, without figures
    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    binding = bound()
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/engine/conversations/{binding.public_id}/delete/")
    expect(page.get_by_test_id("preview-rules-only")).to_be_visible()
    expect(page.get_by_test_id("preview-kept")).to_contain_text("Exports you saved")
    expect(page.get_by_test_id("preview-kept")).to_contain_text("otherwise the shared copy remains")
    expect(page.get_by_test_id("preview-kept")).to_contain_text("kept for the declared period")
    expect(page.get_by_test_id("preview-outside")).to_contain_text("Provider retention follows provider terms.")
    expect(page.get_by_role("button", name="Delete for good")).to_be_visible()
    check_layout(page, f"bound delete confirmation {viewport}")
    binding.delete()

    op = completed(RECEIPT)
    page.goto(f"{live_server.url}/engine/deletes/{op.public_id}/")
    receipt = page.get_by_test_id("receipt")
    expect(receipt.locator("li")).to_have_count(len(RECEIPT["stores"]))
    expect(receipt.locator("li").first).to_have_text("Messages and tool calls 2 records erased · 2.0 KB")
    expect(receipt).to_contain_text("Event log 3 files erased · 4.0 KB")
    expect(receipt).to_contain_text("Exports you saved 1 record kept, link cut")
    expect(receipt).to_contain_text("1 shared copy remains")
    expect(receipt).to_contain_text("Other data on the engine")
    expect(page.get_by_test_id("receipt-kept")).to_contain_text("kept until their period after the delete runs out")
    expect(page.get_by_test_id("receipt-kept")).to_contain_text("follows provider terms")
    expect(page.get_by_test_id("changed-totals")).to_contain_text("5 records, 4 files")
    expect(page.locator("main")).not_to_contain_text("lifecycle.")
    check_layout(page, f"bound delete receipt {viewport}")
    screenshot(page, f"bound-delete-receipt-{viewport}")

    # Read again later (remote.receipts): the engine has since expired the usage facts.
    later = copy.deepcopy(op.receipt)
    for entry in later["kept"]:
        if isinstance(entry, dict) and entry.get("store") == "lifecycle.UsageFact":
            entry.update(action="expired", expired_at="2027-03-01T04:00:00+00:00")
    read_at = timezone.now()
    BoundDelete.objects.filter(pk=op.pk).update(receipt=later, receipt_read_at=read_at)
    page.reload()
    expect(page.get_by_test_id("receipt-kept")).to_contain_text("2 records, removed on")
    expect(page.get_by_test_id("receipt-kept")).to_contain_text("3 records kept")
    expect(page.get_by_test_id("receipt-read")).to_contain_text("Receipt as the engine reported it on")
    check_layout(page, f"bound delete receipt read again {viewport}")
    screenshot(page, f"bound-delete-receipt-read-again-{viewport}")


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_link_to_an_owner_the_engine_list_does_not_have_shows_the_first_owner_and_says_so(
        live_server, open_page, settings, viewport):
    settings.ENGINE_URL = ""
    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    bound("Quarterly plan")
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/engine/conversations/?owner=account:4040")
    note = page.get_by_test_id("unknown-owner")
    expect(note).to_be_visible()
    expect(note).to_have_text("No owner here matches that link, so Account 1 is shown. Pick another owner above.")
    expect(page.get_by_label("Owner")).to_have_value("account:1")
    expect(page.get_by_test_id("bindings")).to_contain_text("Quarterly plan")
    check_layout(page, f"engine list, unknown owner {viewport}")
    screenshot(page, f"engine-list-unknown-owner-{viewport}", full_page=False)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_conversation_the_engine_already_deleted_says_so_in_the_list_and_before_the_delete(
        live_server, open_page, settings, viewport):
    settings.ENGINE_URL = ""  # no engine to ask: the state the last read stored
    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    binding = bound("Gone on the engine")
    EngineBinding.objects.filter(pk=binding.pk).update(engine_state="deleted")
    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/engine/conversations/")
    expect(page.get_by_test_id("engine-deleted")).to_have_text("Deleted on the engine")
    check_layout(page, f"engine list, deleted on the engine {viewport}")
    page.goto(f"{live_server.url}/engine/conversations/{binding.public_id}/delete/")
    note = page.get_by_test_id("engine-deleted")
    expect(note).to_contain_text("The engine has already deleted this conversation")
    expect(page.get_by_test_id("preview-rules-only")).to_have_count(0)  # no delete to come is previewed
    check_layout(page, f"bound delete of a conversation the engine deleted {viewport}")
    screenshot(page, f"bound-delete-engine-deleted-{viewport}", full_page=False)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_delete_the_engine_would_refuse_says_why_and_offers_no_confirmation(live_server, open_page, settings,
                                                                               viewport):
    from lifecycle.deletion import reasons
    from tests.scripted_engine import scripted_engine
    from tests.test_remote_delete_screens import point_at, preview

    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    binding = bound("Busy on the engine")
    admission = {"outcome": "refused", "code": reasons.TURN_ACTIVE, "ambiguous": [], "reasons": [
        {"code": reasons.TURN_ACTIVE, "outcome": "refused", "message": ""},
        {"code": reasons.APPROVAL_PENDING, "outcome": "refused", "message": ""}]}
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, preview(admission=admission))}) as (url, _seen):
        point_at(settings, url)
        page = open_page(viewport)
        log_in(page, live_server.url, *ADMIN)
        page.goto(f"{live_server.url}/engine/conversations/{binding.public_id}/delete/")
        card = page.get_by_test_id("delete-not-admitted")
        expect(card).to_contain_text("Delete is refused right now")
        expect(card.locator("li")).to_have_count(2)
        expect(page.get_by_role("button", name="Delete for good")).to_have_count(0)
        expect(page.get_by_role("link", name="Check again")).to_be_visible()
        check_layout(page, f"bound delete the engine would refuse {viewport}")
        screenshot(page, f"bound-delete-engine-refuses-{viewport}")
        page.goto(f"{live_server.url}/conversations/")
        expect(page.get_by_test_id("remote-engine-note")).to_be_visible()
        check_layout(page, f"conversation list of a remote console {viewport}")
        screenshot(page, f"conversations-remote-console-{viewport}", full_page=False)
        page.goto(f"{live_server.url}/settings/system/data-storage/")
        expect(page.get_by_test_id("engine-usage")).to_have_text(
            "On the engine: this console keeps no engine folder of its own.")
        expect(page.get_by_test_id("insight-remote")).to_be_visible()
        check_layout(page, f"data and storage of a remote console {viewport}")
        screenshot(page, f"data-storage-remote-console-{viewport}")


def test_a_bound_confirmation_refused_as_changed_starts_at_its_message_on_a_short_phone(
        live_server, open_page, settings):
    """The engine's conversation grew after the delete page was shown: the confirmation is
    refused (409) and the page shows the engine's preview as it is now. On a phone with its
    keyboard open the focus starts at the refusal, in view between the bars (r105: it stayed on
    the page's body, the message under the bottom navigation); the next Tab goes on past it."""
    from tests.scripted_engine import scripted_engine
    from tests.test_remote_delete_screens import point_at, preview

    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    binding = bound("Grew on the engine")
    shown = {"stores": preview()}
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (200, shown["stores"])}) as (url, seen):
        point_at(settings, url)
        page = open_page({"width": 320, "height": 300})
        log_in(page, live_server.url, *ADMIN)
        page.goto(f"{live_server.url}/engine/conversations/{binding.public_id}/delete/")
        page.wait_for_load_state("load")
        grown = preview()
        grown["stores"] = [{**s, "records": 9} if s["store"] == "lifecycle.Item" else s for s in grown["stores"]]
        shown["stores"] = grown
        confirm_refused_as_changed(page, "[data-testid=delete-error]")
        assert not [request for request in seen if request[0] == "DELETE"]
    assert not BoundDelete.objects.exists()


@pytest.mark.parametrize("viewport", ["small-phone", "phone"])
def test_a_read_that_left_conversations_out_names_them_within_a_phone_screen(live_server, open_page, settings,
                                                                             viewport):
    """r123: rows the console cannot keep are left out and named (the others read), and the
    message naming them stays within a phone's width, in English and Spanish."""
    from tests.scripted_engine import scripted_engine
    from tests.test_remote_answers import point_at, row

    bad = [row(n, scope="s" * 9) for n in range(2, 27)]
    page_of_rows = {"results": [row(1, title="Título " + "é" * 298), *bad], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, page_of_rows)}) as (url, _seen):
        point_at(settings, url)
        get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
        for language, words in (("en", "25 conversations on the engine were left out"),
                                ("es", "25 conversaciones del motor se dejaron fuera")):
            page = open_page(viewport)
            log_in(page, live_server.url, *ADMIN)
            page.context.add_cookies([{"name": "django_language", "value": language, "url": live_server.url}])
            page.goto(live_server.url + "/engine/conversations/")
            page.locator("form[action='/engine/conversations/sync/'] button").click()
            expect(page.get_by_text(words)).to_be_visible()
            check_layout(page, f"engine conversations, rows left out ({language})")
    assert EngineBinding.objects.get().title == "Título " + "é" * 293
