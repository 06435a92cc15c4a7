"""`manage.py conversations archive|close|delete|status` for operators."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from lifecycle import models as m
from lifecycle.deletion.plan import step_keys
from tests import factories

pytestmark = pytest.mark.django_db


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*args) -> str:
    out = io.StringIO()
    call_command("conversations", *args, stdout=out)
    return out.getvalue()


def test_it_archives_closes_and_undoes_both(admin_user):
    conversation = factories.make_conversation(title="Ops")
    assert "archived" in run("archive", conversation.public_id, "--as", "alice")
    assert json.loads(run("close", conversation.public_id, "--json"))["closed"] is True
    run("close", conversation.public_id, "--resume")
    run("archive", conversation.public_id, "--undo")
    conversation.refresh_from_db()
    assert conversation.archived_at is None and conversation.closed_at is None
    actors = list(m.AuditFact.objects.order_by("pk").values_list("action", "actor"))
    assert actors[0] == ("conversation.archived", admin_user.pk) and len(actors) == 4


def test_status_takes_no_actor_since_it_records_nothing(admin_user):
    conversation = factories.make_conversation(title="Ops")
    with pytest.raises(CommandError) as refused:
        run("status", conversation.public_id, "--as", "alice")
    assert "unrecognized arguments: --as" in str(refused.value)
    assert "Ops" in run("status", conversation.public_id)
    assert not m.AuditFact.objects.exists()


def test_it_deletes_and_waits_with_a_progress_bar_on_a_terminal(monkeypatch):
    conversation = factories.make_conversation(title="Erase from the shell")
    factories.fill_every_store(conversation)
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    out = run("delete", conversation.public_id, "--key", "cli-1")
    assert "completed" in out and "Messages and tool calls" in out and "physical erasure" in out
    bar = terminal.getvalue()
    assert "[" in bar and "#" in bar and "Messages and tool calls" in bar
    total = len(step_keys())
    assert f"] 0/{total} preparing" in bar and f"] {total}/{total} " in bar
    conversation.refresh_from_db()
    assert conversation.state == "deleted"
    again = json.loads(run("delete", conversation.public_id, "--key", "cli-1", "--json"))
    assert (again["state"], again["id"]) == ("completed", m.DeleteOperation.objects.get().public_id)
    status = json.loads(run("status", conversation.public_id, "--json"))
    assert status["thread"]["state"] == "deleted" and status["operation"]["receipt"]["stores"]


def test_it_records_without_waiting_and_refuses_with_exit_code_2():
    idle, busy = factories.make_conversation(), factories.make_conversation()
    factories.start_turn(busy)
    data = json.loads(run("delete", idle.public_id, "--no-wait", "--json"))
    assert data["state"] == "pending"
    assert "Preparing: taking keyed fingerprints for the residue check, before anything is erased. Step 0 of " in run(
        "status", data["id"])
    with pytest.raises(SystemExit) as caught:
        run("delete", busy.public_id)
    assert caught.value.code == 2
    busy.refresh_from_db()
    assert busy.state == "live"
    with pytest.raises(CommandError, match="not_found"):
        run("status", "c_00000000000000000000")
    with pytest.raises(CommandError, match="No active admin") as archive:
        run("archive", idle.public_id, "--as", "nobody")
    assert archive.value.returncode == 1
    # r30: a delete refused before it was asked (not an admin, an unknown id) exited 1 where the
    # help and the README say a refused delete exits 2
    for args in (("delete", idle.public_id, "--as", "nobody"), ("delete", "c_00000000000000000000")):
        with pytest.raises(CommandError) as refused:
            run(*args)
        assert refused.value.returncode == 2


def test_a_delete_that_stops_on_an_error_says_why_and_exits_3(engine_home):
    conversation = factories.make_conversation()
    factories.fill_every_store(conversation)
    fleet_path = engine_home / "state" / "subagents.v1.json"
    out = io.StringIO()
    from lifecycle.actions.request_deletion import request_deletion

    op = request_deletion(conversation, key="cli-error", acting_user=None)  # admitted while the file is fine
    fleet_path.write_bytes(b"{broken")
    with pytest.raises(SystemExit) as caught:
        call_command("conversations", "delete", conversation.public_id, "--key", "cli-error", stdout=out)
    assert caught.value.code == 3
    text = out.getvalue()
    assert f"{op.public_id}  pending" in text and "fleet_unreadable" in text
    assert "subagent state file cannot be read" in text


def test_an_engine_folder_that_cannot_be_written_is_unavailable_and_records_no_intent(admin_user, engine_home):
    conversation = factories.make_conversation()
    (engine_home / "state").write_text("a file where the fleet's folder belongs")
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        call_command("conversations", "delete", conversation.public_id, "--as", admin_user.username, stdout=out)
    assert caught.value.code == 2
    assert "  engine_folder_not_writable: Lethe cannot write in the engine folder (a permission, a file where a " \
           "folder belongs" in out.getvalue()
    assert m.DeleteOperation.objects.get().state == "unavailable" and not m.DeleteOperation.objects.intents().exists()
    assert m.Conversation.objects.get(pk=conversation.pk).state == "live"


def test_on_a_console_of_a_remote_engine_it_refuses_and_does_nothing(settings, admin_user):
    """Its conversations are the engine's: status read this console's own table, and delete
    went to the engine without the console's bound delete (no record, no Pending)."""
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9/", "t" * 40
    conversation = factories.make_conversation()
    for verb in ("archive", "close", "delete", "status"):
        with pytest.raises(CommandError, match="engine_remote: this console reaches a remote engine") as caught:
            run(verb, conversation.public_id, *(("--as", admin_user.username) if verb != "status" else ()))
        assert caught.value.returncode == 2
    conversation.refresh_from_db()
    assert (conversation.archived_at, conversation.closed_at, conversation.state) == (None, None, "live")
    assert not m.DeleteOperation.objects.exists()


def test_verify_erasure_on_a_console_of_a_remote_engine_refuses_instead_of_a_clean_nothing(settings):
    """It said "0 deleted conversation(s) checked." and exited 0: a clean bill that scanned
    nothing (r42). The deletes are the engine's."""
    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9/", "t" * 40
    for args in (("--all",), ("--all", "--physical"), ("op_" + "1" * 20,)):
        with pytest.raises(CommandError, match="remote engine") as caught:
            call_command("verify_erasure", *args, stdout=io.StringIO())
        assert caught.value.returncode == 2
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        call_command("verify_erasure", "--all", "--json", stdout=out)
    assert caught.value.code == 2 and json.loads(out.getvalue())["error"]["code"] == "engine_remote"


def test_the_report_names_what_still_holds_the_deleted_bytes(engine_home, settings, tmp_path):
    """The restore steps (docs/operations.md) rely on this report: it left out the backup the
    operation page lists as holding the deleted bytes."""
    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    settings.LETHE_BACKUP_DIR.mkdir()
    (settings.LETHE_BACKUP_DIR / "lethe-sqlite-20261204T214732Z-7c6b87.sqlite3").write_bytes(b"a backup")
    conversation = factories.make_conversation(title="Held in a backup")
    run("delete", conversation.public_id, "--key", "held-1")
    op = m.DeleteOperation.objects.get()
    receipt = {**op.receipt, "holders": [{"kind": "backup", "name": "lethe-sqlite-20261204T214732Z-7c6b87.sqlite3"},
                                         {"kind": "database_files"}]}
    m.DeleteOperation.objects.filter(pk=op.pk).update(receipt=receipt)
    out = run("status", op.public_id)
    assert ("still held by: Backup lethe-sqlite-20261204T214732Z-7c6b87.sqlite3, made before the delete: "
            "until that backup is deleted.") in out
    assert "still held by: The database's table files: until an operator runs manage.py finish_erasure." in out


def test_the_report_says_1_record_not_1_records(engine_home):
    conversation = factories.make_conversation(title="One of each")
    factories.fill_every_store(conversation)
    run("delete", conversation.public_id, "--key", "one-1")
    out = run("status", m.DeleteOperation.objects.get().public_id)
    assert "1 records" not in out
    assert "  erased             1 record           96 bytes  Goals\n" in out
    assert "  erased            2 records          274 bytes  Messages and tool calls\n" in out


def test_the_report_counts_files_says_the_shared_copies_left_and_the_verification(engine_home):
    """r17: the text receipt printed `revoked 0 records` where the page says a shared copy
    remains, counted files as records, and never said what the store check found."""
    conversation = factories.make_conversation(title="Shared and filed")
    factories.fill_every_store(conversation)
    m.SharedLink.objects.filter(conversation=conversation).update(publisher_supports_revoke=False)
    run("delete", conversation.public_id, "--key", "shared-1")
    op = m.DeleteOperation.objects.get()
    out = run("status", op.public_id)
    shared = next(line for line in out.splitlines() if line.endswith("Shared links and published copies")
                  or "Shared links and published copies ·" in line)
    remaining = next(e["remaining"] for e in op.receipt["stores"] if e["store"] == "lifecycle.SharedLink")
    assert remaining >= 1 and f"· {remaining} shared cop" in shared
    files = next(e for e in op.receipt["stores"] if e["store"] == "artifacts")
    assert files["records"] >= 1
    artifacts = next(line for line in out.splitlines() if line.endswith("Large outputs and tool artifacts"))
    assert f" {files['records']} file" in artifacts and "record" not in artifacts
    tombstone = next(line for line in out.splitlines() if "title erased; the record stays as the tombstone" in line)
    assert tombstone.startswith("  erased") and "record " not in tombstone.split("Conversation record")[0]
    assert f"  verification: every store re-checked on {op.verified_at.isoformat().replace('+00:00', 'Z')}: clean" in out


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_the_reports_verification_says_which_raw_bytes_were_checked(engine_home, engine):
    """r18: "clean, raw bytes included" on PostgreSQL, whose server files are never read; and a
    raw-byte finding dropped the stores' clean re-check the page still shows."""
    from django.utils import timezone

    conversation = factories.make_conversation(title="Checked")
    run("delete", conversation.public_id, "--key", f"checked-{engine}")
    op = m.DeleteOperation.objects.get()
    at = timezone.now()
    m.DeleteOperation.objects.filter(pk=op.pk).update(verified_physical_at=at, receipt={**op.receipt, "engine": engine})
    out = run("status", op.public_id)
    line = next(line for line in out.splitlines() if line.startswith("  verification: clean on "))
    if engine == "postgresql":
        assert "the raw bytes of the engine folder's files hold none" in line and "cannot be read from here" in line
    else:
        assert "the raw bytes of the database and the engine folder hold none" in line
    found = {**op.receipt, "engine": engine, "verification": {**op.receipt["verification"], "physical": "found",
                                                              "physical_at": at.isoformat()}}
    m.DeleteOperation.objects.filter(pk=op.pk).update(receipt=found)
    out = run("status", op.public_id)
    stamp = at.isoformat().replace("+00:00", "Z")
    assert f"  verification: on {stamp} the raw-byte check found some of its content; manage.py verify_erasure --physical {op.public_id} names each file" in out
    assert "  verification: every store re-checked on " in out and ": clean\n" in out


def test_the_reports_verification_names_each_kind_of_residue_and_its_remedy_as_the_page_does(engine_home):
    """The report said only "the raw-byte check found some of its content" where the operation
    page tells the conversation's own files (--erase-residue removes them), other files of the
    engine folder (by hand) and the database file (Compact database) apart, with the command
    for each; and it read the receipt by its own rules, not the page's."""
    from django.utils import timezone

    conversation = factories.make_conversation(title="Found again")
    run("delete", conversation.public_id, "--key", "found-1")
    op = m.DeleteOperation.objects.get()
    at = timezone.now().replace(microsecond=0)
    stamp = at.isoformat().replace("+00:00", "Z")
    found = {**op.receipt, "verification": {**op.receipt["verification"], "physical": "found", "physical_at": at.isoformat(),
                                           "physical_files": {"erasable": 2, "engine_folder": 1, "database": 1}}}
    m.DeleteOperation.objects.filter(pk=op.pk).update(receipt=found)
    lines = [line for line in run("status", op.public_id).splitlines() if line.startswith("  verification: ")]
    assert lines[0] == (f"  verification: on {stamp} the raw-byte check found its content in 2 of this conversation's own "
                        f"file(s); remove them and check again with: manage.py verify_erasure --erase-residue --physical {op.public_id}")
    assert lines[1].startswith(f"  verification: on {stamp} the raw-byte check found copies of its content in 1 file(s) of the engine folder")
    assert "--erase-residue does not remove them" in lines[1]
    assert lines[2].startswith(f"  verification: on {stamp} the raw-byte check found some of its content in the database file")
    assert "Compact database" in lines[2]
    assert lines[3].startswith("  verification: every store re-checked on ") and len(lines) == 4

    # Traces written after the delete: the clean line is not given (the page gives none either)
    traced = {**found, "verification": {**found["verification"], "logical": "found", "logical_findings": 3, "at": at.isoformat()}}
    m.DeleteOperation.objects.filter(pk=op.pk).update(receipt=traced)
    lines = [line for line in run("status", op.public_id).splitlines() if line.startswith("  verification: ")]
    assert lines[0] == (f"  verification: on {stamp} found 3 trace(s) of this conversation written or restored after its "
                        f"delete; erase them with: manage.py verify_erasure --erase-residue {op.public_id}")
    assert len(lines) == 4 and not any("clean" in line for line in lines)


def test_the_report_states_the_kept_facts_and_when_they_expired_as_the_operation_page_does():
    """The report listed the erased and compacted stores only: the kept usage, billing and
    audit facts (and once expired, when they were removed), which the operation page and
    GET /v1/operations/{id} state, were missing."""
    from datetime import timedelta

    from lifecycle.actions.expire_facts import expire_facts

    conversation = factories.make_conversation(title="Facts")
    factories.fill_every_store(conversation)
    run("delete", conversation.public_id, "--key", "kept-1")
    op = m.DeleteOperation.objects.get()
    out = run("status", op.public_id)
    assert "  kept:\n" in out
    assert "    Billing: 1 record kept until its period after the delete runs out (2555 days)\n" in out
    assert "    Audit: 2 records kept until their period after the delete runs out (365 days)\n" in out
    assert "    Provider-retained inputs: follows provider terms\n" in out
    expire_facts(now=op.completed_at + timedelta(days=366))
    expired_at = next(e["expired_at"] for e in m.DeleteOperation.objects.get().receipt["kept"]
                      if e["store"] == "lifecycle.AuditFact")
    out = run("status", op.public_id)
    assert f"    Audit: 2 records, removed on {expired_at} when their period ran out (365 days)\n" in out
    assert "    Usage and metering: 1 record kept until its period after the delete runs out (400 days)\n" in out


def test_with_json_a_refusal_is_a_json_document_too():
    """A script reading --json output got nothing on standard output for a refusal."""
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        call_command("conversations", "status", "c_00000000000000000000", "--json", stdout=out)
    assert caught.value.code == 1
    assert json.loads(out.getvalue()) == {"error": {"code": "not_found",
                                                    "message": "Nothing with that id exists here."}}
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("tool_payloads", "cancel", "999", "--as", "nobody", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {"error": {"code": "refused", "message": "No active admin named nobody."}}


def test_an_unavailable_delete_names_its_subagent_rows_and_resolve_subagent_clears_one(admin_user, engine_home):
    """The README's walkthrough ended Unavailable on the demo's subagent row of unknown origin,
    with no way out from the command line."""
    from lifecycle import fleet

    conversation = factories.make_conversation(days_idle=1)
    fleet.write_snapshot([{"agent_id": "sa_old", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat(), "finished_at": None}])
    out = io.StringIO()
    with pytest.raises(SystemExit) as refused:
        call_command("conversations", "delete", conversation.public_id, "--as", "alice", stdout=out)
    assert refused.value.code == 2
    assert ("  subagent row sa_old: resolve it with manage.py conversations resolve-subagent sa_old --attribute "
            "<conversation> (or --clear) --as <admin>") in out.getvalue().splitlines()
    with pytest.raises(CommandError, match="needs --as"):
        run("resolve-subagent", "sa_old", "--clear")
    assert run("resolve-subagent", "sa_old", "--clear", "--as", "alice") == "subagent row sa_old: cleared\n"
    assert fleet.read_rows(fleet.EngineHome().fleet_path) == []
    assert m.AuditFact.objects.filter(action="subagent.cleared", actor=admin_user.pk).count() == 1
    run("delete", conversation.public_id, "--as", "alice")
    assert m.Conversation.objects.get(pk=conversation.pk).state == "deleted"


def test_status_says_a_pending_step_and_a_tombstone_as_the_screens_do(monkeypatch):
    """A pending delete's step by its store's name and the steps done ("Step 13 of 21 done", not
    "step 13/21: lifecycle.Item"); a tombstone is said as one, not as an open conversation."""
    from lifecycle.deletion import executor

    conversation = factories.make_conversation(title="Stopped in messages")
    factories.fill_every_store(conversation)
    op = factories.erasure_stopped_in(conversation, "lifecycle.Item", key="status-words", monkeypatch=monkeypatch)
    done = m.DeleteStep.objects.filter(operation=op, state="done").count()
    total = m.DeleteStep.objects.filter(operation=op).count()
    said = run("status", conversation.public_id)
    assert f"{conversation.public_id}  pending_delete  accepts no writes, its content is being erased  " in said
    assert f"  Erasing: Messages and tool calls. Step {done} of {total} done." in said
    assert "lifecycle.Item" not in said and "step " not in said

    monkeypatch.undo()
    assert executor.run_erasure(op.pk) == "completed"
    said = run("status", conversation.public_id)
    assert f"{conversation.public_id}  deleted  content erased, a content-free tombstone remains\n" in said
    assert " open" not in said


def run_on_a_terminal(command: str, *args) -> tuple[str, object]:
    """The command's output as a terminal takes it, UTF-8 and strict (a StringIO takes a lone
    surrogate, a terminal's stream fails on it), and how it exited (None, or SystemExit's code)."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8", errors="strict", newline="")
    code = None
    try:
        call_command(command, *args, stdout=out)
    except SystemExit as exit_:
        code = exit_.code
    out.flush()
    return raw.getvalue().decode(), code


def test_a_row_whose_id_holds_a_lone_surrogate_is_left_out_of_the_report(admin_user, engine_home):
    """r123: the delete printed its report, then failed with UnicodeEncodeError (exit 1) on the
    way out's row whose id held a lone surrogate, and so did status; that row cannot be named
    (the report says to repair the file) and the others are named as ever."""
    from lifecycle import fleet

    conversation = factories.make_conversation(days_idle=1)
    row = {"origin": None, "status": "completed", "delivery": "settled",
           "started_at": conversation.created_at.isoformat()}
    fleet.write_snapshot([{**row, "agent_id": "sa_ok"}, {**row, "agent_id": "sa_sur\ud800x"}])
    text, code = run_on_a_terminal("conversations", "delete", conversation.public_id, "--as", "alice")
    assert code == 2
    op = m.DeleteOperation.objects.get()
    assert op.reasons == ["conversation_child_ownership_ambiguous", "conversation_child_state_unreadable"]
    for args in ((), ("status", op.public_id)):
        if args:
            text, code = run_on_a_terminal("conversations", *args)
            assert code is None, args
        assert "  subagent row sa_ok: resolve it with manage.py conversations resolve-subagent sa_ok" in text, args
        assert "sa_sur" not in text and "state/subagents.v1.json in the engine folder" in text, args


def test_the_text_output_writes_out_control_and_format_characters_of_stored_text(engine_home, settings, tmp_path):
    """r123: a title's BEL, escape sequence and line break went to the terminal as they are (it
    rang, turned red, and one result took two lines: a title could fake a line of output). They
    are written out as on the screens; --json keeps the text as it is."""
    title = "Bell\x07 tab\tline\nbreak esc\x1b[31mred \u202eevil"
    conversation = factories.make_conversation(title=title)
    text, _code = run_on_a_terminal("conversations", "status", conversation.public_id)
    assert text == (f"{conversation.public_id}  live  open  Bell[U+0007] tab[U+0009]line[U+000A]break "
                    "esc[U+001B][31mred [U+202E]evil\n")
    assert json.loads(run("status", conversation.public_id, "--json"))["thread"]["title"] == title
    # A backup's name, as the delete's report and verify_erasure name it
    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    settings.LETHE_BACKUP_DIR.mkdir()
    name = "lethe\x1b[2J\nfake line.sqlite3"
    (settings.LETHE_BACKUP_DIR / name).write_bytes(b"a backup")
    run("delete", conversation.public_id, "--key", "hostile-1")
    op = m.DeleteOperation.objects.get()
    m.DeleteOperation.objects.filter(pk=op.pk).update(receipt={**op.receipt, "holders": [
        {"kind": "backup", "name": name}]})
    for command, args in (("conversations", ("status", op.public_id)), ("verify_erasure", (op.public_id,))):
        text, _code = run_on_a_terminal(command, *args)
        assert "lethe[U+001B][2J[U+000A]fake line.sqlite3" in text, command
        assert "\x1b" not in text and not any(line.startswith("fake line") for line in text.splitlines()), command


@pytest.mark.parametrize("agent_id", ["sa_\u202eevil2", "sa_\tx", "sa x'$(y)", "sa\nx"])
def test_the_report_names_a_row_with_a_command_a_shell_reads_back_as_its_id(admin_user, engine_home, agent_id):
    """The way out's command gives the id as one shell word ($'...' with escapes when it holds a
    character written out), so what an operator pastes names the row: here through bash."""
    import shutil
    import subprocess

    from console.shown import written_out
    from lifecycle import fleet

    conversation = factories.make_conversation(days_idle=1)
    home = fleet.EngineHome()
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [{
        "agent_id": agent_id, "status": "completed", "delivery": "settled",
        "started_at": conversation.created_at.isoformat()}])
    text, code = run_on_a_terminal("conversations", "delete", conversation.public_id, "--as", "alice")
    assert code == 2 and "conversation_child_state_unreadable" not in text
    line = next(line for line in text.splitlines() if line.startswith("  subagent row "))
    assert line.startswith(f"  subagent row {written_out(agent_id)}: resolve it with")
    word = line.split("resolve-subagent ", 1)[1].rsplit(" --attribute", 1)[0]
    if shutil.which("bash"):
        read_back = subprocess.run(["bash", "-c", f"printf %s {word}"], capture_output=True, check=True).stdout
        assert read_back.decode() == agent_id
    assert run("resolve-subagent", agent_id, "--clear", "--as", "alice") == \
        f"subagent row {written_out(agent_id)}: cleared\n"
    assert fleet.read_rows(home.legacy_fleet_path) == []
