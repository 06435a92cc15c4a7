"""Hostile input to the API: every refusal is a 4xx with a stable code and changes nothing."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from console.models import ApiToken
from lifecycle import api as lifecycle_api
from lifecycle.models import Item
from tests import factories

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}


@pytest.fixture
def runtime(admin_user) -> Client:
    _token, raw = ApiToken.issue(admin_user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)


def post_raw(client: Client, conversation, raw: bytes):
    return client.post(f"/v1/threads/{conversation.public_id}/items", data=raw, content_type="application/json")


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"role":"user","content":' + b"[" * 10_000 + b"]" * 10_000 + b"}", "too_deep"),
        (b'{"role":"tool","tool_kind":"generic","payload":' + b'{"a":' * 100 + b"1" + b"}" * 100 + b"}", "too_deep"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":NaN}}', "invalid_number"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":Infinity}}', "invalid_number"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":-Infinity}}', "invalid_number"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":1e400}}', "invalid_number"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":' + b"9" * 5000 + b"}}", "invalid_number"),
        # r75: the written-out form of a number past the largest double, as 1e400 (-1 and 400 zeros too)
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":1' + b"0" * 400 + b"}}", "invalid_number"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"x":-1' + b"0" * 400 + b"}}", "invalid_number"),
        (b'{"role":"user","content":"\\ud800"}', "invalid_text"),
        (b'{"role":"user","content":"a\\udfffb"}', "invalid_text"),
        (b'{"role":"user","content":"a\\u0000b"}', "invalid_text"),
        (b'{"role":"user","title":"\\u0000"}', "invalid_text"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"out":"x\\u0000"}}', "invalid_text"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"k\\u0000":1}}', "invalid_text"),
        (b'{"role":"user","role":"tool"}', "duplicate_key"),
        (b'{"role":"tool","tool_kind":"generic","payload":{"a":1,"a":2}}', "duplicate_key"),
        (b'{"role":"user","content":"\xff\xfe"}', "malformed_json"),
        (b'{"role":"user"} {"role":"user"}', "malformed_json"),
        (b"  ", "malformed_json"),
        (b"null", "invalid_body"),
        (b'"text"', "invalid_body"),
    ],
)
def test_it_refuses_hostile_bodies_with_a_stable_code_and_stores_nothing(runtime, conversation, raw, code):
    response = post_raw(runtime, conversation, raw)
    assert (response.status_code, response.json()["code"]) == (400, code), response.content[:300]
    assert response["Content-Type"] == "application/json"
    assert Item.objects.count() == 0


def test_a_whole_number_a_double_holds_is_kept_to_the_last_digit(runtime, conversation):
    import sys

    largest = int(sys.float_info.max)
    for n in (2**64 + 1, largest, -largest):
        body = b'{"role":"tool","tool_kind":"generic","payload":{"x":' + str(n).encode() + b"}}"
        response = post_raw(runtime, conversation, body)
        assert response.status_code == 201, response.content[:200]
        assert Item.objects.get(pk=Item.objects.latest("pk").pk).payload["x"] == n
    assert post_raw(runtime, conversation, b'{"role":"tool","tool_kind":"generic","payload":{"x":'
                    + str(largest + 1).encode() + b"}}").status_code == 400


def test_it_refuses_hostile_patches_and_changes_nothing(runtime, conversation):
    item = factories.add_tool(conversation)
    before = Item.objects.get(pk=item.pk)
    for raw in (b'{"title":"a","title":"b"}', b'{"payload":{"x":NaN}}', b'{"title":"\\ud800"}'):
        response = runtime.patch(f"/v1/threads/{conversation.public_id}/items/{item.pk}", data=raw,
                                 content_type="application/json")
        assert response.status_code == 400
    after = Item.objects.get(pk=item.pk)
    assert (after.title, after.payload, after.revision) == (before.title, before.payload, before.revision)


def test_it_accepts_what_is_strict_json_and_stores_it_exactly(runtime, conversation):
    payload = {"tool_name": "calc", "output": "ünïcødé ✓ 日本語", "n": 12345678901234567890, "f": 1.5, "deep": [[[1]]]}
    response = post_raw(runtime, conversation, json.dumps({"role": "tool", "tool_kind": "generic", "payload": payload}).encode())
    assert response.status_code == 201, response.content
    assert Item.objects.get(pk=response.json()["id"]).payload == payload


@pytest.mark.parametrize("old, new", [({"n": 1}, {"n": 1.0}), ({"n": 1}, {"n": True}), ({"n": 0}, {"n": False})])
def test_it_treats_a_change_of_type_as_a_change(runtime, conversation, old, new):
    item = factories.add_tool(conversation, kind="generic", payload={"tool_name": "t", **old})
    response = runtime.patch(f"/v1/threads/{conversation.public_id}/items/{item.pk}",
                             data=json.dumps({"payload": {"tool_name": "t", **new}}), content_type="application/json")
    assert response.status_code == 200, response.content
    stored = Item.objects.get(pk=item.pk)
    assert stored.revision == 2
    assert type(stored.payload["n"]) is type(new["n"])


def test_it_answers_json_for_unknown_api_paths_and_methods(runtime, member_client):
    for path in ("/v1/nothing", "/v1/threads/c_x/items/1/more", "/api/v1/nope", "/v1/"):
        response = runtime.get(path)
        assert (response.status_code, response.json()["code"]) == (404, "not_found"), path
    response = runtime.delete("/v1/threads")
    assert (response.status_code, response.json()["code"]) == (405, "method_not_allowed")
    assert response["Allow"] == "GET, HEAD, OPTIONS"


def test_options_answers_204_with_the_methods_after_the_same_sign_in_check_as_405(runtime, conversation):
    item = factories.add_message(conversation)
    for path, allow in (("/v1/threads", "GET, HEAD, OPTIONS"),
                        (f"/v1/threads/{conversation.public_id}/items", "GET, HEAD, OPTIONS, POST"),
                        (f"/v1/threads/{conversation.public_id}/items/{item.pk}", "GET, HEAD, OPTIONS, PATCH"),
                        ("/api/v1/bindings/b_x", "DELETE, OPTIONS"),
                        ("/api/v1/system/retained-facts", "GET, HEAD, OPTIONS, PUT")):
        response = runtime.options(path)
        assert (response.status_code, response["Allow"], response.content) == (204, allow, b""), path
        assert "Content-Type" not in response
        anonymous = Client(**HOST).options(path)
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "not_authenticated"), path
    # A public path (the document) needs no sign-in, for OPTIONS either.
    public = Client(**HOST).options("/v1/openapi.json")
    assert (public.status_code, public["Allow"]) == (204, "GET, HEAD, OPTIONS")


def test_the_api_prefixes_without_their_slash_answer_json_404_not_an_html_redirect(runtime):
    """The API's roots are no endpoint: its 404, as every unknown address under them (no
    redirect to the slashed address, whose answer was an HTML type)."""
    for path in ("/v1", "/api/v1", "/v1?x=1"):
        for client in (runtime, Client(**HOST)):
            response = client.get(path)
            assert (response.status_code, response["Content-Type"]) == (404, "application/json"), path
            assert response.json()["code"] == "not_found"
        spanish = Client(enforce_csrf_checks=True, **HOST).post(path, HTTP_ACCEPT_LANGUAGE="es")
        assert (spanish.status_code, spanish.json()["message"]) == (404, "No hay nada en esta dirección.")
    nul = Client(**HOST).get("/v1?x=%00")  # refused before any view: in JSON there too
    assert (nul.status_code, nul.json()["code"]) == (400, "invalid_text")


def test_unsafe_methods_on_unknown_api_paths_answer_json_404_without_a_token():
    """No endpoint there, so no CSRF page either: a client without a token that POSTs to a
    mistyped path (a trailing slash) learns that in JSON, in its language."""
    from django.middleware.csrf import get_token
    from django.test import RequestFactory

    from console.views import csrf_failure

    client = Client(enforce_csrf_checks=True, **HOST)
    for method, path in (("post", "/api/v1/nope"), ("put", "/api/v1/system/retained-facts/"),
                         ("delete", "/v1/threads/"), ("patch", "/v1/")):
        response = getattr(client, method)(path, HTTP_ACCEPT_LANGUAGE="es")
        assert response["Content-Type"].startswith("application/json"), (method, path)
        assert (response.status_code, response.json()["code"]) == (404, "not_found"), (method, path)
        assert response.json()["message"] == "No hay nada en esta dirección."
    # A CSRF refusal under the API prefixes, should any view there lack its own check: JSON too.
    request = RequestFactory().post("/v1/threads", **HOST)
    get_token(request)
    refused = csrf_failure(request)
    assert (refused.status_code, json.loads(refused.content)["code"]) == (403, "csrf_failed")


def test_it_answers_json_500_and_logs_when_a_view_fails(runtime, conversation, monkeypatch, caplog):
    def broken(_c):
        raise RuntimeError("boom with secret detail")

    monkeypatch.setattr(lifecycle_api, "thread_json", broken)
    response = runtime.get(f"/v1/threads/{conversation.public_id}")
    assert response.status_code == 500
    assert response.json()["code"] == "internal_error"
    assert "secret" not in response.content.decode()
    assert "boom with secret detail" in caplog.text


def test_a_500_after_a_change_was_stored_does_not_say_nothing_changed(runtime, conversation, monkeypatch):
    """An unexpected error can come after part of the request was stored (here: the close is
    committed, then building the answer fails): the answer must not claim that nothing changed."""
    from lifecycle import api

    def broken(_c):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "thread_json", broken)
    response = runtime.patch(f"/v1/threads/{conversation.public_id}", json.dumps({"closed": True}),
                             content_type="application/json")
    conversation.refresh_from_db()
    assert conversation.closed_at is not None  # the change was stored
    assert (response.status_code, response.json()["code"]) == (500, "internal_error")
    message = response.json()["message"]
    assert "Nothing was changed" not in message and "current state" in message
    spanish = runtime.patch(f"/v1/threads/{conversation.public_id}", json.dumps({"archived": True}),
                            content_type="application/json", HTTP_ACCEPT_LANGUAGE="es")
    assert spanish.status_code == 500 and "estado actual" in spanish.json()["message"]


def test_the_500_handler_answers_json_under_the_api_and_html_elsewhere(rf):
    from console.views import server_error

    assert server_error(rf.get("/v1/threads"))["Content-Type"] == "application/json"
    assert server_error(rf.get("/api/v1/system/x"))["Content-Type"] == "application/json"
    page = server_error(rf.get("/conversations/"))
    assert page["Content-Type"].startswith("text/html") and page.status_code == 500
    # styled by a file: the Content-Security-Policy allows no inline style
    assert "<style" not in page.content.decode() and '/static/css/error' in page.content.decode()
    from django.utils import translation

    with translation.override("es"):  # as the request's language is active when it fails
        spanish = server_error(rf.get("/conversations/")).content.decode()
    assert '<html lang="es">' in spanish and "<h1>Algo salió mal</h1>" in spanish
    assert "Something went wrong" not in spanish


def test_it_sends_www_authenticate_on_401_and_takes_the_scheme_in_any_case(admin_user, client, conversation):
    response = client.get("/v1/threads", **HOST)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    _token, raw = ApiToken.issue(admin_user)
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
        assert Client(HTTP_AUTHORIZATION=f"{scheme} {raw}", **HOST).get("/v1/threads").status_code == 200
    assert Client(HTTP_AUTHORIZATION=f"Token {raw}", **HOST).get("/v1/threads").status_code == 401
    assert Client(HTTP_AUTHORIZATION="Bearer nope", **HOST).get("/v1/threads").status_code == 401


def test_head_works_wherever_get_does(runtime, conversation):
    item = factories.add_message(conversation)
    for path in ("/v1/threads", f"/v1/threads/{conversation.public_id}", f"/v1/threads/{conversation.public_id}/items",
                 f"/v1/threads/{conversation.public_id}/items/{item.pk}", "/v1/openapi.json"):
        get, head = runtime.get(path), runtime.head(path)
        assert (get.status_code, head.status_code) == (200, 200), path
        assert head.content == b"" and head["Content-Type"] == get["Content-Type"]
        assert head["Content-Length"] == str(len(get.content)), path  # the GET's length, not 0 (RFC 9110 8.6)
    assert runtime.head("/v1/threads/c_unknown").status_code == 404


@pytest.mark.parametrize("query", ["owner_id=1", "owner_kind=account", "view=recent&view=closed"])
def test_it_refuses_incomplete_or_repeated_filters(member_client, query):
    response = member_client.get(f"/v1/threads?{query}", **HOST)
    assert (response.status_code, response.json()["code"]) == (400, "invalid_filter")


def test_it_bounds_an_item_page_in_bytes_and_pages_through_everything(runtime, conversation, settings):
    settings.API_MAX_PAGE_BYTES = 10_000
    items = [factories.add_tool(conversation, kind="generic",
                                payload={"tool_name": "t", "output": f"{n:02d}" + "x" * 4000}) for n in range(7)]
    huge = factories.add_tool(conversation, kind="generic", payload={"tool_name": "t", "output": "y" * 30_000})
    seen, after, pages = [], "0", 0
    while after is not None:
        body = runtime.get(f"/v1/threads/{conversation.public_id}/items?limit=200&after={after}").json()
        assert body["results"], "a page always carries at least one item"
        size = sum(len(json.dumps(i["payload"])) for i in body["results"])
        assert len(body["results"]) == 1 or size <= 10_000 + 200
        seen += [i["id"] for i in body["results"]]
        after, pages = body["next"], pages + 1
    assert seen == [i.pk for i in items] + [huge.pk]
    assert pages >= 4


def test_an_item_page_of_non_ascii_text_stays_within_its_byte_budget_on_the_wire(runtime, conversation, settings):
    """The budget counts a payload's UTF-8 bytes, and the answer is UTF-8 JSON with the same
    text: an "é" takes 2 bytes in both (r95: the answer escaped it as \\u00e9, 6 bytes, and a page
    was three times its budget; emoji took 12 bytes, CJK 6)."""
    settings.API_MAX_PAGE_BYTES = 20_000
    texts = ["é" * 4000, "漢" * 2600, "😀" * 2000, "é" * 4000, "ñ" * 4000]
    items = [factories.add_tool(conversation, kind="generic", payload={"tool_name": "t", "output": text})
             for text in texts]
    seen, after = [], "0"
    while after is not None:
        response = runtime.get(f"/v1/threads/{conversation.public_id}/items?limit=200&after={after}")
        assert response["Content-Type"] == "application/json"
        body = response.content.decode("utf-8")
        assert len(response.content) <= 20_000 + 1_000  # the budget, and the page's own fields
        page = json.loads(body)
        assert len(page["results"]) >= 2 or page["next"] is None
        seen += [(i["id"], i["payload"]["output"]) for i in page["results"]]
        after = page["next"]
    assert seen == [(i.pk, t) for i, t in zip(items, texts, strict=True)]
    assert "ééé" in runtime.get(f"/v1/threads/{conversation.public_id}/items?limit=1").content.decode("utf-8")


@pytest.mark.parametrize(
    "path",
    ["/conversations/?q=a%00b", "/conversations/c_x%00y/", "/settings/system/data-storage/?x=%00"],
)
def test_it_refuses_nul_in_page_addresses(member_client, path):
    response = member_client.get(path, **HOST)
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")
    assert "This address has characters that are not allowed." in response.content.decode()


@pytest.mark.parametrize("language", ["en", "es"])
@pytest.mark.parametrize("sent", ["too many fields", "no boundary"])
def test_a_form_the_server_cannot_read_is_not_said_to_be_about_the_address(admin_client, sent, language):
    """r23: every 400 page said the address had characters that are not allowed, also for a form
    of 1,200 fields (over the server's limit) or a multipart body without its boundary."""
    from lifecycle.models import RetainedFactsPolicy

    admin_client.cookies["django_language"] = language
    url = "/settings/system/data-storage/retained-facts/"
    if sent == "too many fields":
        response = admin_client.post(url, "&".join(f"f{n}=1" for n in range(1200)),
                                     content_type="application/x-www-form-urlencoded", **HOST)
    else:
        response = admin_client.post(url, "audit_days=30", content_type="multipart/form-data", **HOST)
    assert response.status_code == 400
    page = response.content.decode()
    assert "characters that are not allowed" not in page and "caracteres no permitidos" not in page
    expected = ("Lethe could not accept this request" if language == "en"
                else "Lethe no pudo aceptar esta solicitud")
    assert expected in page
    assert RetainedFactsPolicy.load().revision == 1


@pytest.mark.parametrize("path", ["/v1/threads?q=a%00b", "/v1/threads/c_x%00y", "/v1/threads?%00=1"])
def test_it_refuses_nul_in_api_addresses(member_client, path):
    response = member_client.get(path, **HOST)
    assert (response.status_code, response.json()["code"]) == (400, "invalid_text")


@pytest.mark.parametrize(
    ("raw", "code", "message"),
    [
        # A wrong type where a union is declared names the field, not the union's member types
        (b'{"role":"tool","tool_kind":"shell","payload":true}', "invalid_type", "Field payload has the wrong type."),
        (b'{"role":"tool","tool_kind":"shell","payload":false}', "invalid_type", "Field payload has the wrong type."),
        # A number where one of some words is expected is a wrong type; an unknown word is not a choice
        (b'{"role":5}', "invalid_type", "Field role has the wrong type."),
        (b'{"role":"robot"}', "invalid_choice", "Field role has an unknown value."),
        # A name from the request is shown with its control and bidi characters escaped
        (b'{"role":"user","\\u202egnp.exe\\u001b[2J<b>":1}', "unknown_field",
         "Unknown field: \\u202egnp.exe\\u001b[2J<b>."),
    ],
)
def test_its_messages_name_fields_as_the_client_wrote_them_and_safely(runtime, conversation, raw, code, message):
    response = post_raw(runtime, conversation, raw)
    assert (response.status_code, response.json()["code"], response.json()["message"]) == (400, code, message)
    assert Item.objects.count() == 0


def test_a_chunked_body_is_refused_with_411_not_read_as_empty(runtime, conversation):
    response = runtime.post(f"/v1/threads/{conversation.public_id}/items", data=b'{"role":"user","content":"x"}',
                            content_type="application/json", HTTP_TRANSFER_ENCODING="chunked")
    assert (response.status_code, response.json()["code"]) == (411, "length_required")
    assert Item.objects.count() == 0


def test_an_unknown_filter_is_named_safely_and_a_bad_limit_says_its_range(member_client, conversation):
    response = member_client.get("/v1/threads?%E2%80%AEx=1", **HOST)
    assert response.json()["message"] == "Unknown filter: \\u202ex."
    # r16: a name with "[" or spelled like a type ("int") was named "body"
    for sent in ("limit[]", "int", "dict", "a[b]"):
        for path in ("/v1/threads", "/v1/operations", f"/v1/threads/{conversation.public_id}/items"):
            answer = member_client.get(f"{path}?{sent}=1", **HOST).json()
            assert answer == {"code": "unknown_filter", "message": f"Unknown filter: {sent}."}, (path, answer)
    response = member_client.get("/v1/threads?limit=0", **HOST)
    assert response.json()["message"] == "The value of limit is not valid; expected a whole number from 1 to 200."


def test_a_body_in_another_encoding_than_utf8_is_refused_with_415(runtime, conversation):
    response = runtime.post(f"/v1/threads/{conversation.public_id}/items", data='{"role":"user","content":"caf\xe9"}',
                            content_type="application/json; charset=latin-1")  # the client sends it in Latin-1
    assert (response.status_code, response.json()["code"]) == (415, "unsupported_media_type")
    assert Item.objects.count() == 0
    accepted = runtime.post(f"/v1/threads/{conversation.public_id}/items", data='{"role":"user","content":"caf\xe9"}'
                            .encode(), content_type="application/json; charset=UTF-8")
    assert accepted.status_code == 201 and Item.objects.get().content == "caf\xe9"


@pytest.mark.parametrize("coding", ["gzip", "br", " GZIP ", "deflate, identity"])
def test_a_compressed_body_is_refused_with_415_saying_so_not_called_malformed(runtime, conversation, coding):
    """r153: a gzip body was read as JSON and refused as not valid JSON."""
    import gzip

    body = gzip.compress(b'{"role":"user","content":"hello"}')
    response = runtime.post(f"/v1/threads/{conversation.public_id}/items", data=body, content_type="application/json",
                            HTTP_CONTENT_ENCODING=coding)
    assert (response.status_code, response.json()["code"]) == (415, "unsupported_content_encoding")
    assert response["Accept-Encoding"] == "identity" and "Content-Encoding" in response.json()["message"]
    assert Item.objects.count() == 0
    plain = runtime.post(f"/v1/threads/{conversation.public_id}/items", data=b'{"role":"user","content":"hello"}',
                         content_type="application/json", HTTP_CONTENT_ENCODING="identity")
    assert plain.status_code == 201 and Item.objects.get().content == "hello"


def test_a_half_given_owner_filter_says_what_is_missing(member_client):
    for url in ("/v1/threads?owner_kind=account", "/v1/threads?owner_id=3", "/api/v1/bindings?owner_kind=account"):
        answer = member_client.get(url, HTTP_HOST="127.0.0.1")
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_filter"), url
        assert answer.json()["message"] == "owner_kind and owner_id go together: send both, or neither."
        spanish = member_client.get(url, HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es").json()["message"]
        assert spanish == "owner_kind y owner_id van juntos: envíe los dos o ninguno."
    answer = member_client.get("/v1/operations?cursor=x&offset=1", HTTP_HOST="127.0.0.1").json()
    assert answer["message"] == "cursor and offset do not go together: send one of them."
