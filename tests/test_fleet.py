"""The fleet file under delete: strict reads, fenced writes, compaction, the ambiguity way out."""

from __future__ import annotations

import re
import subprocess
import threading

import pytest
from django.db import connection

from lifecycle import fleet
from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.actions.resolve_subagent import resolve_subagent
from lifecycle.deletion import executor
from lifecycle.enginefs import EngineHome
from lifecycle.errors import ActionRefused
from tests import factories
from tests.test_jobs import ROOT


def row(agent: str, conversation: m.Conversation | None, **extra) -> dict:
    origin = {"conversation": conversation.public_id} if conversation else None
    return {"agent_id": agent, "origin": origin, "status": "completed", "delivery": "settled",
            "started_at": "2020-01-01T00:00:00+00:00", "finished_at": "2020-01-02T00:00:00+00:00",
            "prompt": f"prompt of {agent}", **extra}


@pytest.mark.django_db
def test_it_never_reads_an_unreadable_fleet_as_empty(engine_home):
    home = EngineHome()
    assert fleet.read_rows(home.fleet_path) == []  # missing: empty
    home.fleet_path.parent.mkdir(parents=True)
    for broken in (b"{not json", b"[1, 2]", b'{"agents": {"a": 1}}', b'{"agents": [1]}'):
        home.fleet_path.write_bytes(broken)
        with pytest.raises(fleet.FleetUnreadable):
            fleet.read_rows(home.fleet_path)
        with pytest.raises(fleet.FleetUnreadable):
            fleet.update_fleet(lambda rows: rows)
        assert home.fleet_path.read_bytes() == broken  # nothing written over it


@pytest.mark.django_db(transaction=True)
def test_a_stale_snapshot_written_concurrently_cannot_bring_erased_rows_back(engine_home):
    target, other = factories.make_conversation(), factories.make_conversation()
    fleet.write_snapshot([row("sa_target", target), row("sa_other", other), row("sa_other2", other)])
    stale = fleet.read_rows(EngineHome().fleet_path)  # read by the engine before the delete
    op = request_deletion(target, key="fleet-1", acting_user=None)
    errors: list[BaseException] = []
    stop = threading.Event()

    def snapshot_writer() -> None:
        # The engine's debounced writer, still holding its old snapshot, with its own updates.
        try:
            n = 0
            while not stop.is_set():
                n += 1
                fleet.write_snapshot([{**r, "tick": n} for r in stale])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    writer = threading.Thread(target=snapshot_writer)
    writer.start()
    try:
        assert executor.run_erasure(op.pk) == "completed"
        fleet.write_snapshot(stale)  # and once more after the erasure finished
    finally:
        stop.set()
        writer.join(60)
    assert errors == []
    rows = fleet.read_rows(EngineHome().fleet_path)
    assert {r["agent_id"] for r in rows} == {"sa_other", "sa_other2"}
    op.refresh_from_db()
    assert {e["store"]: e["records"] for e in op.receipt["stores"]}["subagents"] == 1


@pytest.mark.django_db
def test_it_compacts_only_the_targets_rows_and_leaves_others_byte_for_byte(engine_home):
    target, other = factories.make_conversation(), factories.make_conversation()
    fleet.write_snapshot([row("sa_1", other), row("sa_2", target), row("sa_3", None, started_at="2000-01-01T00:00:00+00:00",
                                                                       finished_at="2000-01-02T00:00:00+00:00")])
    before = {r["agent_id"]: r for r in fleet.read_rows(EngineHome().fleet_path)}
    op = request_deletion(target, key="fleet-2", acting_user=None)
    executor.run_erasure(op.pk)
    after = {r["agent_id"]: r for r in fleet.read_rows(EngineHome().fleet_path)}
    assert after == {"sa_1": before["sa_1"], "sa_3": before["sa_3"]}


@pytest.mark.django_db
def test_an_admin_attributes_or_clears_an_ambiguous_row_then_the_delete_is_admitted(admin_user, engine_home):
    target = factories.make_conversation(days_idle=1)
    overlapping = row("sa_legacy", None, started_at=target.created_at.isoformat(),
                      finished_at=target.last_activity_at.isoformat(), prompt="legacy prompt")
    second = {**overlapping, "agent_id": "sa_legacy2"}
    fleet.write_snapshot([overlapping, second])
    home = EngineHome()
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [overlapping])
    assert request_deletion(target, key="amb-1", acting_user=admin_user).state == "unavailable"

    resolve_subagent("sa_legacy", action="attribute", conversation=target, acting_user=admin_user)
    resolve_subagent("sa_legacy2", action="clear", acting_user=admin_user)
    for path in (home.fleet_path, home.legacy_fleet_path):
        rows = fleet.read_rows(path)
        assert [fleet.origin_of(r) for r in rows] == [target.public_id]
    facts = {f.action: f for f in m.AuditFact.objects.filter(action__startswith="subagent.")}
    assert facts["subagent.attributed"].new_value == {"agent_id": "sa_legacy", "origin": target.public_id,
                                                      "cleared": False}
    assert facts["subagent.cleared"].old_value == {"agent_id": "sa_legacy2", "origin": None}
    assert "legacy prompt" not in str(facts["subagent.attributed"].new_value)

    op = request_deletion(target, key="amb-2", acting_user=admin_user)
    assert op.state == "pending"
    executor.run_erasure(op.pk)
    assert fleet.read_rows(home.fleet_path) == [] and fleet.read_rows(home.legacy_fleet_path) == []


@pytest.mark.django_db
def test_it_refuses_to_resolve_a_row_that_names_its_conversation_or_does_not_exist(admin_user, engine_home):
    owner, other = factories.make_conversation(), factories.make_conversation()
    fleet.write_snapshot([row("sa_owned", owner)])
    cases = [
        ({"agent_id": "sa_owned", "action": "clear"}, "subagent_not_ambiguous"),
        ({"agent_id": "sa_owned", "action": "attribute", "conversation": other}, "subagent_not_ambiguous"),
        ({"agent_id": "sa_missing", "action": "clear"}, "not_found"),
        ({"agent_id": "sa_owned", "action": "burn"}, "invalid_action"),
        ({"agent_id": "sa_owned", "action": "attribute"}, "missing_conversation"),
    ]
    for kwargs, code in cases:
        with pytest.raises(ActionRefused) as caught:
            resolve_subagent(kwargs.pop("agent_id"), acting_user=admin_user, **kwargs)
        assert caught.value.code == code
    assert fleet.read_rows(EngineHome().fleet_path) == [row("sa_owned", owner)]
    assert not m.AuditFact.objects.exists()



@pytest.mark.django_db
def test_a_retried_resolution_answers_as_the_first_and_changes_nothing(admin_user, engine_home):
    owner, other = factories.make_conversation(), factories.make_conversation()
    fleet.write_snapshot([row("sa_a", None), row("sa_c", None)])
    resolve_subagent("sa_a", action="attribute", conversation=owner, acting_user=admin_user)
    resolve_subagent("sa_c", action="clear", acting_user=admin_user)
    after = fleet.read_rows(EngineHome().fleet_path)
    # the same requests again (a client that lost the first answers): no refusal, no second fact
    resolve_subagent("sa_a", action="attribute", conversation=owner, acting_user=admin_user)
    resolve_subagent("sa_c", action="clear", acting_user=admin_user)
    assert fleet.read_rows(EngineHome().fleet_path) == after
    assert [fleet.origin_of(r) for r in after] == [owner.public_id]
    assert sorted(m.AuditFact.objects.values_list("action", flat=True)) == ["subagent.attributed",
                                                                            "subagent.cleared"]
    # not a retry: another conversation, or a clear of a row never cleared here
    for agent_id, kwargs, code in [("sa_a", {"action": "attribute", "conversation": other}, "subagent_not_ambiguous"),
                                   ("sa_a", {"action": "clear"}, "subagent_not_ambiguous"),
                                   ("sa_never", {"action": "clear"}, "not_found"),
                                   ("sa_c", {"action": "attribute", "conversation": owner}, "not_found")]:
        with pytest.raises(ActionRefused) as caught:
            resolve_subagent(agent_id, acting_user=admin_user, **kwargs)
        assert caught.value.code == code, (agent_id, kwargs)
    assert fleet.read_rows(EngineHome().fleet_path) == after


@pytest.mark.django_db
def test_a_row_that_named_its_conversation_itself_is_not_taken_for_a_retry(admin_user, engine_home):
    owner = factories.make_conversation()
    fleet.write_snapshot([row("sa_own", owner)])
    with pytest.raises(ActionRefused) as caught:
        resolve_subagent("sa_own", action="attribute", conversation=owner, acting_user=admin_user)
    assert caught.value.code == "subagent_not_ambiguous"
    assert not m.AuditFact.objects.exists()

def test_every_fleet_write_goes_through_the_fenced_path():
    """`EngineHome.update_fleet` writes without the fence; nothing but tests may call it."""
    found = subprocess.run(["git", "grep", "-n", "-E", r"[A-Za-z_)]\.update_fleet\(", "--", "*.py"], cwd=ROOT,
                           capture_output=True, text=True).stdout.splitlines()
    unfenced = [line for line in found if not line.startswith(("tests/", "lifecycle/fleet.py"))
                and not re.search(r"\bfleet(_file)?\.update_fleet\(", line)]
    assert found and unfenced == []


@pytest.mark.django_db
@pytest.mark.parametrize("started_at", ["2020-01-01T10:00:00", "2020-02-30T10:00:00Z"])
def test_a_legacy_row_with_a_time_that_is_not_one_counts_as_unknown(admin_user, conversation, started_at):
    """A legacy row without an origin whose start has no offset, or is not a real day, is a
    row whose start is unknown: it may be the conversation's (ambiguous, with the way out),
    never a server error for every delete."""
    from django.test import Client

    from console.models import ApiToken
    from lifecycle import fleet
    from lifecycle.enginefs import EngineHome

    home = EngineHome()
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [
        *rows, {"agent_id": "sa_legacy1", "status": "completed", "delivery": "settled", "started_at": started_at}])
    _token, raw = ApiToken.issue(admin_user)
    api = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="127.0.0.1")
    answer = api.delete(f"/v1/threads/{conversation.public_id}", HTTP_IDEMPOTENCY_KEY="k-odd")
    assert answer.status_code == 409 and answer.json()["code"] == "conversation_child_ownership_ambiguous"
    assert api.get(f"/v1/threads/{conversation.public_id}/deletion-preview").status_code == 200
    assert api.get(f"/v1/operations/{answer.json()['operation']}").status_code == 200
    page = Client(HTTP_HOST="127.0.0.1")
    page.force_login(admin_user)
    assert page.get(f"/conversations/{conversation.public_id}/delete/").status_code == 200
