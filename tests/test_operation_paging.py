"""Paging delete operations (GET /v1/operations, the Operations page, the HTTP engine): each
operation is listed once however the list changes while someone pages through it."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from lifecycle.engine.http import HttpEngine
from lifecycle.models import DeleteOperation
from lifecycle.operation_paging import OperationCursor, scope_of
from tests import factories
from tests.scripted_engine import scripted_engine

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
T0 = timezone.now().replace(microsecond=0) - timedelta(days=1)


def make_ops(n: int, *, state: str = "refused", start: int = 0, same_moment: bool = False) -> list[str]:
    """n operations, the later-numbered ones requested later (or all at one moment: then the
    order falls to their row numbers). Returns their ids, oldest first."""
    ids = []
    for i in range(start, start + n):
        op = DeleteOperation.objects.create(
            conversation=factories.make_conversation(), state=state, reason="conversation_busy",
            requested_at=T0 if same_moment else T0 + timedelta(minutes=i),
        )
        ids.append(op.public_id)
    return ids


def newest_first(ids: list[str]) -> list[str]:
    return list(reversed(ids))


def walk(api: Client, query: str = "", *, first: str = "") -> list[list[str]]:
    """Every page by `next`, as lists of ids."""
    pages, position = [], first
    while True:
        answer = api.get(f"/v1/operations?limit=2{query}{position}")
        assert answer.status_code == 200, answer.content
        body = answer.json()
        pages.append([o["id"] for o in body["results"]])
        if body["next"] is None:
            return pages
        position = f"&cursor={body['next']}"


@pytest.mark.parametrize("same_moment", [False, True], ids=["moments", "one-moment"])
def test_pages_list_every_operation_once_newest_first_and_previous_goes_back(api, same_moment):
    ids = make_ops(5, same_moment=same_moment)
    pages = walk(api)
    assert pages == [newest_first(ids)[0:2], newest_first(ids)[2:4], newest_first(ids)[4:5]]
    first = api.get("/v1/operations?limit=2").json()
    assert first["previous"] is None
    second = api.get(f"/v1/operations?limit=2&cursor={first['next']}").json()
    back = api.get(f"/v1/operations?limit=2&cursor={second['previous']}").json()
    assert [o["id"] for o in back["results"]] == pages[0] and back["previous"] is None
    assert back["next"] == first["next"]


def test_an_operation_requested_between_pages_repeats_no_row(api):
    ids = make_ops(4)
    first = api.get("/v1/operations?limit=2").json()
    newer = make_ops(1, start=10)  # requested while the reader looks at the first page
    second = api.get(f"/v1/operations?limit=2&cursor={first['next']}").json()
    assert [o["id"] for o in second["results"]] == newest_first(ids)[2:4]
    assert second["next"] is None
    # Going back shows the rows before the second page; the new one is first on a fresh read.
    assert api.get("/v1/operations?limit=1").json()["results"][0]["id"] == newer[0]


def test_an_operation_leaving_the_filter_between_pages_skips_no_other(api):
    ids = make_ops(5, state="pending")
    first = api.get("/v1/operations?limit=2&state=pending").json()
    assert [o["id"] for o in first["results"]] == newest_first(ids)[0:2]
    DeleteOperation.objects.filter(public_id=ids[-1]).update(state="completed")  # the first row completes
    rest = walk(api, "&state=pending", first=f"&cursor={first['next']}")
    assert sum(rest, []) == newest_first(ids)[2:5]


def test_the_offset_of_the_old_contract_positions_the_first_page_and_next_continues_by_key(api):
    ids = make_ops(5)
    by_offset = api.get("/v1/operations?limit=2&offset=2").json()
    assert [o["id"] for o in by_offset["results"]] == newest_first(ids)[2:4]
    assert by_offset["previous"] is not None
    # A client of the old contract passes `next` back as `offset`: that works as a cursor.
    rest = api.get(f"/v1/operations?limit=2&offset={by_offset['next']}").json()
    assert [o["id"] for o in rest["results"]] == newest_first(ids)[4:5] and rest["next"] is None
    assert api.get("/v1/operations?limit=2&offset=9").json() == {"results": [], "next": None, "previous": None}


def _token(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("query", [
    "cursor=nonsense",
    "cursor=" + _token("o1|f|2026-01-01T00:00:00|5"),  # a naive moment
    "cursor=" + _token("o2|f|2026-01-01T00:00:00+00:00|5"),  # an unknown version
    "cursor=" + _token("o1|x|2026-01-01T00:00:00+00:00|5"),
    "cursor=" + _token("o1|f|2026-01-01T00:00:00+00:00|-5"),
    "cursor=" + _token("o1|f|0001-01-01T00:00:00+23:59|5"),  # outside the years a database holds
    "cursor=" + _token("o1|f|2026-01-01T00:00:00+00:00|" + "9" * 19),
    "offset=-1",
    "offset=1000001",
    "offset=%C2%B2",  # a superscript two is not a whole number
    "cursor=" + "A" * 201,
])
def test_a_position_that_cannot_be_used_is_refused(api, query):
    make_ops(2)
    answer = api.get(f"/v1/operations?{query}")
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor")


def test_an_offset_past_the_published_bound_says_so(api):
    """r75: it answered "The cursor is not valid." to a client that sent no cursor, for a bound
    published nowhere; the parameter's description now gives it, and the refusal says it."""
    make_ops(2)
    answer = api.get("/v1/operations?offset=2147483647")
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor")
    assert answer.json()["message"] == "An offset skips at most 1,000,000 rows: follow the pages' next instead."
    for bad in ("-1", "1e3", "abc"):  # r80: no cursor was sent
        answer = api.get(f"/v1/operations?offset={bad}").json()
        assert (answer["code"], answer["message"]) == (
            "invalid_cursor", "The offset is neither a whole number of rows nor a cursor a page handed out."), bad
    spanish = api.get("/v1/operations?offset=1000001", HTTP_ACCEPT_LANGUAGE="es").json()["message"]
    assert "1\xa0000\xa0000 filas" in spanish  # r77: "1,000,000", the English way; as Spanish pages write it now
    assert api.get("/v1/operations?offset=1000000").json() == {"results": [], "next": None, "previous": None}
    schema = api.get("/v1/openapi.json").json()
    [offset] = [p for p in schema["paths"]["/v1/operations"]["get"]["parameters"] if p["name"] == "offset"]
    assert "at most 1,000,000" in offset["schema"]["anyOf"][0]["description"]


def test_a_cursor_and_an_offset_together_are_refused(api):
    make_ops(2)
    answer = api.get("/v1/operations?offset=0&cursor=" + OperationCursor(T0, 1).encode())
    assert (answer.status_code, answer.json()["code"]) == (400, "invalid_filter")


def test_the_operations_page_pages_by_key_and_a_bad_link_shows_the_first_page(admin_client):
    ids = make_ops(27)  # a page holds 25
    first = admin_client.get("/operations/", **HOST)
    content = first.content.decode()
    assert ids[-1] in content and ids[1] not in content and ">Previous<" not in content
    assert ">Next<" in content
    next_href = content.split('cursor=', 1)[1].split('"', 1)[0]
    second = admin_client.get(f"/operations/?cursor={next_href}", **HOST).content.decode()
    assert ids[1] in second and ids[0] in second and ids[-1] not in second
    assert ">Previous<" in second and ">Next<" not in second
    mangled = admin_client.get("/operations/?cursor=zz", **HOST)
    assert mangled.status_code == 200 and ids[-1] in mangled.content.decode()


def test_a_page_whose_rows_all_changed_says_so_and_links_to_the_newest(admin_client):
    ids = make_ops(3, state="pending")
    after_newest = OperationCursor(T0 + timedelta(minutes=2), DeleteOperation.objects.get(public_id=ids[2]).pk,
                                   scope=scope_of("pending"))
    DeleteOperation.objects.filter(public_id__in=ids[:2]).update(state="completed")
    content = admin_client.get(f"/operations/?state=pending&cursor={after_newest.encode()}", **HOST).content.decode()
    assert "they changed since the list was read" in content
    assert '<a class="btn" href="?state=pending">Show the newest</a>' in content  # a 44 px target


# ---- The console over HTTP: the position is passed through to the engine ----------------------


def operation_row(n: int) -> dict:
    return {"id": f"op_{n:020x}", "target": "c_" + "a" * 20, "state": "refused", "code": "conversation_busy",
            "requested_at": "2026-01-01T00:00:00Z"}


def test_the_http_engine_passes_positions_of_either_contract_through(settings):
    def pages(handler):
        if "offset=2" in handler.path:  # an older engine: whole numbers
            return 200, {"results": [operation_row(3)], "next": None}
        return 200, {"results": [operation_row(1), operation_row(2)], "next": 2}

    with scripted_engine({("GET", "/v1/operations"): pages}) as (url, seen):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
        engine = HttpEngine()
        page = engine.operations(limit=2)
        assert ([r.id for r in page.rows], page.next, page.previous) == ([operation_row(1)["id"], operation_row(2)["id"]], "2", None)
        rest = engine.operations(limit=2, position=page.next)
        assert [r.id for r in rest.rows] == [operation_row(3)["id"]] and rest.next is None
    assert [path for method, path in seen if path.startswith("/v1/operations")] == [
        "/v1/operations?limit=2", "/v1/operations?limit=2&offset=2"]


@pytest.mark.parametrize("bad_next", [-1, 1.5, True, "", "tab\there", "é", "x" * 201, ["2"]])
def test_the_http_engine_refuses_a_page_position_it_cannot_pass_on(settings, bad_next):
    from lifecycle.engine.http import EngineBadAnswer

    with scripted_engine({("GET", "/v1/operations"): lambda h: (200, {"results": [], "next": bad_next})}) as (url, _):
        settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
        with pytest.raises(EngineBadAnswer):
            HttpEngine().operations()


def test_a_cursor_of_another_states_list_is_refused(api):
    """r16: a `next` of the Refused list used on the Completed one skipped completed rows."""
    make_ops(3, state="refused")
    make_ops(3, state="completed", start=3)
    foreign = api.get("/v1/operations?state=refused&limit=1").json()["next"]
    for query in ("state=completed", ""):
        answer = api.get(f"/v1/operations?{query}&limit=200&cursor={foreign}")
        assert (answer.status_code, answer.json()["code"]) == (400, "invalid_cursor"), query
    assert len(api.get(f"/v1/operations?state=refused&limit=200&cursor={foreign}").json()["results"]) == 2


@pytest.mark.skipif("connection.vendor != 'sqlite'", reason="SQLite's planner, without statistics")
@pytest.mark.parametrize("state", ["completed", "refused", "pending", "unavailable", None])
def test_every_tab_reads_its_page_from_an_index_in_order_never_sorting_the_table(state):
    """r142: SQLite read the Completed tab through the facts expiry's partial index and sorted
    every completed delete for each page of 50 (195 ms at 50,000 deletes, 5 ms by the index)."""
    qs = DeleteOperation.objects.all() if state is None else DeleteOperation.objects.filter(state=state)
    sql, params = qs.order_by("-requested_at", "-id")[:51].query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
        plan = " / ".join(row[-1] for row in cursor.fetchall())
    assert "TEMP B-TREE" not in plan and "USING INDEX delete_op_" in plan, plan
