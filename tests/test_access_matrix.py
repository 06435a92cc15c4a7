"""Who may change what, over every write there is: each JSON API write (from the endpoint
registry, so a new one is covered as it is declared) and each screen form post.

Members (by session or by their token) are refused with 403, a signed-in admin's browser
without the CSRF token with 403, nobody signed in, a deactivated admin's token and a revoked
or expired token with 401 (the screens: to the sign-in page); and in every case every stored
row is as it was."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.apps import apps
from django.test import Client
from django.utils import timezone

import console.urls  # noqa: F401  (declares the endpoints)
from console.api import ENDPOINTS, SAFE_METHODS
from console.models import ApiToken
from lifecycle.models import RetainedFactsPolicy
from remote.models import EngineBinding
from retention.models import StorageSnapshot, ToolPayloadPolicy
from tests import factories
from tests.conftest import token_client

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
SKIPPED = {"sessions.Session", "console.Throttle"}  # a sign-in's session; failed-token counters
WRITES = [ep for ep in ENDPOINTS if ep.method not in SAFE_METHODS]


def rows() -> dict[str, list[str]]:
    """Every stored row of every table, but a token's last use (reading with it records that)."""
    stored = {}
    for model in apps.get_models():
        if model._meta.label in SKIPPED:
            continue
        names = [f.attname for f in model._meta.concrete_fields if f.attname != "last_used_at"]
        stored[model._meta.label] = sorted(map(repr, model.objects.values_list(*names)))
    return stored


@pytest.fixture
def world(admin_user, member_user, conversation):
    """Something for every write to act on, and the settings rows pages create when first read."""
    ToolPayloadPolicy.load(), StorageSnapshot.load(), RetainedFactsPolicy.load()
    binding = EngineBinding.objects.create(engine_id="c_" + "a" * 20, owner_kind="account", owner_id=1,
                                           scope="bound", thread_id="t1", title="Bound", engine_state="live")
    token, _raw = ApiToken.issue(admin_user, name="Admin script")
    return {"conversation": conversation, "binding": binding, "token": token}


def outsiders(admin_user) -> dict[str, Client]:
    """The clients the API must refuse with 401."""
    gone = factories.make_user("carol", admin=True)
    _t, gone_raw = ApiToken.issue(gone, name="Former admin")
    gone.is_active = False
    gone.save()
    revoked, revoked_raw = ApiToken.issue(admin_user, name="Revoked")
    expired, expired_raw = ApiToken.issue(admin_user, name="Expired")
    ApiToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    return {
        "nobody": Client(),
        "deactivated admin's token": Client(HTTP_AUTHORIZATION=f"Bearer {gone_raw}"),
        "revoked token": Client(HTTP_AUTHORIZATION=f"Bearer {revoked_raw}"),
        "expired token": Client(HTTP_AUTHORIZATION=f"Bearer {expired_raw}"),
    }


def api_path(ep, world) -> str:
    ids = {"public_id": world["conversation"].public_id, "binding_id": world["binding"].public_id}
    path = ep.path
    for name in ep.path_params:
        path = path.replace(f"{{{name}}}", ids.get(name, "1"))
    return path


def admin_browser(admin_user) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    return client


def test_every_api_write_refuses_who_may_not_make_it_and_changes_nothing(world, admin_user, member_user,
                                                                          member_client):
    assert len(WRITES) >= 15  # the registry was read (an empty one would pass anything)
    refusers = {"member's token": (token_client(member_user), 403), "member's session": (member_client, 403),
                "admin's browser without the CSRF token": (admin_browser(admin_user), 403)}
    refusers |= {who: (client, 401) for who, client in outsiders(admin_user).items()}
    before = rows()
    wrong = []
    for ep in WRITES:
        for who, (client, status) in refusers.items():
            response = client.generic(ep.method, api_path(ep, world), b"{}", content_type="application/json",
                                      HTTP_IDEMPOTENCY_KEY="key-1", **HOST)
            code = json.loads(response.content).get("code")
            expected = {401: "not_authenticated", 403: None}[status]
            if response.status_code != status or (expected and code != expected) or rows() != before:
                wrong.append((ep.method, ep.path, who, response.status_code, code))
    assert wrong == []


SCREEN_FORMS = [
    "/conversations/{c}/archive/", "/conversations/{c}/close/", "/conversations/{c}/delete/",
    "/operations/op_00000000000000000001/retry/", "/subagents/resolve/", "/engine/conversations/sync/",
    "/engine/conversations/{b}/delete/", "/settings/system/data-storage/tool-payload-cleanup/",
    "/settings/system/data-storage/tool-payload-cleanup/analyze/",
    "/settings/system/data-storage/tool-payload-cleanup/run/",
    "/settings/system/data-storage/tool-payload-cleanup/cancel/",
    "/settings/system/data-storage/tool-payload-cleanup/retry/",
    "/settings/system/data-storage/tool-payload-cleanup/cancel-preparation/",
    "/settings/system/data-storage/compact/", "/settings/system/data-storage/retained-facts/",
    "/settings/system/data-storage/storage-insight/measure/", "/settings/api-tokens/",
    "/settings/api-tokens/{t}/revoke/",
]
# A form an admin could send: each field every form above reads.
FILLED = {"archived": "1", "closed": "1", "agent_id": "sa_1", "key": "k" * 32, "action": "clear", "enabled": "on", "age_value": "4",
          "age_unit": "weeks", "revision": "1", "backup_choice": "skip", "audit_days": "400", "usage_days": "400",
          "billing_days": "2555", "operation_id": "1", "name": "Made by a member", "days": "3",
          "form_number": "a" * 20}


def test_every_screen_form_refuses_who_may_not_send_it_and_changes_nothing(world, admin_user, member_client):
    from django.urls import resolve

    paths = [p.replace("{c}", world["conversation"].public_id).replace("{b}", world["binding"].public_id)
             .replace("{t}", str(world["token"].pk)) for p in SCREEN_FORMS]
    assert all(resolve(p) for p in paths)
    senders = {"member": (member_client, 403), "admin without the CSRF token": (admin_browser(admin_user), 403),
               "nobody": (Client(), 302)}
    before = rows()
    wrong = []
    for path in paths:
        for who, (client, status) in senders.items():
            response = client.post(path, FILLED, **HOST)
            signed_out = status != 302 or response["Location"].startswith("/accounts/login/")
            if response.status_code != status or not signed_out or rows() != before:
                wrong.append((path, who, response.status_code))
    assert wrong == []
