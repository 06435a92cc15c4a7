"""Data & storage when Lethe's answer to a save or an action is lost on the way (r122): the
request reached Lethe, which did what it asked, and the page got a network failure (or a
proxy's error page) instead of the answer. The page cannot know from that what happened, so it
reads the saved settings or the status again and says what it finds, never "nothing was saved".

The lost answer: Playwright's route sends the request on to Lethe (route.fetch) and then fails
it for the page (route.abort), as a proxy that read Lethe's whole answer and then closed the
browser's connection would; or, for a request that never reached Lethe, only route.abort.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import Page, Route, expect

from e2e.conftest import ADMIN, VIEWPORTS
from e2e.helpers import check_layout, log_in, open_nav
from lifecycle.models import RetainedFactsPolicy
from retention import jobs, service
from retention.models import ToolPayloadOperation, ToolPayloadPolicy

pytestmark = pytest.mark.django_db(transaction=True)

NARROW_AND_WIDE = pytest.mark.parametrize("viewport", ["desktop", "small-phone"],
                                          ids=lambda v: str(VIEWPORTS[v]["width"]))
DATA_STORAGE = "**/settings/system/data-storage/"
TOOL_SAVE = "**/settings/system/data-storage/tool-payload-cleanup/"
FACTS_SAVE = "**/settings/system/data-storage/retained-facts/"

SAVED = "The answer from Lethe did not arrive, but the saved settings read again are your changes: they were saved."
NOT_SAVED = ("The answer from Lethe did not arrive, and the saved settings read again are not your changes: they "
             "were not saved. They are still here; press Save again.")
UNKNOWN = ("The answer from Lethe did not arrive and the saved settings cannot be read now, so this page cannot tell "
           "whether your changes were saved. They are still here; press Save again once Lethe can be reached: it "
           "first checks whether they were.")
WENT_THROUGH = "The answer from Lethe did not arrive, but the status read again shows that your request went through."
DID_NOT = ("The answer from Lethe did not arrive, and the status read again shows that your request did not go "
           "through. Press the button again if you still want it.")


def lose_answers(page: Page, pattern: str, *, reach_lethe: bool = True) -> list[str]:
    """Each POST to `pattern` reaches Lethe (unless not `reach_lethe`) and its answer is lost;
    other requests go on. Returns the methods of the requests lost, in order."""
    lost = []

    def handle(route: Route) -> None:
        if route.request.method != "POST":
            route.continue_()
            return
        lost.append(route.request.method)
        if reach_lethe:
            route.fetch(max_redirects=0)  # Lethe does it and answers; the answer goes no further
        route.abort()

    page.route(pattern, handle)
    return lost


def open_data_storage(page: Page, base: str) -> None:
    log_in(page, base, *ADMIN)
    open_nav(page, "Data & storage")
    expect(page.locator("#tool-card")).to_be_visible()
    page.wait_for_load_state("load")  # the page's script (the save bar) is in place


def draft_weekly_cleanup(page: Page) -> None:
    """The review's draft: a period of 1 week, Automatic cleanup on, Continue without backup."""
    page.get_by_label("Number").fill("1")
    page.get_by_label("Unit").select_option("weeks")
    page.get_by_label("Automatic cleanup").check()
    page.get_by_label("Continue without backup").check()


def save(page: Page) -> None:
    page.locator("#save-bar").get_by_role("button", name="Save").click()


@NARROW_AND_WIDE
def test_a_save_whose_answer_was_lost_after_lethe_saved_it_shows_it_saved(seeded, live_server, open_page, viewport):
    before = ToolPayloadPolicy.load()
    assert not before.enabled
    page = open_page(viewport)
    open_data_storage(page, live_server.url)
    expect(page.get_by_test_id("next-check")).to_have_text("Disabled")
    lost = lose_answers(page, TOOL_SAVE)

    draft_weekly_cleanup(page)
    save(page)

    # Read again: saved. The card shows it saved (what runs next included), the bar is gone.
    confirmation = page.get_by_test_id("lost-saved")
    expect(confirmation).to_have_text(SAVED)
    expect(page.locator("#save-bar")).to_be_hidden()
    expect(page.get_by_test_id("next-check")).not_to_have_text("Disabled")
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()
    expect(page.get_by_label("Number")).to_have_value("1")
    expect(page.get_by_text("nothing was saved")).to_have_count(0)
    expect(confirmation).to_be_in_viewport()
    check_layout(page, "a lost save read again: saved")
    stored = ToolPayloadPolicy.load()
    assert lost == ["POST"]
    assert (stored.enabled, stored.age_value, stored.age_unit, stored.backup_choice) == (True, 1, "weeks", "skip")
    assert stored.revision == before.revision + 1

    # The card holds the saved revision: the next change saves, not refused as someone else's.
    page.unroute(TOOL_SAVE)
    page.get_by_label("Number").fill("2")
    save(page)
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    stored = ToolPayloadPolicy.load()
    assert (stored.enabled, stored.age_value, stored.revision) == (True, 2, before.revision + 2)


@NARROW_AND_WIDE
def test_a_save_whose_answer_was_lost_before_lethe_got_it_keeps_the_draft_and_says_not_saved(
        seeded, live_server, open_page, viewport):
    before = ToolPayloadPolicy.load()
    page = open_page(viewport)
    open_data_storage(page, live_server.url)
    lost = lose_answers(page, TOOL_SAVE, reach_lethe=False)

    draft_weekly_cleanup(page)
    save(page)

    bar = page.locator("#save-bar")
    expect(bar.locator(".save-bar-status")).to_have_text(NOT_SAVED)
    expect(page.locator("#save-bar-live")).to_have_text(NOT_SAVED)
    expect(bar.locator(".save-bar-which")).to_have_text("Tool payload cleanup")
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()  # the draft stays
    expect(page.get_by_label("Number")).to_have_value("1")
    expect(page.get_by_test_id("next-check")).to_have_text("Disabled")
    check_layout(page, "a lost save read again: not saved")
    stored = ToolPayloadPolicy.load()
    assert lost == ["POST"]
    assert (stored.enabled, stored.revision) == (False, before.revision)

    # Save again, with Lethe's answers reaching the page: saved.
    page.unroute(TOOL_SAVE)
    save(page)
    expect(page.get_by_role("status").filter(has_text="Cleanup policy saved.")).to_be_visible()
    expect(bar).to_be_hidden()
    stored = ToolPayloadPolicy.load()
    assert (stored.enabled, stored.age_value, stored.age_unit, stored.revision) == (True, 1, "weeks", before.revision + 1)


def test_a_proxy_error_page_after_lethe_saved_is_read_again_as_saved(seeded, live_server, open_page):
    """A reverse proxy's 504 after Lethe committed: not Lethe's answer, so not taken as a refusal
    or as "nothing was saved"."""
    before = RetainedFactsPolicy.load()
    page = open_page("desktop")
    open_data_storage(page, live_server.url)

    def gateway_timeout(route: Route) -> None:
        route.fetch(max_redirects=0)
        route.fulfill(status=504, content_type="text/html", body="<html><body><h1>504 Gateway Time-out</h1></body></html>")

    page.route(FACTS_SAVE, gateway_timeout)
    page.get_by_label("Audit facts, days").fill(str(before.audit_days + 1))
    save(page)
    expect(page.get_by_test_id("lost-saved")).to_have_text(SAVED)
    expect(page.locator("#save-bar")).to_be_hidden()
    expect(page.get_by_label("Audit facts, days")).to_have_value(str(before.audit_days + 1))
    stored = RetainedFactsPolicy.load()
    assert (stored.audit_days, stored.revision) == (before.audit_days + 1, before.revision + 1)


@NARROW_AND_WIDE
def test_a_lost_save_that_cannot_be_read_again_says_so_and_the_next_save_checks_first(
        seeded, live_server, open_page, viewport):
    before = ToolPayloadPolicy.load()
    page = open_page(viewport)
    open_data_storage(page, live_server.url)
    lost = lose_answers(page, TOOL_SAVE)
    page.route(DATA_STORAGE, lambda route: route.abort())  # the page cannot be read again either
    posts = []
    page.on("request", lambda request: posts.append(request.url) if request.method == "POST" else None)

    draft_weekly_cleanup(page)
    save(page)

    bar = page.locator("#save-bar")
    expect(bar.locator(".save-bar-status")).to_have_text(UNKNOWN)
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()
    check_layout(page, "a lost save that cannot be read again")
    stored = ToolPayloadPolicy.load()
    assert (stored.enabled, stored.revision) == (True, before.revision + 1)  # Lethe saved it

    # Lethe can be reached again: Save reads first, finds the changes saved, sends nothing more.
    page.unroute(DATA_STORAGE)
    page.unroute(TOOL_SAVE)
    save(page)
    expect(page.get_by_test_id("lost-saved")).to_have_text(SAVED)
    expect(bar).to_be_hidden()
    expect(page.get_by_test_id("next-check")).not_to_have_text("Disabled")
    assert lost == ["POST"] and len(posts) == 1
    stored = ToolPayloadPolicy.load()
    assert (stored.enabled, stored.age_value, stored.revision) == (True, 1, before.revision + 1)


def test_discard_after_a_lost_save_that_could_not_be_read_shows_what_is_saved(seeded, live_server, open_page):
    """Discard goes back to what is saved: after a save that may have gone through, that is
    what the page reads again, not what the card held before the save."""
    page = open_page("desktop")
    open_data_storage(page, live_server.url)
    lose_answers(page, TOOL_SAVE)
    page.route(DATA_STORAGE, lambda route: route.abort())
    draft_weekly_cleanup(page)
    save(page)
    expect(page.locator("#save-bar .save-bar-status")).to_have_text(UNKNOWN)

    page.unroute(DATA_STORAGE)
    page.locator("#save-bar").get_by_role("button", name="Discard").click()
    expect(page.get_by_label("Automatic cleanup")).to_be_checked()  # Lethe saved it
    expect(page.get_by_label("Number")).to_have_value("1")
    expect(page.get_by_test_id("next-check")).not_to_have_text("Disabled")
    expect(page.locator("#save-bar")).to_be_hidden()
    assert ToolPayloadPolicy.load().enabled


def test_a_lost_save_on_a_phone_with_the_keyboard_open_says_so_in_spanish(seeded, live_server, open_page):
    size = {"width": 320, "height": 300}
    page = open_page(size)
    log_in(page, live_server.url, *ADMIN)
    page.context.add_cookies([{"name": "django_language", "value": "es", "url": live_server.url}])
    page.goto(f"{live_server.url}/settings/system/data-storage/")
    expect(page.locator("html")).to_have_attribute("lang", "es")
    page.wait_for_load_state("load")
    lose_answers(page, FACTS_SAVE, reach_lethe=False)
    before = RetainedFactsPolicy.load()

    audit = page.locator("#id_audit_days")
    audit.fill(str(before.audit_days + 1))
    audit.press("Enter")
    bar = page.locator("#save-bar")
    expect(bar.locator(".save-bar-status")).to_have_text(
        "La respuesta de Lethe no llegó, y los ajustes guardados, leídos de nuevo, no son sus cambios: no se "
        "guardaron. Siguen aquí; vuelva a pulsar Guardar.")
    expect(bar.locator(".save-bar-short")).to_have_text("Sin respuesta: los cambios no se guardaron.")
    expect(bar.locator(".save-bar-short")).to_be_visible()
    assert bar.bounding_box()["height"] <= 0.45 * size["height"], bar.bounding_box()
    expect(audit).to_have_value(str(before.audit_days + 1))
    assert RetainedFactsPolicy.load().revision == before.revision

    # An action lost before Lethe got it, in Spanish beside its button.
    lose_answers(page, "**/data-storage/compact/", reach_lethe=False)
    page.get_by_role("button", name="Compactar la base de datos").click()
    expect(page.get_by_test_id("compact-error")).to_have_text(
        "La respuesta de Lethe no llegó, y el estado, leído de nuevo, muestra que su solicitud no se llevó a cabo. "
        "Vuelva a pulsar el botón si aún la quiere.")
    check_layout(page, "lost answers in Spanish at 320x300")


def enabled_policy() -> ToolPayloadPolicy:
    admin = get_user_model().objects.get(username=ADMIN[0])
    policy = ToolPayloadPolicy.load()
    service.save_policy(user=admin, enabled=True, age_value=1, age_unit="weeks", revision=policy.revision,
                        backup_choice="skip")
    return ToolPayloadPolicy.load()


@NARROW_AND_WIDE
def test_run_cancel_and_compact_whose_answers_were_lost_say_they_went_through(
        seeded, live_server, open_page, viewport):
    enabled_policy()
    page = open_page(viewport)
    open_data_storage(page, live_server.url)
    error = page.get_by_test_id("action-error")

    # Run cleanup now: queued by Lethe, its answer lost.
    lost = lose_answers(page, "**/tool-payload-cleanup/run/")
    page.get_by_role("button", name="Run cleanup now").click()
    expect(error).to_have_text(WENT_THROUGH)
    expect(page.get_by_test_id("run")).to_have_attribute("data-run", "running")
    expect(page.get_by_text("nothing was started")).to_have_count(0)
    check_layout(page, "a lost run read again: went through")
    run = ToolPayloadOperation.objects.get(kind="cleanup")
    assert lost == ["POST"] and run.state == "queued"

    # Cancel run: asked, its answer lost.
    lost = lose_answers(page, "**/tool-payload-cleanup/cancel/")
    page.get_by_role("button", name="Cancel run").click()
    expect(error).to_have_text(WENT_THROUGH)
    expect(page.get_by_test_id("run").get_by_test_id("cancel-requested")).to_be_visible()
    run.refresh_from_db()
    assert lost == ["POST"] and run.cancel_requested
    jobs.run_operation(run.pk)
    expect(page.get_by_test_id("run")).to_have_attribute("data-run", "cancelled", timeout=15_000)

    # Compact database: queued, its answer lost; said beside its own button.
    lost = lose_answers(page, "**/data-storage/compact/")
    page.get_by_role("button", name="Compact database").click()
    compact_error = page.get_by_test_id("compact-error")
    expect(compact_error).to_have_text(WENT_THROUGH)
    expect(compact_error).to_be_in_viewport()
    expect(page.get_by_test_id("compact-state")).to_have_attribute("data-state", "queued")
    assert lost == ["POST"]
    assert ToolPayloadOperation.objects.get(kind="compact").state == "queued"


def test_an_action_lost_before_lethe_got_it_says_it_did_not_go_through(seeded, live_server, open_page):
    enabled_policy()
    page = open_page("small-phone")
    open_data_storage(page, live_server.url)
    lost = lose_answers(page, "**/tool-payload-cleanup/run/", reach_lethe=False)
    page.get_by_role("button", name="Run cleanup now").click()
    expect(page.get_by_test_id("action-error")).to_have_text(DID_NOT)
    expect(page.get_by_role("button", name="Run cleanup now")).to_be_enabled()
    assert lost == ["POST"] and not ToolPayloadOperation.objects.exists()


def test_an_action_whose_status_cannot_be_read_says_it_cannot_tell_until_it_can(seeded, live_server, open_page):
    enabled_policy()
    page = open_page("desktop")
    open_data_storage(page, live_server.url)
    lose_answers(page, "**/data-storage/compact/")
    page.route("**/data-storage/status/", lambda route: route.abort())
    page.get_by_role("button", name="Compact database").click()
    expect(page.get_by_test_id("compact-error")).to_have_text(
        "The answer from Lethe did not arrive and the status cannot be read now, so this page cannot tell yet "
        "whether your request went through. It says so here once it can read the status again.")
    assert ToolPayloadOperation.objects.get(kind="compact").state == "queued"
    # The status can be read again: the page reads it by itself and says what it finds.
    page.unroute("**/data-storage/status/")
    expect(page.get_by_test_id("compact-error")).to_have_text(WENT_THROUGH, timeout=15_000)
    expect(page.get_by_test_id("compact-state")).to_have_attribute("data-state", "queued")
