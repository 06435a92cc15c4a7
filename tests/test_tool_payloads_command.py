"""`manage.py tool_payloads`: the operator's commands, same rules as the API."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from lifecycle.models import Item
from retention import service
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests.migrated import migrate
from tests.test_tool_payload_jobs import old_conversation

pytestmark = pytest.mark.django_db


def command(*args) -> str:
    out = StringIO()
    call_command("tool_payloads", *args, stdout=out)
    return out.getvalue()


def interrupted_at(monkeypatch, point: str, *args: str) -> None:
    """The command `args` stopped by Ctrl-C at the fault point `point`."""
    from lifecycle import faults

    real = faults.kill_point

    def interrupted(name: str) -> None:
        if name == point:
            raise KeyboardInterrupt
        real(name)

    monkeypatch.setattr(faults, "kill_point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        command(*args)
    monkeypatch.setattr(faults, "kill_point", real)


def test_status_analyze_run_and_compact_from_the_command_line(admin_user):
    conversation = old_conversation("cli", tools=2)
    status = json.loads(command("status", "--json"))
    assert status["policy"]["enabled"] is False and status["analysis_state"] == "not_analyzed"
    analysis = json.loads(command("analyze", "--age", "3", "--unit", "months", "--as", "alice", "--here", "--json"))
    assert analysis["state"] == "succeeded" and analysis["eligible_messages"] == 3
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()
    with pytest.raises(CommandError, match="not_enabled"):
        command("run", "--as", "alice", "--here")
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="skip")
    text = command("run", "--as", "alice", "--here")
    assert "cleanup #" in text and "succeeded" in text and "removed 3" in text
    assert Item.objects.filter(conversation=conversation, details_removed_at__isnull=False).count() == 3
    assert "cleanup on, 3 months" in command("status")
    queued = json.loads(command("analyze", "--age", "2", "--as", "alice", "--no-wait", "--json"))
    assert queued["state"] == "queued"
    cancelled = json.loads(command("cancel", str(queued["id"]), "--as", "alice", "--json"))
    assert cancelled["cancel_requested"] is True


def test_status_says_1_week_and_2_months(admin_user):
    """The status line read "1 weeks"."""
    for value, unit, words in ((1, "weeks", "1 week,"), (2, "months", "2 months,"), (1, "months", "1 month,")):
        service.save_policy(user=admin_user, enabled=False, age_value=value, age_unit=unit,
                            revision=ToolPayloadPolicy.load().revision, backup_choice=None)
        assert command("status").splitlines()[0].startswith(f"cleanup off, {words}")


def test_changes_need_an_admin(member_user):
    with pytest.raises(CommandError, match="No active admin"):
        command("compact", "--as", "bob")
    with pytest.raises(CommandError, match="No active admin"):
        command("analyze", "--age", "3", "--as", "nobody")
    assert ToolPayloadOperation.objects.count() == 0


def test_run_with_revision_zero_is_stale_not_the_current_one(admin_user):
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="skip")
    assert ToolPayloadPolicy.load().revision == 2
    for read in ("0", "1"):
        with pytest.raises(CommandError, match="stale_revision") as stale:
            command("run", "--revision", read, "--as", "alice", "--no-wait")
        # a terminal has no page to reload (r37)
        assert "Reload" not in str(stale.value) and "tool_payloads status" in str(stale.value)
    assert ToolPayloadOperation.objects.count() == 0
    queued = json.loads(command("run", "--revision", "2", "--as", "alice", "--no-wait", "--json"))
    assert queued["kind"] == "cleanup" and queued["state"] == "queued"


def backup_chosen(admin_user, settings, tmp_path) -> None:
    """Cleanup on with a backup first, over one idle conversation of three tool outputs."""
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    old_conversation("cli", tools=2)
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="create")


@pytest.mark.django_db(transaction=True)
def test_json_is_one_document_when_the_backup_runs_before_the_cleanup(admin_user, settings, tmp_path):
    backup_chosen(admin_user, settings, tmp_path)
    doc = json.loads(command("run", "--as", "alice", "--here", "--json"))
    assert (doc["kind"], doc["state"], doc["removed_messages"]) == ("cleanup", "succeeded", 3)
    assert (doc["preceded_by"]["kind"], doc["preceded_by"]["state"]) == ("backup", "succeeded")
    # r83: the backup is in the folder, and the document says so (it said null: "not listed")
    assert doc["preceded_by"]["backup"]["present"] is True
    assert [(op.kind, op.state) for op in ToolPayloadOperation.objects.order_by("pk")] == [
        ("backup", "succeeded"), ("cleanup", "succeeded")]


def test_a_run_stopped_part_way_exits_4(admin_user, monkeypatch):
    from retention import jobs

    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    old_conversation("cli", tools=6)
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="skip")
    stopped = []

    def cancel_after_the_first_batch(name: str) -> None:
        if name == "tool-cleanup-after-batch" and not stopped:
            stopped.append(name)
            ToolPayloadOperation.objects.filter(kind="cleanup").update(cancel_requested=True)

    monkeypatch.setattr(jobs.faults, "kill_point", cancel_after_the_first_batch)
    out = StringIO()
    with pytest.raises(SystemExit) as exit_status:
        call_command("tool_payloads", "run", "--as", "alice", "--here", stdout=out)
    assert exit_status.value.code == 4
    run = ToolPayloadOperation.objects.get(kind="cleanup")
    assert run.state == "partial" and 0 < run.removed_messages < run.eligible_messages
    assert f"cleanup #{run.pk}: partial;" in out.getvalue() and f"removed {run.removed_messages}" in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_the_compact_line_gives_the_sizes_before_and_after(admin_user):
    compact = command("compact", "--as", "alice", "--here")
    op = ToolPayloadOperation.objects.get(kind="compact")
    assert op.state == "succeeded" and op.before_bytes and op.after_bytes is not None
    assert f"compact #{op.pk}: succeeded; database file {op.before_bytes} -> {op.after_bytes} bytes" in compact
    assert "messages" not in compact


@pytest.mark.django_db(transaction=True)
def test_the_backup_line_names_its_file_and_checksum(admin_user, settings, tmp_path):
    backup_chosen(admin_user, settings, tmp_path)
    text = command("run", "--as", "alice", "--here")
    backup = ToolPayloadOperation.objects.get(kind="backup")
    assert (f"backup #{backup.pk}: succeeded; {backup.backup_name}, {backup.backup_size} bytes, "
            f"SHA-256 {backup.backup_sha256}") in text
    assert "cleanup #" in text and "removed 3" in text


def _interrupted_run(admin_user, monkeypatch, tools: int = 6) -> ToolPayloadOperation:
    """`run --here` stopped by Ctrl-C after its first batch, long enough ago that its lease ran out."""
    from datetime import timedelta

    from django.utils import timezone

    from retention import jobs

    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    old_conversation("cli", tools=tools)
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="skip")
    interrupted_at(monkeypatch, "tool-cleanup-after-batch", "run", "--as", "alice", "--here")
    run = ToolPayloadOperation.objects.get(kind="cleanup")
    assert run.state == "running" and run.lease and 0 < run.removed_messages < run.eligible_messages
    ToolPayloadOperation.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    return run


def test_a_run_interrupted_here_is_continued_here_without_a_job_cluster(admin_user, monkeypatch, capsys):
    """Ctrl-C on `run --here` left the run open; with no job cluster, `run --here` said busy and
    `cancel` printed "running" and changed nothing visible. Now `run --here` takes it to its end
    first, and the totals are exact."""
    run = _interrupted_run(admin_user, monkeypatch)
    out = StringIO()
    call_command("tool_payloads", "run", "--as", "alice", "--here", stdout=out)
    assert "was left open with no worker on it; continuing it here (it is the cleanup run asked for)." in capsys.readouterr().err
    done = ToolPayloadOperation.objects.get(pk=run.pk)
    assert done.state == "succeeded" and done.removed_messages == done.eligible_messages == 7  # 6 shell, 1 read
    assert done.progress_done == done.progress_total == 7
    assert Item.objects.filter(details_removed_at__isnull=False).count() == 7
    assert f"cleanup #{run.pk}: succeeded" in out.getvalue()


def test_cancel_here_ends_an_interrupted_run_and_cancel_says_it_was_asked(admin_user, monkeypatch):
    run = _interrupted_run(admin_user, monkeypatch)
    removed = ToolPayloadOperation.objects.get(pk=run.pk).removed_messages
    assert "cancel requested (it stops at its next check)" in command("cancel", str(run.pk), "--as", "alice")
    assert f"cleanup #{run.pk}: partial" in command("cancel", str(run.pk), "--as", "alice", "--here")
    done = ToolPayloadOperation.objects.get(pk=run.pk)
    assert (done.state, done.removed_messages) == ("partial", removed)  # what it removed before stays
    assert Item.objects.filter(details_removed_at__isnull=False).count() == removed


def test_a_run_here_killed_with_sigkill_is_taken_to_its_end_by_the_next_run_here(tmp_path):
    """A real process: `run --here` killed with SIGKILL between batches (no job cluster runs),
    then `run --here` again continues the run left open and ends with exact totals."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    database = tmp_path / "db.sqlite3"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", DATABASE_URL=f"sqlite:///{database}",
               LETHE_VAR_DIR=str(tmp_path / "var"), ENGINE_HOME=str(tmp_path / "engine"),
               LETHE_TOOL_CLEANUP_BATCH="1", LETHE_TOOL_CLEANUP_PAUSE="0.2", LETHE_TOOL_JOB_LEASE_SECONDS="1")

    def manage(*args: str, **kwargs):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=root, env=env, timeout=300, **kwargs)

    migrate(env)
    manage("shell", "-c", (
        "from django.contrib.auth import get_user_model; from retention import service; "
        "from retention.models import ToolPayloadPolicy; "
        "from tests.test_tool_payload_jobs import old_conversation; "
        "user = get_user_model().objects.create_user('op', password='pw-op-12345', is_staff=True); "
        "[old_conversation(f'killed-{n}', tools=4) for n in range(2)]; "
        "service.save_policy(user=user, enabled=True, age_value=3, age_unit='months', "
        "revision=ToolPayloadPolicy.load().revision, backup_choice='skip')"), check=True, capture_output=True)

    def removed() -> int:
        with sqlite3.connect(database) as db:
            return db.execute("SELECT count(*) FROM lifecycle_item WHERE details_removed_at IS NOT NULL").fetchone()[0]

    process = subprocess.Popen([sys.executable, "manage.py", "tool_payloads", "run", "--as", "op", "--here"],
                               cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while removed() < 3 and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    before = removed()
    assert 3 <= before < 10  # killed part-way: 2 conversations of 4 shell and 1 read_file items
    time.sleep(2.5)  # no worker on it for twice the lease
    result = manage("tool_payloads", "run", "--as", "op", "--here", "--json", capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "was left open with no worker on it; continuing it here (it is the cleanup run asked for)." in result.stderr
    doc = json.loads(result.stdout)
    assert doc["state"] == "succeeded" and doc["removed_messages"] == doc["eligible_messages"] == removed() == 10
    assert doc["progress"] == {"done": 10, "total": 10}


def test_a_queued_operation_with_no_worker_is_taken_to_its_end_by_the_next_command_here(admin_user, capsys):
    """No job cluster: an analysis queued with --no-wait made status say 'analysis running' (its
    line said queued) and `analyze --here` answer busy. Now status says queued and --here runs
    the queued one first; the same analysis asked for again is that one, run once."""
    old_conversation("cli", tools=2)
    queued = json.loads(command("analyze", "--age", "3", "--unit", "months", "--as", "alice", "--no-wait", "--json"))
    status = command("status")
    assert "; analysis queued" in status.splitlines()[0]
    assert f"analysis #{queued['id']}: queued" in status
    capsys.readouterr()
    out = command("analyze", "--age", "3", "--unit", "months", "--as", "alice", "--here")  # exit status 0
    done = ToolPayloadOperation.objects.get()  # nothing else was started
    assert (done.pk, done.state, done.eligible_messages) == (queued["id"], "succeeded", 3)
    assert out == (f"analysis #{done.pk}: succeeded; conversations 1, messages 3, removed 0, payload bytes "
                   f"{done.payload_bytes}; skipped protected 2\n")
    assert stderr_lines(capsys) == [f"analysis #{done.pk} is queued and no worker has taken it; running it here (it is "
                                    "the analysis asked for)."]
    assert "; analysis completed" in command("status").splitlines()[0]


def stderr_lines(capsys) -> list[str]:
    """The command's own lines on standard error (the JSON log lines left out)."""
    return [line for line in capsys.readouterr().err.splitlines() if not line.startswith("{")]


def two_periods() -> None:
    """One conversation idle 200 days (in a 3-month and a 5-week period), one idle 50 days (in
    the 5-week period only)."""
    old_conversation("old", tools=2)
    old_conversation("recent", tools=1, days=50)


def analysis_line(op: ToolPayloadOperation) -> str:
    return (f"analysis #{op.pk}: succeeded; conversations {op.eligible_conversations}, messages "
            f"{op.eligible_messages}, removed 0, payload bytes {op.payload_bytes}; skipped protected "
            f"{2 * op.eligible_conversations}")


@pytest.mark.parametrize("cancelled", [False, True])
def test_here_runs_the_operation_left_queued_then_the_one_asked_for_and_prints_that_one(admin_user, capsys,
                                                                                        cancelled):
    """The review's case: `analyze --age 5 --unit weeks --here --json` with a 3-month analysis left
    queued (--no-wait, no job cluster) ran the leftover, printed ITS JSON and exited 0; the 5-week
    analysis was never queued (a cancelled leftover: exit 3 for the leftover). Now the leftover is
    taken to its end, then the analysis asked for runs, and its document is the one printed."""
    two_periods()
    leftover = json.loads(command("analyze", "--age", "3", "--unit", "months", "--as", "alice", "--no-wait",
                                  "--json"))["id"]
    if cancelled:
        command("cancel", str(leftover), "--as", "alice")
    capsys.readouterr()
    out = command("analyze", "--age", "5", "--unit", "weeks", "--as", "alice", "--here", "--json")  # exit status 0
    first = ToolPayloadOperation.objects.get(pk=leftover)
    asked = ToolPayloadOperation.objects.exclude(pk=leftover).get()
    doc = json.loads(out)
    assert out.count("\n") == 1 and doc["id"] == asked.pk
    assert (doc["kind"], doc["state"], doc["age"], doc["eligible_conversations"], doc["eligible_messages"]) == (
        "analysis", "succeeded", {"value": 5, "unit": "weeks"}, 2, 5)
    assert (first.state, first.eligible_conversations) == (("cancelled", 0) if cancelled else ("succeeded", 1))
    assert stderr_lines(capsys) == [
        f"analysis #{leftover} is queued and no worker has taken it; running it here first, then the analysis "
        "asked for.",
        f"analysis #{leftover}: cancelled" if cancelled else analysis_line(first)]


def test_run_and_compact_here_run_the_analysis_left_queued_first_then_their_own(admin_user, capsys):
    two_periods()
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="skip")
    leftover = json.loads(command("analyze", "--age", "5", "--unit", "weeks", "--as", "alice", "--no-wait",
                                  "--json"))["id"]
    capsys.readouterr()
    out = command("run", "--as", "alice", "--here")  # exit status 0
    first = ToolPayloadOperation.objects.get(pk=leftover)
    run = ToolPayloadOperation.objects.get(kind="cleanup")
    assert (first.state, run.state, run.removed_messages) == ("succeeded", "succeeded", 3)
    assert out == (f"cleanup #{run.pk}: succeeded; conversations 1, messages 3, removed 3, payload bytes "
                   f"{run.payload_bytes}; skipped protected 2\n")
    assert stderr_lines(capsys) == [
        f"analysis #{leftover} is queued and no worker has taken it; running it here first, then the cleanup run "
        "asked for.", analysis_line(first)]


@pytest.mark.django_db(transaction=True)
def test_compact_here_runs_the_analysis_left_queued_first_then_compacts(admin_user, capsys):
    two_periods()
    leftover = json.loads(command("analyze", "--age", "5", "--unit", "weeks", "--as", "alice", "--no-wait",
                                  "--json"))["id"]
    capsys.readouterr()
    doc = json.loads(command("compact", "--as", "alice", "--here", "--json"))  # exit status 0
    compact = ToolPayloadOperation.objects.get(kind="compact")
    assert (doc["id"], doc["kind"], doc["state"]) == (compact.pk, "compact", "succeeded")
    assert ToolPayloadOperation.objects.get(pk=leftover).state == "succeeded"
    assert stderr_lines(capsys)[0] == (f"analysis #{leftover} is queued and no worker has taken it; running it here "
                                       "first, then the compaction asked for.")


def test_here_with_no_wait_leaves_the_queued_operation_and_says_busy(admin_user):
    """--no-wait runs nothing here: the operation in the way is named by the busy refusal."""
    leftover = json.loads(command("analyze", "--age", "3", "--as", "alice", "--no-wait", "--json"))["id"]
    with pytest.raises(SystemExit) as refused:
        command("analyze", "--age", "5", "--unit", "weeks", "--as", "alice", "--here", "--no-wait", "--json")
    assert refused.value.code == 1
    assert ToolPayloadOperation.objects.get().pk == leftover


def test_queued_cancelled_and_failed_operations_show_their_state_never_0(admin_user):
    """`--no-wait`, `status` and `cancel` printed "analysis #3: queued; conversations 0, messages
    0, removed 0, payload bytes 0", and the same once cancelled. As on the screens, figures show
    only for what finished with them; the --json document keeps its whole numbers."""
    old_conversation("cli", tools=2)
    queued = command("analyze", "--age", "3", "--as", "alice", "--no-wait")
    a = ToolPayloadOperation.objects.get().pk
    assert queued == f"analysis #{a}: queued\n"
    requested = f"analysis #{a}: queued; cancel requested (it stops at its next check)"
    assert command("cancel", str(a), "--as", "alice") == requested + "\n"
    assert command("status").splitlines()[-1] == requested
    # What it counted before the cancel is no result either (the card's "No estimate").
    ToolPayloadOperation.objects.filter(pk=a).update(eligible_conversations=1, eligible_messages=2, payload_bytes=9)
    assert command("cancel", str(a), "--as", "alice", "--here") == f"analysis #{a}: cancelled\n"
    assert command("status").splitlines()[-1] == f"analysis #{a}: cancelled"
    doc = json.loads(command("status", "--json"))["history"][0]
    assert (doc["state"], doc["eligible_messages"], doc["removed_messages"], doc["payload_bytes"]) == ("cancelled", 2, 0, 9)

    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="skip")
    queued = command("run", "--as", "alice", "--no-wait")
    r = ToolPayloadOperation.objects.get(kind="cleanup").pk
    assert queued == f"cleanup #{r}: queued\n"
    assert command("cancel", str(r), "--as", "alice", "--here") == (
        f"cleanup #{r}: cancelled; cancelled: Removals committed before the cancel stay.\n")
    ToolPayloadOperation.objects.filter(pk=r).update(state="failed", error_code="engine_unavailable",
                                                     error_message="The engine did not answer.")
    assert command("status").splitlines()[-2] == f"cleanup #{r}: failed; engine_unavailable: The engine did not answer."
    doc = json.loads(command("status", "--json"))["history"][0]
    assert (doc["id"], doc["removed_messages"], doc["eligible_messages"]) == (r, 0, 0)


def test_a_run_left_queued_and_asked_to_stop_is_not_the_run_asked_for(admin_user, capsys):
    """A queued run under the same revision is the run asked for, unless it was cancelled: it
    ends cancelled, and the run asked for is started after it (exit status 0, not 3)."""
    old_conversation("cli", tools=2)
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="skip")
    queued = command("run", "--as", "alice", "--no-wait")
    first = ToolPayloadOperation.objects.get().pk
    assert queued == f"cleanup #{first}: queued\n"
    command("cancel", str(first), "--as", "alice")
    capsys.readouterr()
    out = command("run", "--as", "alice", "--here")  # exit status 0
    run = ToolPayloadOperation.objects.exclude(pk=first).get()
    assert (ToolPayloadOperation.objects.get(pk=first).state, run.state, run.removed_messages) == (
        "cancelled", "succeeded", 3)
    assert out == (f"cleanup #{run.pk}: succeeded; conversations 1, messages 3, removed 3, payload bytes "
                   f"{run.payload_bytes}; skipped protected 2\n")
    assert stderr_lines(capsys) == [
        f"cleanup #{first} is queued and no worker has taken it; running it here first, then the cleanup run asked "
        "for.", f"cleanup #{first}: cancelled; cancelled: Removals committed before the cancel stay."]


def test_the_command_here_exits_0_with_the_document_of_the_analysis_asked_for(tmp_path):
    """A real process, as a script runs it: exit status 0 and one JSON document on standard
    output, the 5-week analysis's (it printed the 2-week leftover's)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3",
               LETHE_VAR_DIR=str(tmp_path / "var"), ENGINE_HOME=str(tmp_path / "engine"))

    def manage(*args: str):
        return subprocess.run([sys.executable, "manage.py", *args], cwd=root, env=env, timeout=300,
                              capture_output=True, text=True)

    migrate(env)
    assert manage("shell", "-c", (
        "from django.contrib.auth import get_user_model; "
        "from tests.test_tool_payloads_command import two_periods; "
        "get_user_model().objects.create_user('op', password='pw-op-12345', is_staff=True); "
        "two_periods()")).returncode == 0
    queued = manage("tool_payloads", "analyze", "--age", "2", "--unit", "weeks", "--as", "op", "--no-wait")
    assert (queued.returncode, queued.stdout) == (0, "analysis #1: queued\n")
    result = manage("tool_payloads", "analyze", "--age", "5", "--unit", "weeks", "--as", "op", "--here", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert result.stdout.count("\n") == 1
    assert (doc["id"], doc["state"], doc["age"], doc["eligible_conversations"]) == (
        2, "succeeded", {"value": 5, "unit": "weeks"}, 2)
    assert ("analysis #1 is queued and no worker has taken it; running it here first, then the analysis asked "
            "for.\nanalysis #1: succeeded; conversations 2, ") in result.stderr


def test_busy_behind_an_operation_no_worker_has_taken_points_to_here(admin_user):
    """No job cluster runs and an analysis is queued: the next command (without --here) said only
    busy; it now says no worker has taken that one and that --here runs it."""
    leftover = json.loads(command("analyze", "--age", "3", "--as", "alice", "--no-wait", "--json"))["id"]
    with pytest.raises(CommandError) as refused:
        command("compact", "--as", "alice")
    assert str(refused.value).startswith("busy: ")
    assert str(refused.value).endswith(
        f"No worker has taken analysis #{leftover} or shown progress for a while: is the job cluster running? "
        "(--here runs it in this process, then the one asked for.)")
    assert list(ToolPayloadOperation.objects.values_list("pk", "state")) == [(leftover, "queued")]


@pytest.mark.django_db(transaction=True)
def test_a_failed_backup_is_shown_with_its_reason_and_retried_or_cancelled_from_the_command_line(
        admin_user, settings, tmp_path):
    """r34: after a failed backup `run` answered "Retry the backup, or change the backup choice",
    but the command had no way to do either, and `status` said only "preparation failed"."""
    import fcntl
    import os

    backup_chosen(admin_user, settings, tmp_path)
    folder = tmp_path / "backups"
    folder.mkdir(mode=0o700)
    holder = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another backup holds the folder: this one fails for real
    try:
        with pytest.raises(SystemExit) as failed:
            command("run", "--as", "alice", "--here")
    finally:
        os.close(holder)
    assert failed.value.code == 3
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed" and policy.preparation_error
    status = command("status")
    assert f"backup failed: {service.status_document()['preparation']['error']}" in status
    assert "tool_payloads retry --as ADMIN" in status and "tool_payloads cancel-preparation --as ADMIN" in status

    # Retry: the backup again, then the cleanup it was for
    doc = json.loads(command("retry", "--as", "alice", "--here", "--json"))
    assert (doc["kind"], doc["state"], doc["removed_messages"]) == ("cleanup", "succeeded", 3)
    assert (doc["preceded_by"]["kind"], doc["preceded_by"]["state"]) == ("backup", "succeeded")
    assert ToolPayloadPolicy.load().preparation_state == "ready"
    assert Item.objects.filter(details_removed_at__isnull=False).count() == 3
    with pytest.raises(CommandError, match="nothing_to_retry"):
        command("retry", "--as", "alice", "--here")

    # Cancel instead: cleanup off, nothing removed by it
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed", preparation_error="x")
    with pytest.raises(CommandError, match="forbidden|admin"):
        command("cancel-preparation", "--as", "nobody")
    text = command("cancel-preparation", "--as", "alice")
    assert text.startswith("cleanup off,") and ToolPayloadPolicy.load().enabled is False
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="skip")
    with pytest.raises(CommandError) as nothing_failed:  # nothing to cancel any more (r37: "Reload to see")
        command("cancel-preparation", "--as", "alice")
    assert str(nothing_failed.value).startswith("preparation_changed: ") and "Reload" not in str(nothing_failed.value)
    assert "tool_payloads status" in str(nothing_failed.value)


def test_status_with_an_unreadable_backup_folder_logs_a_warning_without_a_stack(admin_user, settings, tmp_path, caplog):
    """r37: a backup folder that cannot be read (a file where it should be) is said by the
    status, yet it was logged as an error with the exception's stack, as if Lethe had failed."""
    import logging

    (tmp_path / "backups").write_text("not a folder")
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    with caplog.at_level(logging.WARNING, logger="retention.service"):
        status = json.loads(command("status", "--json"))
    assert status["backups"] == []
    records = [r for r in caplog.records if r.name == "retention.service"]
    assert [r.levelname for r in records] == ["WARNING"] and records[0].exc_info is None
    assert "backup folder cannot be read" in records[0].getMessage()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("verb", ["retry", "run"])
def test_a_backup_interrupted_here_is_never_taken_for_the_one_asked_for(admin_user, monkeypatch, capsys, settings,
                                                                        tmp_path, verb):
    """r70: `run --here` stopped mid-backup. While that backup was open, `run` said "Retry the
    backup" (which a retry then refused as busy), and the next `run --here` did not take it
    over; `retry --here` took it for the backup asked for, ended "failed: interrupted" and made
    no backup. Now `run` is busy while a backup is open; `--here` takes the left one to its end
    first (it can only end interrupted), then `retry` makes a backup and the cleanup follows."""
    from datetime import timedelta

    from django.utils import timezone

    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    old_conversation("halted-backup", tools=2)
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="create")
    interrupted_at(monkeypatch, "tool-backup-copied", "run", "--as", "alice", "--here")
    left = ToolPayloadOperation.objects.get()
    assert (left.kind, left.state, bool(left.lease)) == ("backup", "running", True)
    with pytest.raises(CommandError, match=r"^busy: The backup is being made; the cleanup follows it once it is "
                                           r"verified\.$"):
        command("run", "--as", "alice", "--no-wait")  # its holder's lease has not run out yet
    ToolPayloadOperation.objects.filter(pk=left.pk).update(heartbeat_at=timezone.now() - timedelta(minutes=5))
    capsys.readouterr()
    if verb == "retry":
        out = command("retry", "--as", "alice", "--here")
    else:
        with pytest.raises(CommandError, match=r"^preparation_required: Cleanup waits for the backup\. Retry the "
                                               r"backup"):
            command("run", "--as", "alice", "--here")
    asked = "backup" if verb == "retry" else "cleanup run"
    assert (f"backup #{left.pk} was left open with no worker on it; continuing it here first, then the {asked} "
            "asked for.") in capsys.readouterr().err
    left.refresh_from_db()
    assert (left.state, left.error_code) == ("failed", "interrupted")
    removed = Item.objects.filter(details_removed_at__isnull=False).count()
    if verb == "run":  # nothing runs before an admin retries the backup or changes the choice
        assert ToolPayloadOperation.objects.count() == 1 and removed == 0
        assert ToolPayloadPolicy.load().preparation_state == "failed"
        return
    made = ToolPayloadOperation.objects.get(kind="backup", state="succeeded")
    assert (tmp_path / "backups" / made.backup_name).is_file() and f"backup #{made.pk}: succeeded" in out
    cleanup = ToolPayloadOperation.objects.get(kind="cleanup")
    assert cleanup.state == "succeeded" and removed == cleanup.removed_messages == 3
