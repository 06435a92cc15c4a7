"""The engine folder this database uses (lifecycle.engine_folder): a missing or replaced folder
never lets a delete complete against nothing, nor a check report clean; a folder that cannot be
written (a read-only mount, a full disk) is a refusal that says which, never a 500."""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import stat

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django_q.models import OrmQ

from lifecycle import engine_folder, fleet
from lifecycle import models as m
from lifecycle.actions.append_log import append_log
from lifecycle.actions.recover_torn_logs import recover_all_torn_logs
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.actions.resolve_subagent import resolve_subagent
from lifecycle.actions.write_artifact import write_artifact
from lifecycle.deletion import executor, verify
from lifecycle.deletion.admission import admit
from lifecycle.deletion.errors import error_message
from lifecycle.enginefs import EngineHome
from lifecycle.errors import ActionRefused
from ops.health import check_engine_folder
from tests import factories
from tests.swapping import attempts_until, swapping

pytestmark = pytest.mark.django_db


def files_of(conversation) -> list[str]:
    home = EngineHome()
    return sorted(str(p.relative_to(home.root)) for folder in home.conversation_paths(conversation.storage_key)
                  if folder.exists() for p in folder.rglob("*") if p.is_file())


def forget_the_mark(home) -> None:
    """The database as it was before the mark: nothing recorded, no mark in the folder."""
    m.EngineFolderMark.objects.all().delete()
    (home / engine_folder.MARK_NAME).unlink(missing_ok=True)


def test_a_delete_waits_while_its_engine_folder_is_unmounted_and_finishes_once_it_is_back(engine_home):
    target = factories.make_conversation(title="On the disk")
    factories.fill_every_store(target)
    before = files_of(target)
    assert before
    op = request_deletion(target, key="k-unmounted", acting_user=None)
    assert op.state == "pending" and engine_folder.recorded() == engine_folder.folder_mark(EngineHome())
    unmounted = engine_home.with_name("engine-unmounted")
    engine_home.rename(unmounted)  # the disk is not mounted: nothing at ENGINE_HOME

    assert executor.run_erasure(op.pk) == "pending"
    op.refresh_from_db()
    assert op.last_error == "engine_folder_unavailable"
    assert not engine_home.exists()  # not created empty in its place
    assert not op.steps.filter(state="done").exclude(key="fingerprints").exists()
    assert m.Item.objects.filter(conversation=target).exists()  # nothing erased meanwhile
    assert "nothing in it was erased or counted as gone" in error_message(op.last_error)

    engine_home.mkdir()  # an empty folder at the mount point: still not this database's
    assert executor.run_erasure(op.pk, force=True) == "pending"
    assert engine_folder.problem() == "unmarked"
    engine_home.rmdir()

    unmounted.rename(engine_home)  # mounted again
    assert executor.run_erasure(op.pk, force=True) == "completed"
    assert files_of(target) == [] and not m.Item.objects.filter(conversation=target).exists()
    op.refresh_from_db()
    assert not verify.verify(op).logical


def test_a_delete_waiting_for_its_folder_is_retried_for_as_long_as_it_takes(engine_home, admin_client):
    """r103: after five runs that found the folder unmounted the delete stalled (nothing retried
    it any more), while its page said it goes on once the folder is back. A run that ends on an
    error it caught keeps being retried, at the longest back-off; only runs that die stall it."""
    target = factories.make_conversation(title="Waits for its disk")
    factories.fill_every_store(target)
    op = request_deletion(target, key="k-waits", acting_user=None)
    unmounted = engine_home.with_name("engine-unmounted")
    engine_home.rename(unmounted)
    for run in range(executor.MAX_STALLED + 3):
        assert op.pk in executor.outstanding(), run  # the recovery job takes it again
        started = m.timezone.now()
        assert executor.run_erasure(op.pk) == "pending"
        op.refresh_from_db()
        assert (op.last_error, executor.stalled(op)) == ("engine_folder_unavailable", False)
        wait = (op.next_attempt_at - started).total_seconds()
        assert wait >= (executor.BACKOFF_SECONDS[-1] if run >= executor.MAX_STALLED - 1 else 0)
        m.DeleteOperation.objects.filter(pk=op.pk).update(next_attempt_at=None)  # its back-off, passed
    shown = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "no longer retried by itself" not in shown and "it goes on once" in shown
    assert executor.run_erasure(op.pk) == "pending"
    op.refresh_from_db()
    answer = admin_client.get(f"/v1/operations/{op.public_id}", HTTP_HOST="127.0.0.1").json()
    # the API says when it is tried again (r108), as a bound delete's answer does
    assert (answer["stalled"], answer["error"]) == (False, "engine_folder_unavailable")
    assert answer["next_attempt_at"] and answer["next_attempt_at"].startswith(
        op.next_attempt_at.astimezone(m.timezone.UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    m.DeleteOperation.objects.filter(pk=op.pk).update(next_attempt_at=None)  # its back-off, passed
    # r120: runs that die count, runs that waited do not: killed once now (its lease left to a
    # dead holder), the delete is retried again; killed four more times in a row, it stalls, and
    # says so alone (not "it goes on once the folder is back" beside "no longer retried")
    for kill in range(executor.MAX_STALLED):
        assert executor.take_lease(op.pk) is not None, kill  # a run that takes it, then dies
        m.DeleteOperation.objects.filter(pk=op.pk).update(lease_holder="somehost:1:dead", next_attempt_at=None,
                                                          lease_expires_at=m.timezone.now())
        op.refresh_from_db()
        assert executor.stalled(op) == (kill == executor.MAX_STALLED - 1), kill
    answer = admin_client.get(f"/v1/operations/{op.public_id}", HTTP_HOST="127.0.0.1").json()
    assert (answer["stalled"], answer["error"]) == (True, "stalled")
    shown = admin_client.get(f"/operations/{op.public_id}/", HTTP_HOST="127.0.0.1").content.decode()
    assert "no longer retried by itself" in shown and "it goes on once" not in shown
    admin_client.post(f"/operations/{op.public_id}/retry/", HTTP_HOST="127.0.0.1")
    unmounted.rename(engine_home)  # mounted again: the next retry finishes it
    assert op.pk in executor.outstanding()
    assert executor.run_erasure(op.pk) == "completed"
    assert files_of(target) == [] and not m.Item.objects.filter(conversation=target).exists()


def test_a_folder_gone_during_a_delete_stops_it_before_any_file_step_counts_it_gone(engine_home):
    """r81: the folder was checked once, when the run began. Unmounted during the messages'
    step, every file step then read it as holding nothing and the residue check found nothing:
    the delete completed, its receipt clean, with the conversation's files still on the disk
    (and the fleet step made lock files in a new, unmarked folder at ENGINE_HOME)."""
    target = factories.make_conversation(title="Unmounted midway")
    factories.fill_every_store(target)
    before = files_of(target)
    assert before
    op = request_deletion(target, key="k-midway", acting_user=None)
    away = engine_home.with_name("engine-away")

    def unmount(_op, step, _n, _total):
        if step.key == "lifecycle.Item" and engine_home.exists():
            engine_home.rename(away)  # the disk goes while the messages are erased

    assert executor.run_erasure(op.pk, progress=unmount) == "pending"
    op.refresh_from_db()
    assert (op.state, op.last_error) == ("pending", "engine_folder_unavailable")
    assert not engine_home.exists()  # nothing made in its place
    file_steps = {"events", "approval_receipts", "artifacts", "subagents", "legacy_subagents"}
    assert not op.steps.filter(key__in=file_steps, state="done").exists()
    assert not m.Item.objects.filter(conversation=target).exists()  # the step before it went on

    away.rename(engine_home)  # mounted again: the files are all there, and the delete finishes
    assert files_of(target) == before
    assert executor.run_erasure(op.pk, force=True) == "completed"
    op.refresh_from_db()
    assert files_of(target) == [] and not verify.verify(op).logical
    erased_files = sum(step.records for step in op.steps.filter(key__in={"events", "approval_receipts", "artifacts"}))
    assert erased_files == len(before)


@pytest.mark.parametrize("during", ["logical_findings", "physical_check"])
def test_a_check_during_which_the_folder_goes_records_nothing(engine_home, monkeypatch, during):
    """r84: the check looked at the folder once, before reading it: unmounted during the read
    (a long raw-byte scan reads the database first), it found nothing and recorded clean."""
    target = factories.make_conversation(title="Checked while it goes")
    factories.fill_every_store(target)
    kept = engine_home.with_name("engine-copy")
    shutil.copytree(engine_home, kept)
    op = request_deletion(target, key="k-check-goes", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    shutil.rmtree(engine_home)
    kept.rename(engine_home)  # brought back by a restore: residue in the folder
    op.refresh_from_db()
    assert verify.verify(op, record=False).logical
    recorded = (op.receipt or {}).get("verification")
    away = engine_home.with_name("engine-away")
    reading = getattr(verify, during)

    def unmounted_meanwhile(*args, **kwargs):
        found = reading(*args, **kwargs) if during == "physical_check" else None
        engine_home.rename(away)
        return found if during == "physical_check" else reading(*args, **kwargs)

    monkeypatch.setattr(verify, during, unmounted_meanwhile)
    with pytest.raises(engine_folder.EngineFolderUnavailable):
        verify.verify(op, physical=True, record=True)
    op.refresh_from_db()
    assert (op.receipt or {}).get("verification") == recorded  # nothing recorded
    away.rename(engine_home)
    monkeypatch.undo()
    assert verify.verify(op, record=False).logical  # the files were there all along


def test_no_new_delete_is_admitted_and_no_check_reports_clean_without_the_folder(engine_home):
    done = factories.make_conversation(title="Deleted before")
    factories.fill_every_store(done)
    op = request_deletion(done, key="k-done", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    target = factories.make_conversation(title="Asked later")
    factories.fill_every_store(target)
    engine_home.rename(engine_home.with_name("engine-away"))

    refused = request_deletion(target, key="k-later", acting_user=None)
    assert (refused.state, refused.reason) == ("unavailable", "engine_folder_unavailable")
    assert not m.DeleteOperation.objects.intents().filter(conversation=target).exists()
    with pytest.raises(CommandError, match="is missing, so nothing was checked") as refused_check:
        call_command("verify_erasure", "--all")
    assert refused_check.value.returncode == 2
    op.refresh_from_db()
    recorded_at = (op.receipt or {}).get("verification", {}).get("at")
    with pytest.raises(CommandError):
        call_command("verify_erasure", op.public_id)
    op.refresh_from_db()
    assert (op.receipt or {}).get("verification", {}).get("at") == recorded_at  # nothing recorded
    assert not engine_home.exists()


def test_a_new_install_creates_and_marks_its_folder_but_a_database_with_conversations_does_not(engine_home):
    forget_the_mark(engine_home)  # the test database starts marked, as after a new install's serve
    engine_home.rmdir()
    folder_id = engine_folder.adopt(force=False)
    assert engine_home.is_dir() and engine_folder.folder_mark(EngineHome()) == folder_id == engine_folder.recorded()
    assert (engine_home / engine_folder.MARK_NAME).stat().st_mode & 0o777 == 0o600
    assert engine_folder.adopt(force=False) == folder_id  # once

    m.EngineFolderMark.objects.all().delete()  # a database from before the mark, its folder not mounted
    (engine_home / engine_folder.MARK_NAME).unlink()
    engine_home.rmdir()
    factories.make_conversation(title="Has files somewhere")
    with pytest.raises(engine_folder.EngineFolderUnavailable) as missing:
        engine_folder.adopt(force=False)
    assert missing.value.reason == "missing" and not engine_home.exists()

    engine_home.mkdir()  # an empty folder there: not plausibly the one its conversation's files are in
    with pytest.raises(engine_folder.EngineFolderUnavailable) as empty:
        engine_folder.adopt(force=False)
    assert empty.value.reason == "unmarked" and engine_folder.recorded() is None
    assert list(engine_home.iterdir()) == []  # no mark written


def test_readiness_and_the_command_name_what_is_wrong_and_adopt_marks_a_replacement(engine_home, settings):
    engine_folder.adopt(force=False)
    assert check_engine_folder() == {"ok": True}
    out = io.StringIO()
    call_command("engine_folder", stdout=out)
    assert "is this database's engine folder" in out.getvalue()

    engine_home.rename(engine_home.with_name("engine-old"))
    assert check_engine_folder() == {"ok": False, "error": "missing"}
    engine_home.mkdir()
    assert check_engine_folder() == {"ok": False, "error": "unmarked"}
    with pytest.raises(SystemExit) as status:
        call_command("engine_folder", stdout=io.StringIO())
    assert status.value.code == 1
    (engine_home / engine_folder.MARK_NAME).write_text("f" * 32 + "\n")
    assert check_engine_folder() == {"ok": False, "error": "not_this_folder"}

    out = io.StringIO()
    (engine_home / engine_folder.MARK_NAME).unlink()  # a replacement without a mark
    call_command("engine_folder", "--adopt", stdout=out)  # an operator's choice: this folder is the one now
    assert "is this database's engine folder now (mark " in out.getvalue()
    assert check_engine_folder() == {"ok": True}
    assert engine_folder.recorded() == engine_folder.folder_mark(EngineHome()) is not None


def test_adopting_another_databases_folder_is_refused_unless_asked_by_name(engine_home):
    """`--adopt` copied another database's mark into this one: two databases then erased in one
    folder, unwarned. Now it is refused; --take-from-other-database takes it with a new mark, so
    the other database no longer counts it as its own."""
    ours = engine_folder.adopt(force=False)
    done = request_deletion(factories.make_conversation(), key="taken-folder", acting_user=None)
    executor.run_erasure(done.pk)  # a delete for verify_erasure to check, below
    other = "f" * 32
    (engine_home / engine_folder.MARK_NAME).write_text(other + "\n")  # another database's folder here
    out = io.StringIO()
    with pytest.raises(SystemExit) as status:
        call_command("engine_folder", stdout=out)
    assert status.value.code == 1 and "another database's engine folder" in out.getvalue()
    assert "engine_folder --adopt --take-from-other-database." in out.getvalue()

    with pytest.raises(CommandError) as refused:
        call_command("engine_folder", "--adopt", stdout=io.StringIO())
    assert refused.value.returncode == 2
    assert str(refused.value) == (
        f"{engine_home} is another database's engine folder (mark {other}): adopting it would have two databases "
        "erase in one folder, so nothing was adopted. If that database no longer uses it, run manage.py "
        "engine_folder --adopt --take-from-other-database: the folder gets a new mark and that database's "
        "deletes wait.")
    assert engine_folder.recorded() == ours and engine_folder.folder_mark(EngineHome()) == other  # nothing changed
    assert check_engine_folder() == {"ok": False, "error": "not_this_folder"}

    with pytest.raises(CommandError) as alone:  # the flag says nothing without --adopt
        call_command("engine_folder", "--take-from-other-database", stdout=io.StringIO())
    assert alone.value.returncode == 2 and "goes with --adopt" in str(alone.value)

    # verify_erasure, refused the same folder, names the way that takes it (r98: --adopt alone)
    with pytest.raises(CommandError) as unchecked:
        call_command("verify_erasure", "--all", stdout=io.StringIO())
    assert unchecked.value.returncode == 2
    assert str(unchecked.value).endswith("mark it with manage.py engine_folder --adopt --take-from-other-database.")
    assert engine_folder.recorded() == ours and engine_folder.folder_mark(EngineHome()) == other

    out = io.StringIO()
    call_command("engine_folder", "--adopt", "--take-from-other-database", stdout=out)
    taken = engine_folder.folder_mark(EngineHome())
    assert taken not in (None, other, ours) and engine_folder.recorded() == taken
    assert f"is this database's engine folder now (mark {taken})" in out.getvalue()
    assert check_engine_folder() == {"ok": True}
    # The other database, which records `other`, no longer finds its mark here: its deletes wait
    assert engine_folder._reason(EngineHome(), other) == "not_this_folder"


def test_a_database_that_recorded_no_folder_is_refused_another_databases_folder_too(engine_home):
    """A database from before the mark (or restored from a backup made before it) finds the folder
    marked by another: adopting it needs the flag as well; one that holds its files is its own."""
    target = factories.make_conversation(title="Not in this folder")
    forget_the_mark(engine_home)
    (engine_home / engine_folder.MARK_NAME).write_text("e" * 32 + "\n")
    assert engine_folder.problem() == "not_this_folder"
    with pytest.raises(CommandError, match="another database's engine folder"):
        call_command("engine_folder", "--adopt", stdout=io.StringIO())
    assert engine_folder.recorded() is None
    factories.fill_every_store(target)  # its own files are there: it plausibly is its own folder
    assert engine_folder.problem() is None
    call_command("engine_folder", "--adopt", stdout=io.StringIO())
    assert engine_folder.recorded() == "e" * 32


def test_a_database_without_conversations_does_not_take_a_folder_another_database_marked(engine_home, capsys,
                                                                                           settings):
    """A new install (or one whose conversations are all deleted) pointed at a folder another
    database marked: taken with that mark, both would erase and resolve subagent rows in one
    folder. It waits for the operator, who may take it only by name (and it is marked anew)."""
    from console.management.commands.serve import Command

    forget_the_mark(engine_home)
    other = "f" * 32
    (engine_home / engine_folder.MARK_NAME).write_text(other + "\n")
    assert engine_folder.problem() == "not_this_folder"
    settings.LOG_FORMAT = "text"  # (under JSON logs it is a warning record: test_serve_never_makes_an_empty_folder...)
    Command().prepare_engine_folder()  # serve starts, says why (and the command that helps), records nothing
    said = capsys.readouterr().err
    assert "another database's engine folder" in said and "--adopt --take-from-other-database" in said
    assert "until it is back" not in said
    assert engine_folder.recorded() is None and check_engine_folder() == {"ok": False, "error": "not_this_folder"}
    # seed_demo writes nothing into it (r18: it wrote its files and subagent rows there, replaced
    # the legacy subagent file, and serve then took the folder, the other's mark and all)
    (engine_home / "state").mkdir(exist_ok=True)
    (engine_home / "state" / "subagents.v1.json").write_text('{"version": 1, "agents": [{"agent_id": "sa_theirs"}]}')
    before = sorted((p.relative_to(engine_home), p.read_bytes() if p.is_file() else b"") for p in engine_home.rglob("*"))
    with pytest.raises(CommandError, match="Nothing was seeded: the engine folder .* is another database's engine "
                                           "folder. If no other database uses it any more") as refused:
        call_command("seed_demo", "--conversations", "2", "--messages", "2", stdout=io.StringIO())
    assert refused.value.returncode == 2
    from django.contrib.auth import get_user_model

    assert not get_user_model().objects.filter(username__in=["admin", "member"]).exists()  # r20: no users either
    assert not m.Conversation.objects.exists() and engine_folder.recorded() is None
    assert sorted((p.relative_to(engine_home), p.read_bytes() if p.is_file() else b"")
                  for p in engine_home.rglob("*")) == before
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("engine_folder", stdout=out)
    assert "it carries another database's mark" in out.getvalue()
    (engine_home / "state" / "subagents.v1.json").unlink()  # the other's row: of no conversation here
    conversation = factories.make_conversation(title="First of this database")  # no files anywhere yet
    assert admit(conversation).outcome == "unavailable"
    assert engine_folder.recorded() is None and engine_folder.folder_mark(EngineHome()) == other
    call_command("engine_folder", "--adopt", "--take-from-other-database", stdout=io.StringIO())
    taken = engine_folder.recorded()
    assert taken not in (None, other) and engine_folder.folder_mark(EngineHome()) == taken
    assert admit(conversation).outcome == "admitted"


def test_serve_never_makes_an_empty_folder_in_place_of_the_databases(engine_home, settings, tmp_path, caplog):
    from console.management.commands.serve import Command

    engine_folder.adopt(force=False)
    engine_home.rename(engine_home.with_name("engine-away"))
    settings.LOG_FORMAT = "text"
    err = io.StringIO()
    command = Command(stdout=io.StringIO(), stderr=err)
    command.prepare_engine_folder()
    assert not engine_home.exists()
    assert "is missing: deletes wait and /readyz says not ready" in err.getvalue()
    # Under JSON logs (a deployment's), the line is a warning record as every other line there.
    settings.LOG_FORMAT = "json"
    err = io.StringIO()
    Command(stdout=io.StringIO(), stderr=err).prepare_engine_folder()
    assert err.getvalue() == "" and not engine_home.exists()
    [record] = [r for r in caplog.records if r.name == "lethe.serve"]
    assert record.levelname == "WARNING" and "is missing: deletes wait and /readyz says not ready" in record.getMessage()

    settings.ENGINE_HOME = tmp_path / "a-file"
    settings.ENGINE_HOME.write_text("not a folder")
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="is not a folder"):  # exit 2 from manage.py (test_settings_env)
        command.prepare_engine_folder()


def test_adopting_writes_the_mark_alone_and_never_replaces_another(engine_home):
    """The mark is the only file adoption adds, and holds the id the database records; a mark
    already there (another process's, written first) stands."""
    folder_id = engine_folder.adopt(force=False)
    assert [p.name for p in engine_home.iterdir()] == [engine_folder.MARK_NAME]
    assert (engine_home / engine_folder.MARK_NAME).read_text() == folder_id + "\n"
    assert engine_folder._mark(EngineHome(), replace=False) == folder_id
    assert (engine_home / engine_folder.MARK_NAME).read_text() == folder_id + "\n"
    (engine_home / engine_folder.MARK_NAME).write_text("not an id\n")  # a mark that holds no id
    m.EngineFolderMark.objects.all().delete()
    with pytest.raises(engine_folder.EngineFolderUnavailable) as unmarked:
        engine_folder.adopt(force=False)
    assert unmarked.value.reason == "unmarked" and engine_folder.recorded() is None


def test_adopt_refuses_a_path_that_is_not_there_and_notes_a_folder_without_its_files(engine_home, settings):
    """A misspelt ENGINE_HOME given to --adopt was created empty and marked; every check then
    said clean while the real folder held residue (r42). It is refused now, changing nothing,
    and an empty folder adopted on purpose is said to hold none of the conversations' files."""
    target = factories.make_conversation(title="Files in the real folder")
    factories.fill_every_store(target)
    done = factories.make_conversation(title="Deleted")
    factories.fill_every_store(done)
    assert executor.run_erasure(request_deletion(done, key="k-r42", acting_user=None).pk) == "completed"
    recorded = engine_folder.recorded()
    wrong = engine_home.with_name("engnie")
    settings.ENGINE_HOME = str(wrong)
    with pytest.raises(CommandError) as refused:
        call_command("engine_folder", "--adopt", stdout=io.StringIO())
    assert refused.value.returncode == 2 and "does not exist, so nothing was adopted" in str(refused.value)
    assert not wrong.exists() and engine_folder.recorded() == recorded
    with pytest.raises(CommandError) as check:
        call_command("verify_erasure", "--all", stdout=io.StringIO())
    assert "is missing" in str(check.value) and "--adopt" not in str(check.value)  # not advised for a missing one
    out = io.StringIO()
    with pytest.raises(SystemExit):
        call_command("engine_folder", stdout=out)
    assert "--adopt" not in out.getvalue()

    wrong.mkdir()  # made on purpose (the real folder lost for good): adopted, with a note
    out = io.StringIO()
    call_command("engine_folder", "--adopt", stdout=out)
    assert "is this database's engine folder now" in out.getvalue()
    assert "Note: it holds no file of any conversation this database has not deleted." in out.getvalue()
    settings.ENGINE_HOME = str(engine_home)  # the real one, adopted again: no note
    out = io.StringIO()
    call_command("engine_folder", "--adopt", "--take-from-other-database", stdout=out)
    assert "is this database's engine folder now" in out.getvalue() and "Note:" not in out.getvalue()


def test_adopt_makes_the_folder_of_a_new_install_that_holds_no_conversation(engine_home, settings):
    made = engine_home.with_name("engine-new")
    settings.ENGINE_HOME = str(made)
    call_command("engine_folder", "--adopt", stdout=io.StringIO())
    assert made.is_dir() and engine_folder.recorded() == engine_folder.folder_mark(EngineHome())


def test_adopt_names_the_whole_path_it_could_not_make(engine_home, settings, tmp_path):
    """It named one step of the path ("hostname: Not a directory"), not the folder (r46)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    settings.ENGINE_HOME = str(blocker / "engine")
    with pytest.raises(CommandError) as refused:
        call_command("engine_folder", "--adopt", stdout=io.StringIO())
    assert str(refused.value).startswith(f"io_error: {blocker / 'engine'}: Not a directory. Nothing was adopted; "
                                         "a file stands where a folder of its path belongs")


def test_seeding_into_a_missing_folder_does_not_advise_adopting_it(engine_home, settings):
    """(r43) --adopt refuses a path that is not there; seed_demo advised it for one."""
    engine_folder.adopt(force=False)  # this database's folder, recorded
    settings.ENGINE_HOME = str(engine_home.with_name("engine-typo"))
    with pytest.raises(CommandError) as seeding:
        call_command("seed_demo", stdout=io.StringIO())
    assert "is missing" in str(seeding.value) and "--adopt" not in str(seeding.value)
    assert not engine_home.with_name("engine-typo").exists() and not m.Conversation.objects.exists()


def test_a_database_from_before_the_mark_does_not_take_a_wrong_folder_by_itself(engine_home, settings):
    """A wrong ENGINE_HOME (an empty folder, another database's) at the first delete of a
    database from before the mark: nothing is erased or counted as gone, nothing is recorded, and
    the operator is told to check and adopt; the real folder is taken once it is there."""
    target = factories.make_conversation(title="Files in the real folder")
    factories.fill_every_store(target)
    op = request_deletion(target, key="k-before-the-mark", acting_user=None)
    assert op.state == "pending"
    forget_the_mark(engine_home)
    before = files_of(target)
    assert before
    real = engine_home.with_name("engine-real")
    engine_home.rename(real)
    engine_home.mkdir()  # a wrong ENGINE_HOME: an empty folder

    assert executor.run_erasure(op.pk, force=True) == "pending"
    op.refresh_from_db()
    assert op.last_error == "engine_folder_unavailable"
    assert not op.steps.filter(state="done").exclude(key="fingerprints").exists()
    assert m.Item.objects.filter(conversation=target).exists()
    assert engine_folder.recorded() is None and list(engine_home.iterdir()) == []
    assert check_engine_folder() == {"ok": False, "error": "unmarked"}
    other = factories.make_conversation(title="Asked meanwhile")
    refused = request_deletion(other, key="k-meanwhile", acting_user=None)
    assert (refused.state, refused.reason) == ("unavailable", "engine_folder_unavailable")
    with pytest.raises(engine_folder.EngineFolderUnavailable):  # what verify_erasure refuses on
        verify.verify(op)

    out = io.StringIO()
    with pytest.raises(SystemExit) as status:
        call_command("engine_folder", stdout=out)
    assert status.value.code == 1
    assert out.getvalue() == (
        f"{engine_home}: not marked as this database's engine folder. This database has recorded no engine folder "
        "yet and does not take this one by itself: it holds none of the files of this database's conversations. "
        "Deletes wait. Check that it is the right folder (or set ENGINE_HOME to the right one), then run "
        "manage.py engine_folder --adopt.\n")
    from console.management.commands.serve import Command

    settings.LOG_FORMAT = "text"
    err = io.StringIO()
    Command(stdout=io.StringIO(), stderr=err).prepare_engine_folder()
    assert "not marked as this database's engine folder" in err.getvalue()
    assert "manage.py engine_folder --adopt" in err.getvalue()
    assert engine_folder.recorded() is None and list(engine_home.iterdir()) == []

    # Another database's folder, marked: not taken either.
    (engine_home / engine_folder.MARK_NAME).write_text("f" * 32 + "\n")
    assert engine_folder.problem() == "not_this_folder"
    assert executor.run_erasure(op.pk, force=True) == "pending" and engine_folder.recorded() is None
    assert files_of(target) == []  # the wrong folder holds none, and the real one still holds them all
    assert sorted(str(p.relative_to(real)) for p in real.rglob("*") if p.is_file() and target.storage_key in str(p)) \
        == before

    # The real folder, back at ENGINE_HOME: it holds the conversation's files, so it is taken.
    (engine_home / engine_folder.MARK_NAME).unlink()
    engine_home.rmdir()
    real.rename(engine_home)
    assert engine_folder.problem() is None
    assert executor.run_erasure(op.pk, force=True) == "completed"
    assert files_of(target) == [] and not m.Item.objects.filter(conversation=target).exists()
    assert engine_folder.recorded() == engine_folder.folder_mark(EngineHome())


def test_a_database_from_before_the_mark_without_undeleted_conversations_takes_the_folder_it_finds(engine_home):
    done = factories.make_conversation(title="Deleted")
    factories.fill_every_store(done)
    op = request_deletion(done, key="k-deleted-first", acting_user=None)
    assert executor.run_erasure(op.pk) == "completed"
    forget_the_mark(engine_home)
    other = engine_home.with_name("engine-other")
    other.mkdir()
    from django.conf import settings

    settings.ENGINE_HOME = other  # only deleted conversations: no file of theirs can be elsewhere
    folder_id = engine_folder.adopt(force=False)
    assert engine_folder.recorded() == folder_id == engine_folder.folder_mark(EngineHome(other))


@pytest.mark.parametrize("unnamed_temporary_files", [True, False], ids=["O_TMPFILE", "create-and-unlink"])
def test_readiness_scans_a_folder_it_has_not_taken_once_while_the_folder_stays_as_it_was(
        engine_home, monkeypatch, unnamed_temporary_files):
    """/readyz is open to anyone: for a database that has recorded no folder, the scan of the
    folder's conversation areas against the database is not repeated on every probe, only
    once the folder changed (or FOLDER_SCAN_SECONDS passed)."""
    import tempfile

    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if not unnamed_temporary_files:  # as on filesystems without O_TMPFILE: the probe changes the folder's time
        monkeypatch.setattr(tempfile, "_O_TMPFILE_WORKS", False)
    known = factories.make_conversation(title="Its files are elsewhere")
    forget_the_mark(engine_home)
    for area in ("threads", "sessions", "artifacts"):
        for child in (engine_home / area).glob("*"):
            if child.name == known.storage_key:
                import shutil

                shutil.rmtree(child)
    strangers = engine_home / "threads"
    strangers.mkdir(exist_ok=True)
    for n in range(1200):  # another install's conversation folders: three lookups of 500
        (strangers / f"c_{n:020d}").mkdir()

    def lookups() -> tuple[dict, int]:
        with CaptureQueriesContext(connection) as queries:
            answer = check_engine_folder()
        return answer, sum("lifecycle_conversation" in q["sql"] for q in queries.captured_queries)

    first, scanned = lookups()
    assert first == {"ok": False, "error": "unmarked"} and scanned >= 3
    assert lookups() == ({"ok": False, "error": "unmarked"}, 0)  # kept: nothing changed
    # The known conversation's folder appears: the area changed, so the folder is looked at again
    (strangers / known.storage_key).mkdir()
    again, scanned = lookups()
    assert again == {"ok": True} and scanned >= 1
    assert engine_folder.recorded() is None  # a readiness probe never takes the folder


@pytest.mark.django_db(transaction=True)
def test_two_forced_adopts_at_once_mark_the_folder_with_one_id(engine_home, monkeypatch):
    """Two operators' `engine_folder --adopt` at once on an unmarked folder each wrote its own
    mark over the other's and recorded its own id: the folder then read as another database's."""
    import threading

    from django.db import connections

    forget_the_mark(engine_home)
    both_looked = threading.Barrier(2, timeout=10)
    real = engine_folder._mark

    def after_both_found_no_mark(home, *, replace):
        both_looked.wait()
        return real(home, replace=replace)

    monkeypatch.setattr(engine_folder, "_mark", after_both_found_no_mark)
    ids: list[str] = []

    def adopt() -> None:
        try:
            ids.append(engine_folder.adopt(EngineHome(engine_home), force=True))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=adopt) for _ in range(2)]
    [t.start() for t in threads]
    [t.join(20) for t in threads]
    assert len(ids) == 2 and ids[0] == ids[1]
    assert (engine_home / engine_folder.MARK_NAME).read_text() == ids[0] + "\n"
    assert engine_folder.recorded() == ids[0] and engine_folder.problem(EngineHome(engine_home)) is None
    # a mark that holds no id is replaced when the operator forces it
    monkeypatch.setattr(engine_folder, "_mark", real)
    (engine_home / engine_folder.MARK_NAME).write_text("not an id\n")
    fresh = engine_folder.adopt(EngineHome(engine_home), force=True)
    assert fresh != ids[0] and (engine_home / engine_folder.MARK_NAME).read_text() == fresh + "\n"
    assert engine_folder.recorded() == fresh


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_mark_that_is_a_link_or_a_fifo_is_no_mark_and_is_never_waited_on(engine_home, tmp_path, kind):
    import os
    import signal

    mark = engine_home / engine_folder.MARK_NAME
    other = tmp_path / "other-mark"
    other.write_text(mark.read_text())  # the id this database recorded, but in a file elsewhere
    mark.unlink()
    mark.symlink_to(other) if kind == "link" else os.mkfifo(mark)

    class Blocked(BaseException):  # not an OSError, which the reader catches
        pass

    def stop(signum, frame):
        raise Blocked("waited on a FIFO")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(20)
    try:
        assert engine_folder.folder_mark(EngineHome()) is None
        with pytest.raises(engine_folder.EngineFolderUnavailable) as refused:
            engine_folder.check()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert refused.value.reason == "unmarked"


def test_a_new_install_makes_its_folder_one_name_at_a_time_and_never_through_a_link(engine_home, tmp_path, settings):
    """The folder was made by path (mkdir -p): a link put on the way after ENGINE_HOME was
    resolved had it made (and the database wait on a folder) elsewhere. It is now made from
    /, one name at a time and never through a link, as the engine folder's own folders are."""
    forget_the_mark(engine_home)
    settings.ENGINE_HOME = tmp_path / "mount" / "lethe" / "engine"
    home = EngineHome()  # resolved while nothing is there
    folder_id = engine_folder.adopt(home, force=False)
    assert engine_folder.folder_mark(home) == folder_id == engine_folder.recorded()
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(home.root.stat().st_mode) == 0o700  # the folder itself; those above it as mkdir -p makes them
    assert stat.S_IMODE(home.root.parent.stat().st_mode) == 0o777 & ~umask

    m.EngineFolderMark.objects.all().delete()
    shutil.rmtree(tmp_path / "mount")
    home = EngineHome()  # resolved; then a link takes the place of a folder on the way
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "mount").symlink_to(outside)
    with pytest.raises(engine_folder.EngineFolderUnavailable) as missing:
        engine_folder.adopt(home, force=False)
    assert missing.value.reason == "missing" and engine_folder.recorded() is None
    assert list(outside.iterdir()) == []  # nothing made, nothing marked there


def _known_outside(engine_home, tmp_path):
    """A conversation of this database whose folder is outside the engine folder (behind the
    link `threads.link` in it), a database that has recorded no folder, and in the engine
    folder's `threads` only folders of conversations it does not know."""
    known = factories.make_conversation(title="Its folder is elsewhere")
    forget_the_mark(engine_home)
    outside = tmp_path / "outside"
    (outside / known.storage_key).mkdir(parents=True)
    (engine_home / "threads").mkdir(exist_ok=True)
    for n in range(3):
        (engine_home / "threads" / f"c_{n:020d}").mkdir()
    link = engine_home / "threads.link"
    link.symlink_to(outside)
    return EngineHome(), engine_home / "threads", link


def test_a_conversation_area_behind_a_link_holds_no_files_of_known_conversations(engine_home, tmp_path):
    """os.scandir(area) followed a link at the area: another folder's conversations counted as
    this folder's, and the database took the folder as its own."""
    home, threads, link = _known_outside(engine_home, tmp_path)
    shutil.rmtree(threads)
    threads.symlink_to(link.readlink())  # the area itself a link to the folder outside
    assert not engine_folder.holds_files_of_known_conversations(home)
    with pytest.raises(engine_folder.EngineFolderUnavailable) as refused:
        engine_folder.adopt(home, force=False)
    assert refused.value.reason == "unmarked" and engine_folder.recorded() is None
    assert not (engine_home / engine_folder.MARK_NAME).exists()


def test_a_conversation_area_swapped_for_a_link_never_counts_the_folders_outside(engine_home, tmp_path):
    home, threads, link = _known_outside(engine_home, tmp_path)
    with swapping(threads, link):
        attempts, seen = attempts_until(lambda: engine_folder.holds_files_of_known_conversations(home))
    assert not seen, f"a folder outside was taken for this database's after {attempts} attempts"
    assert attempts > 1 and engine_folder.problem() == "unmarked"


# ---- A folder that cannot be written: a read-only mount, a full disk ------------------------


@pytest.mark.parametrize(("errno_", "code", "words"), [
    (errno.EROFS, "engine_folder_read_only", "The engine folder is on a read-only disk"),
    (errno.ENOSPC, "engine_folder_full", "The engine folder's disk is full"),
    (errno.EACCES, "engine_folder_not_writable", "Lethe cannot write in the engine folder"),
])
def test_a_delete_in_a_folder_it_cannot_write_is_unavailable_by_its_errno_and_records_no_intent(
        api, unwritable_engine_folder, errno_, code, words):
    """The fleet's lock files are opened for writing before admission: a read-only or full
    engine folder made every Delete a 500 (the OSError reached the view)."""
    conversation = factories.make_conversation(title="Asked on a read-only disk")
    unwritable_engine_folder(errno_)
    api.raise_request_exception = False
    answer = api.delete(f"/v1/threads/{conversation.public_id}", HTTP_IDEMPOTENCY_KEY=f"k-{code}")
    assert answer.status_code == 409, answer.content
    body = answer.json()
    assert (body["code"], body["outcome"]) == (code, "unavailable") and body["message"].startswith(words)
    op = m.DeleteOperation.objects.get(public_id=body["operation"])
    assert (op.state, op.reason, op.reasons) == ("unavailable", code, [code])
    conversation.refresh_from_db()
    assert conversation.state == m.ConversationState.LIVE
    assert not m.DeleteOperation.objects.intents().exists() and not m.DeletionFence.objects.exists()
    assert not OrmQ.objects.exists()  # no erasure job
    unwritable_engine_folder(None)  # writable again: a new key asks again
    assert api.delete(f"/v1/threads/{conversation.public_id}", HTTP_IDEMPOTENCY_KEY="k-again").status_code == 202


def test_the_screen_says_why_a_delete_on_a_read_only_folder_cannot_start(admin_user, unwritable_engine_folder):
    conversation = factories.make_conversation(title="Deleted from the screen")
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    page = client.get(f"/conversations/{conversation.public_id}/delete/")
    key = page.content.decode().split('name="key" value="', 1)[1].split('"', 1)[0]
    unwritable_engine_folder(errno.EROFS)
    answer = client.post(f"/conversations/{conversation.public_id}/delete/", {"key": key}, follow=True)
    assert answer.status_code == 200
    assert "The engine folder is on a read-only disk" in answer.content.decode()
    op = m.DeleteOperation.objects.get()
    assert (op.state, op.reason) == ("unavailable", "engine_folder_read_only")
    assert m.Conversation.objects.get(pk=conversation.pk).state == m.ConversationState.LIVE
    # Spanish too, from the stored code
    client.cookies["django_language"] = "es"
    shown = client.get(f"/operations/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "La carpeta del motor está en un disco de solo lectura" in shown


@pytest.mark.parametrize("locks_there", [False, True], ids=["before-any-delete", "after-one"])
def test_the_preview_on_a_read_only_disk_says_what_the_request_then_does(
        api, admin_user, engine_home, unwritable_engine_folder, locks_there):
    """The preview takes no lock, so a read-only engine folder whose mark was there read as
    "can be deleted" on the page and in the API, and the request was then Unavailable."""
    conversation = factories.make_conversation(title="Previewed on a read-only disk")
    if locks_there:
        earlier = factories.make_conversation(title="Deleted before")
        assert request_deletion(earlier, key="k-earlier", acting_user=None).state == "pending"
    assert (engine_home / "state").exists() == locks_there
    url = f"/v1/threads/{conversation.public_id}/deletion-preview"
    assert api.get(url).json()["admission"]["outcome"] == "admitted"
    unwritable_engine_folder(errno.EROFS)
    admission = api.get(url).json()["admission"]
    assert (admission["outcome"], admission["code"]) == ("unavailable", "engine_folder_read_only")
    assert admission["reasons"][0]["message"].startswith("The engine folder is on a read-only disk")
    client = Client()
    client.force_login(admin_user)
    page = client.get(f"/conversations/{conversation.public_id}/delete/").content.decode()
    assert "The engine folder is on a read-only disk" in page
    # what the preview said is what the request does, and it wrote nothing
    assert (engine_home / "state").exists() == locks_there
    op = request_deletion(conversation, key="k-read-only", acting_user=None)
    assert (op.state, op.reason) == ("unavailable", "engine_folder_read_only")
    # a full disk (here every open for writing fails, as the request's own does): the same when
    # the lock files are there; before, whether a full disk has room for them is not known
    # without making them (free-block figures do not say), so the preview admits and the
    # request, which makes them, says
    unwritable_engine_folder(errno.ENOSPC)
    admission = api.get(url).json()["admission"]
    op = request_deletion(conversation, key="k-full", acting_user=None)
    assert (op.state, op.reason) == ("unavailable", "engine_folder_full")
    assert (admission["outcome"], admission["code"]) == (
        ("unavailable", "engine_folder_full") if locks_there else ("admitted", None))
    unwritable_engine_folder(None)
    assert api.get(url).json()["admission"]["outcome"] == "admitted"
    assert request_deletion(conversation, key="k-writable", acting_user=None).state == "pending"


def test_a_first_delete_that_cannot_write_the_folders_mark_is_unavailable_too(engine_home, unwritable_engine_folder):
    """A database from before the mark writes it at its first delete (and the preview's check)."""
    target = factories.make_conversation(title="First delete")
    append_log(target, log="events", records=[{"type": "turn.started"}])  # its files are here: taken
    forget_the_mark(engine_home)
    unwritable_engine_folder(errno.ENOSPC)
    assert admit(target).reasons == ["engine_folder_full"]
    op = request_deletion(target, key="k-no-mark", acting_user=None)
    assert (op.state, op.reason) == ("unavailable", "engine_folder_full")
    assert engine_folder.recorded() is None and not (engine_home / engine_folder.MARK_NAME).exists()


def test_a_delete_stopped_by_a_read_only_or_full_folder_says_which_and_goes_on_once_it_is_writable(
        unwritable_engine_folder):
    target = factories.make_conversation(title="Erased on a full disk")
    factories.fill_every_store(target)
    op = request_deletion(target, key="k-stopped", acting_user=None)
    assert op.state == "pending"
    for errno_, code, words in ((errno.EROFS, "engine_folder_read_only", "it is on a read-only disk"),
                                (errno.ENOSPC, "engine_folder_full", "its disk is full")):
        unwritable_engine_folder(errno_)
        assert executor.run_erasure(op.pk, force=True) == "pending"
        op.refresh_from_db()
        assert op.last_error == code
        assert error_message(code).startswith(f"The engine folder could not be changed: {words}.")
        assert files_of(target)  # nothing of the folder was changed
    unwritable_engine_folder(errno.EIO)  # another errno: as before
    assert executor.run_erasure(op.pk, force=True) == "pending"
    op.refresh_from_db()
    assert op.last_error == "io_error"
    unwritable_engine_folder(None)
    assert executor.run_erasure(op.pk, force=True) == "completed"
    assert files_of(target) == []


def test_resolving_a_subagent_row_on_a_full_disk_is_a_refusal_that_says_so(api, admin_user, unwritable_engine_folder):
    conversation = factories.make_conversation(days_idle=1)
    fleet.write_snapshot([{"agent_id": "sa_old", "origin": None, "status": "completed", "delivery": "settled",
                           "started_at": conversation.created_at.isoformat(), "finished_at": None}])
    before = EngineHome().fleet_path.read_bytes()
    unwritable_engine_folder(errno.ENOSPC)
    api.raise_request_exception = False
    answer = api.post("/v1/subagents/sa_old/resolve", data=json.dumps({"action": "clear"}),
                      content_type="application/json")
    assert answer.status_code == 409, answer.content
    assert answer.json() == {"code": "engine_folder_full", "message": "The engine folder could not be written: no "
                             "space is left on the disk. Ask again once it can be."}
    with pytest.raises(CommandError) as refused:
        call_command("conversations", "resolve-subagent", "sa_old", "--clear", "--as", "alice", stdout=io.StringIO())
    assert str(refused.value) == ("engine_folder_full: The engine folder could not be written: no space is left "
                                  "on the disk. Ask again once it can be.")
    assert "permissions" not in str(refused.value)
    assert EngineHome().fleet_path.read_bytes() == before
    assert not m.AuditFact.objects.filter(action__startswith="subagent.").exists()
    assert not m.SubagentResolution.objects.exists()  # refused: nothing left for recovery to carry out


def in_both_fleet_files(agent_id: str) -> tuple[m.Conversation, EngineHome]:
    """A conversation, and a row of unknown origin overlapping its lifetime in the fleet file and
    in its legacy copy."""
    conversation = factories.make_conversation(days_idle=1)
    row = {"agent_id": agent_id, "origin": None, "status": "completed", "delivery": "settled",
           "started_at": conversation.created_at.isoformat(), "finished_at": None}
    home = EngineHome()
    fleet.write_snapshot([row])
    fleet.update_file(home, home.legacy_fleet_path, lambda rows: [*rows, row])
    return conversation, home


def full_at_the_legacy_copy(monkeypatch, home: EngineHome):
    """From now on the legacy copy's disk is full (the fleet file's is not); returns the real
    update_file, to set back."""
    update = fleet.update_file

    def full_at_the_copy(home_, path, change):
        if path == home.legacy_fleet_path:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return update(home_, path, change)

    monkeypatch.setattr(fleet, "update_file", full_at_the_copy)
    return update


def test_an_attribution_stopped_between_the_two_fleet_files_is_finished_by_its_retry(admin_user, monkeypatch):
    """The fleet file written, its legacy copy not (the disk filled up in between): the retry
    finishes the copy instead of refusing the row as one that already names its conversation."""
    conversation, home = in_both_fleet_files("sa_old")
    update = full_at_the_legacy_copy(monkeypatch, home)
    with pytest.raises(ActionRefused) as refused:
        resolve_subagent("sa_old", action="attribute", conversation=conversation, acting_user=admin_user)
    assert refused.value.code == "engine_folder_full"
    assert refused.value.message == (
        "The engine folder could not be written: no space is left on the disk. Part of the change was written "
        "already: the rest is written and recorded by itself once the folder can be written.")
    assert fleet.origin_of(fleet.read_rows(home.fleet_path)[0]) == conversation.public_id
    assert fleet.origin_of(fleet.read_rows(home.legacy_fleet_path)[0]) is None
    # kept for the rest (r25: dropped, the first file's change was never recorded)
    assert m.SubagentResolution.objects.count() == 1 and not m.AuditFact.objects.exists()
    monkeypatch.setattr(fleet, "update_file", update)
    resolve_subagent("sa_old", action="attribute", conversation=conversation, acting_user=admin_user)
    assert [fleet.origin_of(r) for p in fleet.fleet_files(home) for r in fleet.read_rows(p)] == [
        conversation.public_id, conversation.public_id]
    assert m.AuditFact.objects.filter(action="subagent.attributed").count() == 1


def test_a_clear_stopped_between_the_two_fleet_files_is_finished_and_recorded_by_recovery(admin_user, monkeypatch):
    """r25: the state file's row removed, the legacy copy's not (a full disk), and nothing kept:
    no fact ever, and a later attribution of the row recorded only that. Now recovery
    finishes the clear and records it, and the later request is answered after it."""
    from lifecycle import tasks

    conversation, home = in_both_fleet_files("sa_p")
    update = full_at_the_legacy_copy(monkeypatch, home)
    with pytest.raises(ActionRefused) as refused:
        resolve_subagent("sa_p", action="clear", acting_user=admin_user)
    assert refused.value.code == "engine_folder_full" and "Part of the change was written" in refused.value.message
    assert tasks.recover()["subagents"] == 0  # still full: kept
    # r27: no delete is admitted meanwhile (it would erase rows the admin's change is not yet
    # on record for), in the preview and the request alike
    assert admit(conversation, cached=True).reasons[0] == "subagent_resolution_pending"
    op = request_deletion(conversation, key="while-kept", acting_user=admin_user)
    assert (op.state, op.reason) == ("unavailable", "subagent_resolution_pending")
    with pytest.raises(ActionRefused) as again:  # another request for the row meanwhile: the same refusal
        resolve_subagent("sa_p", action="attribute", conversation=conversation, acting_user=admin_user)
    assert again.value.code == "engine_folder_full"
    assert fleet.read_rows(home.fleet_path) == [] and len(fleet.read_rows(home.legacy_fleet_path)) == 1
    monkeypatch.setattr(fleet, "update_file", update)
    assert tasks.recover()["subagents"] == 1
    assert fleet.read_rows(home.fleet_path) == fleet.read_rows(home.legacy_fleet_path) == []
    assert list(m.AuditFact.objects.values_list("action", "actor")) == [("subagent.cleared", admin_user.pk)]
    with pytest.raises(ActionRefused) as gone:
        resolve_subagent("sa_p", action="attribute", conversation=conversation, acting_user=admin_user)
    assert gone.value.code == "not_found" and not m.SubagentResolution.objects.exists()


def test_a_fleet_lock_that_is_not_a_regular_file_is_a_refusal_never_a_500(api, admin_user, tmp_path):
    """r25: a link in place of the legacy copy's lock made every resolution of the row a 500 (the
    state file changed already), and stopped recovery's settling of every other row."""
    from lifecycle import tasks

    conversation, home = in_both_fleet_files("sa_s")
    lock = home.lock_for(home.legacy_fleet_path)
    lock.unlink(missing_ok=True)
    lock.symlink_to(tmp_path / "elsewhere.lock")
    api.raise_request_exception = False
    said = []
    for _ in range(2):
        answer = api.post("/v1/subagents/sa_s/resolve", data=json.dumps({"action": "clear"}),
                          content_type="application/json")
        assert answer.status_code == 409, answer.content
        assert answer.json()["code"] == "engine_folder_not_writable"
        assert answer.json()["message"].startswith("A subagent state file or its lock is not a regular file")
        said.append(answer.json()["message"])
    # the first wrote the state file and says the rest follows; the second (its settle) changed nothing
    assert "Part of the change was written already" in said[0] and "so it was not read or changed" not in said[0]
    assert "Part of the change was written already" not in said[1]
    assert fleet.read_rows(home.fleet_path) == [] and len(fleet.read_rows(home.legacy_fleet_path)) == 1
    assert tasks.recover()["subagents"] == 0 and m.SubagentResolution.objects.count() == 1
    lock.unlink()
    assert tasks.recover()["subagents"] == 1
    assert fleet.read_rows(home.legacy_fleet_path) == []
    assert m.AuditFact.objects.filter(action="subagent.cleared").count() == 1


def test_the_engines_writes_to_a_folder_it_cannot_write_are_refusals(unwritable_engine_folder):
    conversation = factories.make_conversation(title="Engine writes")
    home = EngineHome()
    append_log(conversation, log="events", records=[{"type": "turn.started"}])
    before = home.events_path(conversation.storage_key).read_bytes()
    unwritable_engine_folder(errno.EROFS)
    with pytest.raises(ActionRefused) as refused:
        append_log(conversation, log="events", records=[{"type": "turn.completed"}])
    assert (refused.value.code, refused.value.message) == (
        "engine_folder_read_only", "The engine folder could not be written: the file system is read-only. Ask again "
        "once it can be.")
    unwritable_engine_folder(errno.ENOSPC)
    with pytest.raises(ActionRefused) as refused:
        write_artifact(conversation, name="output.txt", data=b"x")
    assert refused.value.code == "engine_folder_full"
    assert home.events_path(conversation.storage_key).read_bytes() == before
    assert not (home.artifacts_dir(conversation.storage_key) / "output.txt").exists()


def test_torn_logs_in_a_read_only_folder_are_left_and_recovery_goes_on(unwritable_engine_folder):
    conversation = factories.make_conversation(title="Torn")
    home = EngineHome()
    append_log(conversation, log="events", records=[{"type": "turn.started"}])
    events = home.events_path(conversation.storage_key)
    with events.open("ab") as log:
        log.write(b'{"torn')
    unwritable_engine_folder(errno.EROFS)
    assert recover_all_torn_logs() == 0
    assert events.read_bytes().endswith(b'{"torn')
    unwritable_engine_folder(None)
    assert recover_all_torn_logs() == 1


def test_commands_advise_by_errno():
    from console.management.cli import io_error

    def advice(code: int) -> str:
        return str(io_error(OSError(code, os.strerror(code), "/srv/engine/x"), "Nothing was done"))

    assert advice(errno.ENOSPC).endswith("Nothing was done; free space on its disk, then try again.")
    assert advice(errno.EROFS).endswith("Nothing was done; mount it read-write, then try again.")
    assert advice(errno.EACCES).endswith("Nothing was done; fix the folder's permissions or mount, then try again.")


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_delete_whose_fleet_lock_is_a_link_or_a_fifo_is_unavailable_not_a_server_error(api, tmp_path, kind):
    from lifecycle.enginefs import EngineHome

    conversation = factories.make_conversation(title="Odd lock")
    home = EngineHome()
    lock = home.lock_for(home.fleet_path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.unlink(missing_ok=True)
    outside = tmp_path / "outside"
    outside.write_bytes(b"kept")
    if kind == "link":
        lock.symlink_to(outside)
    else:
        os.mkfifo(lock)
    api.raise_request_exception = False
    preview = api.get(f"/v1/threads/{conversation.public_id}/deletion-preview")
    assert preview.status_code == 200, preview.content  # the preview says what the request then does
    assert (preview.json()["admission"]["code"], preview.json()["admission"]["outcome"]) == (
        "engine_folder_not_writable", "unavailable")
    answer = api.delete(f"/v1/threads/{conversation.public_id}", HTTP_IDEMPOTENCY_KEY=f"k-lock-{kind}")
    assert answer.status_code == 409, answer.content
    assert (answer.json()["code"], answer.json()["outcome"]) == ("engine_folder_not_writable", "unavailable")
    assert not m.DeleteOperation.objects.intents().exists()
    assert outside.read_bytes() == b"kept"


def test_a_mark_recorded_with_an_earlier_form_of_this_databases_key_stays_this_databases(engine_home, tmp_path):
    """r125: a mark recorded by the release of 2026-12-05 bore this database's key in the form of
    the time (PostgreSQL: the host, port and name as reached; a SQLite file reached through a
    link: the link's target). Upgraded in place, the database read as a copy of itself: deletes
    waited and /readyz said not ready. It is this database's; lifecycle 0029 brings the key to
    today's form, keeping the old one with its origins. Another database's key stays another's."""
    import hashlib
    import sqlite3
    import subprocess
    import sys
    from pathlib import Path

    from django.db import connection

    from retention.backups import database_key, location_key
    from tests.migrated import migrate, run_data_migration

    name = "0029_engine_folder_key_current_form"

    def migration() -> None:
        run_data_migration("lifecycle", name, "current_form")

    here = database_key()
    another = "a" * 32
    m.EngineFolderMark.objects.filter(pk=1).update(database_key=another, origin_keys=["b" * 32])
    migration()
    assert m.EngineFolderMark.objects.values_list("database_key", "origin_keys").get() == (another, ["b" * 32])
    assert engine_folder.is_copy() and engine_folder.problem() == "not_this_folder"
    if connection.vendor == "postgresql":
        earlier = location_key()  # the host, port and name as reached
        assert earlier != here
        m.EngineFolderMark.objects.filter(pk=1).update(database_key=earlier, origin_keys=["b" * 32])
        assert not engine_folder.is_copy() and engine_folder.problem() is None  # before the migration too
        migration()
        assert m.EngineFolderMark.objects.values_list("database_key", "origin_keys").get() == (
            here, ["b" * 32, earlier])
        assert not engine_folder.is_copy() and engine_folder.problem() is None
        return
    # SQLite: a file reached through a link, its mark recorded with the link's target, then
    # `manage.py migrate` and `engine_folder` as an upgrade runs them.
    root = Path(__file__).resolve().parent.parent
    real, link = tmp_path / "real" / "db.sqlite3", tmp_path / "link.sqlite3"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "upgraded-engine"), DATABASE_URL=f"sqlite:///{real}")
    migrate(env)
    link.symlink_to(real)
    env["DATABASE_URL"] = f"sqlite:///{link}"

    def manage(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=root, env=env, capture_output=True, text=True,
                              timeout=300)

    assert manage("engine_folder", "--adopt").returncode == 0
    # The migrations after 0029 taken back first, as a database of that release has none of them
    later = manage("migrate", "lifecycle", name)
    assert later.returncode == 0, later.stderr
    target = hashlib.sha256(f"sqlite\0{real.resolve()}".encode()).hexdigest()[:32]  # the earlier form
    with sqlite3.connect(real) as db:
        current = db.execute("SELECT database_key FROM lifecycle_enginefoldermark").fetchone()[0]
        assert current != target
        db.execute("UPDATE lifecycle_enginefoldermark SET database_key = ?, origin_keys = '[]'", [target])
        db.execute("DELETE FROM django_migrations WHERE app = 'lifecycle' AND name = ?", [name])
    upgraded = manage("migrate")
    assert upgraded.returncode == 0, upgraded.stderr
    with sqlite3.connect(real) as db:
        assert db.execute("SELECT database_key, origin_keys FROM lifecycle_enginefoldermark").fetchone() == (
            current, json.dumps([target]))
    checked = manage("engine_folder")
    assert checked.returncode == 0 and "is this database's engine folder" in checked.stdout, checked
    # The same file copied elsewhere is another database: its own folder still refused.
    copy = tmp_path / "copy" / "db.sqlite3"
    copy.parent.mkdir()
    shutil.copyfile(real, copy)
    env["DATABASE_URL"] = f"sqlite:///{copy}"
    refused = manage("engine_folder")
    assert refused.returncode == 1 and "This database is a copy of the one that marked it" in refused.stdout + refused.stderr
