"""The residue verifier: markers in every store are found before erasure and gone after."""

from __future__ import annotations

import json
import secrets
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from lifecycle import fleet
from lifecycle import models as m
from lifecycle.actions.record_compaction import record_compaction
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor, fingerprints, verify
from lifecycle.enginefs import EngineHome
from lifecycle.registry import content_tables
from tests import factories

# The physical scan needs committed data and a checkpoint outside any transaction.
pytestmark = pytest.mark.django_db(transaction=True)

SAMPLED = ["lifecycle.Item", "tool", "lifecycle.Goal", "lifecycle.MailEnvelope", "lifecycle.SessionDocument",
           "lifecycle.BranchJournalEntry", "lifecycle.Checkpoint", "lifecycle.RecoveryMaterial",
           "lifecycle.RuntimeClaim", "lifecycle.ProcessLease", "lifecycle.OperationBinding",
           "lifecycle.HistoryReceipt"]
FILE_SAMPLED = ["events", "approval_receipts", "artifacts", "subagents", "legacy_subagents"]


def found_markers(op: m.DeleteOperation, markers: dict[str, str]) -> set[str]:
    """Which markers the raw scan finds, by the bytes of the windows it hits."""
    scanner = fingerprints.Scanner(m.ErasureFingerprint.objects.get(operation=op))
    windows = []
    for path in verify.database_files() + verify.engine_files(EngineHome()):
        windows += [scanner.window_at(hit) for hit in scanner.scan_file(path)]
    return {key for key, value in markers.items()
            if any(value.split("-")[-1][i:i + 24].encode() in w for w in windows for i in (0, 28, 56))}


def test_it_finds_every_stores_markers_before_and_none_after():
    target = factories.make_conversation(title="Marked")
    markers = factories.fill_every_store(target)
    other = factories.make_conversation(title="Bystander")
    other_markers = factories.fill_every_store(other)
    op = request_deletion(target, key="verify-1", acting_user=None)
    fingerprints.record(op, fingerprints.sample(target, EngineHome()))
    expected = set(FILE_SAMPLED) | (set(SAMPLED) if connection.vendor == "sqlite" else set())
    assert found_markers(op, markers) == expected
    before = verify.verify(op, physical=True, record=False)
    assert before.physical == "found" and before.logical  # everything still there

    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    # The delete ran the residue check of every store itself: a clean report in its receipt
    assert op.verified_at is not None and op.receipt["verification"]["logical"] == "clean"
    assert op.verified_physical_at is None  # reading the files stays the operator's command
    # Hits that remain are text the bystander shares (the tool payload's opening), never a marker.
    assert found_markers(op, markers) == set()
    report = verify.verify(op, physical=True)
    assert report.logical == [] and report.physical_findings == []
    op.refresh_from_db()
    assert op.verified_at is not None
    if connection.vendor == "sqlite":
        # secure_delete and the checkpoint: physically erased, recorded, fingerprints dropped.
        assert (report.physical, op.physical_state) == ("clean", "erased")
        assert op.verified_physical_at is not None
        assert not m.ErasureFingerprint.objects.filter(operation=op).exists()
        raw = b"".join(p.read_bytes() for p in verify.database_files())
        for key in SAMPLED:
            assert markers[key].encode() not in raw, key
        assert other_markers["lifecycle.Item"].encode() in raw
    else:
        assert (report.physical, op.physical_state) == ("pending", "pending")
        assert op.verified_physical_at is None
        assert m.ErasureFingerprint.objects.filter(operation=op).exists()
        assert record_compaction(started_at=timezone.now(), finished_at=timezone.now(),
                                 tables=op.touched_tables) == 1
        assert verify.verify(op, physical=True).physical == "clean"
        op.refresh_from_db()
        assert op.verified_physical_at is not None
    # Retained rows and the bystander's content are intact.
    assert m.MemoryEntry.objects.filter(text=markers["lifecycle.MemoryEntry"]).exists()
    assert m.Item.objects.filter(content=other_markers["lifecycle.Item"]).exists()


def test_it_exits_non_zero_and_names_what_it_finds(capsys, admin_client):
    client = admin_client
    target = factories.make_conversation()
    markers = factories.fill_every_store(target)
    op = request_deletion(target, key="verify-2", acting_user=None)
    executor.run_erasure(op.pk)
    call_command("verify_erasure", "--all")
    assert "logical: clean" in capsys.readouterr().out
    # Residue planted behind the lifecycle's back: a folder reappears, and a stray copy of content.
    home = EngineHome()
    home.thread_dir(target.storage_key).mkdir(parents=True)
    (home.thread_dir(target.storage_key) / "events.jsonl").write_bytes(b"{}\n")
    (home.root / "stray-copy.txt").write_bytes(markers["events"].encode() * 2)
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", target.public_id, "--physical", "--json")
    assert caught.value.code == 1
    out = json.loads(capsys.readouterr().out)
    report = out["reports"][0]
    assert out["found"] is True
    assert report["logical_findings"] == [{"store": "events", "what": "folder", "count": 1, "where": ""}]
    assert [f["where"] for f in report["physical_findings"]] == ["engine:stray-copy.txt"]
    op.refresh_from_db()
    assert op.receipt["verification"]["logical"] == "found"
    # The receipt's page says so, instead of "not verified yet" under "the content is erased"
    page = client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert 'data-testid="residue-found"' in page
    # The command to run, whole, with this operation's id
    assert (f'<code class="cmd" translate="no"><span>manage.py</span> <span>verify_erasure</span> '
            f'<span>--erase-residue</span> <span>{op.public_id}</span></code>') in page
    assert "Not verified yet" not in page

    # The operator erases what came back; the stray copy outside any store stays the operator's to remove
    (home.root / "stray-copy.txt").unlink()
    call_command("verify_erasure", target.public_id, "--erase-residue", "--json")
    out = json.loads(capsys.readouterr().out)
    assert out["found"] is False and out["reports"][0]["erased_again"] == ["events"]
    assert not home.thread_dir(target.storage_key).exists()
    op.refresh_from_db()
    assert op.receipt["verification"]["logical"] == "clean"
    # That check read no raw bytes: the last raw-byte finding stands until one does
    assert op.receipt["verification"]["physical"] == "found"
    page = client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert 'data-testid="residue-found"' not in page and 'data-testid="residue-engine-files"' in page
    call_command("verify_erasure", target.public_id, "--physical")
    op.refresh_from_db()
    assert op.receipt["verification"]["physical"] in ("clean", "pending")  # PostgreSQL: until finish_erasure
    page = client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "residue-" not in page and "clean" in page


def _stray_copy(conversation, home: EngineHome) -> Path:
    """The conversation's artifact copied elsewhere in the engine folder (by hand, by a tool):
    no store of the conversation holds it, only its raw bytes say whose it is."""
    stray = home.root / "stray" / "copy.txt"
    stray.parent.mkdir()
    stray.write_bytes((home.artifacts_dir(conversation.storage_key) / "large-output.txt").read_bytes())
    return stray


def test_a_check_without_raw_bytes_keeps_the_last_raw_byte_finding(admin_client, capsys):
    """`verify_erasure --all` (what the restore procedure runs) reads no raw bytes: it must not
    replace a raw-byte finding with "clean", nor the page stop showing it."""
    target = factories.make_conversation(title="Marked")
    factories.fill_every_store(target)
    home = EngineHome()
    stray = _stray_copy(target, home)
    op = request_deletion(target, key="verify-kept", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert verify.verify(op, physical=True).physical == "found"
    op.refresh_from_db()
    found = op.receipt["verification"]
    assert (found["physical"], found["physical_files"]) == ("found", {"erasable": 0, "engine_folder": 1, "database": 0})
    assert found["physical_at"] == found["at"]

    call_command("verify_erasure", "--all")
    out = capsys.readouterr().out
    assert "logical: clean" in out and f"last raw-byte check ({found['physical_at']}): CONTENT FOUND" in out
    op.refresh_from_db()
    kept = op.receipt["verification"]
    assert kept["at"] > found["at"] and kept["logical"] == "clean"
    assert (kept["physical"], kept["physical_at"], kept["physical_files"], kept["findings"]) == (
        "found", found["physical_at"], found["physical_files"], 1)
    assert stray.exists()
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert 'data-testid="residue-engine-files"' in page
    assert "in 1 file of the engine folder that is not this conversation's own." in page
    assert "does not remove such files" in page and "delete them or the copied content by hand" in page
    api = admin_client.get(f"/v1/operations/{op.public_id}", HTTP_HOST="127.0.0.1").json()
    assert api["receipt"]["verification"]["physical"] == "found"


def test_the_advice_names_what_erase_residue_removes_and_what_it_cannot(admin_client, capsys):
    target = factories.make_conversation(title="Marked")
    factories.fill_every_store(target)
    home = EngineHome()
    artifact = (home.artifacts_dir(target.storage_key) / "large-output.txt").read_bytes()
    stray = _stray_copy(target, home)
    op = request_deletion(target, key="verify-advice", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    # Written back into the conversation's own folder after the delete, by a process outside Lethe
    own = home.artifacts_dir(target.storage_key) / "large-output.txt"
    own.parent.mkdir(parents=True)
    own.write_bytes(artifact)
    op.refresh_from_db()
    report = verify.verify(op, physical=True)
    assert {f.where: f.erasable for f in report.physical_findings} == {
        f"engine:artifacts/{target.storage_key}/large-output.txt": True, "engine:stray/copy.txt": False}
    op.refresh_from_db()
    assert op.receipt["verification"]["physical_files"] == {"erasable": 1, "engine_folder": 1, "database": 0}
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    for shown in ("residue-found", "residue-own-files", "residue-engine-files"):
        assert f'data-testid="{shown}"' in page
    spanish = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1",
                               HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "Borrar los restos (--erase-residue) no elimina esos archivos" in spanish

    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", op.public_id, "--physical", "--erase-residue")
    assert caught.value.code == 1
    out = capsys.readouterr().out
    assert "erased again: artifacts" in out
    assert "engine:stray/copy.txt: not this conversation's own file, so --erase-residue does not remove it" in out
    assert not own.parent.exists() and stray.exists()  # the copy elsewhere stays the operator's
    op.refresh_from_db()
    assert op.receipt["verification"]["physical_files"] == {"erasable": 0, "engine_folder": 1, "database": 0}
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert 'data-testid="residue-found"' not in page and 'data-testid="residue-own-files"' not in page
    assert 'data-testid="residue-engine-files"' in page and "Every store re-checked on" in page


def test_a_raw_byte_check_without_fingerprints_says_it_scanned_nothing(admin_client, capsys):
    """A clean raw-byte check drops the fingerprints. A later --physical check has nothing to
    look for: it must say so, not "clean" (a copy of the content placed in the engine folder
    since then is not looked for), and the receipt keeps the clean result with its date."""
    target = factories.make_conversation(title="Marked")
    factories.fill_every_store(target)
    home = EngineHome()
    artifact = (home.artifacts_dir(target.storage_key) / "large-output.txt").read_bytes()
    op = request_deletion(target, key="verify-no-fingerprints", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    if connection.vendor == "postgresql":  # as finish_erasure records it
        assert record_compaction(started_at=timezone.now(), finished_at=timezone.now(),
                                 tables=content_tables()) == 1
    op.refresh_from_db()
    fingerprint_line = {e["store"]: e for e in op.receipt["kept"]}["lifecycle.ErasureFingerprint"]
    assert (fingerprint_line["action"], fingerprint_line["records"], fingerprint_line["days"]) == ("kept", 1, 7)
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "Erasure check fingerprints" in page and "1 record kept until its period after the delete runs out" in page
    assert verify.verify(op, physical=True).physical == "clean"
    op.refresh_from_db()
    clean = op.receipt["verification"]
    assert op.verified_physical_at is not None and not m.ErasureFingerprint.objects.filter(operation=op).exists()
    # The receipt says they went, and why: before their week ran out, after the clean check.
    fingerprint_line = {e["store"]: e for e in op.receipt["kept"]}["lifecycle.ErasureFingerprint"]
    assert (fingerprint_line["action"], fingerprint_line["after_check"]) == ("expired", True)
    assert fingerprint_line["expired_at"] == clean["physical_at"]
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "1 record, removed on" in page and "after a clean physical check" in page
    (home.root / "stray").mkdir()
    (home.root / "stray" / "copy.txt").write_bytes(artifact)

    call_command("verify_erasure", op.public_id, "--physical", "--json")
    report = json.loads(capsys.readouterr().out)["reports"][0]
    assert (report["physical"], report["windows"], report["found"]) == ("no_fingerprints", 0, False)
    assert report["last_physical"] == {"result": "clean", "at": clean["physical_at"],
                                       "files": {"erasable": 0, "engine_folder": 0, "database": 0}}
    op.refresh_from_db()
    recorded = op.receipt["verification"]
    assert (recorded["physical"], recorded["physical_at"]) == ("clean", clean["physical_at"])
    assert recorded["unscanned"] == {"at": recorded["at"], "reason": "no_fingerprints"}
    call_command("verify_erasure", op.public_id, "--physical")
    out = capsys.readouterr().out
    assert "physical: no fingerprints, so nothing was scanned" in out
    assert f"last raw-byte check ({clean['physical_at']}): clean" in out
    page = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert 'data-testid="physical-unscanned"' in page and "scanned nothing: no fingerprints" in page
    assert "Verified on" in page  # the clean check that did scan, with its own date
    spanish = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1",
                               HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "no examinó nada: no se conservan huellas" in spanish

    op.refresh_from_db()
    unscanned = op.receipt["verification"]["unscanned"]
    verify.verify(op)  # a check of the stores only keeps both
    op.refresh_from_db()
    assert op.receipt["verification"]["unscanned"] == unscanned
    assert op.receipt["verification"]["physical"] == "clean"


def test_an_unknown_or_unfinished_target_exits_2_not_1_which_means_residue():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError) as caught:
        call_command("verify_erasure", "c_nope")
    assert caught.value.returncode == 2


def test_it_refuses_to_verify_an_unfinished_delete():
    target = factories.make_conversation()
    op = request_deletion(target, key="verify-3", acting_user=None)
    with pytest.raises(Exception, match="pending"):
        call_command("verify_erasure", op.public_id)


def test_it_records_physical_erasure_only_for_receipts_a_compaction_covers():
    early, late, wide = (factories.make_conversation() for _ in range(3))
    for conversation in (early, late, wide):
        factories.add_message(conversation, content="x")
    m.Goal.objects.create(conversation=wide, text="goal")
    ops = {}
    for name, conversation in (("early", early), ("wide", wide)):
        ops[name] = request_deletion(conversation, key=f"rc-{name}", acting_user=None)
        executor.run_erasure(ops[name].pk)
    started = timezone.now()
    ops["late"] = request_deletion(late, key="rc-late", acting_user=None)
    executor.run_erasure(ops["late"].pk)
    m.DeleteOperation.objects.update(physical_state="pending", physically_erased_at=None)
    finished = started + timedelta(seconds=5)
    # Every delete names every content table, also one its conversation had no rows in.
    assert {tuple(op.touched_tables) for op in m.DeleteOperation.objects.all()} == {tuple(content_tables())}
    assert record_compaction(started_at=started, finished_at=finished,
                             tables=[t for t in content_tables() if t != "lifecycle_goal"]) == 0
    assert record_compaction(started_at=started, finished_at=finished, tables=content_tables()) == 2
    states = {name: m.DeleteOperation.objects.get(pk=op.pk) for name, op in ops.items()}
    assert (states["early"].physical_state, states["early"].physically_erased_at) == ("erased", finished)
    assert states["wide"].physical_state == "erased"
    assert not any(h.get("kind") in ("database_files", "wal") for h in states["early"].receipt["holders"])
    assert states["late"].physical_state == "pending"  # finished after the compaction started
    assert record_compaction(started_at=started, finished_at=finished, tables=content_tables()) == 0


@pytest.mark.parametrize("reached_by", ["symlink", "relative path"])
def test_an_old_format_fleet_temporary_is_erased_however_engine_home_is_reached(settings, tmp_path, monkeypatch,
                                                                               engine_home, reached_by):
    """`subagents.v1.json.tmp-<8 hex>`, an earlier release's leftover, holds the conversation's
    rows: the delete removes it and the receipt's clean report is true, with ENGINE_HOME a
    link to the folder (/var/lib/lethe/engine -> /data/engine) or a path relative to the
    working folder."""
    if reached_by == "symlink":
        (tmp_path / "engine-link").symlink_to(engine_home)
        settings.ENGINE_HOME = tmp_path / "engine-link"
    else:
        monkeypatch.chdir(tmp_path)
        settings.ENGINE_HOME = Path("engine")
    target = factories.make_conversation(title="Fleet rows")
    markers = factories.fill_every_store(target)
    stale = engine_home / "state" / "subagents.v1.json.tmp-0123abcd"
    held = (engine_home / "state" / "subagents.v1.json").read_bytes()
    assert markers["subagents"].encode() in held
    stale.write_bytes(held)
    op = request_deletion(target, key="verify-legacy-tmp", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    assert not stale.exists()
    op.refresh_from_db()
    assert op.receipt["verification"]["logical"] == "clean"
    report = verify.verify(op, physical=True, record=False)
    assert report.logical == [] and not [f for f in report.physical_findings if "state/" in f.where]

    stale.write_bytes(held)  # the same leftover, found later (a restored copy of the folder)
    report = verify.verify(op, physical=True, record=False)
    assert [(f.store, f.what) for f in report.logical] == [("subagents", "fleet_temporary")]
    assert executor.erase_residue(op) == ["subagents"] and not stale.exists()


def test_an_area_folder_turned_into_a_symlink_is_a_finding_not_a_crash(tmp_path, capsys):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    op = request_deletion(target, key="verify-symlink", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    home = EngineHome()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    threads = home.root / "threads"
    threads.rename(tmp_path / "threads-moved")
    threads.symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", op.public_id, "--json")
    assert caught.value.code == 1
    report = json.loads(capsys.readouterr().out)["reports"][0]
    assert ("events", "unsafe_folder") in {(f["store"], f["what"]) for f in report["logical_findings"]}
    assert list(elsewhere.iterdir()) == []  # nothing was written or removed through the link


def test_erase_residue_refuses_a_conversation_folder_come_back_as_a_link_and_touches_nothing_behind_it(
        tmp_path, capsys):
    """r48: after a completed delete something outside Lethe made the conversation's folder a
    link; --erase-residue ended in a traceback with exit 1 (which means "found") and, with
    --json, no document at all."""
    target = factories.make_conversation()
    factories.fill_every_store(target)
    op = request_deletion(target, key="verify-link-back", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"not Lethe's")
    link = EngineHome().thread_dir(target.storage_key)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", op.public_id, "--erase-residue", "--json")
    out = capsys.readouterr().out
    assert caught.value.code == 2 and out.count("\n") == 1
    error = json.loads(out)["error"]
    assert error["code"] == "unsafe_path"
    assert error["message"].startswith(f"The residue of {op.public_id} was not all removed: ")
    assert link.is_symlink() and (outside / "keep.txt").read_bytes() == b"not Lethe's"
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="nothing was checked. Move it aside, then run this again.") as refused:
        call_command("verify_erasure", "--all", "--erase-residue")
    assert refused.value.returncode == 2
    link.unlink()  # moved aside: the check is clean again
    call_command("verify_erasure", op.public_id, "--erase-residue")


def test_all_writes_each_operation_as_it_is_checked_and_parses_the_fleet_once(monkeypatch):
    from io import StringIO

    from lifecycle import enginefs, fleet

    home = EngineHome()
    fleet.put_row({"agent_id": "someone-else", "status": "done", "delivery": "settled",
                   "origin": {"conversation": factories.make_conversation().public_id}}, home=home)
    ops = []
    for i in range(3):
        op = request_deletion(factories.make_conversation(), key=f"stream-{i}", acting_user=None)
        executor.run_erasure(op.pk)
        ops.append(op.public_id)
    out = StringIO()
    written_before: list[str] = []
    check = verify.verify
    parses: list[str] = []
    parse = enginefs._parse_fleet
    monkeypatch.setattr(enginefs, "_parsed", {})
    monkeypatch.setattr(enginefs, "_parse_fleet", lambda path, data: parses.append(str(path)) or parse(path, data))

    def spy(op, **kw):
        written_before.append(out.getvalue())
        return check(op, **kw)

    monkeypatch.setattr("lifecycle.management.commands.verify_erasure.verify", spy)
    call_command("verify_erasure", "--all", stdout=out)
    assert written_before[0] == "" and ops[0] in written_before[1] and ops[1] in written_before[2]
    assert out.getvalue().count("logical: clean") == 3
    assert parses == [str(home.fleet_path)]  # once for the run, not once per operation


def test_json_refusals_are_one_json_document_with_the_same_exit_status(capsys, engine_home):
    """`verify_erasure --json` printed its refusals as `CommandError: ...` text, where
    `tool_payloads --json` prints `{"error": {"code", "message"}}`: now the same shape, exit 2 kept."""
    def refused(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as caught:
            call_command("verify_erasure", *args, "--json")
        out = capsys.readouterr()
        return caught.value.code, out.out, out.err

    assert refused("c_nope") == (
        2, '{"error": {"code": "not_found", "message": "No delete operation for c_nope."}}\n', "")
    pending = request_deletion(factories.make_conversation(), key="verify-json", acting_user=None)
    assert refused(pending.public_id) == (
        2, json.dumps({"error": {"code": "not_completed", "message": f"{pending.public_id} is pending; nothing to "
                                                                    "verify yet."}}, sort_keys=True) + "\n", "")
    m.DeleteOperation.objects.filter(pk=pending.pk).delete()
    done = factories.make_conversation()
    op = request_deletion(done, key="verify-json-2", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    engine_home.rename(engine_home.with_name("engine-away"))
    status, out, err = refused("--all")
    assert (status, err) == (2, "") and out.count("\n") == 1
    assert json.loads(out)["error"]["code"] == "engine_folder_unavailable"
    assert json.loads(out)["error"]["message"].startswith(f"The engine folder {engine_home} is missing, so nothing was "
                                                           "checked")
    engine_home.write_text("a file where the folder was")  # r50: said "is missing" of a file that is there
    status, out, err = refused("--all")
    assert json.loads(out)["error"]["message"].startswith(f"The engine folder {engine_home} is not a folder, so nothing "
                                                           "was checked")
    engine_home.unlink()
    # Without --json the refusal is the CommandError it was (manage.py prints "CommandError: ...").
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match=r"^No delete operation for c_nope\.$") as caught:
        call_command("verify_erasure", "c_nope")
    assert caught.value.returncode == 2

def test_on_postgresql_nothing_sampled_is_said_as_such_not_as_values_too_short(capsys):
    """PostgreSQL samples no table value: a conversation with no engine file to sample (re-
    deleted after a restore) was said to have "no stored value long enough to sample", whatever
    its values (r98). It is still not called clean (nothing was looked for), and the command says
    why in PostgreSQL's terms."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite samples its table values and scans its files")
    conversation = factories.make_conversation(title="Long values " + "t" * 200)
    factories.add_message(conversation, content="a long enough message " + "m" * 500)
    op = request_deletion(conversation, key="pg-nothing-sampled", acting_user=None)
    executor.run_erasure(op.pk)
    assert not verify.Scanner(m.ErasureFingerprint.objects.get(operation=op)).windows  # nothing sampled
    assert verify.verify(op, physical=True).physical == "no_samples"
    call_command("verify_erasure", conversation.public_id, "--physical")
    said = capsys.readouterr().out
    assert "PostgreSQL: no engine file of the conversation was sampled, and its table values never are" in said


@pytest.mark.skipif(connection.vendor != "sqlite", reason="the raw scan reads the database file on SQLite only")
def test_a_copy_in_a_row_outside_the_stores_is_named_with_a_way_out_that_removes_it(capsys):
    """A copy in a live row of a table no store names (here a job's stored result) stays after
    Compact database: the advice says so, not only "run Compact database" (r102)."""
    target = factories.make_conversation()
    markers = factories.fill_every_store(target)
    op = request_deletion(target, key="verify-outside", acting_user=None)
    executor.run_erasure(op.pk)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO django_q_task (id, name, func, started, stopped, success, attempt_count, result) "
                       "VALUES ('plantedcopy0000000000000000000001', 'planted', 'x.y', %s, %s, 0, 1, %s)",
                       [timezone.now(), timezone.now(), markers["lifecycle.Item"] * 2])
    connection.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", target.public_id, "--physical")
    assert caught.value.code == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "run Compact database (Data & storage), which clears free pages" in out
    assert "the copy is in a row of a table outside Lethe's stores" in out and "remove it by hand" in out


# ---- Fleet rows as a runtime writes them (r123) ----------------------------------------------


def _cjk(n: int) -> str:
    """Unguessable text of `n` CJK characters (three UTF-8 bytes each, `\\uXXXX` escaped: six)."""
    return "".join(chr(0x4E00 + secrets.randbelow(0x5000)) for _ in range(n))


def _settled_child(conversation: m.Conversation, prompt: str, result: str) -> dict:
    return {"agent_id": "sa_" + conversation.public_id[2:10], "origin": {"conversation": conversation.public_id},
            "status": "completed", "delivery": "settled", "started_at": conversation.created_at.isoformat(),
            "finished_at": timezone.now().isoformat(), "prompt": prompt, "result": result}


def _raw(row: dict) -> bytes:
    """A row as most runtimes write it: UTF-8 as is (JSON allows it), here indented by two."""
    return json.dumps(row, ensure_ascii=False, indent=2).encode()


def _go(row: dict) -> bytes:
    """A row as Go's encoding/json writes it: compact, UTF-8 as is, but <, > and & escaped."""
    text = json.dumps(row, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def _runtime_writes_fleet(home: EngineHome, held: list[bytes]) -> None:
    home.fleet_path.parent.mkdir(parents=True, exist_ok=True)
    home.fleet_path.write_bytes(b'{"version": 1, "agents": [\n' + b",\n".join(held) + b"\n]}\n")


def _deleted(conversation: m.Conversation, key: str) -> m.DeleteOperation:
    op = request_deletion(conversation, key=key, acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    return op


def _compacted_bytes(op: m.DeleteOperation) -> int:
    [entry] = [e for e in op.receipt["stores"] if e["store"] == "subagents"]
    assert entry["records"] == 1
    return entry["bytes"]


def _physical_line(capsys, conversation: m.Conversation) -> str:
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", conversation.public_id, "--physical")
    assert caught.value.code == 1
    [line] = [line for line in capsys.readouterr().out.splitlines() if "physical:" in line]
    return line


def test_fleet_rows_written_as_raw_utf8_are_found_in_a_copy_and_counted_as_the_file_holds_them(capsys):
    """r123: a runtime wrote the fleet file as raw UTF-8 and a copy of it stayed beside it. The
    copy held a Japanese prompt byte for byte, and `--physical` said "clean" (the samples were
    the `\\uXXXX` escaped form only); the receipt counted the row as re-encoded (5057 bytes for
    a row of 2657). A row whose text Go's encoder wrote (<, > and & escaped) is found as well."""
    home = EngineHome()
    ascii_c, japanese_c, go_c = (factories.make_conversation() for _ in range(3))
    tags = "".join(f"<{secrets.token_hex(2)}>&" for _ in range(60))
    rows = [_settled_child(ascii_c, ("A" + secrets.token_hex(200))[:400], "ok " + secrets.token_hex(60)),
            _settled_child(japanese_c, _cjk(400), _cjk(200)),
            _settled_child(go_c, tags, tags[::-1])]
    held = [_raw(rows[0]), _raw(rows[1]), _go(rows[2])]
    _runtime_writes_fleet(home, held)
    backup = home.fleet_path.with_name("subagents.v1.json.bak")
    backup.write_bytes(home.fleet_path.read_bytes())
    assert rows[1]["prompt"].encode() in backup.read_bytes()

    for n, conversation in enumerate((ascii_c, japanese_c, go_c)):
        _runtime_writes_fleet(home, held[n:])  # its next snapshot (Lethe's compaction wrote its own form)
        op = _deleted(conversation, f"raw-fleet-{n}")
        assert _compacted_bytes(op) == len(held[n])  # the row as the file held it, not re-encoded
        line = _physical_line(capsys, conversation)
        assert "CONTENT FOUND: engine:state/subagents.v1.json.bak (6)" in line, line
        assert conversation.public_id.encode() not in home.fleet_path.read_bytes()
    assert rows[1]["prompt"].encode() in backup.read_bytes()  # the operator's to remove


def test_a_raw_utf8_copy_is_found_after_lethe_rewrote_the_fleet_file_escaped(capsys):
    """The runtime's raw UTF-8 file was copied aside, then Lethe wrote the fleet (its form escapes
    every non-ASCII character): the copy holds the row in the form the file no longer does."""
    home = EngineHome()
    target, bystander = factories.make_conversation(), factories.make_conversation()
    row = _settled_child(target, _cjk(400), _cjk(200))
    _runtime_writes_fleet(home, [_raw(row)])
    backup = home.fleet_path.with_name("subagents.v1.json.bak")
    backup.write_bytes(home.fleet_path.read_bytes())
    fleet.put_row(_settled_child(bystander, "unrelated", "done"))  # Lethe's own write
    assert row["prompt"].encode() not in home.fleet_path.read_bytes()
    assert json.dumps(row["prompt"]).encode() in home.fleet_path.read_bytes()

    op = _deleted(target, "raw-fleet-rewritten")
    # Lethe's form: indent 1, the rows one level in, every non-ASCII character escaped.
    assert _compacted_bytes(op) == len(json.dumps(row, indent=1, sort_keys=True).replace("\n", "\n  "))
    line = _physical_line(capsys, target)
    assert "CONTENT FOUND: engine:state/subagents.v1.json.bak (6)" in line, line


def test_a_fleet_row_is_sampled_and_its_copy_found_however_many_artifact_files_come_before_it(capsys):
    """The samples were taken store by store in erasure order up to their cap (512 windows): a
    conversation with a few hundred artifact files filled it before its fleet rows, and a copy of
    the fleet file left behind was called clean. Every store is sampled in turn."""
    from lifecycle.actions.write_artifact import write_artifact

    home = EngineHome()
    conversation = factories.make_conversation()
    for n in range(200):  # 600 windows of artifacts alone
        write_artifact(conversation, name=f"out-{n:03d}.txt", data=secrets.token_hex(100).encode())
    row = _settled_child(conversation, ("P" + secrets.token_hex(200))[:400], "ok " + secrets.token_hex(60))
    _runtime_writes_fleet(home, [_raw(row)])
    backup = home.fleet_path.with_name("subagents.v1.json.bak")
    backup.write_bytes(home.fleet_path.read_bytes())
    op = _deleted(conversation, "many-artifacts")
    assert m.ErasureFingerprint.objects.get(operation=op).window_count == fingerprints.MAX_WINDOWS
    line = _physical_line(capsys, conversation)
    assert "CONTENT FOUND: engine:state/subagents.v1.json.bak" in line, line
    assert row["prompt"].encode() in backup.read_bytes()  # the operator's to remove


def test_sqlite_content_held_back_by_a_reader_is_pending_not_found(capsys):
    """r129: with a reader holding the checkpoint back, the delete is physically pending, and
    `--physical` called the old pages in the database file "CONTENT FOUND" (exit 1), advising to
    look for a row of another program's table. They are what pending says, until the checkpoint
    runs; the same check afterwards is clean."""
    import sqlite3

    if connection.vendor != "sqlite":
        pytest.skip("the database's own files are read on SQLite only")
    conversation = factories.make_conversation(title="Held back")
    factories.add_message(conversation, content="ZQX held " + secrets.token_hex(200))
    reader = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM lifecycle_item").fetchone()  # its snapshot holds the checkpoint
        op = _deleted(conversation, "held-back")
        assert op.physical_state == "pending"
        call_command("verify_erasure", conversation.public_id, "--physical")
        out = capsys.readouterr().out
        assert "physical: pending" in out and "CONTENT FOUND" not in out, out
    finally:
        reader.execute("ROLLBACK")
        reader.close()
    call_command("verify_erasure", conversation.public_id, "--physical")
    assert "physical: clean" in capsys.readouterr().out


def test_a_raw_byte_check_that_cannot_read_a_folder_is_not_called_clean_and_keeps_the_fingerprints(capsys):
    """r143: a folder of the engine folder Lethe could not read was skipped without a word: the
    check said clean, recorded it, and dropped the fingerprints, so the copy in that folder could
    never be found once it was readable again. The check stops with exit 2 and records nothing."""
    from tests.permissions import unreadable

    target = factories.make_conversation(title="Copied")
    factories.fill_every_store(target)
    home = EngineHome()
    stash = home.root / "stash"
    stash.mkdir()
    stash.joinpath("copy.jsonl").write_bytes(home.events_path(target.storage_key).read_bytes())
    op = request_deletion(target, key="unread-1", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    with pytest.raises(SystemExit) as found:
        call_command("verify_erasure", op.public_id, "--physical")
    assert found.value.code == 1 and "engine:stash/copy.jsonl" in capsys.readouterr().out
    op.refresh_from_db()
    before = op.receipt["verification"]
    with unreadable(stash), pytest.raises(CommandError) as stopped:
        call_command("verify_erasure", op.public_id, "--physical")
    assert stopped.value.returncode == 2
    said = str(stopped.value)
    assert "stash: Permission denied" in said and "could not read it, so nothing was recorded" in said
    assert "residue" not in said  # none was asked to be removed
    op.refresh_from_db()
    assert op.receipt["verification"] == before and op.verified_physical_at is None
    assert m.ErasureFingerprint.objects.filter(operation=op).exists()
    with pytest.raises(SystemExit) as again:  # readable again: the copy is still found
        call_command("verify_erasure", op.public_id, "--physical")
    assert again.value.code == 1 and "engine:stash/copy.jsonl" in capsys.readouterr().out


def test_a_name_that_is_not_utf8_and_an_unreadable_file_are_named_in_full_with_escapes(capsys):
    """r145: `--json` sent a folder's non-UTF-8 bytes as lone surrogates (invalid JSON text), in
    a finding's place and in the exit-2 message, and an unreadable file was named by its bare
    name (every conversation has an events.jsonl): the operator could not tell which."""
    import os

    from tests.permissions import unreadable

    target = factories.make_conversation(title="Odd copies")
    factories.fill_every_store(target)
    home = EngineHome()
    odd = Path(os.fsdecode(os.fsencode(home.root) + b"/bad\xffdir"))
    odd.mkdir()
    (odd / "copy.jsonl").write_bytes(home.events_path(target.storage_key).read_bytes())
    op = request_deletion(target, key="odd-1", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"

    def json_run() -> tuple[int, str]:
        with pytest.raises(SystemExit) as ended:
            call_command("verify_erasure", op.public_id, "--physical", "--json")
        return ended.value.code, capsys.readouterr().out

    code, out = json_run()
    out.encode("utf-8")  # no lone surrogate in the text
    assert code == 1 and "\\ud" not in out.lower()
    assert json.loads(out)["reports"][0]["physical_findings"][0]["where"] == "engine:bad\\xffdir/copy.jsonl"
    with unreadable(odd):
        code, out = json_run()
    assert code == 2 and "\\ud" not in out.lower()
    assert json.loads(out)["error"]["code"] == "io_error"
    assert json.loads(out)["error"]["message"].startswith(f"{home.root}/bad\\xffdir: Permission denied.")
    plain = home.root / "plain"
    plain.mkdir()
    (plain / "events.jsonl").write_bytes(b"x" * 100)
    with unreadable(plain / "events.jsonl"):  # a file this time (its folder can be listed)
        code, out = json_run()
    assert code == 2
    assert json.loads(out)["error"]["message"].startswith(f"{plain / 'events.jsonl'}: Permission denied.")
