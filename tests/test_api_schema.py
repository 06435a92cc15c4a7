"""The published OpenAPI document: generated from the endpoint declarations, complete, and
honoured by the server (fuzzed with schemathesis against a live server)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from console.api import ENDPOINTS
from console.models import ApiToken
from tests import factories

HOST = {"HTTP_HOST": "127.0.0.1"}


def api_routes() -> set[str]:
    """Every URL pattern under the API prefixes, as an OpenAPI path template."""
    found = set()

    def walk(patterns, prefix=""):
        for p in patterns:
            route = prefix + str(p.pattern)
            if isinstance(p, URLResolver):
                walk(p.url_patterns, route)
            elif isinstance(p, URLPattern) and route.startswith(("v1/", "api/v1/")) and "unmatched" not in route:
                found.add("/" + re.sub(r"<\w+:", "{", route).replace(">", "}"))

    walk(get_resolver().url_patterns)
    return found


@pytest.mark.django_db
def test_it_publishes_every_endpoint_and_nothing_else(client):
    response = client.get("/v1/openapi.json", **HOST)  # no sign-in needed
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"] == "3.1.0"
    declared = {(ep.path, ep.method.lower()) for ep in ENDPOINTS}
    published = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    assert published == declared
    # No API route bypasses the declarations (the catch-all 404 route is the one exception).
    leftover = api_routes() - {ep.path for ep in ENDPOINTS}
    assert leftover == set()


@pytest.mark.django_db
def test_it_derives_request_schemas_from_the_models_that_validate_them(client):
    doc = client.get("/v1/openapi.json", **HOST).json()
    body = doc["paths"]["/v1/threads/{public_id}/items"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    item_in = doc["components"]["schemas"][body["$ref"].rsplit("/", 1)[1]]
    assert item_in["additionalProperties"] is False
    assert item_in["required"] == ["role"]
    assert item_in["properties"]["title"]["maxLength"] == 300
    params = {p["name"]: p for p in doc["paths"]["/v1/threads"]["get"]["parameters"]}
    assert set(params) == {"view", "owner_kind", "owner_id", "q", "archived", "closed", "active", "limit", "cursor"}
    # The bounds the server enforces, under JSON Schema's names (pydantic's "ge"/"le" are read by no tool).
    assert (params["limit"]["schema"]["minimum"], params["limit"]["schema"]["maximum"]) == (1, 200)
    assert params["owner_id"]["schema"]["anyOf"][0]["minimum"] == 0
    items = {p["name"]: p for p in doc["paths"]["/v1/threads/{public_id}/items"]["get"]["parameters"]}
    assert items["after"]["schema"]["minimum"] == 0 and items["limit"]["schema"]["maximum"] == 200
    text = json.dumps(doc)
    assert '"ge":' not in text and '"le":' not in text and '"gt":' not in text and '"lt":' not in text
    for operation in (op for ops in doc["paths"].values() for op in ops.values()):
        for status, answer in operation["responses"].items():
            if int(status) >= 400:
                assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorOut")


@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_no_server_error_and_no_answer_outside_the_schema(live_server, tmp_path, settings):
    """Bounded property-based fuzzing of every operation, signed in as an admin token."""
    settings.API_VALIDATE_RESPONSES = False  # the live server answers; schemathesis judges
    admin = factories.make_user("fuzz-admin", admin=True)
    conversation = factories.make_conversation(title="Fuzz target")
    item = factories.add_tool(conversation)
    factories.add_message(conversation)
    _token, raw = ApiToken.issue(admin)
    config = tmp_path / "schemathesis.toml"
    config.write_text(
        "[parameters]\n"
        f'"path.public_id" = "{conversation.public_id}"\n'
        f'"path.item_id" = {item.pk}\n'
    )
    report = tmp_path / "report"
    result = subprocess.run(
        [str(Path(sys.executable).with_name("schemathesis")), "--config-file", str(config), "run",
         f"{live_server.url}/v1/openapi.json",
         "--header", f"Authorization: Bearer {raw}",
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                     "response_schema_conformance,response_headers_conformance,negative_data_rejection",
         "--max-examples", "25", "--seed", "7", "--no-shrink", "--workers", "1",
         "--generation-database", "none", "--phases", "examples,coverage,fuzzing",
         "--request-timeout", "20", "--report", "ndjson", "--report-dir", str(report)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )
    tail = (result.stdout + result.stderr)[-6000:]
    assert result.returncode == 0, tail
    assert "No issues found" in result.stdout or " passed" in result.stdout, tail


@pytest.mark.django_db
def test_every_error_answer_is_the_documented_error_shape(member_client):
    for path in ("/v1/threads?limit=0", "/v1/threads/c_none", "/v1/nothing"):
        body = member_client.get(path, **HOST).json()
        assert set(body) >= {"code", "message"} and isinstance(body["message"], str)
    anonymous = Client(**HOST).get("/v1/threads")
    assert json.loads(anonymous.content)["code"] == "not_authenticated"


# ---- The document against the server: what the server answers, the document lists ----------


def _address(ep) -> str:
    """The operation's path with a placeholder for each parameter (an id that names nothing)."""
    address = ep.path
    for name in ep.path_params:
        address = address.replace(f"{{{name}}}", "1" if ep.param_type(name) is int else "x")
    return address


def _documented(doc: dict, ep) -> set[int]:
    return {int(status) for status in doc["paths"][ep.path][ep.method.lower()]["responses"]}


@pytest.mark.django_db
def test_every_operation_documents_the_refusals_any_request_can_get(api):
    """A query string an operation does not take is 400 `unknown_filter` on every operation
    (one without parameters too); gunicorn's own refusals (414, 431) come before any routing,
    with the same error document, for every path."""
    from gunicorn.http import errors

    from ops.gunicorn_worker import json_error, refusal

    doc = Client(**HOST).get("/v1/openapi.json").json()
    gunicorn = [refusal(errors.LimitRequestLine(9000, 4094)), refusal(errors.LimitRequestHeaders("too many"))]
    assert [status for status, *_rest in gunicorn] == [414, 431]
    for status, reason, code, message in gunicorn:
        body = json.loads(json_error(status, reason, code, message).split(b"\r\n\r\n", 1)[1])
        assert body == {"code": code, "message": message}  # the documented error shape
    for ep in ENDPOINTS:
        response = api.generic(ep.method, _address(ep) + "?x=1")
        assert response.status_code == 400, (ep.method, ep.path, response.content)
        assert {400, 414, 431} <= _documented(doc, ep), (ep.method, ep.path)


KEYED = [("DELETE", "/v1/threads/{public_id}"), ("POST", "/v1/threads/{public_id}/items"),
         ("DELETE", "/api/v1/bindings/{binding_id}")]


@pytest.mark.django_db
@pytest.mark.parametrize(("method", "path"), KEYED)
def test_the_idempotency_key_schema_admits_exactly_the_keys_the_server_takes(api, method, path):
    """A key the published schema admits is taken (here: 404, the id names nothing) and one it
    does not is refused with 400 `idempotency_key_invalid`, and the other way round."""
    import jsonschema_rs

    doc = Client(**HOST).get("/v1/openapi.json").json()
    assert sorted(KEYED) == sorted((ep.method, ep.path) for ep in ENDPOINTS
                                   if any(header.name == "Idempotency-Key" for header in ep.headers))
    operation = doc["paths"][path][method.lower()]
    schema = next(p["schema"] for p in operation["parameters"] if p["in"] == "header" and p["name"] == "Idempotency-Key")
    assert schema["pattern"] == "^[!-~]{1,200}$"
    body = json.dumps({"role": "user", "content": "x"}) if method == "POST" else None
    address = path.replace("{public_id}", "c_0000000000000000000f").replace("{binding_id}", "b_0000000000000000000f")
    for key in ("two words", "é", "k" * 201, "tab\there", "a\n", "k" * 200, "!~", "op_1:retry"):
        response = api.generic(method, address, body or "", content_type="application/json", HTTP_IDEMPOTENCY_KEY=key)
        taken = jsonschema_rs.is_valid(schema, key)
        assert response.status_code in {int(status) for status in operation["responses"]}, (key, response.content)
        assert (response.status_code, response.json()["code"]) == ((404, "not_found") if taken else
                                                                   (400, "idempotency_key_invalid")), key


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "name", "url"), [
    ("/v1/threads", "owner_id", "/v1/threads?owner_kind=account&owner_id={n}"),
    ("/api/v1/bindings", "owner_id", "/api/v1/bindings?owner_kind=account&owner_id={n}"),
    ("/v1/threads/{public_id}/items", "after", "/v1/threads/{id}/items?after={n}"),
])
def test_whole_number_parameters_publish_the_bound_the_server_enforces(api, path, name, url):
    """The server reads at most 18 digits (console.api.is_number): the largest is taken, one more
    digit (or the int64 maximum) refused, and the published schema says the same."""
    import jsonschema_rs

    conversation = factories.make_conversation(title="Bound target")
    doc = Client(**HOST).get("/v1/openapi.json").json()
    operation = doc["paths"][path]["get"]
    schema = next(p["schema"] for p in operation["parameters"] if p["in"] == "query" and p["name"] == name)
    number = next(option for option in schema.get("anyOf", [schema]) if option["type"] == "integer")
    assert (number["minimum"], number["maximum"]) == (0, 10**18 - 1)
    for n in (0, 10**18 - 1, 10**18, 2**63 - 1):
        response = api.get(url.format(id=conversation.public_id, n=n))
        assert response.status_code == (200 if jsonschema_rs.is_valid(number, n) else 400), (n, response.content)
        assert str(response.status_code) in operation["responses"]
    assert response.json()["message"] == (f"The value of {name} is not valid; expected a whole number from 0 to "
                                          f"{10**18 - 1}.")


@pytest.mark.django_db
def test_every_path_allows_the_methods_its_document_lists_and_a_get_refuses_a_body_as_documented(api):
    """OPTIONS and a 405 name the documented methods (HEAD with GET, OPTIONS itself); a body sent
    with a GET is read and refused like any body, with a status the document lists."""
    doc = Client(**HOST).get("/v1/openapi.json").json()
    for path, operations in doc["paths"].items():
        address = _address(next(ep for ep in ENDPOINTS if ep.path == path))
        methods = {method.upper() for method in operations} | {"OPTIONS"} | ({"HEAD"} if "get" in operations else set())
        options = api.options(address)
        assert (options.status_code, set(options["Allow"].split(", "))) == (204, methods), path
        refused = api.generic("TRACE", address)
        assert (refused.status_code, refused["Allow"]) == (405, options["Allow"]), path
    for ep in (ep for ep in ENDPOINTS if ep.method == "GET"):
        documented = _documented(doc, ep)
        for status, headers in ((415, {"content_type": "text/plain"}),
                                (411, {"content_type": "application/json", "HTTP_TRANSFER_ENCODING": "chunked"}),
                                (413, {"content_type": "application/json", "CONTENT_LENGTH": str(10**12)})):
            response = api.generic("GET", _address(ep), "{}", **headers)
            assert response.status_code == status and status in documented, (ep.path, status, response.content)
