"""The fleet file under delete: strict reads, fenced writes, compaction, the ambiguity way out."""

from __future__ import annotations

import io
import json
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
@pytest.mark.parametrize("origin", [{"conversation": ""}, {"conversation": "unknown"}, {"conversation": None},
                                    {"conversation": 7}, "upper", "legacy"])
def test_a_row_whose_origin_names_no_conversation_is_ambiguous_never_another_conversations(
        admin_user, engine_home, origin):
    """r150: an origin that is not a conversation's public id ("", "unknown", the id in capitals
    or with a prefix) was taken for another conversation's row: the delete completed, the row
    with the conversation's prompt stayed, and the check said clean. It is a row of unknown
    origin: ambiguous for the conversation it overlaps, with the way out."""
    target = factories.make_conversation(days_idle=1)
    if origin == "upper":
        origin = {"conversation": target.public_id.upper()}
    elif origin == "legacy":
        origin = {"conversation": f"legacy:{target.public_id}"}
    odd = {**row("sa_odd", None, started_at=target.created_at.isoformat(),
                 finished_at=target.last_activity_at.isoformat(), prompt="SECRET-CHILD-CONTENT"), "origin": origin}
    fleet.write_snapshot([odd])
    assert fleet.origin_of(odd) is None
    op = request_deletion(target, key="odd-1", acting_user=admin_user)
    assert (op.state, op.reasons) == ("unavailable", ["conversation_child_ownership_ambiguous"])
    assert fleet.read_rows(EngineHome().fleet_path) == [odd]

    resolve_subagent("sa_odd", action="attribute", conversation=target, acting_user=admin_user)
    op = request_deletion(target, key="odd-2", acting_user=admin_user)
    executor.run_erasure(op.pk)
    op.refresh_from_db()
    assert op.state == "completed"
    assert fleet.read_rows(EngineHome().fleet_path) == []
    assert b"SECRET-CHILD-CONTENT" not in EngineHome().fleet_path.read_bytes()


@pytest.mark.django_db
@pytest.mark.parametrize("origin", ["upper", "legacy", "none-but-prompt"])
def test_a_row_of_unknown_origin_that_names_the_conversation_stays_its_delete_whenever_it_ran(
        admin_user, engine_home, origin):
    """r154: such a row that began after the conversation's last activity (a child started just
    after the last item) was neither ambiguous nor compacted: the delete completed, the check
    called it clean and the row kept the prompt. A row naming the conversation is ambiguous
    whatever its times; a new one is refused once the delete is under way; one that appears
    after is named by the erasure check."""
    from datetime import timedelta

    from django.core.management import call_command

    target = factories.make_conversation(days_idle=5)
    later = target.last_activity_at + timedelta(days=1)
    naming = {"upper": {"conversation": target.public_id.upper()},
              "legacy": {"conversation": f"legacy:{target.public_id}"}, "none-but-prompt": None}[origin]
    late = {**row("sa_late", None, started_at=later.isoformat(), finished_at=(later + timedelta(hours=1)).isoformat(),
                  prompt=f"SECRET-CHILD-CONTENT of {target.public_id}"), "origin": naming}
    unrelated = {**row("sa_other", None, started_at=later.isoformat(), finished_at=later.isoformat()), "origin": None}
    fleet.write_snapshot([late, unrelated])
    op = request_deletion(target, key="late-1", acting_user=admin_user)
    assert (op.state, op.reasons) == ("unavailable", ["conversation_child_ownership_ambiguous"])

    resolve_subagent("sa_late", action="clear", acting_user=admin_user)
    op = request_deletion(target, key="late-2", acting_user=admin_user)
    assert op.state == "pending"
    with pytest.raises(ActionRefused):  # a new row naming it, while its delete is under way
        fleet.put_row({**late, "agent_id": "sa_again"})
    executor.run_erasure(op.pk)
    op.refresh_from_db()
    assert op.state == "completed"
    home = EngineHome()
    assert [r["agent_id"] for r in fleet.read_rows(home.fleet_path)] == ["sa_other"]  # the other row kept
    with pytest.raises(ActionRefused) as refused:  # once deleted, said so (r156: "being deleted")
        fleet.put_row({**late, "agent_id": "sa_after"})
    assert "was deleted" in refused.value.message
    # One written behind Lethe's back afterwards is residue the check names
    fleet.update_file(home, home.fleet_path, lambda rows: [*rows, {**late, "agent_id": "sa_behind"}])
    assert [r["agent_id"] for r in fleet.read_rows(home.fleet_path)] == ["sa_other", "sa_behind"]
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", target.public_id, "--json", stdout=out)
    assert caught.value.code == 1
    findings = json.loads(out.getvalue())["reports"][0]["logical_findings"]
    assert {"what": "fleet_rows", "count": 1, "where": "sa_behind"} in [
        {k: f[k] for k in ("what", "count", "where")} for f in findings], findings  # the id to clear (r156)
    op.refresh_from_db()
    assert op.receipt["verification"]["logical"] == "found"


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["clear", "attribute"])
@pytest.mark.parametrize("where", ["legacy", "same-file"])
def test_a_copy_of_unknown_origin_beside_one_that_names_its_conversation_can_be_resolved(
        admin_user, engine_home, action, where):
    """r156: one agent id with a copy naming its conversation (the other file's, or twice in one
    file) and a copy of unknown origin quoting the target's id: the delete was held back by the
    latter and every resolution refused for the former, with no way out but editing the file.
    The resolution changes the unknown copies only; the other stays as it was."""
    from datetime import timedelta

    target, other = factories.make_conversation(days_idle=5), factories.make_conversation(days_idle=5)
    later = (target.last_activity_at + timedelta(days=400)).isoformat()
    known = row("sa_b", other, prompt=f"about {target.public_id}")
    unknown = {**row("sa_b", None, started_at=later, finished_at=later, prompt=f"about {target.public_id}"),
               "origin": None}
    home = EngineHome()
    if where == "legacy":
        fleet.write_snapshot([known])
        fleet.update_file(home, home.legacy_fleet_path, lambda rows: [unknown])
    else:
        fleet.update_file(home, home.fleet_path, lambda rows: [known, unknown])
    op = request_deletion(target, key="mixed-1", acting_user=admin_user)
    assert (op.state, op.reasons) == ("unavailable", ["conversation_child_ownership_ambiguous"])
    if action == "clear":
        resolve_subagent("sa_b", action="clear", acting_user=admin_user)
        resolve_subagent("sa_b", action="clear", acting_user=admin_user)  # a retry answers as the first
    else:
        resolve_subagent("sa_b", action="attribute", conversation=other, acting_user=admin_user)
        resolve_subagent("sa_b", action="attribute", conversation=other, acting_user=admin_user)
    rows = fleet.read_rows(home.fleet_path) + fleet.read_rows(home.legacy_fleet_path)
    assert known in rows  # untouched
    assert [fleet.origin_of(r) for r in rows] == [other.public_id] * (1 if action == "clear" else 2)
    op = request_deletion(target, key="mixed-2", acting_user=admin_user)
    assert op.state == "pending"
    executor.run_erasure(op.pk)
    op.refresh_from_db()
    assert op.state == "completed"
    assert known in fleet.read_rows(home.fleet_path) + fleet.read_rows(home.legacy_fleet_path)


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


def _resolve_in_a_process_killed_after_the_files(tmp_path, engine_home, user, call: str) -> None:
    """Run `resolve_subagent(<call>)` in its own process, SIGKILLed once the fleet files changed
    and before its audit fact commits."""
    import os
    import signal
    import sys

    from lifecycle.actions.resolve_subagent import FILES_CHANGED
    from tests.test_jobs import database_url

    kills = tmp_path / "kills"
    kills.mkdir(exist_ok=True)
    for marker in kills.iterdir():
        marker.unlink()
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "ENGINE_HOME": str(engine_home), "LETHE_TEST_KILL_AT": FILES_CHANGED, "LETHE_TEST_KILL_DIR": str(kills)}
    code = ("from django.contrib.auth import get_user_model\n"
            "from lifecycle.models import Conversation\n"
            "from lifecycle.actions.resolve_subagent import resolve_subagent\n"
            f"user = get_user_model().objects.get(pk={user.pk})\n"
            f"resolve_subagent({call}, acting_user=user)\n")
    run = subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]


@pytest.mark.django_db(transaction=True)
def test_a_resolution_killed_after_the_files_changed_is_recorded_by_its_retry_and_by_recovery(
        tmp_path, engine_home, admin_user):
    from lifecycle import tasks

    target = factories.make_conversation()
    fleet.write_snapshot([row("sa_a", None), row("sa_c", None), row("sa_kept", None)])

    _resolve_in_a_process_killed_after_the_files(tmp_path, engine_home, admin_user, '"sa_c", action="clear"')
    assert [r["agent_id"] for r in fleet.read_rows(EngineHome().fleet_path)] == ["sa_a", "sa_kept"]
    assert not m.AuditFact.objects.exists()  # rolled back with the process
    assert list(m.SubagentResolution.objects.values_list("agent_id", "action")) == [("sa_c", "clear")]
    # The admin's retry (the first answer never came) succeeds and the clear is recorded, once.
    resolve_subagent("sa_c", action="clear", acting_user=admin_user)
    cleared = m.AuditFact.objects.get(action="subagent.cleared")
    assert cleared.actor == admin_user and cleared.new_value == {"agent_id": "sa_c", "origin": None, "cleared": True}
    assert not m.SubagentResolution.objects.exists()

    _resolve_in_a_process_killed_after_the_files(
        tmp_path, engine_home, admin_user,
        f'"sa_a", action="attribute", conversation=Conversation.objects.get(pk={target.pk})')
    assert [fleet.origin_of(r) for r in fleet.read_rows(EngineHome().fleet_path)] == [target.public_id, None]
    assert not m.AuditFact.objects.filter(action="subagent.attributed").exists()
    # Nobody retries: the every-minute recovery records it, as its admin's.
    assert tasks.recover()["subagents"] == 1
    attributed = m.AuditFact.objects.get(action="subagent.attributed")
    assert attributed.actor == admin_user and attributed.conversation == target
    assert attributed.new_value == {"agent_id": "sa_a", "origin": target.public_id, "cleared": False}
    assert not m.SubagentResolution.objects.exists()
    assert tasks.recover()["subagents"] == 0
    assert m.AuditFact.objects.filter(action__startswith="subagent.").count() == 2
    assert [r["agent_id"] for r in fleet.read_rows(EngineHome().fleet_path)] == ["sa_a", "sa_kept"]


@pytest.mark.django_db
def test_a_resolution_cut_short_is_finished_from_its_record_or_dropped_when_it_can_no_longer_be(
        admin_user, engine_home):
    """What recovery does with a resolution a killed process left before its files changed: it
    carries it out (the admin's request was written down); one whose conversation is being
    deleted (its row never attributed), or whose row now names a conversation, is dropped
    without a fact; while the fleet file cannot be read every one is kept for later."""
    from lifecycle.actions.resolve_subagent import settle_resolutions

    live, leaving, owner = (factories.make_conversation() for _ in range(3))
    m.Conversation.objects.filter(pk=leaving.pk).update(state=m.ConversationState.PENDING_DELETE)
    fleet.write_snapshot([row("sa_1", None), row("sa_2", None), row("sa_3", owner)])
    for agent_id, action, conversation in (("sa_1", "attribute", live), ("sa_2", "attribute", leaving),
                                           ("sa_3", "clear", None)):
        m.SubagentResolution.objects.create(agent_id=agent_id, action=action, actor=admin_user,
                                            conversation_public_id=conversation.public_id if conversation else "")
    home = EngineHome()
    good = home.fleet_path.read_bytes()
    home.fleet_path.write_bytes(b"{not json")
    assert settle_resolutions() == 0 and m.SubagentResolution.objects.count() == 3
    home.fleet_path.write_bytes(good)
    assert settle_resolutions() == 3 and not m.SubagentResolution.objects.exists()
    assert [fleet.origin_of(r) for r in fleet.read_rows(home.fleet_path)] == [live.public_id, None, owner.public_id]
    assert list(m.AuditFact.objects.values_list("action", "conversation")) == [("subagent.attributed", live.pk)]


@pytest.mark.django_db
def test_an_attribution_cut_short_is_on_record_before_its_conversation_is_deleted(admin_user, engine_home):
    """r25: the attribution's files changed, its process killed, the admin then deleted the
    conversation (now admitted: the row is its own) and recovery dropped the attribution, so
    nothing recorded who made the row erasable with it. The delete's admission records it first."""
    from lifecycle.actions.resolve_subagent import settle_resolutions

    target = factories.make_conversation()
    attributed = {**row("sa_d", None), "origin": {"conversation": target.public_id, "attributed": True}}
    fleet.write_snapshot([attributed])  # as the killed process left the files
    m.SubagentResolution.objects.create(agent_id="sa_d", action="attribute", actor=admin_user,
                                        conversation_public_id=target.public_id)
    op = request_deletion(target, key="after-cut", acting_user=admin_user)
    assert op.state == "pending" and not m.SubagentResolution.objects.exists()
    fact = m.AuditFact.objects.get(action="subagent.attributed")
    assert (fact.actor, fact.conversation, fact.new_value["origin"]) == (admin_user, target, target.public_id)
    # Recovery coming after a delete admitted meanwhile (the resolution's lock was the only
    # thing in the delete's way): its rows attributed there, or gone with the delete, are what
    # the attribution made, on record; a row never attributed is left as it was, with no fact.
    others = [factories.make_conversation() for _ in range(3)]
    fleet.write_snapshot([{**row("sa_e", None), "origin": {"conversation": others[0].public_id, "attributed": True}},
                          row("sa_g", None)])
    for agent_id, conversation in (("sa_e", others[0]), ("sa_f", others[1]), ("sa_g", others[2])):
        m.Conversation.objects.filter(pk=conversation.pk).update(state=m.ConversationState.PENDING_DELETE)
        m.SubagentResolution.objects.create(agent_id=agent_id, action="attribute", actor=admin_user,
                                            conversation_public_id=conversation.public_id)
    assert settle_resolutions() == 3 and not m.SubagentResolution.objects.exists()
    assert sorted(m.AuditFact.objects.filter(action="subagent.attributed").values_list("new_value__agent_id",
                                                                                      flat=True)) == [
        "sa_d", "sa_e", "sa_f"]
    assert [fleet.origin_of(r) for r in fleet.read_rows(EngineHome().fleet_path)] == [others[0].public_id, None]


@pytest.mark.django_db
def test_a_resolution_that_recovery_finished_first_is_answered_as_done(admin_user, engine_home, monkeypatch):
    """Recovery runs between the commit of the record and the request's own change: the
    request answers as its retry would (done), with one fact."""
    from lifecycle.actions import resolve_subagent as action

    fleet.write_snapshot([row("sa_c", None)])
    carry_out = action._carry_out

    def recovery_first(pk, home, *, settling):
        monkeypatch.setattr(action, "_carry_out", carry_out)
        assert action.settle_resolutions() == 1
        return carry_out(pk, home, settling=settling)

    monkeypatch.setattr(action, "_carry_out", recovery_first)
    resolve_subagent("sa_c", action="clear", acting_user=admin_user)
    assert fleet.read_rows(EngineHome().fleet_path) == []
    assert m.AuditFact.objects.filter(action="subagent.cleared").count() == 1
    assert not m.SubagentResolution.objects.exists()

    # A delete of the conversation asked for in between: its admission settles the attribution
    # (the row becomes the conversation's, so the delete is admitted). The request answers done,
    # not that the conversation is being deleted.
    target = factories.make_conversation()
    fleet.write_snapshot([row("sa_a", None)])
    deleted: list = []

    def delete_first(pk, home, *, settling):
        monkeypatch.setattr(action, "_carry_out", carry_out)
        deleted.append(request_deletion(target, key="between", acting_user=admin_user))
        return carry_out(pk, home, settling=settling)

    monkeypatch.setattr(action, "_carry_out", delete_first)
    resolve_subagent("sa_a", action="attribute", conversation=target, acting_user=admin_user)
    assert deleted[0].state == "pending" and not m.SubagentResolution.objects.exists()
    assert m.AuditFact.objects.get(action="subagent.attributed").conversation == target


@pytest.mark.django_db(transaction=True)
def test_another_resolution_of_a_row_under_way_is_refused_as_busy(admin_user, engine_home, monkeypatch):
    """Another request's resolution of the row, another action, is under way: its record is
    committed and locked by that request (PostgreSQL: a real second connection holds the lock,
    and the settle passes it over; SQLite's one write lock keeps two requests apart, so there the
    record alone stands for it). The clear is refused as busy and changes nothing."""
    import psycopg

    from lifecycle.actions import resolve_subagent as action
    from tests.test_jobs import database_url

    # The attribution under way has changed the files already, its fact not yet committed
    # (r25: the second request answered "No subagent row has that id").
    owner = factories.make_conversation()
    fleet.write_snapshot([{**row("sa_c", None), "origin": {"conversation": owner.public_id, "attributed": True}}])
    pending = m.SubagentResolution.objects.create(agent_id="sa_c", action="attribute", actor=admin_user,
                                                  conversation_public_id=owner.public_id)
    holder = None
    if connection.vendor == "postgresql":
        holder = psycopg.connect(database_url())
        holder.execute("SELECT id FROM lifecycle_subagentresolution WHERE id = %s FOR UPDATE", [pending.pk])
    else:
        carry_out = action._carry_out
        monkeypatch.setattr(action, "_carry_out", lambda pk, home, *, settling, wait=False: (
            False if settling else carry_out(pk, home, settling=settling)))
    try:
        for kwargs in ({"action": "clear"}, {"action": "attribute", "conversation": factories.make_conversation()}):
            with pytest.raises(ActionRefused) as caught:
                resolve_subagent("sa_c", acting_user=admin_user, **kwargs)
            assert caught.value.code == "busy" and caught.value.status == 409
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    assert [fleet.origin_of(r) for r in fleet.read_rows(EngineHome().fleet_path)] == [owner.public_id]
    assert not m.AuditFact.objects.exists()
    assert list(m.SubagentResolution.objects.values_list("pk", flat=True)) == [pending.pk]


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor != 'postgresql'",
                    reason="PostgreSQL's row lock; SQLite's one write lock keeps two requests apart")
def test_the_same_resolution_under_way_is_waited_for_then_answered_as_its_retry(admin_user, engine_home):
    """r122: a double press of "Clear this row" while the first press's resolution held its
    record's lock was refused as busy. The same resolution is waited for, then answered as a
    retry: one fact, the row cleared once."""
    import psycopg

    from tests.test_jobs import database_url

    fleet.write_snapshot([])  # the first press changed the files; its fact not yet committed
    pending = m.SubagentResolution.objects.create(agent_id="sa_c", action="clear", actor=admin_user)
    holder = psycopg.connect(database_url())
    holder.execute("SELECT id FROM lifecycle_subagentresolution WHERE id = %s FOR UPDATE", [pending.pk])
    released = threading.Timer(1.0, holder.rollback)  # the first press stops short: its record stays
    released.start()
    try:
        resolve_subagent("sa_c", action="clear", acting_user=admin_user)
    finally:
        released.join()
        holder.close()
    assert fleet.read_rows(EngineHome().fleet_path) == []
    assert list(m.AuditFact.objects.values_list("action", "actor", "new_value__agent_id")) == [
        ("subagent.cleared", admin_user.pk, "sa_c")]
    assert not m.SubagentResolution.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("how", ["clear", "attribute"])
def test_identical_resolutions_sent_at_once_all_answer_200_and_resolve_the_row_once(admin_user, engine_home,
                                                                                   monkeypatch, how):
    """r122: five identical POST /v1/subagents/{id}/resolve at once (a double press, retries
    racing a lost answer) gave 2x200 and 3x409 busy on PostgreSQL. Each request has its own
    connection; the files are written slowly, so the others arrive while the first holds its
    record. Every one answers 200, the row is resolved once, with one fact."""
    from django.test import Client

    from console.models import ApiToken

    owner = factories.make_conversation()
    fleet.write_snapshot([row("sa_c", None), row("sa_keep", None)])
    update_file = fleet.update_file

    def slowly(*args, **kwargs):
        import time

        time.sleep(0.3)
        return update_file(*args, **kwargs)

    monkeypatch.setattr(fleet, "update_file", slowly)
    body = {"action": "clear"} if how == "clear" else {"action": "attribute", "conversation": owner.public_id}
    tokens = [ApiToken.issue(admin_user)[1] for _ in range(5)]
    answers: list[tuple[int, dict]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(tokens))

    def press(token: str) -> None:
        try:
            client = Client(HTTP_AUTHORIZATION=f"Bearer {token}", HTTP_HOST="127.0.0.1")
            start.wait()
            response = client.post("/v1/subagents/sa_c/resolve", body, content_type="application/json")
            answers.append((response.status_code, response.json()))
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection

    threads = [threading.Thread(target=press, args=(token,)) for token in tokens]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert [status for status, _body in answers] == [200] * 5, answers
    rows = fleet.read_rows(EngineHome().fleet_path)
    if how == "clear":
        assert [r["agent_id"] for r in rows] == ["sa_keep"]
    else:
        assert [(r["agent_id"], fleet.origin_of(r)) for r in rows] == [("sa_c", owner.public_id), ("sa_keep", None)]
    facts = m.AuditFact.objects.filter(action__startswith="subagent.")
    fact = {"clear": "subagent.cleared", "attribute": "subagent.attributed"}[how]
    assert list(facts.values_list("action", "new_value__agent_id")) == [(fact, "sa_c")]
    assert not m.SubagentResolution.objects.exists()


@pytest.mark.django_db
def test_a_delete_settles_every_resolution_cut_short_before_its_admission(admin_user, engine_home):
    """r27: with more than 100 left, the delete's admission settled the first 100 only, and the
    conversation's attribution was recorded after its erasure. Now every one is settled first,
    and recovery settles them before it erases."""
    target = factories.make_conversation()
    others = [row(f"sa_{n:03d}", None) for n in range(101)]
    fleet.write_snapshot([*others, {**row("sa_t", None), "origin": {"conversation": target.public_id,
                                                                   "attributed": True}}])
    m.SubagentResolution.objects.bulk_create(
        [m.SubagentResolution(agent_id=r["agent_id"], action="clear", actor=admin_user) for r in others]
        + [m.SubagentResolution(agent_id="sa_t", action="attribute", actor=admin_user,
                                conversation_public_id=target.public_id)])
    op = request_deletion(target, key="after-many", acting_user=admin_user)
    assert op.state == "pending" and not m.SubagentResolution.objects.exists()
    facts = list(m.AuditFact.objects.order_by("pk").values_list("action", flat=True))
    assert facts.count("subagent.cleared") == 101
    assert facts.index("subagent.attributed") < facts.index("conversation.delete_requested")
    assert [r["agent_id"] for r in fleet.read_rows(EngineHome().fleet_path)] == ["sa_t"]
