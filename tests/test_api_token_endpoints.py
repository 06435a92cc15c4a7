"""API tokens through the API: the screen's list (admins every user's, members their own) and
Revoke (admins); never made through the API."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from console.models import ApiToken
from lifecycle.models import AuditFact
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def client_of(raw: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="127.0.0.1")


def test_admins_list_every_token_members_their_own_with_their_states():
    admin, member = factories.make_user(admin=True), factories.make_user(admin=False)
    mine, admin_raw = ApiToken.issue(admin, name="deploy script")
    theirs, member_raw = ApiToken.issue(member, name="phone")
    old, _ = ApiToken.issue(member, name="old", days=1)
    ApiToken.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(days=1))
    listed = client_of(admin_raw).get("/api/v1/tokens").json()
    assert [t["id"] for t in listed["results"]] == [old.pk, theirs.pk, mine.pk] and listed["next"] is None
    first = listed["results"][-1]
    assert first == {"id": mine.pk, "name": "deploy script", "prefix": admin_raw[:12], "user": admin.username,
                     "state": "active", "created_at": first["created_at"], "last_used_at": first["last_used_at"],
                     "expires_at": first["expires_at"], "revoked_at": None}
    assert first["last_used_at"] is not None  # this very request used it
    assert listed["results"][0]["state"] == "expired"
    assert admin_raw not in str(listed)  # the token itself is never given again
    own = client_of(member_raw).get("/api/v1/tokens").json()
    assert [t["id"] for t in own["results"]] == [old.pk, theirs.pk]


def test_pages_of_tokens_and_a_bad_cursor():
    admin = factories.make_user(admin=True)
    made = [ApiToken.issue(admin, name=f"t{n}")[0] for n in range(5)]
    _token, raw = ApiToken.issue(admin, name="reader")
    api = client_of(raw)
    seen, cursor = [], None
    while True:
        page = api.get("/api/v1/tokens?limit=2" + (f"&cursor={cursor}" if cursor else "")).json()
        seen += [t["id"] for t in page["results"]]
        if not (cursor := page["next"]):
            break
    assert seen == sorted([t.pk for t in made] + [_token.pk], reverse=True)
    for bad in ("cursor=nonsense", "limit=0", "limit=201", "extra=1"):
        assert api.get(f"/api/v1/tokens?{bad}").status_code == 400, bad


def test_an_admin_revokes_a_token_and_it_is_refused_from_then_on():
    admin, member = factories.make_user(admin=True), factories.make_user(admin=False)
    _mine, admin_raw = ApiToken.issue(admin)
    target, target_raw = ApiToken.issue(member, name="lost laptop")
    assert client_of(target_raw).get("/api/v1/tokens").status_code == 200
    answer = client_of(admin_raw).delete(f"/api/v1/tokens/{target.pk}")
    assert answer.status_code == 200 and answer.json()["state"] == "revoked" and answer.json()["revoked_at"]
    target.refresh_from_db()
    assert target.revoked_at is not None
    assert client_of(target_raw).get("/api/v1/tokens").status_code == 401
    assert AuditFact.objects.filter(action="api_token_revoked").count() == 1
    again = client_of(admin_raw).delete(f"/api/v1/tokens/{target.pk}")  # already revoked: as it is
    assert again.status_code == 200 and again.json()["revoked_at"] == answer.json()["revoked_at"]
    assert AuditFact.objects.filter(action="api_token_revoked").count() == 1
    missing = client_of(admin_raw).delete("/api/v1/tokens/999999999")
    assert (missing.status_code, missing.json()["code"]) == (404, "not_found")
    assert client_of(admin_raw).delete("/api/v1/tokens/" + "9" * 40).status_code == 404


def test_a_member_cannot_revoke_and_no_token_is_made_through_the_api():
    admin, member = factories.make_user(admin=True), factories.make_user(admin=False)
    target, _raw = ApiToken.issue(admin)
    _m, member_raw = ApiToken.issue(member)
    refused = client_of(member_raw).delete(f"/api/v1/tokens/{target.pk}")
    assert (refused.status_code, refused.json()["code"]) == (403, "forbidden")
    target.refresh_from_db()
    assert target.revoked_at is None
    count = ApiToken.objects.count()
    _a, admin_raw = ApiToken.issue(admin)
    made = client_of(admin_raw).post("/api/v1/tokens", data='{"name": "x"}', content_type="application/json")
    assert made.status_code == 405 and ApiToken.objects.count() == count + 1  # only the one issued here
