import pytest
from e2e.conftest import ADMIN, MEMBER
from e2e.helpers import log_in, _LAYOUT_PROBE, INTERACTIVE
from lifecycle.models import Conversation, Item

@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("vp", ["desktop", "phone", "small-phone"])
def test_it_probe(seeded, live_server, open_page, vp):
    page = open_page(vp)
    page.goto(live_server.url + "/accounts/login/")
    print("\n==", vp, "login", page.evaluate(_LAYOUT_PROBE, INTERACTIVE))
    page.screenshot(path=f"/tmp/shots/login-{vp}.png", full_page=True)
    log_in(page, live_server.url, *ADMIN)
    print("==", vp, "list", page.evaluate(_LAYOUT_PROBE, INTERACTIVE))
    page.screenshot(path=f"/tmp/shots/list-{vp}.png", full_page=True)
    c = Conversation.objects.filter(items__role="tool").first()
    page.goto(live_server.url + f"/conversations/{c.public_id}/")
    print("==", vp, "conv", page.evaluate(_LAYOUT_PROBE, INTERACTIVE))
    page.screenshot(path=f"/tmp/shots/conv-{vp}.png", full_page=True)
    page.goto(live_server.url + "/settings/system/data-storage/")
    print("==", vp, "ds", page.url, page.evaluate(_LAYOUT_PROBE, INTERACTIVE))
    page.screenshot(path=f"/tmp/shots/ds-{vp}.png", full_page=True)
    page.fill("#id_audit_days", "500")
    print("==", vp, "ds-bar", page.url, page.evaluate(_LAYOUT_PROBE, INTERACTIVE))
    page.screenshot(path=f"/tmp/shots/dsbar-{vp}.png", full_page=False)
