"""HEAD works wherever GET does (RFC 9110: link checkers and uptime probes send it): every
screen a signed-in user reads answers HEAD as it answers GET, without a body, and a HEAD on a
screen whose form posts (a delete's confirmation) shows nothing and changes nothing (r96: the
screens answered 405 and the two confirmation pages, taught HEAD, must not take it for their
POST, which CSRF protection does not guard against a HEAD)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from remote.models import BoundDelete, EngineBinding
from tests import factories
from tests.test_access_matrix import rows

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


@pytest.fixture
def screens(conversation) -> list[str]:
    item = factories.add_tool(conversation)
    other = factories.make_conversation(title="Being deleted")
    op = request_deletion(other, key="head-screens", acting_user=None)
    binding = EngineBinding.objects.create(engine_id="c_" + "a" * 20, owner_kind="account", owner_id=1,
                                           scope="bound", thread_id="t1", title="Bound", engine_state="live")
    now = timezone.now()
    bound = BoundDelete.objects.create(key="k-head", binding_ref="b_" + "0" * 20, engine_id="c_" + "e" * 20,
                                       owner_kind="account", owner_id=1, scope="bound", thread_id="t1",
                                       state="completed", receipt={"stores": []}, acknowledged_at=now,
                                       completed_at=now)
    return [
        "/conversations/", "/conversations/?view=archived&q=fix", f"/conversations/{conversation.public_id}/",
        f"/conversations/{conversation.public_id}/items/{item.pk}/output/",
        f"/conversations/{conversation.public_id}/delete/", "/operations/", f"/operations/{op.public_id}/",
        "/settings/system/data-storage/", "/settings/system/data-storage/status/", "/settings/api-tokens/",
        "/engine/conversations/", f"/engine/conversations/{binding.public_id}/delete/",
        f"/engine/deletes/{bound.public_id}/", "/accounts/login/", "/healthz",
    ]


@pytest.mark.parametrize("who", ["admin_client", "member_client"])
def test_every_screen_answers_head_as_it_answers_get(request, who, screens):
    client = request.getfixturevalue(who)
    for path in screens:
        got = client.get(path, **HOST)
        head = client.head(path, **HOST)
        assert (path, head.status_code) == (path, got.status_code)
        assert got.status_code in (200, 302, 403), path  # a screen, the status poll's way to its page, a refusal
        assert head.content == b"", path


def test_a_head_on_a_confirmation_page_takes_no_action(admin_client, conversation, screens):
    before = rows()
    binding = EngineBinding.objects.get()
    for path in (f"/conversations/{conversation.public_id}/delete/",
                 f"/engine/conversations/{binding.public_id}/delete/"):
        assert admin_client.head(path, {"key": "k-head-1"}, **HOST).status_code == 200
    assert rows() == before
    assert not m.DeleteOperation.objects.filter(conversation_id=conversation.pk).exists()
    assert not BoundDelete.objects.filter(key="k-head-1").exists()
