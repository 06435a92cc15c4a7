"""A list of delete operations reads what its rows share once: the fleet files (a large fleet
takes long to parse) and the retained-facts policy, and its steps in one query."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from lifecycle import fleet
from lifecycle.deletion import reasons
from lifecycle.enginefs import EngineHome
from lifecycle.models import DeleteOperation, DeleteStep
from tests import factories

pytestmark = pytest.mark.django_db

KEPT = [{"store": "lifecycle.AuditFact", "action": "kept", "class": "retain_facts", "days": 1}]


def test_it_parses_the_fleet_once_for_a_page_of_ambiguous_operations(api, parses):
    home = EngineHome()
    fleet.put_row({"agent_id": "agent-of-no-one", "status": "done", "delivery": "settled"}, home=home)
    for _ in range(5):
        DeleteOperation.objects.create(conversation=factories.make_conversation(), state="unavailable",
                                       reason=reasons.CHILD_AMBIGUOUS)
    parses.clear()
    answer = api.get("/v1/operations?state=unavailable&limit=200")
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert len(results) == 5
    assert all(r["way_out"]["ambiguous"][0]["agent_id"] == "agent-of-no-one" for r in results)
    assert sorted(parses) == sorted(str(p) for p in fleet.fleet_files(home) if p.exists())


def _completed(n: int) -> None:
    for _ in range(n):
        op = DeleteOperation.objects.create(conversation=factories.make_conversation(), state="completed",
                                            receipt={"engine": "sqlite", "stores": [], "kept": KEPT,
                                                     "holders": []})
        for position, key in enumerate(("lifecycle.Item", "lifecycle.Turn")):
            DeleteStep.objects.create(operation=op, key=key, position=position, state="done")


def _queries(api, query: str) -> int:
    with CaptureQueriesContext(connection) as captured:
        answer = api.get(f"/v1/operations?{query}")
    assert answer.status_code == 200
    return len(captured.captured_queries)


def test_it_lists_completed_operations_in_a_constant_number_of_queries(api):
    _completed(2)
    few = _queries(api, "state=completed&limit=200")
    _completed(18)
    body = api.get("/v1/operations?state=completed&limit=200").json()
    assert len(body["results"]) == 20
    assert all(len(r["steps"]) == 2 and r["steps"][0]["store"] == "lifecycle.Item" for r in body["results"])
    assert all(r["receipt"]["kept"][0]["days"] != 1 for r in body["results"])  # the period in force now
    assert _queries(api, "state=completed&limit=200") == few


def _polled(client, ids: list[str]) -> int:
    query = "&".join(f"op={op_id}" for op_id in ids)
    with CaptureQueriesContext(connection) as captured:
        answer = client.get(f"/operations/?live=1&{query}", HTTP_HX_REQUEST="true", HTTP_HOST="127.0.0.1")
    assert answer.status_code in (200, 204)
    return len(captured.captured_queries)


def test_the_operations_poll_reads_its_rows_in_a_constant_number_of_queries(admin_client):
    """The Operations list polls its pending deletes every few seconds: it read each one apart
    (its row, its steps, the policy and the fleet files, per operation)."""
    _completed(2)
    ids = list(DeleteOperation.objects.values_list("public_id", flat=True))
    few = _polled(admin_client, ids)
    _completed(18)
    ids = list(DeleteOperation.objects.values_list("public_id", flat=True))
    assert len(ids) == 20 and _polled(admin_client, ids) == few


@pytest.mark.parametrize(("lang", "empty", "other"), [
    ("en", "No delete operations were refused.", "No delete operations yet."),
    ("es", "No se ha rechazado ninguna operación de eliminación.", "Todavía no hay operaciones de eliminación."),
])
def test_an_empty_tab_says_no_operation_has_its_state_while_other_tabs_list_some(admin_client, lang, empty, other):
    """With completed deletes listed under All, the Refused tab said there were no delete
    operations yet (r59)."""
    import html

    _completed(3)

    def page(query: str) -> str:
        return html.unescape(admin_client.get(f"/operations/{query}", HTTP_ACCEPT_LANGUAGE=lang,
                                              HTTP_HOST="127.0.0.1").content.decode())

    refused, everything = page("?state=refused"), page("")
    assert empty in refused and other not in refused
    assert everything.count('class="op-row"') == 3 and empty not in everything and other not in everything
    DeleteOperation.objects.all().delete()
    assert other in page("")
