"""In-place requests of a signed-out browser get 401 and a way back, never the login page
inside the page; and a save whose session ended changes nothing."""

from __future__ import annotations

import pytest
from django.contrib.sessions.models import Session

from lifecycle.models import RetainedFactsPolicy

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}


def test_a_signed_out_list_request_gets_401_and_a_redirect_back(client):
    response = client.get(
        "/conversations/?view=archived&q=x", HTTP_HX_CURRENT_URL="http://127.0.0.1/conversations/?view=archived", **HX
    )
    assert response.status_code == 401
    # Back to the search just made, not the page before it.
    assert response["HX-Redirect"] == "/accounts/login/?next=/conversations/%3Fview%3Darchived%26q%3Dx"
    assert b"<html" not in response.content


def test_it_never_redirects_to_another_site(client):
    response = client.post(
        "/settings/system/data-storage/retained-facts/", {}, HTTP_HX_CURRENT_URL="https://evil.example/phish", **HX
    )
    assert response.status_code == 401
    assert response["HX-Redirect"] == "/accounts/login/?next=/settings/system/data-storage/retained-facts/"


def test_plain_requests_and_history_restores_still_get_the_login_page(client):
    assert client.get("/conversations/", **HOST).status_code == 302
    restore = client.get("/conversations/", HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HX)
    assert restore.status_code == 302 and restore["Location"].startswith("/accounts/login/")


def test_a_save_after_the_session_ended_is_refused_and_changes_nothing(admin_client):
    before = RetainedFactsPolicy.load()
    Session.objects.all().delete()
    response = admin_client.post(
        "/settings/system/data-storage/retained-facts/",
        {"audit_days": 500, "usage_days": 400, "billing_days": 2555, "revision": before.revision},
        HTTP_HX_CURRENT_URL="http://127.0.0.1/settings/system/data-storage/", **HX,
    )
    assert response.status_code == 401
    assert response["HX-Redirect"] == "/accounts/login/?next=/settings/system/data-storage/"
    after = RetainedFactsPolicy.load()
    assert (after.audit_days, after.revision) == (before.audit_days, before.revision)


def test_signed_in_htmx_requests_are_untouched(member_client):
    response = member_client.get("/conversations/", **HX)
    assert response.status_code == 200 and "HX-Redirect" not in response
