"""The Storage card's figures and Measure now through the API: the same figures as the card,
members read, admins measure, and a read measures nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from django_q.models import OrmQ

from insight.models import ConversationSize, DailySize, Measurement, OwnerSize, ToolKindSize
from insight.tasks import measure_storage
from lifecycle.models import Conversation
from tests.test_storage_insight import HOST, PAGE, build_fleet

pytestmark = pytest.mark.django_db
BASE = "/api/v1/system/storage"


def test_before_any_measurement_it_says_so_and_a_read_measures_nothing(member_api, engine_home):
    doc = member_api.get(BASE).json()
    assert doc == {"measured_at": None, "request": "none", "requested_at": None, "remote_engine": False,
                   "totals": None, "conversations": [], "accounts": [], "computers": [], "tool_kinds": [],
                   "deleted_since": 0, "days": []}
    assert Measurement.objects.count() == 0 and OrmQ.objects.count() == 0


def test_it_gives_the_stored_figures_the_card_shows(member_api, engine_home, admin_client):
    fleet = build_fleet()
    measure_storage()
    doc = member_api.get(BASE).json()
    m = Measurement.load()
    assert doc["measured_at"] == m.measured_at.isoformat().replace("+00:00", "Z") and doc["request"] == "none"
    assert doc["totals"] == {
        "database_bytes": m.database_bytes, "engine_bytes": m.engine_bytes, "engine_files": m.engine_files,
        "engine_unreadable": 0, "unattributed_engine_bytes": m.unattributed_engine_bytes,
        "text_bytes": m.text_bytes, "payload_bytes": m.payload_bytes, "removable_bytes": m.removable_bytes}
    assert m.engine_bytes > 0 and m.payload_bytes > 0
    # Largest first, only conversations holding data (the empty one is measured, not listed)
    sizes = {s.conversation_id: s for s in ConversationSize.objects.all()}
    expected = sorted((fleet[k] for k in ("big", "small", "local")), key=lambda c: -sizes[c.pk].total_bytes)
    assert [(c["id"], c["thread_id"], c["title"], c["owner"], c["db_bytes"], c["engine_bytes"], c["total_bytes"])
            for c in doc["conversations"]] == [
        (c.public_id, c.thread_id, c.title, {"kind": c.owner_kind, "id": c.owner_id, "name": c.owner.name},
         sizes[c.pk].db_bytes, sizes[c.pk].engine_bytes, sizes[c.pk].total_bytes) for c in expected]
    north = OwnerSize.objects.get(kind="account", owner_id=fleet["north"].pk)
    assert doc["accounts"][0] == {"id": fleet["north"].pk, "name": "Northwind", "conversations": 2,
                                  "db_bytes": north.db_bytes, "engine_bytes": north.engine_bytes,
                                  "total_bytes": north.total_bytes}
    assert [a["name"] for a in doc["accounts"]] == ["Northwind", "Southwind"]
    assert [(c["name"], c["conversations"]) for c in doc["computers"]] == [("laptop", 1)]
    assert doc["tool_kinds"] == [{"kind": k.tool_kind, "items": k.items, "payload_bytes": k.payload_bytes,
                                  "removable_bytes": k.removable_bytes}
                                 for k in ToolKindSize.objects.order_by("-payload_bytes", "tool_kind")]
    assert len(doc["tool_kinds"]) == 3
    day = DailySize.objects.get()
    assert doc["days"] == [{"day": day.day.isoformat(), "measured_at": doc["measured_at"],
                            "database_bytes": day.database_bytes, "engine_bytes": day.engine_bytes,
                            "payload_bytes": day.payload_bytes, "removable_bytes": day.removable_bytes}]
    # The card says the same figures
    page = admin_client.get(PAGE, **HOST).content.decode()
    assert "Northwind" in page and "laptop" in page and 'data-testid="tool-kinds"' in page

    # A delete since leaves the lists at once, as on the card; the tool kinds still count it, and say so.
    # A conversation being deleted is listed by its thread id only: its title is content.
    Conversation.objects.filter(pk=fleet["small"].pk).update(state="deleted", title="")
    Conversation.objects.filter(pk=fleet["big"].pk).update(state="pending_delete")
    doc = member_api.get(BASE).json()
    assert fleet["small"].public_id not in {c["id"] for c in doc["conversations"]}
    [big] = [c for c in doc["conversations"] if c["id"] == fleet["big"].public_id]
    assert big["title"] == "" and big["thread_id"] == fleet["big"].thread_id
    small = sizes[fleet["small"].pk]
    assert doc["accounts"][0]["conversations"] == 1
    assert doc["accounts"][0]["total_bytes"] == north.total_bytes - small.total_bytes
    assert doc["deleted_since"] == 1
    assert [k["payload_bytes"] for k in doc["tool_kinds"]] == [
        k.payload_bytes for k in ToolKindSize.objects.order_by("-payload_bytes", "tool_kind")]


def test_a_folder_missing_when_measured_has_no_size(member_api, engine_home, settings):
    build_fleet()
    settings.ENGINE_HOME = engine_home.parent / "unmounted"
    measure_storage()
    totals = member_api.get(BASE).json()["totals"]
    assert Measurement.load().engine_missing
    assert (totals["engine_bytes"], totals["engine_files"], totals["unattributed_engine_bytes"]) == (None, None, None)
    assert totals["payload_bytes"] > 0


def test_with_a_remote_engine_it_says_the_figures_are_this_consoles_own(member_api, engine_home, settings):
    measure_storage()
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9", "t" * 32
    doc = member_api.get(BASE).json()
    assert doc["remote_engine"] is True and doc["totals"]["engine_bytes"] is None
    assert doc["totals"]["database_bytes"] == Measurement.load().database_bytes > 0


def measure(client, body: str = ""):
    return client.post(BASE + "/measure", data=body, content_type="application/json")


def test_members_cannot_measure_and_an_admin_queues_one_measurement(api, member_api, engine_home):
    refused = measure(member_api)
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    assert OrmQ.objects.count() == 0 and Measurement.objects.filter(requested_at__isnull=False).count() == 0
    first = api.generic("POST", BASE + "/measure")  # no body, no content type
    assert first.status_code == 202 and first.json()["request"] == "waiting"
    assert first.json()["requested_at"] == Measurement.load().requested_at.isoformat().replace("+00:00", "Z")
    assert measure(api).status_code == 202  # a second while one waits queues nothing more
    assert OrmQ.objects.count() == 1
    measure_storage()
    doc = member_api.get(BASE).json()
    assert doc["request"] == "none" and doc["totals"] is not None
    # A request not finished after 15 minutes is said lost, and Measure now asks again
    now = timezone.now()
    Measurement.objects.filter(pk=1).update(requested_at=now - timedelta(hours=6), measured_at=now - timedelta(hours=7))
    assert member_api.get(BASE).json()["request"] == "lost"
    assert measure(api).json()["request"] == "waiting"
    assert OrmQ.objects.count() == 2


def test_the_measure_endpoint_takes_no_body_and_only_posts(api, engine_home):
    for body, code in (('{"now": true}', "unknown_field"), ("[1]", "invalid_body"), ('{"a": NaN}', "invalid_number")):
        refused = measure(api, body)
        assert (refused.status_code, refused.json()["code"]) == (400, code), body
    assert api.get(BASE + "/measure").status_code == 405
    assert api.put(BASE, data="{}", content_type="application/json").status_code == 405
    assert OrmQ.objects.count() == 0
