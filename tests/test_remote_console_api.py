"""A console of a remote engine (ENGINE_URL set) is no engine: every engine route (`/v1/`) answers
421 `engine_remote` the same way, reads and writes alike, and changes nothing here. Before, the
reads listed the console's own empty tables, a PATCH answered 404, and a DELETE went to the
engine past the console's bindings (no bound delete kept the binding until the receipt)."""

from __future__ import annotations

import json
import re

import pytest
from django.test import Client

from console.api import ENDPOINTS
from console.models import ApiToken
from lifecycle.models import AuditFact, Conversation, DeleteOperation, Item
from tests import factories

HOST = {"HTTP_HOST": "127.0.0.1"}


def engine_routes() -> list:
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (importing the URL modules registers every endpoint)
    return [ep for ep in ENDPOINTS if ep.path.startswith("/v1/") and not ep.public]


def token_client(user) -> Client:
    _token, raw = ApiToken.issue(user)
    return Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST)


def call(client: Client, method: str, path: str, **extra):
    body = {"archived": True} if method == "PATCH" else None
    return client.generic(method, path, data=b"" if body is None else json.dumps(body),
                          content_type="application/json", HTTP_IDEMPOTENCY_KEY="remote-console-key", **extra)


def filled(route: str, conversation: Conversation, item: Item) -> str:
    values = {"public_id": conversation.public_id, "item_id": str(item.pk), "operation_id": "op_" + "0" * 20,
              "agent_id": "agent-1"}
    return re.sub(r"\{(\w+)\}", lambda m: values.get(m.group(1), "x1"), route)


@pytest.mark.django_db
def test_every_engine_route_on_a_console_of_a_remote_engine_answers_421_and_changes_nothing(settings):
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t"  # nothing listens: never asked
    conversation = factories.make_conversation(title="Only on this console's own tables")
    item = factories.add_message(conversation, "user", "kept")
    admin = token_client(factories.make_user(admin=True))
    member = token_client(factories.make_user())
    facts = AuditFact.objects.count()
    routes = engine_routes()
    assert {ep.path for ep in routes} >= {"/v1/threads", "/v1/threads/{public_id}", "/v1/operations"}
    for ep in routes:
        path = filled(ep.path, conversation, item)
        for client in (admin, member):
            answer = call(client, ep.method, path)
            assert answer.status_code == 421, (ep.method, path, answer.content)
            assert answer.json() == {"code": "engine_remote", "message": (
                "This console's conversations are on its engine, not here: use the engine's own /v1/ API, "
                "or this console's /api/v1/bindings.")}
        anonymous = call(Client(**HOST), ep.method, path)
        assert (anonymous.status_code, anonymous.json()["code"]) == (401, "not_authenticated"), (ep.method, path)
    # nothing stored: not archived, no item appended, no delete, no audit fact
    conversation.refresh_from_db()
    assert conversation.archived_at is None and conversation.closed_at is None
    assert list(Item.objects.filter(conversation=conversation).values_list("content", flat=True)) == ["kept"]
    assert not DeleteOperation.objects.exists() and AuditFact.objects.count() == facts
    # the console's own API and the published schema still answer; the schema lists the 421
    assert admin.get("/api/v1/bindings?owner_kind=account&owner_id=1").status_code == 200
    schema = Client(**HOST).get("/v1/openapi.json")
    assert schema.status_code == 200
    responses = schema.json()["paths"]["/v1/threads"]["get"]["responses"]
    assert "421" in responses and "421" not in schema.json()["paths"]["/api/v1/bindings"]["get"]["responses"]


@pytest.mark.django_db
def test_the_refusal_is_in_the_callers_language(settings):
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t"
    admin = token_client(factories.make_user(admin=True))
    answer = admin.get("/v1/threads", HTTP_ACCEPT_LANGUAGE="es")
    assert answer.status_code == 421 and answer.json()["code"] == "engine_remote"
    assert answer.json()["message"].startswith("Las conversaciones de esta consola están en su motor")


@pytest.mark.django_db
def test_an_engine_without_engine_url_still_serves_its_engine_routes(settings):
    settings.ENGINE_URL = ""
    conversation = factories.make_conversation(title="Here")
    admin = token_client(factories.make_user(admin=True))
    listed = admin.get("/v1/threads")
    assert listed.status_code == 200
    assert conversation.public_id in [row["id"] for row in listed.json()["results"]]
