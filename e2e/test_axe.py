"""axe-core on every page (each list tab, and every error page), at 1280, 390 and 320 px, in light and dark: no serious or
critical violations. One test per page; each signs in once and then runs axe at every size
and colour scheme in the same tab."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe
from django.contrib.auth import get_user_model
from django.template.loader import render_to_string
from django.test import RequestFactory
from playwright.sync_api import Page, expect

from e2e.conftest import ADMIN, MEMBER, VIEWPORTS
from e2e.helpers import conversation_with_long_output, log_in, open_from_list, open_nav
from lifecycle.views import VIEWS

pytestmark = pytest.mark.django_db(transaction=True)
AXE = Axe()
BLOCKING = ("serious", "critical")
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


def serve_html(page: Page, url: str, html: str, status: int) -> None:
    """Answer one address with this HTML (its CSS and JS still come from the live server)."""
    page.route(url, lambda route: route.fulfill(status=status, content_type="text/html; charset=utf-8", body=html))
    page.goto(url)


def login_page(page: Page, base: str) -> None:
    page.goto(f"{base}/accounts/login/")
    expect(page.get_by_role("heading", name="Sign in to Lethe")).to_be_visible()


def list_tab(view: str) -> Callable[[Page, str], None]:
    def go(page: Page, base: str) -> None:
        log_in(page, base, *MEMBER)
        page.goto(f"{base}/conversations/?view={view}")
        expect(page.locator("#results .count")).to_be_visible()

    return go


def detail(page: Page, base: str) -> None:
    conversation, item = conversation_with_long_output()
    log_in(page, base, *ADMIN)
    open_from_list(page, conversation)
    page.locator(f"#item-{item.pk}").get_by_role("link", name="Show full output", exact=False).click()
    expect(page.locator(f"#item-{item.pk} .output pre")).to_be_focused()


def removed_details(page: Page, base: str) -> None:
    from e2e.helpers import reduce_tool_item

    conversation, item = conversation_with_long_output()
    reduce_tool_item(item)
    log_in(page, base, *MEMBER)
    open_from_list(page, conversation)
    expect(page.locator(f"#item-{item.pk}").get_by_test_id("details-removed")).to_be_visible()


def removed_output_page(page: Page, base: str) -> None:
    from e2e.helpers import reduce_tool_item

    conversation, item = conversation_with_long_output()
    reduce_tool_item(item)
    log_in(page, base, *MEMBER)
    page.goto(f"{base}/conversations/{conversation.public_id}/items/{item.pk}/output/")
    expect(page.get_by_test_id("details-removed")).to_be_visible()


def data_storage(who: tuple[str, str], edit: bool) -> Callable[[Page, str], None]:
    def go(page: Page, base: str) -> None:
        log_in(page, base, *who)
        open_nav(page, "Data & storage")
        expect(page.get_by_role("heading", level=1)).to_have_text("Data & storage")
        if edit:  # with the save bar showing a failed save, the busiest state of the page
            page.get_by_label("Audit facts, days").fill("0")
            page.locator("#save-bar").get_by_role("button", name="Save").click()
            expect(page.locator("#facts-card .field-error")).to_be_visible()

    return go


def _admin():
    return get_user_model().objects.get(username=ADMIN[0])


def _drain() -> None:
    from retention import jobs
    from retention.models import ToolPayloadOperation

    for _ in range(500):
        op = ToolPayloadOperation.objects.filter(slot__isnull=False).order_by("id").first()
        if op is None:
            return
        jobs.run_operation(op.pk)


def cleanup(state: str) -> Callable[[Page, str], None]:
    """The tool payload cleanup card in its busiest states: running, completed, failed."""

    def go(page: Page, base: str) -> None:
        from retention import service
        from retention.models import ToolPayloadOperation, ToolPayloadPolicy

        admin = _admin()
        if state == "running":
            service.start_analysis(user=admin, age_value=3, age_unit="months")
        elif state == "completed":
            _drain_after(service.start_analysis(user=admin, age_value=3, age_unit="months"))
            service.save_policy(user=admin, enabled=True, age_value=3, age_unit="months", revision=1,
                                backup_choice="skip")
            _drain_after(service.start_run(user=admin, revision=ToolPayloadPolicy.load().revision))
        else:
            service.save_policy(user=admin, enabled=True, age_value=3, age_unit="months", revision=1,
                                backup_choice="create")
            backup = service.start_run(user=admin, revision=ToolPayloadPolicy.load().revision)
            ToolPayloadOperation.objects.filter(pk=backup).update(state="failed", slot=None, error_code="x",
                                                                  error_message="No space left for the backup.")
            ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed",
                                                          preparation_error="No space left for the backup.")
            failed = service.start_analysis(user=admin, age_value=3, age_unit="months")
            ToolPayloadOperation.objects.filter(pk=failed).update(state="failed", slot=None, error_code="x",
                                                                  error_message="The disk said no.")
        log_in(page, base, *ADMIN)
        open_nav(page, "Data & storage")
        analysis = page.get_by_test_id("analysis")
        if state == "running":
            expect(analysis).to_have_attribute("data-state", "running")
            page.get_by_label("Automatic cleanup").check()  # the backup choice and the save bar show
            expect(page.locator("#backup-choice")).to_be_visible()
        elif state == "completed":
            expect(analysis).to_have_attribute("data-state", "completed")
            for summary in page.locator("#tool-card details summary").all():
                summary.click()  # the details open
        else:
            expect(page.get_by_role("button", name="Retry backup")).to_be_visible()
            page.get_by_label("Number").fill("0")
            page.get_by_role("button", name="Analyze savings").click()  # an action error, in its region
            expect(page.get_by_test_id("action-error")).to_contain_text("Choose from")

    return go


def storage_insight(who: tuple[str, str]) -> Callable[[Page, str], None]:
    def go(page: Page, base: str) -> None:
        from e2e.test_storage_insight import measured_history

        measured_history()
        log_in(page, base, *who)
        open_nav(page, "Data & storage")
        section = page.locator("#storage-insight")
        if who == ADMIN:  # with a measurement waiting, the busiest state of the section
            section.get_by_role("button", name="Measure now").click()
            expect(page.locator("#storage-insight").get_by_test_id("insight-pending")).to_be_visible()
        else:
            expect(section.get_by_role("img", name="Storage size per day")).to_be_visible()

    return go


def _drain_after(_operation_id: int) -> None:
    _drain()


def not_found(page: Page, base: str) -> None:
    log_in(page, base, *MEMBER)
    page.goto(f"{base}/conversations/c_00000000000000000000/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Not found")


def bad_request(page: Page, base: str) -> None:
    log_in(page, base, *MEMBER)
    page.goto(f"{base}/conversations/?q=a%00b")
    expect(page.get_by_role("heading", level=1)).to_have_text("Bad request")


def action_only(page: Page, base: str) -> None:
    from lifecycle.models import Conversation

    log_in(page, base, *MEMBER)
    page.goto(f"{base}/conversations/{Conversation.objects.first().public_id}/archive/")
    expect(page.get_by_role("heading", level=1)).to_have_text("Nothing was done")


def later_transcript_page(page: Page, base: str) -> None:
    from lifecycle.models import Item

    item = Item.objects.order_by("conversation_id", "seq").filter(seq__gt=1).first()
    log_in(page, base, *MEMBER)
    page.goto(f"{base}/conversations/{item.conversation.public_id}/?after=1")
    expect(page.get_by_test_id("earlier-left-out")).to_be_visible()


def form_expired(page: Page, base: str) -> None:
    login_page(page, base)
    page.locator("form.stack input[name=csrfmiddlewaretoken]").evaluate("el => el.value = 'stale'")
    page.get_by_label("Username").fill(MEMBER[0])
    page.get_by_label("Password").fill(MEMBER[1])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Form expired")


def forbidden(page: Page, base: str) -> None:
    log_in(page, base, *MEMBER)
    request = RequestFactory().get("/conversations/", HTTP_HOST="127.0.0.1")
    request.user = get_user_model().objects.get(username=MEMBER[0])
    serve_html(page, f"{base}/e2e-forbidden/", render_to_string("403.html", request=request), 403)
    expect(page.get_by_role("heading", level=1)).to_be_visible()


def server_error(page: Page, base: str) -> None:
    from console.views import server_error as page_for

    html = page_for(RequestFactory().get("/conversations/", HTTP_HOST="127.0.0.1")).content.decode()
    serve_html(page, f"{base}/e2e-server-error/", html, 500)
    expect(page.get_by_role("heading", level=1)).to_have_text("Something went wrong")


def delete_preview(page: Page, base: str) -> None:
    from e2e.test_lifecycle import deletable

    log_in(page, base, *ADMIN)
    page.goto(f"{base}/conversations/{deletable().public_id}/delete/")
    expect(page.get_by_role("button", name="Delete for good")).to_be_visible()


def delete_unavailable(page: Page, base: str) -> None:
    from e2e.test_lifecycle import unavailable

    log_in(page, base, *ADMIN)
    page.goto(f"{base}/conversations/{unavailable().public_id}/delete/")
    expect(page.get_by_role("button", name="Clear this row").first).to_be_visible()


def operation_completed(page: Page, base: str) -> None:
    from e2e.test_lifecycle import deletable
    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion.executor import run_erasure

    op = request_deletion(deletable(), key="axe", acting_user=None)
    run_erasure(op.pk)
    log_in(page, base, *ADMIN)
    page.goto(f"{base}/operations/{op.public_id}/")
    expect(page.get_by_test_id("receipt")).to_be_visible()
    open_nav(page, "Operations")
    expect(page.get_by_role("heading", name="Operations", level=1)).to_be_visible()
    page.goto(f"{base}/operations/{op.public_id}/")


def operations(page: Page, base: str) -> None:
    from e2e.test_lifecycle import deletable
    from lifecycle.actions.request_deletion import request_deletion

    request_deletion(deletable(), key="axe-pending", acting_user=None)  # one pending, shown with its step
    log_in(page, base, *MEMBER)
    open_nav(page, "Operations")
    expect(page.get_by_role("heading", name="Operations", level=1)).to_be_visible()


def _bound(state: str):
    """A binding and a bound delete in `state`, written as the delivery job would leave them
    (the remote engine itself is exercised in tests/test_remote_engine.py and the phone e2e)."""
    from django.utils import timezone

    from remote.models import BoundDelete, BoundDeleteKey, EngineBinding

    binding = EngineBinding.objects.create(engine_id="c_" + "a" * 20, owner_kind="account", owner_id=1,
                                           scope="bound", thread_id="t-axe", title="Axe check")
    EngineBinding.objects.create(engine_id="c_" + "b" * 20, owner_kind="computer", owner_id=1, scope="local",
                                 thread_id="t-axe", title="Same id, other owner")
    if state == "none":
        return binding, None
    now = timezone.now()
    fields = {"key": f"axe-{state}", "binding_ref": binding.public_id, "engine_id": binding.engine_id,
              "owner_kind": "account", "owner_id": 1, "scope": "bound", "thread_id": "t-axe", "state": state,
              "attempts": 3, "engine_operation": "op_" + "c" * 20}
    if state == "pending":
        op = BoundDelete.objects.create(**fields, binding=binding, waiting_on="engine", last_error="engine_unreachable",
                                        last_error_at=now, next_attempt_at=now + timezone.timedelta(seconds=30))
    else:
        receipt = {"engine": "sqlite", "stores": [{"store": "lifecycle.Item", "class": "erase", "action": "erased",
                                                   "records": 2, "bytes": 2081}]}
        op = BoundDelete.objects.create(**fields, receipt=receipt, receipt_at=now, acknowledged_at=now,
                                        completed_at=now)
        binding.delete()
    BoundDeleteKey.objects.create(key=op.key, delete=op)
    return binding, op


def engine_conversations(page: Page, base: str) -> None:
    _bound("pending")
    log_in(page, base, *ADMIN)
    page.goto(f"{base}/engine/conversations/?owner=account:1")
    expect(page.get_by_role("heading", name="Engine conversations", level=1)).to_be_visible()


def engine_delete(page: Page, base: str) -> None:
    binding, _op = _bound("none")
    log_in(page, base, *ADMIN)
    page.goto(f"{base}/engine/conversations/{binding.public_id}/delete/")
    expect(page.get_by_role("button", name="Delete for good")).to_be_visible()


def engine_delete_status(state: str) -> Callable[[Page, str], None]:
    def go(page: Page, base: str) -> None:
        _binding, op = _bound(state)
        log_in(page, base, *MEMBER)
        page.goto(f"{base}/engine/deletes/{op.public_id}/")
        expect(page.locator("#op-status")).to_have_attribute("data-state", state)
    return go


PAGES: dict[str, Callable[[Page, str], None]] = {
    "login": login_page,
    **{f"list-{view}": list_tab(view) for view in VIEWS},
    "conversation": detail,
    "conversation-removed-details": removed_details,
    "output-removed-details": removed_output_page,
    "data-storage-admin": data_storage(ADMIN, edit=True),
    "data-storage-member": data_storage(MEMBER, edit=False),
    "cleanup-running": cleanup("running"),
    "cleanup-completed": cleanup("completed"),
    "cleanup-failed": cleanup("failed"),
    "storage-insight-admin": storage_insight(ADMIN),
    "storage-insight-member": storage_insight(MEMBER),
    "400": bad_request,
    "404": not_found,
    "405-action-only": action_only,
    "conversation-later-page": later_transcript_page,
    "403": forbidden,
    "403-form-expired": form_expired,
    "500": server_error,
    "delete-preview": delete_preview,
    "delete-unavailable": delete_unavailable,
    "operation-completed": operation_completed,
    "operations": operations,
    "engine-conversations": engine_conversations,
    "engine-delete": engine_delete,
    "engine-delete-pending": engine_delete_status("pending"),
    "engine-delete-completed": engine_delete_status("completed"),
}


@pytest.mark.parametrize("name", list(PAGES))
def test_it_has_no_serious_accessibility_violations(seeded, live_server, open_page, name):
    page = open_page("desktop")
    PAGES[name](page, live_server.url)
    found = []
    for viewport in ("desktop", "phone", "small-phone"):
        page.set_viewport_size(VIEWPORTS[viewport])
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            for violation in AXE.run(page).response["violations"]:
                if violation["impact"] in BLOCKING:
                    targets = [", ".join(node["target"]) for node in violation["nodes"]][:5]
                    found.append(f"{VIEWPORTS[viewport]['width']} {scheme}: {violation['id']} "
                                 f"({violation['impact']}) {violation['help']}: {targets}")
    assert found == [], f"{name}:\n" + "\n".join(found)


def blocking(page: Page) -> set[str]:
    return {v["id"] for v in AXE.run(page).response["violations"] if v["impact"] in BLOCKING}


def test_the_checker_reports_what_it_should(seeded, live_server, open_page):
    """The harness is not vacuous: a nameless button and faint text on a real page are found."""
    page = open_page("small-phone")
    login_page(page, live_server.url)
    assert blocking(page) == set()
    page.evaluate("""() => {
        const main = document.querySelector('main');
        main.insertAdjacentHTML('beforeend', '<button type=button></button><p id=faint>faint</p>');
        document.getElementById('faint').style.color = '#ddd';  // CSSOM: the CSP allows no style attribute
    }""")
    assert {"button-name", "color-contrast"} <= blocking(page)
