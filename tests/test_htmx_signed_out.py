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


def test_a_form_sent_after_the_session_ended_signs_in_back_to_its_page_and_does_nothing(admin_user):
    """Archive pressed after the session ended: nothing is archived, the login page says so,
    and signing in returns to the page the form was on, not to the action's address (which
    only takes a POST and showed the browser an empty 405)."""
    from django.test import Client

    from tests import factories

    conversation = factories.make_conversation(title="Kept as it was")
    archive = f"/conversations/{conversation.public_id}/archive/"
    browser = Client()
    response = browser.post(archive, {"archived": "1", "next": "/conversations/?view=recent"}, **HOST)
    assert response.status_code == 302
    assert response["Location"] == "/accounts/login/?next=/conversations/%3Fview%3Drecent"
    conversation.refresh_from_db()
    assert conversation.archived_at is None
    login = browser.get(response["Location"], **HOST)
    assert "Your session ended, so nothing was done. Sign in, then do it again." in login.content.decode()
    # Without a `next` field: the same-site page that sent the form; another site's: the list.
    close = f"/conversations/{conversation.public_id}/close/"
    page = f"/conversations/{conversation.public_id}/"
    response = Client().post(close, {"closed": "1"}, HTTP_REFERER=f"http://127.0.0.1{page}", **HOST)
    assert response["Location"] == f"/accounts/login/?next={page}"
    response = Client().post(close, {"closed": "1"}, HTTP_REFERER="https://evil.example/x", **HOST)
    assert response["Location"] == "/accounts/login/?next=/"
    conversation.refresh_from_db()
    assert conversation.closed_at is None


def test_an_action_address_asked_for_with_get_says_nothing_was_done(admin_client, member_client):
    from tests import factories

    conversation = factories.make_conversation(title="Kept as it was")
    for client in (admin_client, member_client):
        for action in ("archive", "close"):
            response = client.get(f"/conversations/{conversation.public_id}/{action}/", **HOST)
            body = response.content.decode()
            assert response.status_code == 405 and response["Allow"] == "POST"
            assert "Nothing was done" in body and "nothing was changed" in body
    spanish = admin_client.get("/settings/system/data-storage/compact/", HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert spanish.status_code == 405 and "No se hizo nada" in spanish.content.decode()
    conversation.refresh_from_db()
    assert conversation.archived_at is None and conversation.closed_at is None
    # The API keeps its JSON answer.
    api = admin_client.get("/api/v1/system/tool-payload-retention/compact", **HOST)
    assert api.status_code == 405 and api["Content-Type"].startswith("application/json")


def test_a_page_asked_with_another_method_says_nothing_was_done(admin_client):
    """A page sent PUT, POST or DELETE (a script, a stale form): 405 with its Allow and a page
    that says nothing was done, in the viewer's language (r106: an empty page); HEAD stays bare."""
    from tests import factories

    conversation = factories.make_conversation(title="Kept as it was")
    for method, path in (("put", "/conversations/"), ("post", "/operations/"),
                         ("delete", "/settings/system/data-storage/"),
                         ("patch", f"/conversations/{conversation.public_id}/")):
        response = getattr(admin_client, method)(path, **HOST)
        body = response.content.decode()
        assert response.status_code == 405 and response["Allow"] == "GET, HEAD", (method, path)
        assert "Nothing was done" in body and "does not take that kind of request" in body, (method, path)
        assert "use the button" not in body
    spanish = admin_client.delete("/conversations/", HTTP_ACCEPT_LANGUAGE="es", **HOST)
    assert spanish.status_code == 405 and "No se hizo nada" in spanish.content.decode()
    assert "does not take" not in spanish.content.decode()
    conversation.refresh_from_db()
    assert conversation.title == "Kept as it was" and conversation.state == "live"


def test_signing_out_is_a_plain_login_page(member_client):
    """Sign-out redirects to the login page after the session is gone: not a form whose action
    was lost (no "nothing was done", no page to return to for whoever signs in next)."""
    response = member_client.post("/accounts/logout/", HTTP_REFERER="http://127.0.0.1/conversations/", **HOST)
    assert (response.status_code, response["Location"]) == (302, "/accounts/login/")
    login = member_client.get(response["Location"], **HOST).content.decode()
    assert "nothing was done" not in login


def test_the_sign_in_pages_language_switch_works_signed_out(client, admin_user):
    from django.conf import settings

    turned_away = client.get("/operations/", **HOST)
    assert turned_away["Location"] == "/accounts/login/?next=/operations/"
    switched = client.post("/i18n/setlang/", {"language": "es", "next": turned_away["Location"]}, **HOST)
    assert (switched.status_code, switched["Location"]) == (302, "/accounts/login/?next=/operations/")
    assert switched.cookies[settings.LANGUAGE_COOKIE_NAME].value == "es"
    login = client.get(switched["Location"], **HOST).content.decode()
    assert '<html lang="es"' in login and "no se hizo nada" not in login.lower()
    signed_in = client.post(switched["Location"], {"username": admin_user.username, "password": "pw-for-tests"}, **HOST)
    assert (signed_in.status_code, signed_in["Location"]) == (302, "/operations/")


def test_the_status_poll_after_the_session_ended_returns_to_its_page(client, admin_client):
    """The Data & storage poller's address is a fragment: after signing in (it is where the
    login page returns to) the browser gets the page, not the bare fragment."""
    turned_away = client.get("/settings/system/data-storage/status/", HTTP_HX_CURRENT_URL="http://127.0.0.1/settings/system/data-storage/", **HX)
    assert turned_away.status_code == 401
    assert turned_away["HX-Redirect"] == "/accounts/login/?next=/settings/system/data-storage/status/"
    plain = admin_client.get("/settings/system/data-storage/status/", **HOST)  # after signing in
    assert (plain.status_code, plain["Location"]) == (302, "/settings/system/data-storage/")
    assert admin_client.get("/settings/system/data-storage/status/", **HX).status_code == 200
