"""A remote engine (or something in front of it) that answers badly: redirects, error pages,
timeouts, answers nested too deeply, oddly shaped operations, never-ending lists. The console
keeps a bound delete Pending unless the engine's own word ends it, never answers 500, never
passes the engine's status on as its own, and is held by an engine call for a bounded time."""

from __future__ import annotations

import time

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from console.models import ApiToken
from lifecycle.engine.http import EngineBadAnswer, EngineUnreachable, HttpEngine
from remote import delivery, receipts, sync
from remote.models import BoundDelete, EngineBinding
from tests import factories
from tests.scripted_engine import scripted_engine
from tests.test_remote_answers import NONE_LEFT_OUT

pytestmark = pytest.mark.django_db

TARGET, OTHER = "c_" + "a" * 20, "c_" + "b" * 20
OP = "op_" + "1" * 20
DEEP = b"[" * 5000 + b"]" * 5000
PENDING = {"id": OP, "target": TARGET, "state": "pending", "code": None}
RECEIPT = {"stores": [{"store": "lifecycle.Item", "action": "erased", "records": 2, "bytes": 10}]}
COMPLETED = {**PENDING, "state": "completed", "requested_at": "2026-01-01T00:00:00Z",
             "completed_at": "2026-01-01T00:00:01Z", "receipt": RECEIPT}


def point_at(settings, url: str) -> None:
    settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
    settings.ENGINE_READ_TIMEOUT, settings.REMOTE_RETRY_SECONDS, settings.REMOTE_RETRY_MAX_SECONDS = 2, 60, 300


def binding(engine_id: str = TARGET) -> EngineBinding:
    return EngineBinding.objects.create(engine_id=engine_id, owner_kind="account", owner_id=1, scope="bound",
                                        thread_id="t1", title="Secret title", engine_state="live")


def admin() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(factories.make_user("adm", admin=True))
    return client


def answering_with(row: dict) -> dict:
    """Routes of an engine whose one operation (listed, read, or answering a delete) is `row`."""
    return {("GET", "/v1/operations/"): lambda h: (200, row),
            ("GET", "/v1/operations?"): lambda h: (200, {"results": [row], "next": None}),
            ("DELETE", "/v1/threads/"): lambda h: (202, row)}


def html(status: int) -> tuple[int, bytes]:
    return status, b"<html><body>Sign in</body></html>"


# ---- the bound delete: only the engine's own word ends it ------------------------------------


@pytest.mark.parametrize("answer", [(302, b""), (307, b""), html(404), html(410), html(400), (408, b""),
                                    (409, {"code": "conflict", "message": "x"}), (404, {"code": "not_found"})])
def test_an_answer_met_while_following_the_erasure_keeps_the_delete_pending_and_it_completes_after(settings, answer):
    """The engine admitted the delete (it gave an operation): a redirect, an error page, a
    timeout status or even a refusal met while following it is not "nothing was deleted"."""
    state = {"bad": True}

    def follow(_handler):
        return answer if state["bad"] else (200, COMPLETED)

    routes = {("DELETE", "/v1/threads/"): lambda h: (202, PENDING), ("GET", "/v1/operations/"): follow}
    with scripted_engine(routes) as (url, seen):
        point_at(settings, url)
        made = binding()
        op = delivery.request_bound_delete(made, key="k-follow", actor=None)
        assert delivery.deliver(op.pk, budget=0.5) == "pending"  # the engine admitted it: an operation
        op.refresh_from_db()
        assert (op.engine_operation, op.engine_state) == (OP, "pending")
        assert delivery.deliver(op.pk, budget=0.5) == "pending"  # following it meets the answer
        op.refresh_from_db()
        assert (op.state, op.code) == ("pending", "")
        assert op.last_error in ("engine_error", "engine_bad_answer", "engine_unreachable")
        assert EngineBinding.objects.filter(pk=made.pk).exists()
        state["bad"] = False
        BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
        assert delivery.deliver(op.pk, budget=5) == "completed"
    op.refresh_from_db()
    assert (op.state, op.last_error, op.receipt) == ("completed", "", RECEIPT)
    assert not EngineBinding.objects.filter(pk=made.pk).exists()
    # an operation the engine said it does not know was asked for again with the same key
    deletes = [path for method, path in seen if method == "DELETE"]
    assert len(deletes) == (2 if answer == (404, {"code": "not_found"}) else 1)


def test_an_engine_delete_that_stopped_retrying_itself_is_said_to_wait_for_the_engines_operator(settings):
    """The engine's erasure stalled (its own page offers its admin a Retry): the console said
    "it is erasing the conversation" for as long as that lasted. It says who can move it, keeps
    following, and completes once the engine's operator retried it."""
    from ops.jobs import record_run
    from remote.status import waiting_text

    record_run("ops.tasks.heartbeat", success=True, seconds=0.01)  # a job cluster runs (the page reads it)

    state = {"answer": {**PENDING, "error": "unsafe_path", "stalled": True}}
    routes = {("DELETE", "/v1/threads/"): lambda h: (202, PENDING),
              ("GET", "/v1/operations/"): lambda h: (200, state["answer"])}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-stalled", actor=None)
        assert delivery.deliver(op.pk, budget=0.5) == "pending"
        assert delivery.deliver(op.pk, budget=0.5) == "pending"
        op.refresh_from_db()
        assert (op.state, op.last_error, op.engine_state) == ("pending", "engine_stalled", "pending")
        seen_at = op.last_error_at  # r52: the time of an earlier error, or none
        assert seen_at is not None and seen_at >= op.requested_at
        assert delivery.deliver(op.pk, budget=0.5) == "pending"  # still stalled: the time it was first seen
        op.refresh_from_db()
        assert op.last_error_at == seen_at
        assert waiting_text(op, None) == ("Waiting for the engine: its erasure stopped retrying by itself; the engine's "
                                    "operator can retry it there.")
        page = admin().get(f"/engine/deletes/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
        assert "stopped retrying by itself" in page and "it is erasing the conversation" not in page
        state["answer"] = {**PENDING, "stalled": False}  # retried there: erasing again
        assert delivery.deliver(op.pk, budget=0.5) == "pending"
        op.refresh_from_db()
        assert op.last_error == "" and waiting_text(op, None) == "Waiting for the engine: it is erasing the conversation."
        state["answer"] = COMPLETED
        assert delivery.deliver(op.pk, budget=5) == "completed"


@pytest.mark.parametrize("answer", [(302, b""), html(400), html(410), (408, b"")])
def test_a_redirect_or_an_error_page_at_the_delete_itself_is_retried_not_unavailable(settings, answer):
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: answer}) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-page", actor=None)
        delivery.deliver(op.pk, budget=0.5)
    op.refresh_from_db()
    assert (op.state, op.code) == ("pending", "")
    assert op.last_error in ("engine_bad_answer", "engine_unreachable")


def test_the_engines_own_refusal_of_a_first_request_ends_it_and_clears_the_reasons_met_before(settings):
    answers = iter([(503, b""), (409, {"code": "conversation_busy", "message": "Busy."})])
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: next(answers)}) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-refused", actor=None)
        delivery.deliver(op.pk, budget=0.5)
        op.refresh_from_db()
        assert (op.state, op.last_error) == ("pending", "engine_unreachable")
        BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
        delivery.deliver(op.pk, budget=0.5)
    op.refresh_from_db()
    assert (op.state, op.code, op.last_error) == ("unavailable", "conversation_busy", "")


def test_not_offered_after_an_earlier_request_may_have_reached_the_engine_stays_pending(settings):
    """A first DELETE whose answer was lost, then "not implemented" (a proxy, a downgrade): the
    first may have been applied, so "nothing was deleted" would not be true."""
    answers = iter([(503, b""), (501, b"")])
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: next(answers)}) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-later", actor=None)
        delivery.deliver(op.pk, budget=0.5)
        BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
        delivery.deliver(op.pk, budget=0.5)
    op.refresh_from_db()
    assert (op.state, op.attempts, op.last_error) == ("pending", 2, "engine_bad_answer")


@pytest.mark.parametrize("then", [html(404), (501, b""), (405, b"")])
def test_not_offered_after_a_lost_answer_within_the_same_call_stays_pending_and_completes(settings, then):
    """The first DELETE reached the engine and its answer was lost; the call's own quick retry
    met an error page from something in front of the engine: the delete ended Unavailable,
    "nothing was deleted", while the engine had erased the conversation (r60)."""
    from lifecycle.models import AuditFact

    sends = []

    def delete(handler):
        sends.append(handler.path)
        if len(sends) == 1:  # applied, then the connection is dropped before any answer
            handler.close_connection = True
            return None
        return then if len(sends) == 2 else (202, COMPLETED)  # the engine's word on the key

    with scripted_engine({("DELETE", "/v1/threads/"): delete}) as (url, _seen):
        point_at(settings, url)
        settings.ENGINE_RETRIES = 2
        made = binding()
        op = delivery.request_bound_delete(made, key="k-lost", actor=None)
        assert delivery.deliver(op.pk, budget=0.5) == "pending"
        op.refresh_from_db()
        assert (op.state, op.code, op.attempts, op.last_error) == ("pending", "", 1, "engine_bad_answer")
        assert EngineBinding.objects.filter(pk=made.pk).exists() and len(sends) == 2
        assert not AuditFact.objects.filter(action="conversation.delete_ended").exists()
        BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
        assert delivery.deliver(op.pk, budget=5) == "completed"
    op.refresh_from_db()
    assert (op.state, op.receipt) == ("completed", RECEIPT)
    assert not EngineBinding.objects.filter(pk=made.pk).exists()


def test_the_wait_doubles_while_following_an_accepted_erasure_that_cannot_be_read(settings):
    """The engine accepted the delete, then its operation could not be read: every retry came
    at the first wait (REMOTE_RETRY_SECONDS) for ever, as the back-off counted only the delete's
    own requests (r60). It doubles up to the cap, and a usable answer starts it again."""
    state = {"answer": (503, b"")}
    routes = {("DELETE", "/v1/threads/"): lambda h: (202, PENDING), ("GET", "/v1/operations/"): lambda h: state["answer"]}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)  # 60 s doubling, 300 s cap
        op = delivery.request_bound_delete(binding(), key="k-backoff", actor=None)
        assert delivery.deliver(op.pk, budget=0.5) == "pending"  # admitted: an operation to follow
        waits = []
        for answer in [(503, b""), (200, {**PENDING, "target": OTHER}), (503, b""), (503, b""), (503, b"")]:
            state["answer"] = answer
            BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
            assert delivery.deliver(op.pk, budget=0.5) == "pending"
            op.refresh_from_db()
            waits.append((op.next_attempt_at - op.last_error_at).total_seconds())
        assert waits == [60, 120, 240, 300, 300]
        assert (op.attempts, op.failures) == (1, 5)
        state["answer"] = (200, PENDING)  # read again: the wait starts over
        BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
        delivery.deliver(op.pk, budget=0.5)
        op.refresh_from_db()
        assert op.failures == 0
        state["answer"] = (503, b"")
        BoundDelete.objects.filter(pk=op.pk).update(next_attempt_at=None)
        delivery.deliver(op.pk, budget=0.5)
        op.refresh_from_db()
        assert (op.next_attempt_at - op.last_error_at).total_seconds() == 60


@pytest.mark.parametrize("bad", [{"id": "op_" + "9" * 40}, {"state": "erasing"}, {"state": ["pending"]},
                                 {"step": {"a": 1}}, {"code": ["x"], "state": "refused"}])
def test_an_operation_this_console_cannot_keep_is_not_taken_and_nothing_fails(settings, bad):
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, {**PENDING, **bad})}) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-odd", actor=None)
        delivery.deliver(op.pk, budget=0.5)
    op.refresh_from_db()
    if "code" in bad:  # refused by the engine, its code not one this console reads
        assert (op.state, op.code) == ("refused", "engine_error")
    elif "step" in bad:  # followed; the step it cannot show is left out
        assert (op.state, op.engine_operation, op.engine_step) == ("pending", OP, "")
    else:
        assert (op.state, op.last_error, op.engine_operation) == ("pending", "engine_bad_answer", "")


def test_a_refused_delete_takes_no_title_from_an_answer_about_another_conversation(settings):
    refused = {**PENDING, "state": "refused", "code": "conversation_busy"}
    routes = {("DELETE", "/v1/threads/"): lambda h: (202, refused),
              ("GET", "/v1/threads/"): lambda h: (200, {"id": OTHER, "state": "live", "title": "Another (secret)"})}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        made = binding()
        op = delivery.request_bound_delete(made, key="k-title", actor=None)
        delivery.deliver(op.pk, budget=0.5)
    made.refresh_from_db()
    assert made.title == ""


# ---- pages and API: no 500, no relayed status ------------------------------------------------


@pytest.mark.parametrize("answer", [(302, b""), html(404), (404, {"code": "engine_refused", "message": ""}),
                                    html(400), (409, {"code": "conflict"}), (410, b""),
                                    (401, {"code": "token_expired", "message": "m"}), (200, DEEP)])
def test_the_operations_page_says_the_engine_cannot_list_instead_of_a_server_error(settings, answer):
    with scripted_engine({("GET", "/v1/operations"): lambda h: answer}) as (url, _seen):
        point_at(settings, url)
        response = admin().get("/operations/", HTTP_HOST="127.0.0.1")
    assert response.status_code == 503
    assert b"Delete operations" in response.content or b"engine" in response.content


@pytest.mark.parametrize("fields", [{"code": ["x"]}, {"state": "pending", "error": {"a": 1}},
                                    {"receipt": {"stores": [], "holders": 5}},
                                    {"receipt": {"stores": "x", "physical": "x", "verification": "y", "kept": 3}},
                                    {"receipt": {"verification": {"physical": "found", "physical_files": {"erasable": "x"},
                                                                  "logical": "found", "findings": "many",
                                                                  "unscanned": ["x"]}}},
                                    {"attempts": "many", "step": 5, "message": {"a": 1}},
                                    {"way_out": {"ambiguous": [5, "x", {"agent_id": "sa"}]}}])
def test_operation_pages_take_an_oddly_shaped_operation(settings, fields):
    row = {**PENDING, "state": "completed", **fields}
    routes = {("GET", "/v1/operations/"): lambda h: (200, row),
              ("GET", "/v1/operations?"): lambda h: (200, {"results": [row]})}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        client = admin()
        statuses = [client.get(path, HTTP_HOST="127.0.0.1").status_code for path in ("/operations/", f"/operations/{OP}/")]
    assert statuses == [200, 200]


@pytest.mark.parametrize("op_id", ["op/../x", "op_1?x", "op 1", "op_\u00e9", "op_" + "9" * 40])
def test_an_operation_id_the_console_cannot_link_to_is_a_bad_answer_not_a_server_error(settings, op_id):
    """The pages put the engine's operation id in their own addresses: a "/" made no link at all
    (the whole Operations page failed, for everyone), other odd ids are no id this console keeps."""
    row = {**PENDING, "id": op_id}
    with scripted_engine(answering_with(row)) as (url, _seen):
        point_at(settings, url)
        client = admin()
        pages = [client.get(path, HTTP_HOST="127.0.0.1") for path in ("/operations/", f"/operations/{OP}/")]
        with pytest.raises(EngineBadAnswer):
            HttpEngine(url, "t", retries=0).request_delete(TARGET, key="k-id", actor=None)
    assert [page.status_code for page in pages] == [503, 503]
    assert all(b"could not be used" in page.content for page in pages)


@pytest.mark.parametrize("op_id", ["op/../x", ["op_1"]])
def test_a_refusal_naming_an_operation_the_console_cannot_ask_for_is_a_bad_answer(settings, op_id):
    refusal = {"code": "not_admitted", "message": "No.", "outcome": "refused", "operation": op_id}
    with (scripted_engine({("DELETE", "/v1/threads/"): lambda h: (409, refusal)}) as (url, seen),
          pytest.raises(EngineBadAnswer)):
        HttpEngine(url, "t", retries=0).request_delete(TARGET, key="k-refused", actor=None)
    assert [method for method, _path in seen] == ["DELETE"]  # that id was not asked for


@pytest.mark.parametrize("fields", [{"error": "x\ud800"}, {"error": "x\x00"}, {"message": "\udfff"},
                                    {"receipt": {"stores": [{"store": "lifecycle.Item\x00", "action": "erased"}]}},
                                    {"receipt": {"kept": [{"store": "x"}], "\ud800": 1}}],
                         ids=["surrogate-error", "nul-error", "surrogate-message", "nul-receipt", "surrogate-key"])
def test_an_operation_with_text_no_page_can_show_or_database_keep_is_a_bad_answer(settings, fields):
    """A lone surrogate fails any page that shows it, NUL fails PostgreSQL's writes: on both
    databases the answer is not taken (the pages say so; a bound delete keeps no receipt)."""
    row = {**COMPLETED, **fields}
    with scripted_engine(answering_with(row)) as (url, _seen):
        point_at(settings, url)
        client = admin()
        pages = [client.get(path, HTTP_HOST="127.0.0.1") for path in ("/operations/", f"/operations/{OP}/")]
        op = delivery.request_bound_delete(binding(), key="k-text", actor=None)
        delivery.deliver(op.pk, budget=0.5)
    assert [page.status_code for page in pages] == [503, 503]
    op.refresh_from_db()
    assert (op.state, op.last_error, op.receipt, op.engine_operation) == ("pending", "engine_bad_answer", None, "")


@pytest.mark.parametrize("answer", [html(500), (302, b""), html(409), (200, DEEP)])
def test_the_operation_page_is_not_a_not_found_for_an_engine_that_cannot_say(settings, answer):
    with scripted_engine({("GET", "/v1/operations/"): lambda h: answer}) as (url, _seen):
        point_at(settings, url)
        response = admin().get(f"/operations/{OP}/", HTTP_HOST="127.0.0.1")
    assert response.status_code in (502, 503)


@pytest.mark.parametrize("body", [b"", b"[]", b"null", b'"ok"', DEEP, {"id": OTHER, "archived": True, "closed": False},
                                  {"id": TARGET, "archived": False, "closed": False}])
def test_archive_says_it_could_not_use_the_answer_unless_it_is_this_conversation_archived(settings, body):
    with scripted_engine({("PATCH", "/v1/threads/"): lambda h: (200, body)}) as (url, _seen):
        point_at(settings, url)
        client = admin()
        response = client.post(f"/conversations/{TARGET}/archive/", {"archived": "1"}, HTTP_HOST="127.0.0.1")
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == ["The engine's answer could not be used."]


def test_close_says_closed_only_when_the_engine_says_so(settings):
    answer = {"id": TARGET, "archived": False, "closed": True}
    with scripted_engine({("PATCH", "/v1/threads/"): lambda h: (200, answer)}) as (url, _seen):
        point_at(settings, url)
        response = admin().post(f"/conversations/{TARGET}/close/", {"closed": "1"}, HTTP_HOST="127.0.0.1")
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Closed: no turn runs in it and no process holds it until it is resumed."]


@pytest.mark.parametrize("answer", [(302, b""), (401, {"code": "token_expired", "message": "m"}),
                                    (403, {"code": "forbidden"}), html(404), (200, DEEP)])
def test_the_sync_api_does_not_pass_the_engines_status_on_as_its_own(settings, answer):
    with scripted_engine({("GET", "/v1/threads"): lambda h: answer}) as (url, _seen):
        point_at(settings, url)
        _token, raw = ApiToken.issue(factories.make_user("adm2", admin=True))
        response = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
            "/api/v1/bindings-sync", HTTP_HOST="127.0.0.1", content_type="application/json")
    assert response.status_code in (409, 502, 503)
    assert response.json()["error"]["message"] if "error" in response.json() else response.json()["message"]


def test_a_list_of_empty_pages_without_end_stops_the_sync(settings):
    asked = []

    def pages(_handler):
        asked.append(1)
        return 200, {"results": [], "next": f"n{len(asked)}"}

    with scripted_engine({("GET", "/v1/threads"): pages}) as (url, _seen):
        point_at(settings, url)
        with pytest.raises(EngineBadAnswer):
            sync.refresh("")
    assert len(asked) == sync.EMPTY_PAGES


# ---- the client itself ---------------------------------------------------------------------


def test_a_call_with_its_retries_ends_within_its_deadline(settings):
    """An engine that answers 503 slowly: the retries stop once the call's time is used."""

    def slow(_handler):
        time.sleep(0.4)
        return 503, b""

    with scripted_engine({("GET", "/v1/threads/"): slow}) as (url, seen):
        engine = HttpEngine(url, "t", connect_timeout=0.2, read_timeout=0.5, retries=10)
        started = time.monotonic()
        with pytest.raises(EngineUnreachable):
            engine.thread(TARGET)
        took = time.monotonic() - started
    assert took < 0.2 + 2 * 0.5 + 0.3  # the deadline, and the watchdog's cut
    assert 1 <= len(seen) < 11


def test_a_deeply_nested_answer_is_a_bad_answer(settings):
    with (scripted_engine({("GET", "/v1/operations/"): lambda h: (200, DEEP)}) as (url, _seen),
          pytest.raises(EngineBadAnswer)):
        HttpEngine(url, "t", retries=0).operation(OP)


def test_one_receipt_that_fails_to_be_read_does_not_hold_up_the_others(settings, monkeypatch):
    from django.utils import timezone

    now = timezone.now()
    made = []
    for n, engine_id in enumerate((TARGET, OTHER)):
        made.append(BoundDelete.objects.create(
            key=f"k{n}", binding_ref=f"b{n}", engine_id=engine_id, owner_kind="account", owner_id=1, scope="bound",
            thread_id=f"t{n}", requested_at=now, state="completed", completed_at=now, engine_operation=f"op_{n}",
            receipt=RECEIPT, receipt_at=now, acknowledged_at=now, receipt_next_read_at=now))
    real = receipts._read_one

    def first_fails(op, at, engines):
        if op.pk == made[0].pk:
            raise RuntimeError("unexpected")
        receipts._store(op, receipt_next_read_at=None)
        return "unchanged"

    monkeypatch.setattr(receipts, "_read_one", first_fails)
    counts = receipts.read_again(now)
    monkeypatch.setattr(receipts, "_read_one", real)
    assert counts["not_taken"] == 1 and counts["unchanged"] == 1
    made[0].refresh_from_db()
    assert made[0].receipt_next_read_at > now  # not first in line again


def busy(status: int, wait: str):
    """A route answering `status` with `Retry-After: wait` (the engine or a proxy throttling)."""
    def route(handler):
        raw = b'{"code": "busy", "message": "later"}'
        handler.send_response(status)
        handler.send_header("Retry-After", wait)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)
    return route


@pytest.mark.parametrize(("status", "wait", "at_least", "at_most"), [
    (429, "120", 120, 121),  # longer than the console's own first wait (60 s here): taken
    (503, "10", 60, 61),  # shorter: the console's own wait stands
    (429, "999999999", 300, 301),  # absurd: capped at REMOTE_RETRY_MAX_SECONDS
    (503, "Wed, 21 Oct 2099 07:28:00 GMT", 300, 301),  # an HTTP date far ahead: capped too
    (429, "soon", 60, 61),  # not a Retry-After: the console's own wait
])
def test_a_throttling_engine_is_not_asked_again_sooner_than_it_said(settings, status, wait, at_least, at_most):
    from datetime import timedelta

    from django.utils import timezone

    with scripted_engine({("DELETE", "/v1/threads/"): busy(status, wait)}) as (url, seen):
        point_at(settings, url)
        settings.ENGINE_RETRIES = 2  # retries within the call: none sooner than the engine asked
        op = delivery.request_bound_delete(binding(), key="k-throttled", actor=None)
        before = timezone.now()
        assert delivery.deliver(op.pk, budget=0.5) == "pending"
        op.refresh_from_db()
    assert (op.state, op.last_error) == ("pending", "engine_unreachable")
    assert before + timedelta(seconds=at_least - 1) <= op.next_attempt_at <= timezone.now() + timedelta(seconds=at_most)
    # Asked to wait, the call is not retried within itself; without a usable Retry-After it is.
    assert len([path for method, path in seen if method == "DELETE"]) == (3 if wait == "soon" else 1)


# ---- r40: answers the retries, the database or the calendar could not take ----------------------


@pytest.mark.parametrize("answer", [html(200), (200, b"x" * 10), (200, DEEP), (200, b'{"a": NaN}'),
                                    (200, b'{"a": "\\ud800"}')])
def test_a_bad_answer_with_retries_left_is_a_bad_answer_not_a_server_error(settings, answer):
    """With retries (the default: ENGINE_RETRIES=2) an unusable 2xx answer raised AttributeError
    in the retry loop: 500 on the Operations page, the sync API and the delete's job (r40)."""
    with scripted_engine({("GET", "/v1/operations"): lambda h: answer,
                          ("GET", "/v1/threads"): lambda h: answer}) as (url, _seen):
        point_at(settings, url)
        settings.ENGINE_RETRIES = 2
        with pytest.raises(EngineBadAnswer):
            HttpEngine(url, "t", retries=2).operation(OP)
        assert admin().get("/operations/", HTTP_HOST="127.0.0.1").status_code == 503
        _token, raw = ApiToken.issue(factories.make_user("adm3", admin=True))
        synced = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
            "/api/v1/bindings-sync", HTTP_HOST="127.0.0.1", content_type="application/json")
        assert synced.status_code in (502, 503) and synced.json()["code"] == "engine_bad_answer"


def answered_badly_then_well(settings, bad: dict | bytes, good: dict, *, meanwhile=None) -> BoundDelete:
    """A bound delete whose engine answers `bad` (to the delete, its operation and the list of
    operations), then `good`. After the bad answer the delete is Pending as engine_bad_answer,
    nothing of the answer stored, its binding kept (`meanwhile(op)` runs then, the engine still
    answering badly); it is returned after the next run, once the engine answered well."""
    answers = [bad]

    def listed(_handler):
        last = answers[-1]
        return 200, (b'{"results": [%s], "next": null}' % last if isinstance(last, bytes)
                     else {"results": [last], "next": None})

    routes = {("DELETE", "/v1/threads/"): lambda h: (202, answers[-1]),
              ("GET", "/v1/operations/"): lambda h: (200, answers[-1]), ("GET", "/v1/operations?"): listed}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-bad-then-good", actor=None)
        delivery.deliver(op.pk, budget=0.5)
        op.refresh_from_db()
        assert (op.state, op.last_error, op.receipt, op.receipt_at) == ("pending", "engine_bad_answer", None, None)
        assert EngineBinding.objects.filter(engine_id=TARGET).exists()  # still needed
        if meanwhile is not None:
            meanwhile(op)
        answers.append(good)
        BoundDelete.objects.filter(pk=op.pk).update(lease_holder="", lease_expires_at=None, next_attempt_at=None)
        delivery.deliver(op.pk, budget=0.5)
    op.refresh_from_db()
    return op


@pytest.mark.parametrize("receipt", [
    b'{"stores": [], "verification": {"logical": "clean", "findings": NaN}}',
    b'{"stores": [], "verification": {"logical": "clean", "findings": 1e999}}',
    {"stores": [], "kept": [{"store": "lifecycle.AuditFact", "action": "kept", "records": 3, "days": 999999999}]},
    {"stores": [], "kept": [{"store": "lifecycle.AuditFact", "action": "kept", "records": -1}]},
    {"stores": [], "kept": "all"},
], ids=["nan", "too-large-a-float", "endless-period", "negative", "not-a-list"])
def test_a_receipt_the_console_cannot_keep_leaves_the_delete_pending_without_a_crash(settings, receipt):
    """A receipt with NaN failed every store (the JSON column refuses it), and a period of a billion
    days every dating of its next read: each run stopped on an unexpected error, for ever (r40).
    Now it is a bad answer: Pending, said so, and it completes once the engine answers well."""
    if isinstance(receipt, bytes):
        body = (b'{"id": "%s", "target": "%s", "state": "completed", "code": null, "requested_at": '
                b'"2026-01-01T00:00:00Z", "completed_at": "2026-01-01T00:00:01Z", "receipt": %s}'
                % (OP.encode(), TARGET.encode(), receipt))
    else:
        body = {**COMPLETED, "receipt": receipt}
    op = answered_badly_then_well(settings, body, COMPLETED)
    assert op.state == "completed" and op.receipt == RECEIPT


def test_a_later_receipt_with_a_period_no_calendar_holds_is_not_taken():
    kept = {"store": "lifecycle.AuditFact", "action": "kept", "records": 3, "days": 365}
    stored = {"stores": [], "kept": [kept]}
    assert receipts.later_receipt(stored, {"stores": [], "kept": [{**kept, "days": 400}]})
    assert not receipts.later_receipt(stored, {"stores": [], "kept": [{**kept, "days": 999999999}]})


def test_a_refused_token_is_said_so_from_the_request_on_not_cannot_be_reached(settings):
    """The first answer said "cannot be reached" for a token the engine refused, and only the
    job said what it was (r40); with offline deletes refused it was refused as offline."""
    # A server that answers 401 to everything, the API document too.
    import http.server
    import threading

    class Refusing(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self):  # noqa: N802 (the handler's name)
            self.send_response(401)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        do_DELETE = do_GET

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        point_at(settings, f"http://127.0.0.1:{server.server_port}")
        settings.LIFECYCLE_OFFLINE_DELETE = "refuse"
        op = delivery.request_bound_delete(binding(), key="k-token", actor=None)
    finally:
        server.shutdown()
    assert (op.state, op.last_error, op.waiting_on) == ("pending", "engine_credentials_refused", "console")


def test_an_engine_erasing_slowly_does_not_hold_a_job_worker(settings):
    """An engine whose own job cluster is down keeps every operation pending. Each run followed
    it for 240 s, and the minute sweep gave each due delete the same: two such deletes took both
    workers and every other job of the console queued behind them (r40). The request's run now
    follows it for RUN_BUDGET seconds, the sweep looks at each delete about once."""
    from remote import tasks

    ops = ["op_" + str(n) * 20 for n in range(1, 4)]
    targets = ["c_" + letter * 20 for letter in "def"]

    def answering(handler):
        index = next(i for i, target in enumerate(targets) if target in handler.path or ops[i] in handler.path)
        return (202 if handler.command == "DELETE" else 200), {**PENDING, "id": ops[index], "target": targets[index]}

    with scripted_engine({("DELETE", "/v1/threads/"): answering, ("GET", "/v1/operations/"): answering}) as (url, seen):
        point_at(settings, url)
        bindings = [EngineBinding.objects.create(engine_id=target, owner_kind="account", owner_id=1, scope="bound",
                                                 thread_id=f"t-{target}", title="T", engine_state="live")
                    for target in targets]
        deletes = [delivery.request_bound_delete(made, key=f"k-slow-{made.engine_id}", actor=None)
                   for made in bindings]
        for op in deletes:  # the first request of each (as its queued job sends it), then the sweep
            delivery.deliver(op.pk, budget=0)
        assert all(BoundDelete.objects.get(pk=op.pk).engine_operation for op in deletes)
        before = len(seen)
        tasks.sweep()
        looks = [path for _method, path in seen[before:] if path.startswith("/v1/operations/")]
    assert sorted(set(looks)) == sorted(f"/v1/operations/{op}" for op in ops)  # each looked at
    assert len(looks) <= 2 * len(ops)  # about once each, not for minutes
    assert all(BoundDelete.objects.get(pk=op.pk).state == "pending" for op in deletes)
    # The request's job (remote.tasks.deliver) runs with the default budget: at most RUN_BUDGET.
    import inspect

    assert inspect.signature(delivery.deliver).parameters["budget"].default == delivery.RUN_BUDGET <= 30


@pytest.mark.parametrize("completed_at", ["9999-12-31T00:00:00Z", "2999-01-01T00:00:00+00:00",
                                          "0001-01-01T00:30:00+01:00", "1969-12-31T23:59:59Z"])
def test_a_delete_completed_in_the_future_is_a_bad_answer_not_a_crash(settings, completed_at):
    """Year 9999 plus a 400-day period overflowed the dating of the receipt's next read: the
    run stopped on an unexpected error until the sweep's catch-all put it back (r43)."""
    kept = {"stores": [], "kept": [{"store": "lifecycle.UsageFact", "action": "kept", "records": 1, "days": 400}]}
    op = answered_badly_then_well(settings, {**COMPLETED, "completed_at": completed_at, "receipt": kept},
                                  {**COMPLETED, "receipt": kept})
    assert op.state == "completed" and op.receipt_next_read_at is not None


def test_a_time_without_a_zone_is_read_as_utc_and_the_dating_never_overflows():
    """The latest time an engine may give plus the longest period a receipt may state still
    has a date: the bounds of lifecycle.moments and remote.receipts keep next_read in the calendar."""
    from datetime import UTC, datetime

    from lifecycle.engine import OperationView
    from lifecycle.moments import LATEST

    view = OperationView.from_json({**COMPLETED, "completed_at": "2026-01-01T00:00:01"})
    assert view.completed_at == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    rows = {"kept": [{"store": "lifecycle.UsageFact", "action": "kept", "records": 1,
                      "days": receipts.LONGEST_PERIOD_DAYS}]}
    assert receipts.next_read(rows, LATEST, LATEST, last=LATEST) == LATEST + receipts.LONGEST_WAIT


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00", "9999-12-31T23:00:00Z", "0001-01-01T00:30:00+01:00"])
def test_engine_times_at_the_calendars_ends_are_bad_answers_on_every_page_and_left_out_of_the_sync(settings, when):
    """Year 1 and year 9999, with or without a zone: the Operations pages answered 500 in zones
    where they overflowed, and the sync and its API too (r45). Now such an operation is a bad
    answer, and such a conversation is left out of the sync, named (r123: not the whole list)."""
    row = {**COMPLETED, "requested_at": when, "completed_at": when}
    conversation = {"id": TARGET, "owner": {"kind": "account", "id": 1}, "scope": "bound", "thread_id": "t1",
                    "state": "live", "title": "T", "last_activity_at": when}
    routes = {**answering_with(row), ("GET", "/v1/threads"): lambda h: (200, {"results": [conversation],
                                                                              "next": None})}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        client = admin()
        client.cookies["lethe_timezone"] = "Asia/Tokyo" if when.endswith("Z") else "America/New_York"
        for path in ("/operations/", f"/operations/{OP}/"):
            assert client.get(path, HTTP_HOST="127.0.0.1").status_code in (200, 503), path
        with pytest.raises(EngineBadAnswer):
            HttpEngine(url, "t", retries=0).operation(OP)
        left_out = [{"id": TARGET, "field": "last_activity_at"}]
        assert sync.refresh(url)["rejected_conversations"] == left_out
        _token, raw = ApiToken.issue(factories.make_user("adm4", admin=True))
        synced = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
            "/api/v1/bindings-sync", HTTP_HOST="127.0.0.1", content_type="application/json")
        assert synced.status_code == 200 and synced.json()["rejected_conversations"] == left_out
    assert not EngineBinding.objects.exists()


def test_a_synced_time_without_a_zone_is_read_as_utc_as_operation_times_are(settings):
    from datetime import UTC, datetime

    conversation = {"id": TARGET, "owner": {"kind": "account", "id": 1}, "scope": "bound", "thread_id": "t1",
                    "state": "live", "title": "T", "last_activity_at": "2026-01-01T00:00:01"}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, {"results": [conversation], "next": None})}) as (
            url, _seen):
        point_at(settings, url)
        sync.refresh(url)
    assert EngineBinding.objects.get().last_activity_at == datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)


def test_a_figure_no_database_holds_is_a_bad_answer_not_a_page_that_fails(settings):
    """A receipt of 10**330 bytes was stored, and every page showing it (the bound delete, the
    Operations list and page) failed with a 500 for good (r46); a preview of such figures failed
    the delete confirmation."""
    from remote.preview import preview_is_usable

    huge = {"stores": [{"store": "lifecycle.Item", "action": "erased", "records": 2, "bytes": 10**330}]}
    assert not delivery.receipt_is_usable(huge)
    assert not delivery.receipt_is_usable({"stores": [{"store": "lifecycle.Item", "records": 2**63}]})
    assert delivery.receipt_is_usable({"stores": [{"store": "lifecycle.Item", "records": 2**63 - 1}]})
    assert not preview_is_usable({"target": TARGET, "stores": [{"store": "events", "bytes": 10**330}]}, TARGET)

    def pages_stand(op: BoundDelete) -> None:
        client = admin()
        assert [client.get(path, HTTP_HOST="127.0.0.1").status_code
                for path in ("/operations/", f"/operations/{OP}/", f"/engine/deletes/{op.public_id}/")] == [200] * 3

    op = answered_badly_then_well(settings, {**COMPLETED, "receipt": huge}, COMPLETED, meanwhile=pages_stand)
    assert op.state == "completed" and op.receipt == RECEIPT


def _listed(engine_id: str, thread_id: str, owner_id: int = 5) -> dict:
    return {"id": engine_id, "owner": {"kind": "account", "id": owner_id}, "scope": "bound", "thread_id": thread_id,
            "state": "live", "title": "T " + engine_id}


@pytest.mark.parametrize("where", ["on one page", "against a kept binding"])
def test_one_owners_thread_id_under_two_conversations_is_a_bad_answer_not_a_500(settings, where):
    """An engine rebuilt with new ids (or another engine at ENGINE_URL) lists a thread id an
    owner already has under another conversation: the sync, its API and its button answered 500
    every time (an IntegrityError), r62. Nothing of that page is written."""
    if where == "on one page":
        rows = [_listed("c_twin_one", "twin"), _listed("c_twin_two", "twin")]
    else:
        EngineBinding.objects.create(engine_id="c_old_id", owner_kind="account", owner_id=5, scope="bound",
                                     thread_id="twin", title="Kept", engine_state="live")
        rows = [_listed("c_new_one", "fresh"), _listed("c_new_id", "twin")]
    kept = set(EngineBinding.objects.values_list("engine_id", flat=True))
    routes = {("GET", "/v1/threads"): lambda h: (200, {"results": rows, "next": None})}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        with pytest.raises(EngineBadAnswer):
            sync.refresh("")
        _token, raw = ApiToken.issue(factories.make_user("adm5", admin=True))
        answer = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").post(
            "/api/v1/bindings-sync", HTTP_HOST="127.0.0.1", content_type="application/json")
        assert answer.status_code == 502 and answer.json()["code"] == "engine_bad_answer"
        page = admin().post("/engine/conversations/sync/", HTTP_HOST="127.0.0.1", follow=True)
        assert page.status_code == 200
        assert "could not be used" in " ".join(str(m) for m in get_messages(page.wsgi_request))
    assert set(EngineBinding.objects.values_list("engine_id", flat=True)) == kept


def test_an_owner_id_the_bindings_api_cannot_filter_on_is_not_stored(settings):
    """A synced owner id past the API's whole-number bound was stored, and that owner's
    conversations could not be listed through the API (400 invalid_filter), r62."""
    from console.api import MAX_WHOLE_NUMBER

    rows = {"results": [_listed("c_big_owner", "t", owner_id=MAX_WHOLE_NUMBER + 8)], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, rows)}) as (url, _seen):
        point_at(settings, url)
        left_out = sync.refresh("")
        assert (left_out["created"], left_out["rejected_conversations"]) == (0, [{"id": "c_big_owner", "field": "owner"}])
        rows["results"][0]["owner"]["id"] = MAX_WHOLE_NUMBER
        assert sync.refresh("")["created"] == 1
    _token, raw = ApiToken.issue(factories.make_user("adm6", admin=True))
    listed = Client(HTTP_AUTHORIZATION=f"Bearer {raw}").get(
        f"/api/v1/bindings?owner_kind=account&owner_id={MAX_WHOLE_NUMBER}", HTTP_HOST="127.0.0.1")
    assert listed.status_code == 200 and [r["engine_id"] for r in listed.json()["results"]] == ["c_big_owner"]


def test_a_sync_that_fails_on_a_later_page_says_the_pages_before_are_kept(settings, admin_client):
    """The failing page writes nothing and the pages before it stay written; the message said
    "Nothing was taken from it" all the same (r63)."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    pages = {None: {"results": [_listed("c_a1", "t1"), _listed("c_a2", "twin")], "next": "p2"},
             "p2": {"results": [_listed("c_b1", "t3"), _listed("c_b2", "twin")], "next": None}}

    def threads(handler):
        cursor = next((part[7:] for part in handler.path.split("?", 1)[1].split("&") if part.startswith("cursor=")),
                      None)
        return 200, pages[cursor]

    with scripted_engine({("GET", "/v1/threads"): threads}) as (url, _seen):
        point_at(settings, url)
        admin_client.post("/engine/conversations/sync/", HTTP_HOST="127.0.0.1")
        said = [str(m) for m in admin_client.get("/engine/conversations/", HTTP_HOST="127.0.0.1").context["messages"]]
        assert said == ["The engine's answer could not be used (not in the form expected, or one owner's thread "
                        "listed under two conversations). Nothing was taken from that answer; read again later. The "
                        "pages read before it are kept (2 new conversations, 0 brought up to date, 0 back after a "
                        "completed delete)."]
        assert set(EngineBinding.objects.values_list("engine_id", flat=True)) == {"c_a1", "c_a2"}
        admin_client.post("/engine/conversations/sync/", HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es")
        spanish = admin_client.get("/engine/conversations/", HTTP_HOST="127.0.0.1",
                                   HTTP_ACCEPT_LANGUAGE="es").content.decode()
        assert "Se conservan las páginas leídas antes (0 conversaciones nuevas, 2 actualizadas" in spanish
        from django.utils import translation

        translation.deactivate()
        with pytest.raises(CommandError, match=r"engine_bad_answer: .*The pages read before it are kept \(0 new "
                                               r"conversations, 2 brought up to date"):
            call_command("sync_bindings")
    assert set(EngineBinding.objects.values_list("engine_id", flat=True)) == {"c_a1", "c_a2"}


@pytest.mark.django_db(transaction=True)
def test_two_syncs_at_once_both_end_and_make_one_binding_each(settings):
    """Two admins pressing Read from the engine together: on PostgreSQL the second sync's insert
    met the first's and it was blamed on the engine (engine_bad_answer), r63. It writes its page
    again over what the other wrote."""
    import threading

    from django.db import connection

    rows = {"results": [_listed(f"c_same_{n}", f"t{n}") for n in range(20)], "next": None}

    def slow(_handler):
        time.sleep(0.5)  # both syncs asked before either writes
        return 200, rows

    outcomes = []

    def one_sync():
        try:
            outcomes.append(sync.refresh(""))
        except Exception as exc:  # what the test is about: none expected
            outcomes.append(exc)
        finally:
            connection.close()

    with scripted_engine({("GET", "/v1/threads"): slow}) as (url, _seen):
        point_at(settings, url)
        threads = [threading.Thread(target=one_sync) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert all(isinstance(outcome, dict) for outcome in outcomes), outcomes
    assert sorted(outcome["created"] + outcome["updated"] for outcome in outcomes) == [20, 20]
    assert sum(outcome["created"] for outcome in outcomes) == 20
    assert EngineBinding.objects.count() == 20


@pytest.mark.parametrize("second", ["refused", "repeated cursor"])
def test_a_later_page_refused_or_with_a_repeated_cursor_writes_nothing_of_it_and_names_the_pages_kept(
        settings, admin_client, second):
    """r64: the engine's own refusal of a later page (422 invalid_cursor) was said without the
    pages kept before it; a page whose cursor repeated was written and counted, then said to have
    given nothing."""
    from django.core.management import call_command
    from django.core.management.base import CommandError
    from django.utils import translation

    pages = {None: (200, {"results": [_listed("c_1", "t1"), _listed("c_2", "t2")], "next": "p2"}),
             "p2": ((422, {"code": "invalid_cursor", "message": "Cursor expired."}) if second == "refused" else
                    (200, {"results": [_listed("c_3", "t3")], "next": "p2"}))}

    def threads(handler):
        cursor = next((part[7:] for part in handler.path.split("?", 1)[1].split("&") if part.startswith("cursor=")),
                      None)
        return pages[cursor]

    why = ("Cursor expired." if second == "refused" else
           "The engine's answer could not be used (not in the form expected, or one owner's thread listed under two "
           "conversations). Nothing was taken from that answer; read again later.")
    with scripted_engine({("GET", "/v1/threads"): threads}) as (url, _seen):
        point_at(settings, url)
        admin_client.post("/engine/conversations/sync/", HTTP_HOST="127.0.0.1")
        said = [str(m) for m in admin_client.get("/engine/conversations/", HTTP_HOST="127.0.0.1").context["messages"]]
        assert said == [why + " The pages read before it are kept (2 new conversations, 0 brought up to date, 0 back "
                              "after a completed delete)."]
        assert set(EngineBinding.objects.values_list("engine_id", flat=True)) == {"c_1", "c_2"}
        translation.deactivate()
        with pytest.raises(CommandError, match=r"The pages read before it are kept \(0 new conversations, 2 brought"):
            call_command("sync_bindings")
    assert set(EngineBinding.objects.values_list("engine_id", flat=True)) == {"c_1", "c_2"}


def test_a_read_the_engine_refuses_is_recorded_and_shown_until_a_read_begun_later_goes_through(settings):
    """The hourly read (remote.tasks.read_engine) has no one to tell but the list: the engine's
    own refusal, in its own words (escaped), stays on the list until a read begun after it goes
    through; a read begun before it (two at once) does not take it off."""
    from datetime import timedelta

    from django.utils import timezone

    from remote import tasks
    from remote.models import EngineRead

    answer = {"refuse": True}

    def threads(_handler):
        if answer["refuse"]:
            return 422, {"code": "invalid_cursor", "message": "<b>Cursor</b> expired."}
        return 200, {"results": [_listed("c_1", "t1")], "next": None}

    with scripted_engine({("GET", "/v1/threads"): threads}) as (url, _seen):
        point_at(settings, url)
        settings.ENGINE_TOKENS = {}
        before = timezone.now()
        assert tasks.read_engine("") == "invalid_cursor"
        read = EngineRead.objects.get()
        assert (read.engine_url, read.read_at, read.error_code, read.error_message) == (
            "", None, "invalid_cursor", "<b>Cursor</b> expired.")
        assert read.state == "failed" and before <= read.failed_at <= timezone.now()
        assert not EngineBinding.objects.exists()
        for who, language, words in (("adm-read", "en", "The last read of the engine, begun "),
                                     ("mem-read", "es", "La última lectura del motor, iniciada ")):
            client = Client()
            client.force_login(factories.make_user(who, admin=who == "adm-read"))
            page = client.get("/engine/conversations/", HTTP_HOST="127.0.0.1",
                              HTTP_ACCEPT_LANGUAGE=language).content.decode()
            line = page.split('data-testid="read-failed" data-state="failed">', 1)[1].split("</p>", 1)[0]
            assert line.startswith(words) and "&lt;b&gt;Cursor&lt;/b&gt; expired." in line and "<b>" not in line
        boss = admin()
        api = boss.get("/api/v1/bindings", HTTP_HOST="127.0.0.1").json()
        failed_at = read.failed_at.isoformat().replace("+00:00", "Z")
        assert api == {"owner": None, "results": [], "next": None, "reads": [{
            "engine": "", "state": "failed", "started_at": failed_at, "read_at": None, "failed_at": failed_at,
            "failing": True, "error": "invalid_cursor", "error_message": "<b>Cursor</b> expired.", **NONE_LEFT_OUT}]}
        sync._record("", read.failed_at - timedelta(seconds=1))  # a whole read begun before the refused one
        assert EngineRead.objects.get().state == "failed"
        answer["refuse"] = False
        assert tasks.read_engine("") == {"created": 1, "updated": 0, "returned": 0, **NONE_LEFT_OUT}
        read = EngineRead.objects.get()
        assert read.state == "ok" and read.read_at > read.failed_at
        assert EngineBinding.objects.get().synced_at == read.read_at
        # Two reads at once: one begun earlier that ends later changes nothing of the record.
        sync._record("", read.read_at - timedelta(seconds=2))
        sync._record("", read.read_at - timedelta(seconds=1), sync.ActionRefused("engine_error", "x"))
        again = EngineRead.objects.get()
        assert (again.read_at, again.failed_at, again.error_code) == (read.read_at, read.failed_at, "invalid_cursor")
        page = boss.get("/engine/conversations/", HTTP_HOST="127.0.0.1").content.decode()
        assert 'data-testid="read-failed"' not in page and 'data-testid="bindings-read-at"' in page
        api = boss.get("/api/v1/bindings", HTTP_HOST="127.0.0.1").json()
        synced = api["results"][0]["synced_at"]
        assert api["reads"] == [{"engine": "", "state": "ok", "started_at": synced, "read_at": synced,
                                 "failed_at": failed_at, "failing": False, "error": None, "error_message": None,
                                 **NONE_LEFT_OUT}]
        assert api["results"][0]["synced_at"] and api["reads"][0]["failed_at"] < api["results"][0]["synced_at"]


def test_a_way_out_is_kept_only_in_the_shape_the_page_reads():
    """An engine's way out is not trusted: rows without an id of text (or one with a NUL, a lone
    surrogate, or longer than 256 characters: the engine's own rule, lifecycle.fleet.namable_id)
    are left out, times and status only as short text, at most WAY_OUT_ROWS rows; nothing of the
    shape expected is no way out."""
    good = {"agent_id": "sa_1", "status": "completed", "started_at": "2026-01-01T00:00:00Z", "finished_at": None}
    bare = {"status": None, "started_at": None, "finished_at": None}
    answer = {"ambiguous": [good, "sa_2", {"agent_id": 7}, {"agent_id": ""}, {"agent_id": "a\x00b"},
                            {"agent_id": "\ud800"}, {"agent_id": "x" * 257}, {"agent_id": "x" * 256},
                            {"agent_id": "sa_3", "status": {"deep": 1}, "started_at": "9" * 65,
                             "finished_at": "bad\x00"}]}
    assert delivery.way_out(answer) == {"ambiguous": [good, {"agent_id": "x" * 256, **bare},
                                                      {"agent_id": "sa_3", **bare}]}
    many = delivery.way_out({"ambiguous": [{"agent_id": f"sa_{n}"} for n in range(500)]})
    assert len(many["ambiguous"]) == delivery.WAY_OUT_ROWS
    for nothing in (None, [], {"ambiguous": "sa_1"}, {"ambiguous": [1, None]}, {"other": []}):
        assert delivery.way_out(nothing) is None


def _two_pages(handler):
    """The engine's list in two pages, the second asked for with the first's cursor."""
    cursor = next((part[7:] for part in handler.path.split("?", 1)[1].split("&") if part.startswith("cursor=")), None)
    return 200, {"results": [_listed("c_1", "t1")], "next": "p2"} if cursor is None else \
        {"results": [_listed("c_2", "t2")], "next": None}


@pytest.mark.django_db(transaction=True)
def test_a_read_killed_after_a_page_is_said_not_to_have_gone_through_once_it_has_been_quiet_too_long(settings,
                                                                                                   tmp_path):
    """r71: a read stopped by its job's time limit or a kill recorded nothing, so the list went on
    showing an earlier whole read as the latest. A real process killed with SIGKILL after its
    first page: the read is under way (nothing said) while it may still be reading a page, then
    said to have stopped before the end of the list, with the page it wrote kept."""
    import os
    import signal
    import subprocess
    import sys
    from datetime import timedelta

    from django.db.models import F

    from remote.models import EngineRead
    from tests.remote_engine import ROOT
    from tests.test_jobs import database_url

    with scripted_engine({("GET", "/v1/threads"): _two_pages}) as (url, _seen):
        point_at(settings, url)
        env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
               "ENGINE_URL": url, "ENGINE_TOKEN": "t" * 40, "LETHE_TEST_KILL_AT": "remote.read-page",
               "LETHE_TEST_KILL_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "manage.py", "sync_bindings"], cwd=ROOT, env=env,
                              capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    read = EngineRead.objects.get()
    assert read.started_at is not None and (read.read_at, read.failed_at, read.state) == (None, None, "reading")
    assert list(EngineBinding.objects.values_list("engine_id", flat=True)) == ["c_1"]  # its one page, kept
    boss = admin()
    assert 'data-testid="read-failed"' not in boss.get("/engine/conversations/", HTTP_HOST="127.0.0.1").content.decode()
    # A long read that still writes pages is under way, however long ago it began (r73).
    EngineRead.objects.update(started_at=F("started_at") - timedelta(hours=2))
    assert EngineRead.objects.get().state == "reading"
    # Quiet for longer than one page may take (point_at: 2 s a try, no retry; and a margin): stopped.
    EngineRead.objects.update(active_at=F("active_at") - timedelta(seconds=66))
    for language, words in (("en", "did not go through: It was stopped before the end of the engine"),
                            ("es", "no se completó: Se detuvo antes del final de la lista del motor")):
        page = boss.get("/engine/conversations/", HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE=language)
        line = page.content.decode().split('data-testid="read-failed" data-state="unfinished">', 1)[1]
        assert words in line.split("</p>", 1)[0]
    reads = boss.get("/api/v1/bindings", HTTP_HOST="127.0.0.1").json()["reads"]
    assert [(r["state"], r["failing"], r["error"]) for r in reads] == [("unfinished", True, "read_unfinished")]


def test_a_refusal_without_words_is_shown_in_each_readers_language(settings, admin_client):
    """r71: the placeholder for an engine's refusal without words was stored as the engine's own
    words, in the language of whoever read, and shown so to everyone."""
    from remote.models import EngineRead

    with scripted_engine({("GET", "/v1/threads"): lambda h: (409, {"code": "nope"})}) as (url, _seen):
        point_at(settings, url)
        admin_client.post("/engine/conversations/sync/", HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es")
    read = EngineRead.objects.get()
    assert (read.state, read.error_code, read.error_message) == ("failed", "nope", "")
    for language, words in (("en", "The engine refused the request and gave no reason."),
                            ("es", "El motor rechazó la solicitud sin indicar el motivo.")):
        page = admin_client.get("/engine/conversations/", HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE=language)
        assert words in page.content.decode().split('data-testid="read-failed"', 1)[1].split("</p>", 1)[0]


def test_a_refused_delete_names_the_subagent_rows_the_engine_gave_too(settings, admin_client):
    """r71: the rows were kept for a Refused delete (refused for a running turn, and the rows
    among its reasons) and given by the API, but its page showed them only when Unavailable."""
    refused = {"id": OP, "target": TARGET, "state": "refused", "code": "conversation_turn_active",
               "reasons": ["conversation_turn_active", "conversation_child_ownership_ambiguous"],
               "way_out": {"ambiguous": [{"agent_id": "sa_refused1", "status": "running",
                                          "started_at": "2026-01-01T00:00:00Z", "finished_at": None}]}}
    routes = {("DELETE", "/v1/threads/"): lambda h: (409, {"code": "conversation_turn_active", "message": "Busy.",
                                                           "outcome": "refused", "operation": OP}),
              ("GET", "/v1/operations/"): lambda h: (200, refused)}
    with scripted_engine(routes) as (url, _seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-refused-rows", actor=None)
        delivery.deliver(op.pk, budget=0.5)
    op.refresh_from_db()
    assert (op.state, op.way_out["ambiguous"][0]["agent_id"]) == ("refused", "sa_refused1")
    page = admin_client.get(f"/engine/deletes/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "<code><bdi>sa_refused1</bdi></code>" in page.split('data-testid="way-out"', 1)[1]
