from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.test import Client

from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


def token_for(user) -> str:
    out = io.StringIO()
    call_command("create_api_token", user.username, stdout=out)
    return out.getvalue().strip()


def test_it_answers_anonymous_requests_with_401_json(client):
    response = client.get("/v1/threads", **HOST)
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert response["WWW-Authenticate"] == 'Bearer realm="lethe"'


@pytest.mark.parametrize("how", ["unknown", "revoked", "expired", "inactive"])
def test_a_token_that_is_not_valid_is_named_as_the_cause_of_the_401(member_user, how):
    """r153: an expired or revoked token was told to sign in or send a token, and the header did
    not say the token was the trouble (RFC 6750: error="invalid_token")."""
    from datetime import timedelta

    from django.utils import timezone

    from console.models import ApiToken

    raw = token_for(member_user)
    token = ApiToken.objects.get(user=member_user)
    if how == "unknown":
        raw = raw[:-4] + "zzzz"
    elif how == "revoked":
        ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())
    elif how == "expired":
        ApiToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    else:
        type(member_user).objects.filter(pk=member_user.pk).update(is_active=False)
    for language, words in (("en", "The API token sent is not valid"), ("es", "El token de API enviado no es válido")):
        response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_ACCEPT_LANGUAGE=language, **HOST).get("/v1/threads")
        assert response.status_code == 401 and response.json()["code"] == "not_authenticated"
        assert response.json()["message"].startswith(words), response.json()
        assert response["WWW-Authenticate"] == 'Bearer realm="lethe", error="invalid_token"'


def test_it_lists_threads_with_the_documented_shape(member_client):
    account = factories.make_account("Acme")
    conv = factories.make_conversation(account, thread_id="thr_same", title="Shape")
    factories.start_turn(conv)
    response = member_client.get("/v1/threads", **HOST)
    assert response.status_code == 200
    row = response.json()["results"][0]
    assert row == {
        "id": conv.public_id, "thread_id": "thr_same", "owner": {"kind": "account", "id": account.pk, "name": "Acme"},
        "scope": "bound", "title": "Shape", "archived": False, "closed": False, "active": True,
        "last_activity_at": row["last_activity_at"], "created_at": row["created_at"], "state": "live",
        "delete": None, "deleted_at": None,
    }
    assert response.json()["next"] is None
    # A computer's own conversation names the computer, as the screens do (r72: no name was given).
    computer = factories.make_computer("build-box")
    local = factories.make_conversation(computer, thread_id="thr_local")
    assert member_client.get(f"/v1/threads/{local.public_id}", **HOST).json()["owner"] == {
        "kind": "computer", "id": computer.pk, "name": "build-box"}


def test_it_lists_the_owners_a_list_can_be_filtered_by(member_client, client):
    """The owner filter's choices, as the conversation list offers them (a client had only the
    owners of the conversations it had already read), in pages."""
    zeta, acme = factories.make_account("Zeta"), factories.make_account("Acme")
    box = factories.make_computer("build-box")
    box.account = zeta
    box.save()
    spare = factories.make_computer("spare")
    everyone = [
        {"kind": "account", "id": zeta.pk, "name": "Zeta", "account_id": None},
        {"kind": "account", "id": acme.pk, "name": "Acme", "account_id": None},
        {"kind": "computer", "id": box.pk, "name": "build-box", "account_id": zeta.pk},
        {"kind": "computer", "id": spare.pk, "name": "spare", "account_id": None},
    ]
    assert member_client.get("/v1/owners", **HOST).json() == {"results": everyone, "next": None}
    # Pages of `limit`, across the kinds, each owner once; one added meanwhile comes later
    seen, cursor = [], None
    while True:
        page = member_client.get("/v1/owners?limit=1" + (f"&cursor={cursor}" if cursor else ""), **HOST).json()
        seen += page["results"]
        if len(seen) == 1:
            late = factories.make_account("Late")
        if not (cursor := page["next"]):
            break
    assert seen == [*everyone[:2], {"kind": "account", "id": late.pk, "name": "Late", "account_id": None},
                    *everyone[2:]]
    computers = member_client.get("/v1/owners?kind=computer&limit=1", **HOST).json()
    assert computers["results"] == [everyone[2]] and computers["next"]
    # A cursor that stands among the accounts is not one of the computers' list
    among_accounts = member_client.get("/v1/owners?limit=1", **HOST).json()["next"]
    refused = member_client.get(f"/v1/owners?kind=computer&cursor={among_accounts}", **HOST)
    assert (refused.status_code, refused.json()["code"]) == (400, "invalid_cursor")
    for bad in ("cursor=nonsense", "limit=0", "limit=201", "kind=robot"):
        refused = member_client.get(f"/v1/owners?{bad}", **HOST)
        assert refused.status_code == 400, bad
    local = factories.make_conversation(box, thread_id="thr_box")
    listed = member_client.get(f"/v1/threads?owner_kind=computer&owner_id={box.pk}", **HOST).json()["results"]
    assert [r["id"] for r in listed] == [local.public_id]
    assert client.get("/v1/owners", **HOST).status_code == 401
    assert member_client.post("/v1/owners", data="{}", content_type="application/json", **HOST).status_code == 405


def test_listing_the_owners_takes_the_same_queries_however_many_there_are(member_client):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for n in range(3):
        factories.make_account(f"a{n}")
    with CaptureQueriesContext(connection) as few:
        member_client.get("/v1/owners?limit=200", **HOST)
    for n in range(60):
        factories.make_account(f"b{n}")
        factories.make_computer(f"c{n}")
    with CaptureQueriesContext(connection) as many:
        assert len(member_client.get("/v1/owners?limit=200", **HOST).json()["results"]) == 123
    assert len(many.captured_queries) == len(few.captured_queries)  # one query per kind, whatever the count


def test_it_keeps_equal_raw_ids_under_different_owners_apart(member_client):
    a = factories.make_conversation(factories.make_account(), thread_id="thr_dup")
    b = factories.make_conversation(factories.make_computer(), thread_id="thr_dup")
    rows = member_client.get("/v1/threads", **HOST).json()["results"]
    assert {r["id"] for r in rows} == {a.public_id, b.public_id}
    assert {(r["owner"]["kind"], r["scope"]) for r in rows} == {("account", "bound"), ("computer", "local")}


def test_it_filters_by_view_owner_search_and_activity(member_client):
    account, computer = factories.make_account(), factories.make_computer()
    recent = factories.make_conversation(account, title="Deploy fix")
    archived = factories.make_conversation(account, title="Old deploy", archived=True)
    closed = factories.make_conversation(computer, title="Closed one", closed=True)
    factories.start_turn(recent, "queued")

    def ids(query):
        response = member_client.get("/v1/threads?" + query, **HOST)
        assert response.status_code == 200, response.content
        return {r["id"] for r in response.json()["results"]}

    assert ids("view=recent") == {recent.public_id}
    assert ids("view=archived") == {archived.public_id}
    assert ids("view=closed") == {closed.public_id}
    assert ids(f"owner_kind=computer&owner_id={computer.pk}") == {closed.public_id}
    assert ids("q=deploy") == {recent.public_id, archived.public_id}
    assert ids("active=true") == {recent.public_id}
    assert ids("archived=false&closed=false") == {recent.public_id}


def test_it_pages_with_a_cursor_without_gaps_or_repeats(member_client):
    account = factories.make_account()
    made = {factories.make_conversation(account, days_idle=i % 3).public_id for i in range(7)}
    seen, cursor = [], None
    while True:
        query = "limit=3" + (f"&cursor={cursor}" if cursor else "")
        body = member_client.get("/v1/threads?" + query, **HOST).json()
        seen += [r["id"] for r in body["results"]]
        cursor = body["next"]
        if not cursor:
            break
    assert sorted(seen) == sorted(made)


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("limit=0", "invalid_limit"),
        ("limit=abc", "invalid_limit"),
        ("limit=201", "invalid_limit"),
        ("limit=%C2%B2", "invalid_limit"),
        ("limit=99999999999999999999999", "invalid_limit"),
        ("owner_kind=account&owner_id=%C2%B2", "invalid_filter"),
        ("view=everything", "invalid_filter"),
        ("active=yes", "invalid_filter"),
        ("owner_kind=planet&owner_id=1", "invalid_filter"),
        ("color=blue", "unknown_filter"),
        ("cursor=%%%", "invalid_cursor"),
    ],
)
def test_it_refuses_bad_filters_with_a_clear_error(member_client, query, code):
    response = member_client.get("/v1/threads?" + query, **HOST)
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert response.json()["message"]


def test_a_search_too_long_is_refused_saying_the_limit(member_client):
    for language, said in (("en", "The value of q is too long: at most 200 characters."),
                           ("es", "El valor de q es demasiado largo: como máximo 200 caracteres.")):
        response = member_client.get("/v1/threads?q=" + "x" * 201, HTTP_ACCEPT_LANGUAGE=language, **HOST)
        assert (response.status_code, response.json()) == (400, {"code": "invalid_filter", "message": said})
    assert member_client.get("/v1/threads?q=" + "x" * 200, **HOST).status_code == 200


def test_it_returns_one_thread_and_404_json_for_an_unknown_id(member_client, conversation):
    assert member_client.get(f"/v1/threads/{conversation.public_id}", **HOST).json()["id"] == conversation.public_id
    response = member_client.get("/v1/threads/c_doesnotexist", **HOST)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_it_authenticates_bearer_tokens_and_refuses_bad_ones(admin_user, conversation):
    raw = token_for(admin_user)
    client = Client()
    ok = client.get("/v1/threads", HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)
    assert ok.status_code == 200
    bad = client.get("/v1/threads", HTTP_AUTHORIZATION="Bearer lethe_wrong", **HOST)
    assert bad.status_code == 401
    from console.models import ApiToken

    token = ApiToken.objects.get(user=admin_user)
    assert token.key_hash != raw and token.last_used_at is not None


def test_it_localizes_error_messages(member_client):
    response = member_client.get("/v1/threads?limit=0", HTTP_ACCEPT_LANGUAGE="es", **HOST)
    english = member_client.get("/v1/threads?limit=0", HTTP_ACCEPT_LANGUAGE="en", **HOST)
    assert response.json()["code"] == english.json()["code"] == "invalid_limit"
    assert response.json()["message"] != english.json()["message"]
