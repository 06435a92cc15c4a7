"""What a page says when content comes back after a delete, at desktop and phone widths:
the operation page's residue advice (traces written or restored after the delete, the
conversation's own files, copies elsewhere in the engine folder), and the engine list's
warning for a conversation the engine lists again after its bound delete (restored there
from a backup). Real parts: the erasure executor and the verifier on a temporary engine
folder, the live server and Chromium.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from e2e.conftest import ADMIN
from e2e.helpers import check_layout, log_in, screenshot
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor, verify
from lifecycle.enginefs import EngineHome
from remote.models import EngineBinding
from tests import factories
from tests.test_remote_delete_screens import RECEIPT, TARGET, completed

pytestmark = pytest.mark.django_db(transaction=True)
VIEWPORTS = pytest.mark.parametrize("viewport", ["desktop", "small-phone"], ids=["1280", "320"])


@VIEWPORTS
def test_the_residue_advice_on_the_operation_page(live_server, open_page, settings, tmp_path, viewport):
    settings.ENGINE_HOME = tmp_path / "engine"
    settings.ENGINE_HOME.mkdir()
    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    target = factories.make_conversation(title="Marked")
    factories.fill_every_store(target)
    home = EngineHome()
    artifact = (home.artifacts_dir(target.storage_key) / "large-output.txt").read_bytes()
    stray = home.root / "stray" / "copy.txt"  # a copy elsewhere in the engine folder, made by hand
    stray.parent.mkdir()
    stray.write_bytes(artifact)
    op = request_deletion(target, key=f"residue-{viewport}", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    own = home.artifacts_dir(target.storage_key) / "large-output.txt"  # written back after the delete
    own.parent.mkdir(parents=True)
    own.write_bytes(artifact)
    op.refresh_from_db()
    assert verify.verify(op, physical=True).physical == "found"

    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/operations/{op.public_id}/")
    expect(page.locator("#op-status")).to_have_attribute("data-state", "completed")
    expect(page.get_by_test_id("residue-found").locator(".cmd")).to_have_text(
        f"manage.py verify_erasure --erase-residue {op.public_id}")
    expect(page.get_by_test_id("residue-own-files").locator(".cmd")).to_have_text(
        f"manage.py verify_erasure --erase-residue --physical {op.public_id}")
    expect(page.get_by_test_id("residue-own-files")).to_contain_text("in 1 of this conversation's own files")
    expect(page.get_by_test_id("residue-engine-files")).to_contain_text("does not remove such files")
    expect(page.get_by_test_id("residue-engine-files").locator(".cmd")).to_have_text(
        f"manage.py verify_erasure --physical {op.public_id}")
    for block in page.locator(".cmd").all():  # each word on one line: a command wraps between words only
        for word in block.locator("span").all():
            box = word.bounding_box()
            assert box["height"] < 30, (word.inner_text(), box)
    expect(page.get_by_test_id("verified")).to_have_count(0)  # no "clean" beside a finding
    check_layout(page, f"operation page with residue advice {viewport}")
    screenshot(page, f"operation-residue-{viewport}")
    assert own.exists() and stray.exists()  # the page only advises: nothing was removed by showing it


@VIEWPORTS
def test_a_conversation_back_on_the_engine_after_its_delete(live_server, open_page, settings, viewport):
    settings.ENGINE_URL = ""  # the list reads the bindings this console keeps
    get_user_model().objects.create_user(ADMIN[0], password=ADMIN[1], is_staff=True)
    first = completed(RECEIPT)
    back = EngineBinding.objects.create(engine_id=TARGET, owner_kind="account", owner_id=1, scope="bound",
                                        thread_id="t1", title="", engine_state="live", returned_after=first)

    page = open_page(viewport)
    log_in(page, live_server.url, *ADMIN)
    page.goto(f"{live_server.url}/engine/conversations/")
    row = page.locator(f"[data-binding='{back.public_id}']")
    expect(row).to_have_count(1)
    warning = row.get_by_test_id("returned")
    expect(warning).to_contain_text("and on the engine again since")
    expect(warning).to_contain_text("delete it again")
    expect(row.get_by_role("link", name="Delete")).to_be_visible()
    check_layout(page, f"engine list with a returned conversation {viewport}")
    screenshot(page, f"engine-returned-{viewport}")
    warning.get_by_role("link", name="Erasure receipt").click()
    expect(page.get_by_test_id("op-state")).to_have_text("Completed")
    assert page.url.endswith(f"/engine/deletes/{first.public_id}/")
    check_layout(page, f"the first delete's receipt {viewport}")
