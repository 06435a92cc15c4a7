"""Tool payload cleanup in the browser, the seed's e2e plan at 1280, 390 and 320 px: analyze
the unsaved draft while cleanup is off, turn it on with an explicit backup choice, save with the
shared bar, run, reload, and check the rows in the database, not only the screen.

The job cluster's work is done here in the test thread by `retention.jobs.run_operation` (what
the cluster runs for each queued operation), as the lifecycle e2e does with erasure; the page
finds the results by its own status polling.
"""

from __future__ import annotations

import tempfile
from datetime import timedelta
from pathlib import Path

import pytest
from django.db.models import Sum
from django.utils import timezone
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, MEMBER
from e2e.helpers import assert_focus_between_bars, check_layout, log_in, open_nav, screenshot
from lifecycle.models import Conversation, Item
from retention import jobs
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from retention.reducer import MARKER_KEY
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)
SHOTS = Path(tempfile.gettempdir()) / "screens-shots"  # looked at by hand; e2e/screenshots/ has the rest


def shell(n: int) -> dict:
    return {"command": f"pytest -k case{n}", "cwd": "/srv/app", "exit_code": n % 2,
            "stdout": f"collected {n} items\n" + "PASSED\n" * (150 + n), "stderr": "", "truncated": False}


def conversation(title: str, days_idle: float) -> Conversation:
    made = factories.make_conversation(title=title)
    factories.add_message(made, "user", f"Please check {title}")
    for n in range(4):
        factories.add_tool(made, "shell", shell(n), tool_call_id=f"{title}-{n}", title=f"Run case {n}")
    factories.add_tool(made, "read_file", {"path": "/srv/app/main.py", "content": "print('hi')\n" * 200,
                                           "line_count": 200}, tool_call_id=f"{title}-r", title="Read main.py")
    factories.add_tool(made, "plan", {"steps": ["look", "fix"]}, tool_call_id=f"{title}-p", title="Plan")
    factories.add_message(made, "assistant", f"{title}: done")
    Conversation.objects.filter(pk=made.pk).update(last_activity_at=timezone.now() - timedelta(days=days_idle))
    return made


@pytest.fixture
def data(settings, tmp_path):
    SHOTS.mkdir(exist_ok=True)
    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    settings.ENGINE_HOME = tmp_path / "engine"
    settings.ENGINE_HOME.mkdir()
    from django.contrib.auth import get_user_model

    users = get_user_model()
    users.objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    users.objects.create_user(MEMBER[0], password=MEMBER[1], is_staff=False)
    old = [conversation("Old billing fix", 200), conversation("Old login bug", 120)]
    recent = conversation("Recent deploy", 5)
    return old, recent


def drain() -> None:
    """Run every queued operation to its end, as the cluster would (a backup queues its cleanup)."""
    for _ in range(500):
        op = ToolPayloadOperation.objects.filter(slot__isnull=False).order_by("id").first()
        if op is None:
            return
        jobs.run_operation(op.pk)
    raise AssertionError("operations did not finish")


def removable(conversations) -> int:
    return Item.objects.filter(conversation__in=conversations, payload_skip="").aggregate(
        total=Sum("removable_bytes"))["total"] or 0


def open_card(page: Page, base: str, who=ADMIN) -> None:
    log_in(page, base, *who)
    open_nav(page, "Data & storage")
    expect(page.locator("#tool-card")).to_be_visible()
    # The card is visible while the page still parses; its script (the language switch, the
    # save bar) runs at the end of parsing.
    page.wait_for_load_state("load")


def analyze_draft(page: Page, old) -> int:
    """Analyze a draft period while cleanup is off; the estimate equals the bytes in the rows."""
    expected = removable(old)
    assert expected > 0
    analysis = page.get_by_test_id("analysis")
    expect(analysis).to_have_attribute("data-state", "none")
    page.get_by_label("Number").fill("2")  # the draft: 2 months, not saved
    page.get_by_role("button", name="Analyze savings").click()
    expect(analysis).to_have_attribute("data-state", "running")
    expect(page.get_by_role("button", name="Cancel analysis")).to_be_visible()
    op = ToolPayloadOperation.objects.get(kind="analysis")
    assert (op.age_value, op.age_unit) == (2, "months")
    drain()
    expect(analysis).to_have_attribute("data-state", "completed", timeout=15_000)
    expect(page.get_by_test_id("estimate-bytes")).to_have_attribute("data-bytes", str(expected))
    expect(analysis).to_contain_text("tool messages across 2 conversations")
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value, policy.revision) == (False, 3, 1)  # analysis saved nothing
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()  # and changed no row
    return expected


def turn_on_and_save(page: Page, choice: str) -> None:
    choices = page.locator("#backup-choice")
    expect(choices).to_be_hidden()
    page.get_by_label("Automatic cleanup").check()
    expect(choices).to_be_visible()
    for label in ("Create backup (recommended)", "Continue without backup"):
        expect(page.get_by_label(label)).not_to_be_checked()  # never preselected
    page.get_by_label(choice).check()
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()


def check_removed(old, recent, expected: int, payload_before: int) -> None:
    """The rows: old tool details reduced and marked, plans and the recent conversation untouched."""
    removed = Item.objects.filter(details_removed_at__isnull=False)
    assert set(removed.values_list("conversation_id", flat=True)) == {c.pk for c in old}
    assert removed.count() == 10  # 4 shell + 1 read_file in each old conversation
    for item in removed:
        assert "stdout" not in item.payload and "content" not in item.payload
        assert item.payload[MARKER_KEY]["removed_fields"]
        assert item.payload_skip == "already_removed" and item.removable_bytes == 0
    assert not Item.objects.filter(conversation=recent, details_removed_at__isnull=False).exists()
    assert not Item.objects.filter(tool_kind="plan", details_removed_at__isnull=False).exists()
    after = Item.objects.aggregate(total=Sum("payload_bytes"))["total"]
    assert payload_before - after == expected


@pytest.mark.parametrize("viewport", ["desktop", "phone", "small-phone"], ids=["1280", "390", "320"])
def test_analyze_choose_skip_save_run_reload_and_the_rows_are_reduced(data, live_server, open_page, viewport):
    old, recent = data
    page = open_page(viewport)
    open_card(page, live_server.url)
    check_layout(page, "card, never run")
    page.screenshot(path=f"{SHOTS}/cleanup-never-run-{page.viewport_size['width']}.png", full_page=True)
    # The planned period is 2 months; the draft analysis says what that would remove.
    expected = analyze_draft(page, old)
    check_layout(page, "analysis completed")
    page.screenshot(path=f"{SHOTS}/cleanup-analyzed-{page.viewport_size['width']}.png", full_page=True)

    turn_on_and_save(page, "Continue without backup")
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value, policy.backup_choice) == (True, 2, "skip")
    check_layout(page, "saved")

    payload_before = Item.objects.aggregate(total=Sum("payload_bytes"))["total"]
    run = page.get_by_role("button", name="Run cleanup now")
    expect(run).to_be_enabled()
    run.click()
    expect(page.get_by_test_id("run")).to_have_attribute("data-run", "running")
    expect(page.get_by_role("button", name="Cancel run")).to_be_visible()
    page.screenshot(path=f"{SHOTS}/cleanup-running-{page.viewport_size['width']}.png", full_page=True)
    drain()
    expect(page.get_by_test_id("run")).to_have_attribute("data-run", "succeeded", timeout=15_000)
    expect(page.get_by_test_id("last-run")).to_contain_text("Completed")

    page.reload()
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()
    expect(page.get_by_label("Number")).to_have_value("2")
    expect(page.get_by_test_id("last-run")).to_contain_text("removed from 10 messages")
    expect(page.get_by_test_id("history").locator('[data-kind="cleanup"][data-state="succeeded"]')).to_have_count(1)
    check_layout(page, "after the run")
    screenshot(page, "tool-cleanup-completed")
    page.screenshot(path=f"{SHOTS}/cleanup-completed-{page.viewport_size['width']}.png", full_page=True)
    check_removed(old, recent, expected, payload_before)


def test_create_backup_prepares_a_verified_backup_first_then_cleans_up(data, live_server, open_page):
    old, recent = data
    page = open_page("desktop")
    open_card(page, live_server.url)
    expected = removable(old)
    turn_on_and_save(page, "Create backup (recommended)")
    payload_before = Item.objects.aggregate(total=Sum("payload_bytes"))["total"]
    page.get_by_role("button", name="Run cleanup now").click()
    expect(page.get_by_test_id("run")).to_have_attribute("data-prep", "preparing")
    expect(page.get_by_role("button", name="Cancel preparation")).to_be_visible()
    page.screenshot(path=f"{SHOTS}/cleanup-preparing-1280.png", full_page=True)
    drain()
    expect(page.get_by_test_id("run")).to_have_attribute("data-run", "succeeded", timeout=15_000)
    backup = ToolPayloadOperation.objects.get(kind="backup")
    assert backup.state == "succeeded" and backup.backup_sha256
    backups = page.get_by_test_id("backups")
    expect(backups).to_contain_text(backup.backup_name)
    expect(backups).to_contain_text(backup.backup_sha256)
    expect(backups).to_contain_text("replaces the whole database")
    page.screenshot(path=f"{SHOTS}/cleanup-backup-done-1280.png", full_page=True)
    check_removed(old, recent, expected, payload_before)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_backup_changed_on_disk_is_flagged_in_its_own_row_and_fits(data, live_server, open_page, viewport):
    from retention.backups import create_backup, list_backups

    intact, changed = create_backup(), create_backup()
    with open(changed.path, "ab") as handle:  # one byte more than its receipt says
        handle.write(b"X")
    assert {r.name: r.changed for r in list_backups()} == {intact.name: False, changed.name: True}
    page = open_page(viewport)
    open_card(page, live_server.url)
    backups = page.get_by_test_id("backups")
    rows = backups.locator("li.backup")
    expect(rows).to_have_count(2)
    warning = rows.filter(has_text=changed.name).get_by_test_id("backup-changed")
    expect(warning).to_be_visible()
    expect(warning).to_contain_text("This file changed after it was made")
    expect(warning).to_contain_text("Do not restore it unless its SHA-256 checksum still matches")
    expect(rows.filter(has_text=intact.name).get_by_test_id("backup-changed")).to_have_count(0)
    warning.scroll_into_view_if_needed()
    check_layout(page, "a changed backup")
    # The warning stays inside its row and the screen, clear of the checksum above it.
    row_box, box = rows.filter(has_text=changed.name).bounding_box(), warning.bounding_box()
    assert row_box["x"] <= box["x"] and box["x"] + box["width"] <= row_box["x"] + row_box["width"]
    assert box["x"] + box["width"] <= page.viewport_size["width"]
    checksum = rows.filter(has_text=changed.name).locator(".hash").bounding_box()
    assert box["y"] >= checksum["y"] + checksum["height"]
    screenshot(page, "backup-changed")


def test_members_see_the_status_but_no_actions(data, live_server, open_page):
    page = open_page("small-phone")
    open_card(page, live_server.url, MEMBER)
    card = page.locator("#tool-card")
    expect(card).to_contain_text("only admins can analyze, change or run cleanup")
    for name in ("Analyze savings", "Run cleanup now", "Compact database"):
        expect(page.get_by_role("button", name=name)).to_have_count(0)
    expect(page.get_by_label("Automatic cleanup")).to_be_disabled()
    check_layout(page, "member view")
    page.screenshot(path=f"{SHOTS}/cleanup-member-320.png", full_page=True)


def test_a_failed_status_read_is_said_kept_apart_from_an_action_error_and_clears_itself(data, live_server, open_page):
    from django.contrib.auth import get_user_model

    from retention import service

    old, _recent = data
    service.start_analysis(user=get_user_model().objects.get(username=ADMIN[0]), age_value=3, age_unit="months")
    page = open_page("phone")
    open_card(page, live_server.url)
    analysis = page.get_by_test_id("analysis")
    expect(analysis).to_have_attribute("data-state", "running")
    note, errors = page.get_by_test_id("status-note"), page.get_by_test_id("action-error")
    status_url = f"{live_server.url}/settings/system/data-storage/status/"
    page.route(status_url, lambda route: route.fulfill(status=502, body="Bad gateway"))
    expect(note).to_contain_text("Current status unavailable", timeout=5_000)
    expect(analysis).to_have_attribute("data-state", "running")  # the last status read stays shown
    # An action meanwhile: refused (one operation at a time), its error in its own region.
    page.get_by_role("button", name="Analyze savings").click()
    expect(errors).to_contain_text("one operation runs at a time, so nothing new was started")
    page.wait_for_timeout(2_500)  # more failed reads: the action error stays
    expect(errors).to_contain_text("one operation runs at a time, so nothing new was started")
    expect(note).to_contain_text("Current status unavailable")
    page.screenshot(path=f"{SHOTS}/cleanup-status-unavailable-390.png", full_page=False)
    page.unroute(status_url)
    drain()
    expect(analysis).to_have_attribute("data-state", "completed", timeout=10_000)
    expect(note).to_have_text("")
    expect(errors).to_contain_text("one operation runs at a time, so nothing new was started")  # only an action clears it
    expect(page.get_by_test_id("estimate-bytes")).to_have_attribute("data-bytes", str(removable(old)))
    check_layout(page, "after the status came back")


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_the_card_in_spanish_fits_and_says_everything_in_spanish(data, live_server, open_page, viewport):
    from django.contrib.auth import get_user_model

    from retention import service

    admin = get_user_model().objects.get(username=ADMIN[0])
    service.save_policy(user=admin, enabled=True, age_value=3, age_unit="months", revision=1, backup_choice="skip")
    service.start_run(user=admin, revision=ToolPayloadPolicy.load().revision)
    page = open_page(viewport)
    open_card(page, live_server.url)
    footer = page.locator(".page-foot select[name=language]")
    (page.locator(".sidenav select[name=language]") if viewport == "desktop" else footer).select_option("es")
    expect(page.locator("html")).to_have_attribute("lang", "es")
    page.goto(f"{live_server.url}/settings/system/data-storage/")
    card = page.locator("#tool-card")
    expect(card.get_by_role("heading", level=2)).to_have_text("Limpieza de datos de herramientas")
    expect(card).to_contain_text("Limpieza en cola:")
    expect(page.get_by_role("button", name="Cancelar ejecución")).to_be_visible()
    drain()
    expect(page.get_by_test_id("last-run")).to_contain_text("Completada", timeout=15_000)
    expect(page.get_by_role("button", name="Limpiar ahora")).to_be_enabled()
    check_layout(page, "card in Spanish")
    page.screenshot(path=f"{SHOTS}/cleanup-es-{page.viewport_size['width']}.png", full_page=True)


def test_the_card_works_from_the_keyboard_and_keeps_the_place_across_status_reads(data, live_server, open_page):
    old, _recent = data
    page = open_page("desktop")
    open_card(page, live_server.url)
    page.get_by_label("Number").focus()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    page.keyboard.press("Tab")  # the unit
    expect(page.get_by_label("Unit")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Analyze savings")).to_be_focused()
    page.keyboard.press("Enter")
    analysis = page.get_by_test_id("analysis")
    expect(analysis).to_have_attribute("data-state", "running")
    expect(page.get_by_role("button", name="Analyze savings")).to_be_focused()  # the press kept its place
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Cancel analysis")).to_be_focused()
    page.wait_for_timeout(2_500)  # status reads meanwhile change nothing: the focus stays
    expect(page.get_by_role("button", name="Cancel analysis")).to_be_focused()
    drain()
    expect(analysis).to_have_attribute("data-state", "completed", timeout=10_000)
    expect(analysis).to_be_focused()  # its Cancel button went with the run: the focus moves to the result
    expect(page.locator("#cleanup-live")).to_contain_text("Estimated payload savings")
    page.keyboard.press("Tab")
    expect(page.locator("#analysis-details-summary")).to_be_focused()
    page.keyboard.press("Enter")
    expect(page.locator("#analysis-details")).to_have_attribute("open", "")
    expect(page.locator("#analysis-details")).to_contain_text(f"{removable(old):,}")  # grouped as English writes it


def test_the_page_asks_for_the_choice_when_a_change_of_unit_can_shorten_the_period(data, live_server, open_page):
    """r34: the page counted a month as 30.44 days, the service by the calendar: from 13 weeks
    to 3 months (89 to 92 days) the page hid the choice, and the save was refused for want of
    it. Both now count a period shorter on some day as shorter."""
    policy = ToolPayloadPolicy.load()
    ToolPayloadPolicy.objects.filter(pk=policy.pk).update(enabled=True, age_value=13, age_unit="weeks",
                                                          backup_choice="skip", preparation_state="ready")
    page = open_page("desktop")
    open_card(page, live_server.url)
    choices = page.locator("#backup-choice")
    expect(choices).to_be_hidden()
    page.get_by_label("Unit").select_option("months")
    page.get_by_label("Number").fill("3")
    expect(choices).to_be_visible()  # 3 months are 89 days from 1 May
    page.get_by_label("Number").fill("4")
    expect(choices).to_be_hidden()  # never fewer than 120
    page.get_by_label("Number").fill("3")
    page.get_by_label("Continue without backup").check()
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    saved = ToolPayloadPolicy.load()
    assert (saved.age_value, saved.age_unit, saved.backup_choice) == (3, "months", "skip")
    # Back to weeks: 13 weeks may be shorter than 3 months (91 against 92 days), 14 never
    page.get_by_label("Unit").select_option("weeks")
    page.get_by_label("Number").fill("13")
    expect(choices).to_be_visible()
    page.get_by_label("Number").fill("14")
    expect(choices).to_be_hidden()


def test_the_backup_choice_is_asked_afresh_and_the_form_follows_a_cancelled_preparation(data, live_server, open_page):
    page = open_page("desktop")
    open_card(page, live_server.url)
    choices = page.locator("#backup-choice")
    turn_on_and_save(page, "Create backup (recommended)")
    page.reload()
    page.wait_for_load_state("load")
    # Shortening the period asks again, with nothing chosen: the last save's choice is not a decision
    page.get_by_label("Number").fill("2")
    expect(choices).to_be_visible()
    for label in ("Create backup (recommended)", "Continue without backup"):
        expect(page.get_by_label(label)).not_to_be_checked()
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.locator("#backup-choice-error")).to_be_visible()
    expect(page.get_by_label("Create backup (recommended)")).to_be_focused()  # taken to what needs fixing
    assert ToolPayloadPolicy.load().age_value == 3
    # Discard puts the period back, and with it hides the choice again
    page.locator("#save-bar").get_by_role("button", name="Discard").click()
    expect(page.get_by_label("Number")).to_have_value("3")
    expect(choices).to_be_hidden()

    # A preparation cancelled, then Cancel: cleanup is off, and the form says so at once
    page.get_by_role("button", name="Run cleanup now").click()
    expect(page.get_by_role("button", name="Cancel preparation")).to_be_visible()
    with page.expect_response(lambda r: r.url.endswith("/tool-payload-cleanup/cancel/")
                              and r.request.method == "POST"):
        page.get_by_role("button", name="Cancel preparation").click()  # the server has it before the backup runs
    # Acknowledged at once, while no worker has taken the backup yet: no second Cancel to press
    expect(page.get_by_test_id("cancel-requested")).to_have_text(
        "Cancel requested: the backup stops at its next check.")
    expect(page.get_by_role("button", name="Cancel preparation")).to_have_count(0)
    expect(page.locator("#tool-run")).to_be_focused()  # the button it had went: the focus stays in its region
    drain()
    expect(page.get_by_test_id("preparation")).to_contain_text("Backup preparation cancelled.", timeout=15_000)
    page.locator("#cancel-backup").focus()
    page.keyboard.press("Enter")  # as a keyboard user: the focus stays in the card it replaced
    expect(page.get_by_test_id("next-check")).to_have_text("Disabled")
    page.wait_for_function("document.activeElement !== document.body"
                           " && document.getElementById('tool-card').contains(document.activeElement)", timeout=5_000)
    expect(page.get_by_label("Automatic cleanup")).not_to_be_checked()
    expect(page.locator("#save-bar")).to_be_hidden()
    policy = ToolPayloadPolicy.load()
    assert not policy.enabled
    # and its next save goes with the new revision
    page.get_by_label("Number").fill("5")
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    saved = ToolPayloadPolicy.load()
    assert (saved.enabled, saved.age_value, saved.revision) == (False, 5, policy.revision + 1)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_a_daily_check_past_its_time_is_shown_due(data, live_server, open_page, viewport):
    """The job cluster stopped: the card says the check is due, not a past time to come."""
    from django.contrib.auth import get_user_model
    from django_q.models import Schedule

    from retention import service

    admin = get_user_model().objects.get(username=ADMIN[0])
    service.save_policy(user=admin, enabled=True, age_value=3, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="skip")
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=timezone.now() - timedelta(hours=3))
    page = open_page(viewport)
    open_card(page, live_server.url)
    expect(page.get_by_test_id("next-check")).to_contain_text("Due since ")
    expect(page.get_by_test_id("next-check")).to_contain_text("it runs when the job cluster next runs")
    check_layout(page, f"next check due {viewport}")
    screenshot(page, f"tool-cleanup-check-due-{viewport}")


def test_another_admins_save_is_followed_by_a_form_left_alone_and_kept_in_one_being_edited(
        data, live_server, open_page):
    """Two admins: while this page polls (an analysis runs), another admin turns cleanup on for
    2 months. The form, untouched here, follows (its switch said off beside a status that said
    on, and its revision made Run and Save stale). Then, with a draft typed here, another save
    leaves the draft as typed, and its save is refused as stale."""
    from django.contrib.auth import get_user_model

    from retention import service

    other = get_user_model().objects.create_user("admin-two", password="pw-two-12345", is_staff=True)
    page = open_page("small-phone")
    open_card(page, live_server.url)
    page.get_by_role("button", name="Analyze savings").click()
    expect(page.get_by_test_id("analysis")).to_have_attribute("data-state", "running")  # polling each second
    service.save_policy(user=other, enabled=True, age_value=2, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="skip")
    expect(page.get_by_label("Automatic cleanup")).to_be_checked(timeout=10_000)
    expect(page.get_by_label("Number")).to_have_value("2")
    expect(page.locator("#save-bar")).to_be_hidden()  # nothing of this person's to save
    expect(page.locator("#id_tool_revision")).to_have_value(str(ToolPayloadPolicy.load().revision))
    # A draft typed here stays as typed when the other admin saves again
    page.get_by_label("Number").fill("7")
    expect(page.locator("#save-bar")).to_be_visible()
    service.save_policy(user=other, enabled=False, age_value=2, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice=None)
    page.wait_for_timeout(2_500)  # status reads come and go
    expect(page.get_by_label("Number")).to_have_value("7")
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()
    page.locator("#save-bar").get_by_role("button", name="Save").click()
    expect(page.locator("#tool-card")).to_contain_text("Someone else saved these settings meanwhile.")
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value) == (False, 2)  # the other admin's save stands
    drain()
    check_layout(page, "after the other admin's saves")


_RECORD_SAID = """
() => {
  window.__said = [];
  const live = document.getElementById("cleanup-live");
  new MutationObserver(() => {
    const text = live.textContent.trim();
    if (text) window.__said.push(text);
  }).observe(live, { childList: true, characterData: true, subtree: true });
}
"""


def wait_said(page: Page, text: str) -> None:
    """The live region was given words containing text (it clears itself after a while)."""
    try:
        page.wait_for_function("(t) => window.__said.some((s) => s.includes(t))", arg=text, timeout=15_000)
    except Exception:
        raise AssertionError(f"never said {text!r}; said: {page.evaluate('window.__said')}") from None


def test_each_run_and_compaction_state_is_said_in_the_live_region(data, live_server, open_page):
    from django.contrib.auth import get_user_model

    from retention import service

    admin = get_user_model().objects.get(username=ADMIN[0])
    service.save_policy(user=admin, enabled=True, age_value=3, age_unit="months", revision=1, backup_choice="skip")
    page = open_page("phone")
    open_card(page, live_server.url)
    page.evaluate(_RECORD_SAID)

    page.get_by_role("button", name="Run cleanup now").click()
    wait_said(page, "Cleanup queued:")
    drain()
    run = ToolPayloadOperation.objects.get(kind="cleanup")
    assert (run.state, run.removed_messages) == ("succeeded", 10)
    wait_said(page, "Last cleanup: Completed. ")
    wait_said(page, "removed from 10 messages")
    assert not any("Runs under the saved policy" in s for s in page.evaluate("window.__said"))

    page.get_by_role("button", name="Compact database").click()
    wait_said(page, "Compaction queued:")
    drain()
    compact = ToolPayloadOperation.objects.get(kind="compact")
    assert compact.state == "succeeded" and compact.after_bytes is not None
    wait_said(page, "its size on disk went from")


def failed_backup(live_server, open_page, settings, tmp_path, viewport: str | dict = "phone") -> Page:
    """The card on a phone after Run cleanup now's backup failed (its folder is a file), with
    what the live region says recorded from the start."""
    from django.contrib.auth import get_user_model

    from retention import service

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the backups folder should be")
    settings.LETHE_BACKUP_DIR = blocked
    admin = get_user_model().objects.get(username=ADMIN[0])
    service.save_policy(user=admin, enabled=True, age_value=3, age_unit="months", revision=1, backup_choice="create")
    page = open_page(viewport)
    open_card(page, live_server.url)
    page.evaluate(_RECORD_SAID)
    page.get_by_role("button", name="Run cleanup now").click()
    wait_said(page, "Preparing backup:")
    drain()
    wait_said(page, "Backup failed:")
    return page


def test_an_answer_that_replaces_its_own_button_is_swapped_in_once(data, live_server, open_page, settings, tmp_path):
    """Cancel after a failed backup sits in a region its answer replaces: the answer's regions
    come in once and the focus moves once (r136: swapped in a second time by the handler for
    buttons that left the page before their answer, the confirmation heard twice)."""
    page = failed_backup(live_server, open_page, settings, tmp_path, "desktop")
    page.evaluate("""() => {
      window.swapped = []; window.focused = [];
      document.addEventListener('htmx:oobBeforeSwap', (e) => window.swapped.push(e.detail.target.id));
      document.addEventListener('focusin', (e) => window.focused.push(e.target.id || e.target.tagName));
    }""")
    page.get_by_role("button", name="Cancel", exact=True).focus()
    page.keyboard.press("Enter")
    expect(page.get_by_test_id("preparation-cancelled")).to_be_focused()
    page.wait_for_timeout(500)  # time for a second swap, were there one
    swapped = page.evaluate("window.swapped")
    # (the card's own regions come in with it as well: once each with the answer's)
    assert [swapped.count(region) for region in ("tool-card", "db-compact", "cleanup-history")] == [1, 1, 1], swapped
    assert page.evaluate("window.focused").count("preparation-cancelled") == 1


def test_a_failed_backup_and_its_cancel_are_said_and_the_cancel_is_shown(data, live_server, open_page, settings, tmp_path):
    page = failed_backup(live_server, open_page, settings, tmp_path)
    page.get_by_role("button", name="Cancel", exact=True).click()

    done = "Backup preparation cancelled: automatic cleanup is off and nothing was removed."
    expect(page.get_by_test_id("preparation-cancelled")).to_have_text(done)
    expect(page.get_by_test_id("preparation-cancelled")).to_be_in_viewport()
    expect(page.get_by_test_id("preparation-cancelled")).to_be_focused()  # the outcome, where the card starts again
    # Said once: by the focus on it, not by the live region as well (r19: heard twice)
    assert not any(done in said for said in page.evaluate("window.__said"))
    assert not ToolPayloadPolicy.load().enabled
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()


def test_a_retried_backup_that_fails_again_gives_the_focus_back_to_retry_and_is_said_once(data, live_server, open_page, settings, tmp_path):
    page = failed_backup(live_server, open_page, settings, tmp_path)

    page.evaluate("window.__said = []")
    retry = page.get_by_role("button", name="Retry backup")
    retry.focus()
    page.keyboard.press("Enter")
    wait_said(page, "Preparing backup:")
    expect(page.get_by_test_id("run")).to_be_focused()  # the button gave way to the progress
    drain()
    wait_said(page, "Backup failed:")
    # Back on the button pressed (r19: the focus landed on the whole region, which was read out
    # with the failure while the live region said it too).
    expect(page.get_by_role("button", name="Retry backup")).to_be_focused()
    page.wait_for_timeout(300)
    assert sum("Backup failed:" in said for said in page.evaluate("window.__said")) == 1
    assert sorted(ToolPayloadOperation.objects.filter(kind="backup").values_list("state", flat=True)) == ["failed", "failed"]
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()


# A phone with its on-screen keyboard open: little height, the top bar and the bottom bar.
SHORT_PHONES = [{"width": 390, "height": 300}, {"width": 320, "height": 300}]


@pytest.mark.parametrize("viewport", SHORT_PHONES, ids=["390x300", "320x300"])
def test_a_retried_backup_that_fails_again_on_a_short_phone_leaves_retry_in_view(
        data, live_server, open_page, settings, tmp_path, viewport):
    page = failed_backup(live_server, open_page, settings, tmp_path, viewport)

    page.evaluate("window.__said = []")
    page.get_by_role("button", name="Retry backup").focus()
    page.keyboard.press("Enter")
    wait_said(page, "Preparing backup:")
    drain()
    wait_said(page, "Backup failed:")
    retry = page.get_by_role("button", name="Retry backup")
    expect(retry).to_be_focused()
    page.wait_for_timeout(300)
    # r105: the status read swapped the region that had the focus, the page's scroll anchoring
    # moved it, and the focus went back to Retry without a scroll: the button was 265 px above
    # the top of the screen. It is between the sticky top bar and the fixed bottom bar.
    assert_focus_between_bars(page)
    assert sorted(ToolPayloadOperation.objects.filter(kind="backup").values_list("state", flat=True)) == ["failed", "failed"]


@pytest.mark.parametrize("viewport", ["phone", "small-phone"], ids=["390", "320"])
def test_a_compact_database_error_is_shown_beside_its_button(data, live_server, open_page, viewport):
    page = open_page(viewport)
    open_card(page, live_server.url)
    button = page.get_by_role("button", name="Compact database")

    # The request lost before it reached Lethe: the status read again says it did not go
    # through (e2e/test_lost_answers.py), beside the button, not in the cleanup card.
    page.route("**/data-storage/compact/", lambda route: route.abort())
    button.click()
    error = page.get_by_test_id("compact-error")
    expect(error).to_have_text("The answer from Lethe did not arrive, and the status read again shows that your "
                               "request did not go through. Press the button again if you still want it.")
    expect(error).to_be_in_viewport()
    expect(button).to_be_in_viewport()
    expect(page.get_by_test_id("action-error")).to_have_text("")
    assert not ToolPayloadOperation.objects.filter(kind="compact").exists()

    # Refused by the service (another operation holds the slot): its reason, in the same place.
    page.unroute("**/data-storage/compact/")
    page.get_by_label("Number").fill("2")
    page.get_by_role("button", name="Analyze savings").click()
    expect(page.get_by_test_id("analysis")).to_have_attribute("data-state", "running")
    button.scroll_into_view_if_needed()
    expect(button).to_be_disabled()
    # pressed before the status read: enabled and pressed in one step (a status read in between
    # would swap the button back in disabled, r61)
    page.evaluate("(() => { const b = document.getElementById('compact-now'); b.disabled = false; b.click(); })()")
    expect(error).to_contain_text("one operation runs at a time, so nothing new was started")
    expect(error).to_be_in_viewport()
    expect(page.get_by_test_id("action-error")).to_have_text("")
    assert not ToolPayloadOperation.objects.filter(kind="compact").exists()


def test_the_status_note_is_said_once_however_often_the_status_is_read(data, live_server, open_page):
    """r147: the note was swapped in again at every status read (every second while something is
    queued), so a screen reader said "the job cluster seems to be stopped" eleven times in twelve
    seconds, and a failed read's "Current status unavailable" each second too."""
    from django.contrib.auth import get_user_model

    from retention import service

    service.start_analysis(user=get_user_model().objects.get(username=ADMIN[0]), age_value=3, age_unit="months")
    page = open_page("desktop")
    open_card(page, live_server.url)
    note = page.get_by_test_id("status-note")
    expect(note).to_contain_text("the job cluster seems to be stopped")  # no cluster runs in these tests
    page.evaluate("""() => {
        window.__noteChanges = 0;
        new MutationObserver(() => { window.__noteChanges += 1; })
            .observe(document.getElementById('tool-status-note'), {childList: true, subtree: true, characterData: true});
        window.__reads = 0;
        document.body.addEventListener('htmx:beforeRequest', (e) => { if (e.detail.elt.id === 'tool-poll') window.__reads += 1; });
    }""")
    page.wait_for_function("() => window.__reads >= 5", timeout=15_000)  # reads every second while queued
    assert page.evaluate("window.__noteChanges") == 0
    status_url = f"{live_server.url}/settings/system/data-storage/status/"
    page.route(status_url, lambda route: route.abort())
    expect(note).to_contain_text("Current status unavailable", timeout=5_000)
    changed = page.evaluate("window.__noteChanges")
    page.wait_for_timeout(3_500)  # three more failed reads
    assert page.evaluate("window.__noteChanges") == changed
    page.unroute(status_url)
    expect(note).to_contain_text("the job cluster seems to be stopped", timeout=5_000)
    drain()
    expect(note).to_have_text("", timeout=10_000)


@pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])
def test_escape_on_a_backup_choice_the_discard_hides_gives_the_focus_to_the_card(data, live_server, open_page,
                                                                                 viewport):
    """r147: Escape on a backup-choice radio discarded the change and hid the choice under the
    focus, which fell to the page."""
    page = open_page(viewport)
    open_card(page, live_server.url)
    page.get_by_label("Automatic cleanup").focus()
    page.keyboard.press("Space")
    choice = page.get_by_label("Create backup (recommended)")
    expect(choice).to_be_visible()
    choice.focus()
    page.keyboard.press("Space")
    page.keyboard.press("Escape")
    expect(choice).to_be_hidden()
    expect(page.get_by_label("Automatic cleanup")).not_to_be_checked()
    page.wait_for_function("() => document.activeElement && document.activeElement.id === 'tool-card'",
                           timeout=5_000)
    assert_focus_between_bars(page)
