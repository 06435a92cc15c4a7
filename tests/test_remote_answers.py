"""The remote engine's answers the console must not take: about another conversation, not
JSON, a receipt it cannot keep, a list without end, rows that are not conversations, a
drip-fed answer; and what the screens, the sweep and the back-off do meanwhile."""

from __future__ import annotations

import io
import re
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from remote import delivery, tasks
from remote.models import BoundDelete, EngineBinding
from remote.sync import refresh
from tests import factories
from tests.scripted_engine import scripted_engine

pytestmark = pytest.mark.django_db
TARGET, OTHER = "c_" + "a" * 20, "c_" + "b" * 20
NONE_LEFT_OUT = {"rejected": 0, "rejected_conversations": []}  # a read that took every row
NOW = "2026-01-01T00:00:00Z"
RECEIPT = {"stores": [{"store": "lifecycle.Item", "action": "erased", "records": 2, "bytes": 10}]}


def binding(engine_id: str = TARGET, thread_id: str = "t1") -> EngineBinding:
    return EngineBinding.objects.create(engine_id=engine_id, owner_kind="account", owner_id=1, scope="bound",
                                        thread_id=thread_id, title="Secret title", engine_state="live")


def operation(**fields) -> dict:
    return {"id": "op_" + "1" * 20, "target": TARGET, "state": "completed", "code": None,
            "requested_at": NOW, "completed_at": NOW, "receipt": RECEIPT, **fields}


def point_at(settings, url: str) -> None:
    settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = url, "t" * 40, 0
    settings.ENGINE_READ_TIMEOUT, settings.REMOTE_RETRY_SECONDS, settings.REMOTE_RETRY_MAX_SECONDS = 2, 60, 300


@pytest.mark.parametrize("outcome", ["refused", "unavailable", "completed"])
def test_an_error_met_on_the_way_leaves_no_time_behind_once_the_delete_ends(settings, api, outcome):
    """r75: unreachable first, then the engine's answer: last_error was cleared, its time kept
    (a client saw an error time with no error)."""
    answer = operation(state=outcome, code=None if outcome == "completed" else "conversation_has_active_turn",
                       completed_at=NOW if outcome == "completed" else None,
                       receipt=RECEIPT if outcome == "completed" else None)
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, answer),
                          ("GET", "/v1/threads/"): lambda h: (404, {"code": "not_found"})}) as (url, seen):
        point_at(settings, url)
        op = delivery.request_bound_delete(binding(), key="k-ended", actor=None)
        BoundDelete.objects.filter(pk=op.pk).update(last_error="engine_unreachable", last_error_at=timezone.now())
        assert delivery.deliver(op.pk, budget=2) == outcome
    op.refresh_from_db()
    assert (op.state, op.last_error, op.last_error_at) == (outcome, "", None)
    shown = api.get(f"/api/v1/bound-deletes/{op.public_id}").json()
    assert (shown["last_error"], shown["last_error_message"], shown["last_error_at"]) == (None, None, None)
    assert shown["completed_at"] is not None  # when it ended, whatever the outcome


def test_a_delete_ended_by_earlier_code_gives_no_time_of_an_error_it_no_longer_has(api):
    op = BoundDelete.objects.create(binding=binding(), engine_id=TARGET, owner_kind="account", owner_id=1,
                                    thread_id="t1", scope="bound", state="refused", code="conversation_has_active_turn",
                                    last_error="", last_error_at=timezone.now(), completed_at=timezone.now())
    shown = api.get(f"/api/v1/bound-deletes/{op.public_id}").json()
    assert (shown["last_error"], shown["last_error_at"]) == (None, None)


@pytest.mark.parametrize("answer", [
    operation(target=OTHER),  # a receipt for another conversation
    operation(receipt=["not", "a", "receipt"]),
    operation(receipt={"stores": [{"store": "lifecycle.Item", "action": "erased", "records": "many"}]}),
    operation(receipt=None),  # completed, no receipt
    b"<html>maintenance</html>",  # a 2xx that is not JSON
    {"id": 7},  # not an operation
], ids=["other-conversation", "list-receipt", "text-figure", "no-receipt", "not-json", "not-an-operation"])
def test_an_answer_that_cannot_be_taken_completes_nothing_and_waits_with_back_off(settings, answer):
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, answer)}) as (url, seen):
        point_at(settings, url)
        kept = binding()
        op = delivery.request_bound_delete(kept, key="k-answer", actor=None)
        assert delivery.deliver(op.pk, budget=1) == "pending"
    op.refresh_from_db()
    assert (op.state, op.last_error, op.receipt) == ("pending", "engine_bad_answer", None)
    assert op.next_attempt_at is not None and op.next_attempt_at > op.last_error_at  # backs off
    assert EngineBinding.objects.filter(pk=kept.pk).exists()
    assert "could not be used" in delivery.error_text(op.last_error)


def test_a_delete_that_fails_does_not_keep_the_later_ones_from_their_turn(settings, monkeypatch):
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, operation(target=h.path.rsplit("/", 1)[1]))}) as (url, seen):
        point_at(settings, url)
        first = delivery.request_bound_delete(binding(TARGET, "t1"), key="k-1", actor=None)
        second = delivery.request_bound_delete(binding(OTHER, "t2"), key="k-2", actor=None)
        real = delivery.deliver

        def broken_first(pk, **kwargs):
            if pk == first.pk:
                raise TypeError("an answer nobody foresaw")
            return real(pk, **kwargs)

        monkeypatch.setattr(delivery, "deliver", broken_first)
        tasks.sweep()
    assert BoundDelete.objects.get(pk=second.pk).state == "completed"
    first.refresh_from_db()
    assert first.state == "pending" and first.last_error == "engine_bad_answer" and first.next_attempt_at
    assert first.pk not in delivery.due()  # not first in line again at once


def test_the_back_off_stays_at_its_cap_however_long_the_engine_is_away(settings):
    settings.REMOTE_RETRY_SECONDS, settings.REMOTE_RETRY_MAX_SECONDS = 5.0, 300.0
    assert delivery.retry_delay(1) == timedelta(seconds=5)
    assert delivery.retry_delay(2000) == delivery.retry_delay(10**9) == timedelta(seconds=300)


def test_a_drip_fed_answer_is_cut_at_the_whole_answer_deadline(settings):
    def drip(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        try:
            for _ in range(100):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass
        return None

    from lifecycle.engine.http import EngineUnreachable, HttpEngine

    with scripted_engine({("GET", "/v1/threads/"): drip}) as (url, seen):
        engine = HttpEngine(url, "t" * 40, connect_timeout=0.5, read_timeout=0.5, retries=0)
        started = time.monotonic()
        with pytest.raises(EngineUnreachable):
            engine.thread(TARGET)
    assert time.monotonic() - started < 3  # connect + twice the read timeout, not 20 s


def row(n: int, **fields) -> dict:
    return {"id": f"c_{n:020d}", "owner": {"kind": "account", "id": 1}, "scope": "bound",
            "thread_id": f"t{n}", "state": "live", "title": f"Title {n}", "last_activity_at": NOW, **fields}


def test_only_a_conversation_deleted_on_the_engine_is_said_to_leave_its_title_in_the_files(settings):
    """r77: a live conversation whose title became empty was said "deleted on the engine by other
    means"; only one the engine lists deleted (or being deleted) is."""
    listed = {"row": row(1)}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, {"results": [listed["row"]], "next": None})}) as (
            url, _seen):
        point_at(settings, url)
        refresh("")
        listed["row"] = row(1, title="")
        refresh("")
        b = EngineBinding.objects.get()
        assert (b.title, b.engine_state, b.copy_pending_since) == ("", "live", None)
        listed["row"] = row(1, title="Titled again")
        refresh("")
        listed["row"] = row(1, state="pending_delete")
        refresh("")
        b.refresh_from_db()
        assert (b.title, b.engine_state) == ("", "pending_delete") and b.copy_pending_since is not None


def test_sync_stops_on_a_repeated_cursor(settings):
    asked = []

    def pages(handler):
        asked.append(handler.path)
        return 200, {"results": [row(1)], "next": "same-cursor"}

    from lifecycle.engine.http import EngineBadAnswer

    with scripted_engine({("GET", "/v1/threads"): pages}) as (url, seen):
        point_at(settings, url)
        with pytest.raises(EngineBadAnswer):
            refresh("")
    assert len(asked) == 2 and EngineBinding.objects.count() == 1  # the first page is kept


@pytest.mark.parametrize(("bad", "named"), [
    ({"id": "c_" + "9" * 20, "title": "x"}, ("c_" + "9" * 20, "owner")),  # no owner
    (row(2, owner={"kind": "account", "id": "1"}), (row(2)["id"], "owner")),  # an id as text
    (row(3, owner={"kind": "robot", "id": 1}), (row(3)["id"], "owner")),
    (row(4, title=7), (row(4)["id"], "title")),
    (row(5, last_activity_at="yesterday"), (row(5)["id"], "last_activity_at")),
    (row(6, thread_id="t" * 500), (row(6)["id"], "thread_id")),
    (row(7, title="bad \ud800 title"), (row(7)["id"], "title")),  # no page could show it
    (row(8, title="nul \x00 title"), (row(8)["id"], "title")),  # PostgreSQL could not store it (SQLite would)
    (row(9, extra={"\ud800": 1}), (row(9)["id"], "extra")),
    (row(10, id="c_\x00" + "0" * 18), (None, "id")),  # no id this console could show
    ("not a row", (None, "row")),
    # a field whose name cannot be shown as it is (kept with the read record, shown on the list)
    (row(12, **{"x" * 65: "nul \x00"}), (row(12)["id"], "row")),
    (row(13, **{"\u202eevil": "nul \x00"}), (row(13)["id"], "row")),
], ids=["no-owner", "text-owner-id", "unknown-owner-kind", "number-title", "bad-time", "long-thread-id",
        "surrogate-title", "nul-title", "surrogate-key", "nul-id", "not-a-row", "long-field-name",
        "bidi-field-name"])
def test_a_row_that_is_not_a_conversation_is_left_out_named_and_the_others_are_read(settings, admin_client, bad,
                                                                                     named):
    """r123: one row the console could not take (there, a title over 300 characters) stopped the
    whole read, every conversation with it. Such a row is left out and named; the others are read."""
    page = {"results": [row(1), bad, row(11)], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, page)}) as (url, seen):
        point_at(settings, url)
        response = admin_client.post("/engine/conversations/sync/")
        assert response.status_code == 302
        api = admin_client.post("/api/v1/bindings-sync", content_type="application/json")
    engine_id, field = named
    assert api.status_code == 200
    assert api.json() == {"created": 0, "updated": 2, "returned": 0, "rejected": 1,
                          "rejected_conversations": [{"id": engine_id, "field": field}]}
    assert sorted(EngineBinding.objects.values_list("engine_id", flat=True)) == [row(1)["id"], row(11)["id"]]
    messages = [str(m) for m in admin_client.get("/engine/conversations/").context["messages"]]
    shown = f"{engine_id} ({field})" if engine_id else "a row without an id"
    assert messages == ["Read the engine's conversations: 2 new, 0 already listed and brought up to date.",
                        "1 conversation on the engine was left out: its row is not in the form expected (the field "
                        f"in brackets), so this console cannot keep it: {shown}. The others were read."]


def test_a_read_names_the_first_rows_it_left_out_counts_them_all_and_says_so_in_spanish(settings, admin_client):
    from django.core.management import call_command

    bad = [row(n, scope="s" * 9) for n in range(2, 27)]  # 25 rows: 20 named, 5 more
    page = {"results": [row(1), *bad], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, page)}) as (url, seen):
        point_at(settings, url)
        answer = refresh("")
        admin_client.post("/engine/conversations/sync/", HTTP_ACCEPT_LANGUAGE="es")
        spanish = [str(m) for m in admin_client.get("/engine/conversations/").context["messages"]]
        out = io.StringIO()
        call_command("sync_bindings", stdout=out)
    assert (answer["created"], answer["rejected"]) == (1, 25)
    assert answer["rejected_conversations"] == [{"id": r["id"], "field": "scope"} for r in bad[:20]]
    assert EngineBinding.objects.count() == 1
    named = ", ".join(f"{r['id']} (scope)" for r in bad[:20])
    assert spanish[1] == ("25 conversaciones del motor se dejaron fuera: sus filas no tienen la forma esperada (el "
                          "campo entre paréntesis), así que esta consola no puede conservarlas: "
                          f"{named}, 5 más. Las demás se leyeron.")
    assert out.getvalue().splitlines() == [
        "0 created, 1 updated",
        f"25 left out (the engine's row is not in the form expected; the field not taken is named): {named}, 5 more"]


def test_the_rows_the_hourly_read_left_out_are_said_on_the_list_and_in_the_api_until_a_read_takes_them(
        settings, member_client, member_api):
    """The hourly read (remote.tasks) left rows out and only logged them: Engine conversations said
    "as the engine listed them" with those conversations silently missing. The last whole read's
    left-out rows are kept with its read record: the list names them (also to a member, who sees
    the list) and the bindings API gives them in `reads`, until a whole read takes every row."""
    from django.utils.translation import override

    from remote.models import EngineRead

    bad = [row(n, scope="s" * 9) for n in range(2, 24)]  # 22 rows: 20 named, 2 more
    listed = {"results": [row(1), row(24, owner={"kind": "robot", "id": 1}), *bad], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, listed)}) as (url, seen):
        point_at(settings, url)
        tasks.read_engine("")  # the hourly job's read of the engine at ENGINE_URL
        page = member_client.get("/engine/conversations/?owner=account:1").content.decode()
        spanish = member_client.get("/engine/conversations/?owner=account:1", HTTP_ACCEPT_LANGUAGE="es")
        api = member_api.get("/api/v1/bindings?owner_kind=account&owner_id=1").json()
        named = [{"id": row(24)["id"], "field": "owner"}, *({"id": r["id"], "field": "scope"} for r in bad[:19])]
        assert EngineRead.objects.get(engine_url="").rejected == {"count": 23, "named": named}
        alert = " ".join(re.sub(r"<[^>]+>", " ", re.search(
            r'<div [^>]*data-testid="read-left-out">(.*?)</div>', page, re.S).group(1)).split())
        words = ", ".join(f"{r['id']} ({r['field']})" for r in named)
        assert alert.startswith("The last whole read of the engine, begun ")
        assert alert.endswith("left out 23 conversations: their rows are not in the form expected, so this console "
                              "cannot keep them and they are not listed here. Which ones (the engine's id, and the "
                              f"field not in the form expected) {words}, 3 more"), alert
        assert "dejó fuera 23 conversaciones: sus filas no tienen la forma esperada" in spanish.content.decode()
        (read,) = api["reads"]
        assert (read["state"], read["rejected"], read["rejected_conversations"]) == ("ok", 23, named)
        # A whole read that takes every row: nothing is said any more.
        listed["results"] = [row(1)]
        tasks.read_engine("")
        assert EngineRead.objects.get(engine_url="").rejected is None
        assert 'data-testid="read-left-out"' not in member_client.get("/engine/conversations/?owner=account:1").content.decode()
        (read,) = member_api.get("/api/v1/bindings?owner_kind=account&owner_id=1").json()["reads"]
        assert (read["rejected"], read["rejected_conversations"]) == (0, [])
    # A stored value in a form not written (a hand edit): what can be read of it, never a server error.
    for stored, said in (({"count": "9"}, None), ({"count": True}, None), ([1], None),
                         ({"count": 2, "named": [{"id": 5}, "x", {"field": "scope"}]},
                          "a row without an id, 1 more")):
        EngineRead.objects.filter(engine_url="").update(rejected=stored)
        with override("en"):
            answer = member_client.get("/engine/conversations/?owner=account:1")
        assert answer.status_code == 200
        alert = re.search(r'<p data-testid="read-left-out-named">(.*?)</p>', answer.content.decode(), re.S)
        assert (alert.group(1) == said) if said else alert is None


def test_a_title_longer_than_a_binding_keeps_is_shortened_between_characters_not_refused(settings):
    """r123: an engine on SQLite (which does not enforce a column's length) held a title of 305
    characters; every read of its list failed, engine_bad_answer. The title is shortened as a
    preview is: never between a letter and its accent, or inside a flag."""
    accented = "x" + "A\u0301" * 152  # 305 characters; the 300th is an accent
    flagged = "x" + "\U0001F1EA\U0001F1F8" * 151  # 303; the 300th is the first half of a flag
    titles = [accented, flagged, "y" * 305, "z" * 300]
    page = {"results": [row(n, title=title) for n, title in enumerate(titles, 1)], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, page)}) as (url, seen):
        point_at(settings, url)
        assert refresh("") == {"created": 4, "updated": 0, "returned": 0, **NONE_LEFT_OUT}
    stored = dict(EngineBinding.objects.values_list("thread_id", "title"))
    assert stored == {"t1": "x" + "A\u0301" * 149, "t2": "x" + "\U0001F1EA\U0001F1F8" * 149, "t3": "y" * 300,
                      "t4": "z" * 300}


def test_a_refused_delete_brings_back_a_long_title_shortened(settings):
    """The title a refused delete reads back from the engine is shortened as a sync's is (it
    was left out, and the list showed the thread id until the next sync)."""
    kept = binding(row(1)["id"], "t1")
    refused = operation(target=kept.engine_id, state="refused", code="conversation_turn_active", completed_at=None,
                        receipt=None)
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, refused),
                          ("GET", "/v1/threads/"): lambda h: (200, row(1, title="w" * 305))}) as (url, s):
        point_at(settings, url)
        op = delivery.request_bound_delete(kept, key="k-long", actor=None)
        assert delivery.deliver(op.pk, budget=2) == "refused"
    assert EngineBinding.objects.get(pk=kept.pk).title == "w" * 300


def test_a_sync_never_brings_back_the_title_a_delete_cleared(settings, monkeypatch):
    """A bound delete requested while the sync reads the engine keeps its title cleared."""
    kept = binding(row(1)["id"], "t1")
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, operation(state="pending", receipt=None,
                                                                                 target=kept.engine_id)),
                          ("GET", "/v1/threads"): lambda h: (200, {"results": [row(1)], "next": None})}) as (url, s):
        point_at(settings, url)
        from lifecycle.engine.http import HttpEngine

        real = HttpEngine.threads

        def delete_requested_meanwhile(self, **query):
            page = real(self, **query)
            delivery.request_bound_delete(EngineBinding.objects.get(pk=kept.pk), key="k-mid-sync", actor=None)
            return page

        monkeypatch.setattr(HttpEngine, "threads", delete_requested_meanwhile)
        refresh("")
    assert EngineBinding.objects.get(pk=kept.pk).title == ""
    assert BoundDelete.objects.get(binding=kept).state == "pending"


def _read_while_deleted(kept: EngineBinding, key: str):
    """HttpEngine.threads that returns the engine's page after the binding's delete has run to
    completion: the page was read before the engine erased the conversation."""
    from lifecycle.engine.http import HttpEngine

    real = HttpEngine.threads

    def threads(self, **query):
        page = real(self, **query)
        op = delivery.request_bound_delete(EngineBinding.objects.get(pk=kept.pk), key=key, actor=None)
        assert delivery.deliver(op.pk, budget=2) == "completed"
        return page

    return threads


def test_a_sync_never_binds_again_a_conversation_deleted_while_it_read_the_engine(settings, monkeypatch):
    kept = binding(row(1)["id"], "t1")
    listed = {"results": [row(1)], "next": None}
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, operation(target=kept.engine_id)),
                          ("GET", "/v1/threads"): lambda h: (200, listed)}) as (url, s):
        point_at(settings, url)
        from lifecycle.engine.http import HttpEngine

        monkeypatch.setattr(HttpEngine, "threads", _read_while_deleted(kept, "k-mid-sync"))
        assert refresh("") == {"created": 0, "updated": 0, "returned": 0, **NONE_LEFT_OUT}
    assert not EngineBinding.objects.exists()  # no binding, so no copy of "Title 1" either
    assert list(BoundDelete.objects.values_list("state", "binding")) == [("completed", None)]


def test_a_conversation_back_on_the_engine_after_its_delete_is_bound_without_its_title_and_deleted_anew(
        settings, admin_client):
    """The engine restored from a backup lists a conversation whose delete completed here. It
    is neither hidden as deleted nor listed with its title again: it is bound again, marked as
    back after that delete, without the title, and a delete of it is a new one."""
    kept = binding(row(1)["id"], "t1")
    listed = {"results": [row(1)], "next": None}
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, operation(target=kept.engine_id)),
                          ("GET", "/v1/threads"): lambda h: (200, listed)}) as (url, s):
        point_at(settings, url)
        first = delivery.request_bound_delete(kept, key="k-first", actor=None)
        assert delivery.deliver(first.pk, budget=2) == "completed"
        # Restored later: the engine lists it live again, well after the acknowledgement.
        BoundDelete.objects.filter(pk=first.pk).update(acknowledged_at=timezone.now() - timedelta(minutes=5))
        assert refresh("") == {"created": 0, "updated": 0, "returned": 1, **NONE_LEFT_OUT}
        back = EngineBinding.objects.get(engine_id=kept.engine_id)
        assert (back.title, back.returned_after_id, back.engine_state) == ("", first.pk, "live")
        assert refresh("") == {"created": 0, "updated": 1, "returned": 0, **NONE_LEFT_OUT}  # a later sync keeps it untitled
        back.refresh_from_db()
        assert back.title == ""
        page = admin_client.get("/engine/conversations/", HTTP_HOST="127.0.0.1").content.decode()
        assert 'data-testid="returned"' in page and "Title 1" not in page
        spanish = admin_client.get("/engine/conversations/", HTTP_HOST="127.0.0.1",
                                   HTTP_ACCEPT_LANGUAGE="es").content.decode()
        assert "vuelva a eliminarla" in spanish
        listing = admin_client.get("/api/v1/bindings", HTTP_HOST="127.0.0.1").json()["results"]
        assert [(b["title"], b["returned_after"]) for b in listing] == [("", first.public_id)]

        again = delivery.request_bound_delete(back, key="k-again", actor=None)
        assert again.pk != first.pk and (again.state, again.binding_id) == ("pending", back.pk)
        assert delivery.deliver(again.pk, budget=2) == "completed"
    assert not EngineBinding.objects.exists()
    assert sorted(BoundDelete.objects.values_list("key", "state")) == [("k-again", "completed"),
                                                                       ("k-first", "completed")]
    assert [path for method, path in s if method == "DELETE"] == [f"/v1/threads/{kept.engine_id}"] * 2


def test_a_refused_delete_of_a_conversation_back_after_its_delete_brings_no_title_back(settings):
    kept = binding(row(1)["id"], "t1")
    answers = iter([operation(target=kept.engine_id),
                    operation(id="op_" + "2" * 20, target=kept.engine_id, state="refused",
                              code="conversation_turn_active", completed_at=None, receipt=None)])
    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, next(answers)),
                          ("GET", "/v1/threads/"): lambda h: (200, row(1)),
                          ("GET", "/v1/threads"): lambda h: (200, {"results": [row(1)], "next": None})}) as (url, s):
        point_at(settings, url)
        first = delivery.request_bound_delete(kept, key="k-first", actor=None)
        assert delivery.deliver(first.pk, budget=2) == "completed"
        BoundDelete.objects.filter(pk=first.pk).update(acknowledged_at=timezone.now() - timedelta(minutes=5))
        assert refresh("")["returned"] == 1
        back = EngineBinding.objects.get(engine_id=kept.engine_id)
        again = delivery.request_bound_delete(back, key="k-again", actor=None)
        assert delivery.deliver(again.pk, budget=2) == "refused"
    back.refresh_from_db()
    assert back.title == "" and back.returned_after_id == first.pk  # the engine's title is not copied back


def test_the_lifecycle_screens_say_the_engine_cannot_be_reached(settings):
    settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = "http://127.0.0.1:9", "t" * 40, 0
    settings.ENGINE_CONNECT_TIMEOUT = settings.ENGINE_READ_TIMEOUT = 0.5
    client = Client(raise_request_exception=False)
    client.force_login(factories.make_user("adm", admin=True))
    conversation = factories.make_conversation(title="Here")
    for method, path in (("get", "/operations/"), ("get", "/operations/op_11111111111111111111/"),
                         ("get", f"/conversations/{conversation.public_id}/delete/"),
                         ("post", f"/conversations/{conversation.public_id}/delete/")):
        response = getattr(client, method)(path, HTTP_HOST="127.0.0.1")
        assert response.status_code == 503, path
        assert "The engine cannot be reached" in response.content.decode(), path


def test_with_the_engine_down_the_operations_page_still_lists_this_consoles_own_operations(settings, admin_user):
    from retention import service
    from retention.models import ToolPayloadOperation
    from tests.test_api_tool_payloads import finish

    op = finish(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert ToolPayloadOperation.objects.get(pk=op.pk).state == "succeeded"
    settings.ENGINE_URL, settings.ENGINE_TOKEN, settings.ENGINE_RETRIES = "http://127.0.0.1:9", "t" * 40, 0
    settings.ENGINE_CONNECT_TIMEOUT = settings.ENGINE_READ_TIMEOUT = 0.5
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    response = client.get("/operations/", HTTP_HOST="127.0.0.1")
    page = response.content.decode()
    assert response.status_code == 503
    assert 'data-testid="engine-error"' in page and "delete operations cannot be listed now" in page
    # The deletes this console asked for are listed elsewhere, and the page says where.
    assert 'data-testid="bound-deletes-note"' in page and 'href="/engine/conversations/"' in page
    history = page.split('id="cleanup-history"', 1)[1]
    assert "Analysis" in history and "by " + admin_user.get_username() in history


def test_a_sync_named_by_the_engine_url_keeps_one_binding_per_conversation(settings):
    def pages(handler):
        return 200, {"results": [row(1), row(2)], "next": None}

    with scripted_engine({("GET", "/v1/threads"): pages}) as (url, seen):
        point_at(settings, url)
        assert refresh("") == {"created": 2, "updated": 0, "returned": 0, **NONE_LEFT_OUT}
        for named in (url, url + "/"):  # what `sync_bindings --engine-url <ENGINE_URL>` passes
            assert refresh(named) == {"created": 0, "updated": 2, "returned": 0, **NONE_LEFT_OUT}
    assert EngineBinding.objects.count() == 2
    assert set(EngineBinding.objects.values_list("engine_url", flat=True)) == {""}


@pytest.mark.parametrize("key", ["k\r\nX-Injected: 1", "k\n", "has space", "x" * 201])
def test_a_delete_key_the_engine_could_not_take_is_refused_before_it_is_sent(settings, key):
    """The screen's form sends its key as the engine's Idempotency-Key header: a key that is
    no valid header value (a line break: http.client refused it with a ValueError, a 500) is
    refused as the embedded engine refuses it, and nothing reaches the engine."""
    from lifecycle.engine import get_engine
    from lifecycle.errors import ActionRefused

    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (202, operation())}) as (url, seen):
        point_at(settings, url)
        with pytest.raises(ActionRefused) as refused:
            get_engine().request_delete(TARGET, key=key, actor=None)
    assert (refused.value.code, refused.value.status) == ("idempotency_key_invalid", 400)
    assert not [request for request in seen if request[0] == "DELETE"]


def test_a_failed_read_of_the_engine_says_nothing_was_read_and_promises_no_retry(settings, admin_client):
    """Only bound deletes are retried by themselves; a read is asked for again by a person."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with scripted_engine({}) as (url, _seen):
        pass  # the engine stops: nothing listens at its address any more
    point_at(settings, url)
    response = admin_client.post("/engine/conversations/sync/")
    assert response.status_code == 302
    said = [str(m) for m in admin_client.get("/engine/conversations/").context["messages"]]
    assert said == ["The engine cannot be reached (no connection, a timeout, or its answer was lost). "
                    "Read again when it is back. Nothing was read."]
    admin_client.post("/engine/conversations/sync/", HTTP_ACCEPT_LANGUAGE="es")
    spanish = admin_client.get("/engine/conversations/", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "No se leyó nada" in spanish and "automáticamente" not in spanish
    from django.utils import translation

    translation.deactivate()  # a command speaks the process's language; the Spanish request set this thread's
    with pytest.raises(CommandError, match="engine_unreachable: .*Nothing was read"):
        call_command("sync_bindings")
    assert not EngineBinding.objects.exists()


def test_a_link_to_an_owner_the_console_does_not_know_shows_the_first_owner_and_says_so(admin_client):
    kept = binding("c_" + "9" * 20, "t-known")
    page = admin_client.get("/engine/conversations/?owner=account:999").content.decode()
    assert 'data-testid="unknown-owner"' in page and "No owner here matches that link" in page
    assert f'data-binding="{kept.public_id}"' in page and 'data-testid="no-bindings"' not in page
    plain = admin_client.get("/engine/conversations/?owner=account:1").content.decode()
    assert 'data-testid="unknown-owner"' not in plain and f'data-binding="{kept.public_id}"' in plain
    spanish = admin_client.get("/engine/conversations/?owner=x", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "Ningún propietario" in spanish


def test_a_conversation_the_engine_does_not_know_is_not_found_not_a_server_error(settings, admin_client):
    """A row this console keeps that the remote engine does not know (a mixed set-up, or a
    row left from before ENGINE_URL was set): its delete page is 404, not 500."""
    local = factories.make_conversation(title="Only here")
    unknown = {"code": "not_found", "message": "There is no conversation with that id."}
    with scripted_engine({("GET", "/v1/threads/"): lambda h: (404, unknown)}) as (url, seen):
        point_at(settings, url)
        response = admin_client.get(f"/conversations/{local.public_id}/delete/")
    assert response.status_code == 404
    assert any(path.endswith("/deletion-preview") for _method, path in seen)


@pytest.mark.parametrize(("message", "shown"), [
    ("Ocupado\x00\x1b[31m ahora\ud800\n" + "x" * 5000, None),  # control characters, a lone surrogate, too long
    ({"not": "text"}, "{'not': 'text'}"),
    ("", "The engine refused the request and gave no reason."),
], ids=["hostile-text", "not-text", "empty"])
def test_the_engine_is_asked_in_the_users_language_and_its_refusal_is_one_short_line(settings, message, shown):
    from django.utils import translation

    from lifecycle.engine.http import MESSAGE_CHARS, HttpEngine
    from lifecycle.errors import ActionRefused

    languages = []

    def refuse(handler):
        languages.append(handler.headers.get("Accept-Language"))
        return 409, {"code": "conversation_busy", "message": message}

    with scripted_engine({("DELETE", "/v1/threads/"): refuse}) as (url, seen):
        point_at(settings, url)
        for language in ("es", "en"):
            with translation.override(language), pytest.raises(ActionRefused) as refused:
                HttpEngine().request_delete(TARGET, key="k-lang", actor=None)
            assert (refused.value.code, refused.value.status) == ("conversation_busy", 409)
            text = refused.value.message
            if shown is not None and language == "en":
                assert text == shown
            assert text.isprintable() and "\n" not in text and len(text) <= MESSAGE_CHARS
            text.encode("utf-8")  # a page can show it
    assert languages == ["es", "en"]
    if shown is None:
        assert text.startswith("Ocupado [31m ahora x") and text.endswith("…") and len(text) == MESSAGE_CHARS


@pytest.mark.parametrize("code", [7, {"a": 1}, "Not A Code", "x" * 200, ""])
def test_an_engine_refusal_code_the_console_cannot_read_is_the_engines_refusal_unnamed(settings, code):
    from lifecycle.engine.http import HttpEngine
    from lifecycle.errors import ActionRefused

    with scripted_engine({("DELETE", "/v1/threads/"): lambda h: (409, {"code": code, "message": "No."})}) as (url, _):
        point_at(settings, url)
        with pytest.raises(ActionRefused) as refused:
            HttpEngine().request_delete(TARGET, key="k-code", actor=None)
    assert (refused.value.code, refused.value.message, refused.value.status) == ("engine_refused", "No.", 409)


def test_a_sync_says_how_many_it_found_new_and_how_many_it_brought_up_to_date(settings, admin_client):
    page = {"results": [row(1), row(2)], "next": None}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (200, page)}) as (url, _seen):
        point_at(settings, url)
        said = []
        for _ in range(2):
            admin_client.post("/engine/conversations/sync/")
            said += [str(m) for m in admin_client.get("/engine/conversations/").context["messages"]]
    assert said == ["Read the engine's conversations: 2 new, 0 already listed and brought up to date.",
                    "Read the engine's conversations: 0 new, 2 already listed and brought up to date."]
    assert EngineBinding.objects.count() == 2


def test_a_sync_reads_the_list_again_while_its_last_page_says_conversations_changed(settings):
    """A conversation that changes while the engine's list is read (archived, closed, a new
    item) is left out of the pages and counted in changed_since_start: the sync reads the list
    again instead of missing it until the next sync, counts each conversation once, and stops
    after PASSES readings however busy the engine is."""
    from remote import sync

    calls = []

    def listing(handler):
        calls.append(1)
        if len(calls) == 1:  # the first reading: conversation 2 changed meanwhile, left out
            return 200, {"results": [row(1)], "next": None, "changed_since_start": 1}
        return 200, {"results": [row(1), row(2, title="Title 2")], "next": None, "changed_since_start": 0}

    with scripted_engine({("GET", "/v1/threads"): listing}) as (url, _s):
        point_at(settings, url)
        assert refresh("") == {"created": 2, "updated": 0, "returned": 0, **NONE_LEFT_OUT}
        assert len(calls) == 2
        assert sorted(EngineBinding.objects.values_list("thread_id", flat=True)) == ["t1", "t2"]
    calls.clear()
    busy = {"results": [row(1)], "next": None, "changed_since_start": 5}
    with scripted_engine({("GET", "/v1/threads"): lambda h: (calls.append(1) or 200, busy)}) as (url, _s):
        point_at(settings, url)
        assert refresh("") == {"created": 0, "updated": 1, "returned": 0, **NONE_LEFT_OUT}
        assert len(calls) == sync.PASSES
