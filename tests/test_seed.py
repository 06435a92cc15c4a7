from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from lifecycle import engine_folder
from lifecycle import models as m
from lifecycle.enginefs import EngineHome
from lifecycle.seeding import Seeder

pytestmark = pytest.mark.django_db
ANCHOR = date(2026, 11, 30)
ROOT = Path(__file__).resolve().parent.parent


def digest(home: EngineHome) -> str:
    h = hashlib.sha256()
    for c in m.Conversation.objects.order_by("public_id"):
        h.update(repr((c.public_id, c.scope, c.thread_id, c.title, c.created_at, c.last_activity_at,
                       c.archived_at, c.closed_at, c.account.name if c.account else c.computer.name)).encode())
    for i in m.Item.objects.order_by("conversation__public_id", "seq").select_related("conversation"):
        h.update(repr((i.conversation.public_id, i.seq, i.role, i.tool_kind, i.tool_call_id, i.status, i.title,
                       i.content, json.dumps(i.payload, sort_keys=True), i.payload_bytes, i.removable_bytes,
                       i.created_at)).encode())
    # Not the folder's mark (lifecycle.engine_folder): the test database's own, not seeded data.
    for path in sorted(p for p in home.root.rglob("*") if p.is_file() and p.name != engine_folder.MARK_NAME):
        h.update(str(path.relative_to(home.root)).encode() + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def wipe(home: EngineHome) -> None:
    for model in (m.UsageFact, m.BillingFact, m.AuditFact):
        model.objects.all().delete()
    m.Conversation.objects.all().delete()
    m.Computer.objects.all().delete()
    m.Account.objects.all().delete()
    m.EngineFolderMark.objects.all().delete()  # a new install: the folder it records goes too
    shutil.rmtree(home.root)


def seed(home: EngineHome, seed_value: int = 7, conversations: int = 12) -> str:
    Seeder(seed=seed_value, anchor=ANCHOR, messages=12, home=home).run(conversations)
    return digest(home)


def test_it_seeds_the_same_data_for_the_same_seed(tmp_path):
    home = EngineHome(tmp_path / "engine")
    first = seed(home)
    wipe(home)
    assert seed(home) == first
    wipe(home)
    assert seed(home, seed_value=8) != first


def test_it_seeds_every_kind_of_conversation_and_store(tmp_path):
    home = EngineHome(tmp_path / "engine")
    report = Seeder(seed=1, anchor=ANCHOR, messages=30, home=home).run(20)
    assert report.conversations == 20 and report.items == m.Item.objects.count()
    convs = m.Conversation.objects.all()
    assert convs.filter(scope="bound").exists() and convs.filter(scope="local").exists()
    # Two conversations under different owners share a raw thread id.
    same = [c for c in convs if convs.filter(thread_id=c.thread_id).count() == 2]
    assert len(same) == 2 and {c.scope for c in same} == {"bound", "local"}
    anchor = m.Conversation.objects.order_by("-last_activity_at").first().last_activity_at
    assert convs.filter(last_activity_at__lt=anchor - timedelta(days=92)).exists()
    assert convs.filter(archived_at__isnull=False).exists() and convs.filter(closed_at__isnull=False).exists()
    assert m.Conversation.objects.with_activity().filter(is_active=True).exists()
    kinds = set(m.Item.objects.filter(role="tool").values_list("tool_kind", flat=True))
    assert kinds == set(m.ToolKind.values)
    sizes = [i.payload_bytes for i in m.Item.objects.filter(tool_kind__in=["shell", "read_file", "http"])]
    assert min(sizes) >= 1000 and max(sizes) <= 60_000
    assert m.Item.objects.filter(removable_bytes__gt=0).exists()
    # seeded items carry what every write path stores: the figures and, where cleanup rewrites
    # in SQL, the removal plan
    from retention.reducer import item_figures

    for item in m.Item.objects.filter(role="tool"):
        expected = item_figures(item.tool_kind, item.payload)
        assert (item.payload_bytes, item.removable_bytes, item.payload_skip, item.removal_plan) == expected
    assert m.Item.objects.filter(removal_plan__isnull=False).exists()
    for model in (m.Goal, m.MailEnvelope, m.SessionDocument, m.BranchJournalEntry, m.Checkpoint, m.RecoveryMaterial,
                  m.OperationBinding, m.HistoryReceipt, m.SharedLink, m.Export, m.WorkspaceFile, m.MemoryEntry,
                  m.UsageFact, m.BillingFact, m.AuditFact, m.RuntimeClaim, m.ProcessLease):
        assert model.objects.exists(), model.__name__
    assert m.SharedLink.objects.filter(publisher_supports_revoke=False).exists()
    fleet = home.read_fleet()
    assert {r["status"] for r in fleet} >= {"running", "completed"}
    assert [r for r in fleet if r["origin"] is None]
    first = convs.first()
    assert home.events_path(first.storage_key).exists()
    assert any(home.receipts_path(c.storage_key).exists() for c in convs)
    assert any(home.artifacts_dir(c.storage_key).exists() for c in convs)
    assert home.legacy_fleet_path.exists()


def test_it_creates_the_demo_users_and_seeds_only_once(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("LETHE_DEMO_PASSWORD", "demo-pass-123")
    out = io.StringIO()
    call_command("seed_demo", "--conversations", "4", "--messages", "6", "--if-empty", stdout=out)
    assert "admin / demo-pass-123" in out.getvalue()
    users = {u.username: u for u in get_user_model().objects.all()}
    assert users["admin"].is_staff and not users["member"].is_staff
    assert users["member"].check_password("demo-pass-123")
    count = m.Item.objects.count()
    call_command("seed_demo", "--if-empty", stdout=io.StringIO())
    assert m.Item.objects.count() == count


def test_it_generates_and_remembers_a_password_when_none_is_given(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("LETHE_DEMO_PASSWORD", raising=False)
    out = io.StringIO()
    call_command("seed_demo", "--conversations", "2", "--messages", "2", stdout=out)
    password = (tmp_path / "demo-credentials.txt").read_text().split()[-1]
    assert f"admin / {password}" in out.getvalue()
    assert get_user_model().objects.get(username="admin").check_password(password)


def test_it_prints_benchmark_figures_at_small_size():
    out = io.StringIO()
    call_command("bench_seed", "--items", "400", stdout=out)
    line = out.getvalue()
    assert "items/s" in line
    assert m.Item.objects.count() == int(line.split(": ")[1].split(" items")[0])


def test_the_seed_benchmark_never_writes_into_an_engine_folder_in_use(tmp_path, settings):
    """ENGINE_HOME set in the shell reached `make bench-seed`, which rewrote that folder's files
    (the same seed as the demo: the same conversations) and its subagent state file."""
    from django.core.management.base import CommandError

    folder = tmp_path / "engine-in-use"
    (folder / "state").mkdir(parents=True)
    fleet_file = folder / "state" / "subagents.v1.json"
    fleet_file.write_text('{"rows": []}')
    settings.ENGINE_HOME = folder
    with pytest.raises(CommandError, match="empty engine folder"):
        call_command("bench_seed", "--items", "400", stdout=io.StringIO())
    assert fleet_file.read_text() == '{"rows": []}' and not m.Conversation.objects.exists()
    assert sorted(p.name for p in folder.iterdir()) == ["state"]
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    recipe = makefile.split("\nbench-seed:", 1)[1].split("\n\n", 1)[0]
    assert recipe.count("-u ENGINE_HOME") == 2  # its own folder under var/bench, whatever the shell says


def test_it_prints_page_benchmark_figures_at_small_size():
    Seeder(seed=3, anchor=ANCHOR, messages=8, home=EngineHome()).run(6)
    out = io.StringIO()
    call_command("bench_pages", "--requests", "3", stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("page benchmark")
    assert len([line for line in lines if "p95" in line]) == 7
    assert not get_user_model().objects.filter(username__startswith="bench-reader").exists()


def _seed_process(engine: str, url: str):
    env = {**os.environ, "DATABASE_URL": url, "ENGINE_HOME": engine, "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    return subprocess.Popen(
        [sys.executable, "manage.py", "seed_demo", "--conversations", "60", "--messages", "30", "--seed", "5",
         "--anchor", ANCHOR.isoformat(), "--no-users", "--if-empty"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


@pytest.mark.django_db(transaction=True)
def test_it_finishes_a_killed_seed_exactly_like_an_uninterrupted_one(tmp_path):
    from tests.test_jobs import database_url

    engine = tmp_path / "engine"
    killed = _seed_process(str(engine), database_url())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list((engine / "threads").glob("*"))) < 10:
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert m.Conversation.objects.count() == 0  # nothing half-seeded in the database

    resumed = _seed_process(str(engine), database_url())
    assert resumed.wait(120) == 0, resumed.stderr.read()
    home = EngineHome(engine)
    after_kill = digest(home)
    agent_ids = [r["agent_id"] for r in home.read_fleet()]
    assert len(agent_ids) == len(set(agent_ids))

    wipe(home)
    clean = _seed_process(str(engine), database_url())
    assert clean.wait(120) == 0, clean.stderr.read()
    assert digest(home) == after_kill
    assert m.Conversation.objects.count() == 60


def test_it_seeds_nothing_after_its_anchor(tmp_path):
    from django.utils import timezone

    now = timezone.now()
    Seeder(seed=2, anchor=now, messages=10, home=EngineHome(tmp_path / "engine")).run(12)
    assert not m.Conversation.objects.filter(last_activity_at__gt=now).exists()
    assert not m.Conversation.objects.filter(created_at__gt=now).exists()
    assert not m.Item.objects.filter(created_at__gt=now).exists()
    assert not m.Conversation.objects.filter(archived_at__gt=now).exists()
    assert not m.Conversation.objects.filter(closed_at__gt=now).exists()
    assert m.Conversation.objects.filter(last_activity_at__gt=now - timedelta(hours=3)).exists()


def test_demo_credentials_stay_true_when_the_kept_file_is_deleted(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("LETHE_DEMO_PASSWORD", raising=False)
    kept = tmp_path / "demo-credentials.txt"
    call_command("seed_demo", "--conversations", "2", "--messages", "2", "--if-empty", stdout=io.StringIO())
    first = kept.read_text().split()[-1]
    assert kept.stat().st_mode & 0o777 == 0o600
    again = io.StringIO()
    call_command("seed_demo", "--if-empty", stdout=again)
    assert f"admin / {first}" in again.getvalue() and f"member / {first}" in again.getvalue()

    kept.unlink()
    out = io.StringIO()
    call_command("seed_demo", "--if-empty", stdout=out)
    printed = out.getvalue()
    users = get_user_model().objects
    assert "Demo logins:" not in printed and "not on record" in printed
    assert not kept.exists()  # nothing stored that matches no account
    assert users.get(username="admin").check_password(first) and users.get(username="member").check_password(first)

    # An explicit password resets both, and is what gets printed.
    monkeypatch.setenv("LETHE_DEMO_PASSWORD", "chosen-pass-456")
    out = io.StringIO()
    call_command("seed_demo", "--if-empty", stdout=out)
    assert "admin / chosen-pass-456" in out.getvalue()
    assert users.get(username="admin").check_password("chosen-pass-456")


def test_it_never_prints_a_kept_password_an_account_no_longer_has(monkeypatch, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    monkeypatch.delenv("LETHE_DEMO_PASSWORD", raising=False)
    call_command("seed_demo", "--conversations", "2", "--messages", "2", "--if-empty", stdout=io.StringIO())
    kept = (tmp_path / "demo-credentials.txt").read_text().split()[-1]
    admin = get_user_model().objects.get(username="admin")
    admin.set_password("changed-by-its-owner")
    admin.save()
    out = io.StringIO()
    call_command("seed_demo", "--if-empty", stdout=out)
    printed = out.getvalue()
    assert f"member / {kept}" in printed and f"admin / {kept}" not in printed and "'admin'" in printed
    assert get_user_model().objects.get(username="admin").check_password("changed-by-its-owner")
    # A user made again (deleted meanwhile) gets the kept password, which is then printed for it.
    get_user_model().objects.filter(username="member").delete()
    out = io.StringIO()
    call_command("seed_demo", "--if-empty", stdout=out)
    assert f"member / {kept}" in out.getvalue()


@pytest.mark.parametrize("chosen", ["a", "seven77", "   ", " " * 12])
def test_a_demo_password_the_password_rules_refuse_is_refused_and_changes_nothing(monkeypatch, settings, tmp_path,
                                                                                   chosen):
    """r114: LETHE_DEMO_PASSWORD "a" or "   " became both demo users' password, though the password
    rules (AUTH_PASSWORD_VALIDATORS) ask for 8 characters; a password of blanks only is refused too."""
    from django.core.management.base import CommandError

    settings.VAR_DIR = tmp_path
    users = get_user_model().objects
    refusal = "Nothing was seeded or changed: LETHE_DEMO_PASSWORD is not a password Lethe accepts: "
    monkeypatch.setenv("LETHE_DEMO_PASSWORD", chosen)
    with pytest.raises(CommandError, match=refusal) as caught:  # a new database
        call_command("seed_demo", "--conversations", "2", "--messages", "2", "--if-empty", stdout=io.StringIO())
    assert caught.value.returncode == 2
    assert not users.exists() and not m.Conversation.objects.exists()

    monkeypatch.setenv("LETHE_DEMO_PASSWORD", "demo-pass-123")
    call_command("seed_demo", "--conversations", "2", "--messages", "2", stdout=io.StringIO())
    monkeypatch.setenv("LETHE_DEMO_PASSWORD", chosen)
    out = io.StringIO()
    with pytest.raises(CommandError, match=refusal) as caught:  # demo users already there
        call_command("seed_demo", "--if-empty", stdout=out)
    assert caught.value.returncode == 2 and out.getvalue() == ""
    assert {u.username: u.check_password("demo-pass-123") for u in users.all()} == {"admin": True, "member": True}
    assert not any(u.check_password(chosen) for u in users.all())
    # --no-users sets no password: nothing to refuse
    monkeypatch.setenv("LETHE_DEMO_PASSWORD", chosen)
    call_command("seed_demo", "--if-empty", "--no-users", stdout=io.StringIO())


def test_seed_demo_refuses_a_short_demo_password_in_one_line(tmp_path):
    from tests.migrated import migrate

    env = {**{k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "ENGINE_URL")},
           "DATABASE_URL": f"sqlite:///{tmp_path / 'lethe.sqlite3'}", "LETHE_VAR_DIR": str(tmp_path / "var"),
           "ENGINE_HOME": str(tmp_path / "engine"), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "LETHE_DEMO_PASSWORD": "a"}
    migrate(env)
    result = subprocess.run([sys.executable, "manage.py", "seed_demo", "--if-empty"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", (
        "CommandError: Nothing was seeded or changed: LETHE_DEMO_PASSWORD is not a password Lethe accepts: This "
        "password is too short. It must contain at least 8 characters. Set another one, or unset it to have one "
        "generated.\n"))


def test_make_runs_seed_on_an_install_with_accounts_of_its_own_adds_and_changes_no_user(monkeypatch, settings,
                                                                                        tmp_path):
    """r22: `seed_demo --if-empty` (what `make run` does) on a database set up with its own admin
    created the demo `admin` (an admin account with a printed password) and `member`; with
    LETHE_DEMO_PASSWORD it also reset the passwords of accounts with those names."""
    settings.VAR_DIR = tmp_path
    monkeypatch.setenv("LETHE_DEMO_PASSWORD", "chosen-pass-789")
    users = get_user_model().objects
    users.create_user("boss", password="Boss-pass-123", is_staff=True)
    # A new install before its first conversation (r24), then one with conversations
    for _ in range(2):
        out = io.StringIO()
        call_command("seed_demo", "--if-empty", stdout=out)
        assert "accounts of its own: no demo data or users were added or changed" in out.getvalue()
        assert "Demo logins" not in out.getvalue() and "chosen-pass-789" not in out.getvalue()
        assert list(users.values_list("username", flat=True)) == ["boss"]
        assert not (tmp_path / "demo-credentials.txt").exists()
        assert m.Conversation.objects.count() == (0 if _ == 0 else 2)
        if _ == 0:
            call_command("seed_demo", "--conversations", "2", "--messages", "2", "--no-users", stdout=io.StringIO())


def test_the_demo_seed_refuses_a_console_of_a_remote_engine(settings):
    """r22: with ENGINE_URL set it seeded local conversations and an engine folder on a console
    that keeps none."""
    from django.core.management.base import CommandError

    settings.ENGINE_URL, settings.ENGINE_TOKEN = "http://127.0.0.1:9/", "t" * 40
    with pytest.raises(CommandError, match="reaches a remote engine") as refused:
        call_command("seed_demo", "--conversations", "2", "--messages", "2", stdout=io.StringIO())
    assert refused.value.returncode == 2
    # make run's --if-empty says so and lets the console start (r24: make run stopped there)
    out = io.StringIO()
    call_command("seed_demo", "--if-empty", stdout=out)
    assert "reaches a remote engine" in out.getvalue()
    assert not m.Conversation.objects.exists() and not get_user_model().objects.exists()


@pytest.mark.parametrize("args", [("--conversations", "99999999999999999999"), ("--messages", "10001"),
                                  ("--conversations", "1")])
def test_the_demo_seed_refuses_counts_out_of_range_and_seeds_nothing(args):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="Seed 2 to 1,000,000 conversations"):
        call_command("seed_demo", *args, "--no-users", stdout=io.StringIO())
    assert not m.Conversation.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("if_empty", [False, True])
def test_two_seeds_started_together_seed_once_and_the_other_says_why(tmp_path, if_empty):
    """r70: both passed the check for an empty database before either committed, so both seeded
    (twice the demo data, each run saying it seeded) or one died on a duplicate id; r71: one's
    check of the new engine folder met the other's mark not yet recorded, and said the folder was
    another database's. Each pauses after that first check, so both have passed it before either
    goes on, and after marking the folder before recording the mark."""
    from tests.test_jobs import database_url

    m.EngineFolderMark.objects.all().delete()  # a new install: no folder taken yet, none there
    shutil.rmtree(tmp_path / "engine")
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(tmp_path / "engine"),
           "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    command = [sys.executable, "manage.py", "seed_demo", "--conversations", "40", "--messages", "10", "--anchor",
               ANCHOR.isoformat(), "--no-users", *(["--if-empty"] if if_empty else [])]
    # The second comes to the folder while the first, having marked it, waits to record its mark.
    runs = [subprocess.Popen([*command, "--seed", seed_value], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             env={**env, "LETHE_TEST_PAUSE_AT": f"seed.checked={wait},engine-folder.marked=4"})
            for seed_value, wait in (("7", 1), ("8", 3))]
    ended = sorted((run.wait(120), *run.communicate()) for run in runs)
    seeded = [out for code, out, _err in ended if code == 0 and out.startswith("Seeded 40 conversations")]
    assert len(seeded) == 1, ended
    if if_empty:
        assert [(code, out, err) for code, out, err in ended if out not in seeded] == [
            (0, "Demo data already present; not seeding again.\n", "")]
    else:
        assert ended[1][0] == 1 and ended[1][2].strip() == "CommandError: Conversations already exist; seed into an "\
                                                            "empty database.", ended
    assert (m.Conversation.objects.count(), m.Account.objects.count(), m.Computer.objects.count()) == (40, 2, 2)


@pytest.mark.django_db(transaction=True)
def test_a_seed_killed_between_marking_its_new_folder_and_recording_the_mark_seeds_on_the_next_run(tmp_path):
    """r73: killed there, the next run found the folder marked and unrecorded, and called it
    another database's. The folder carries this database's claim until the mark is recorded."""
    from lifecycle import engine_folder
    from tests.test_jobs import database_url

    m.EngineFolderMark.objects.all().delete()  # a new install: no folder taken yet, none there
    shutil.rmtree(tmp_path / "engine")
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(tmp_path / "engine"),
           "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    command = [sys.executable, "manage.py", "seed_demo", "--conversations", "4", "--messages", "4", "--no-users"]
    killed = subprocess.run(command, cwd=ROOT, env={**env, "LETHE_TEST_KILL_AT": "engine-folder.marked",
                                                    "LETHE_TEST_KILL_DIR": str(tmp_path)}, capture_output=True)
    assert killed.returncode == -signal.SIGKILL
    folder = tmp_path / "engine"
    assert sorted(p.name for p in folder.iterdir()) == [engine_folder.MARK_NAME, engine_folder.CLAIM_NAME]
    assert not m.EngineFolderMark.objects.exists()
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stdout.startswith("Seeded 4 conversations"), again.stderr[-2000:]
    assert m.EngineFolderMark.objects.get().folder_id == (folder / engine_folder.MARK_NAME).read_text().strip()
    assert not (folder / engine_folder.CLAIM_NAME).exists() and m.Conversation.objects.count() == 4


@pytest.fixture
def small_disk(tmp_path):
    """A real disk of its own: `small_disk(size)` mounts a tmpfs of `size` (say "6m") at
    tmp_path/small and returns it; `small_disk(size)` again gives it that size (room freed).
    Unmounted at the end; skipped where this process may not mount (not root)."""
    folder = tmp_path / "small"

    def mount(size: str) -> Path:
        options = f"size={size}" if not folder.is_mount() else f"remount,size={size}"
        folder.mkdir(exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        return folder

    yield mount
    if folder.is_mount():
        subprocess.run(["umount", str(folder)], check=True)


def _engine_files(engine: Path) -> list[str]:
    """The engine folder's files, less its mark (the database's claim on it, recorded first)."""
    return sorted(str(p.relative_to(engine)) for p in engine.rglob("*")
                  if p.is_file() and p.name != engine_folder.MARK_NAME)


def _fleet_rows(engine: Path) -> list:
    fleet = engine / "state" / "subagents.v1.json"
    return json.loads(fleet.read_text())["agents"] if fleet.exists() else []


def test_a_seed_that_fills_the_database_disk_says_so_in_one_line_and_leaves_no_users_or_engine_files(
        small_disk, tmp_path):
    """A reviewer's repro: a new SQLite database on a 6 MB disk; the seed printed the demo logins,
    then a traceback ending in "database or disk is full" (exit 1), and left the demo users and
    137 engine files of 30 conversations that did not exist (listed as files outside conversations
    once another seed ran)."""
    import sqlite3

    disk = small_disk("6m")
    database, engine = disk / "lethe.sqlite3", tmp_path / "seed-engine"
    env = {**{k: v for k, v in os.environ.items() if k != "LETHE_DEMO_PASSWORD"},
           "DATABASE_URL": f"sqlite:///{database}", "LETHE_VAR_DIR": str(disk / "var"),
           "ENGINE_HOME": str(engine), "DJANGO_SETTINGS_MODULE": "console.settings_test", "LANG": "es_ES.UTF-8"}
    manage = [sys.executable, "manage.py"]
    migrated = subprocess.run([*manage, "migrate", "-v0"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    seed_command = [*manage, "seed_demo", "--conversations", "30", "--messages", "300", "--anchor", ANCHOR.isoformat()]

    full = subprocess.run([*seed_command, "--seed", "1"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert (full.returncode, full.stdout, full.stderr.splitlines()) == (2, "", [
        f"Lethe database error: The database {database} is full: the disk it is on has no room left (database or "
        "disk is full). The step the command was taking was not written; what it finished before stays. Free space "
        "on that disk, then run it again."]), full.stderr[-3000:]
    with contextlib.closing(sqlite3.connect(database)) as db:
        counts = [db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 (fixed names)
                  for table in ("auth_user", "lifecycle_conversation", "lifecycle_item", "lifecycle_account")]
    assert counts == [0, 0, 0, 0]
    assert _engine_files(engine) == [] and _fleet_rows(engine) == []

    small_disk("64m")  # room freed: another seed seeds, and the engine folder holds its conversations' files only
    again = subprocess.run([*seed_command, "--seed", "2"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.startswith("Demo logins: admin / ") and "Seeded 30 conversations" in again.stdout
    with contextlib.closing(sqlite3.connect(database)) as db:
        keys = {row[0] for row in db.execute("SELECT public_id FROM lifecycle_conversation")}
    assert len(keys) == 30
    assert {Path(name).parts[1] for name in _engine_files(engine) if Path(name).parts[0] != "state"
            and Path(name).parts[0] != "legacy-state"} <= keys


@pytest.mark.django_db(transaction=True)
def test_a_seed_that_fills_the_engine_folder_disk_says_so_in_one_line_and_leaves_nothing_half_written(
        small_disk, tmp_path):
    """The engine folder's disk full mid-seed (ENOSPC on a file write): one line and exit 2, no
    logins printed, no users or rows, and none of the files this run wrote."""
    from tests.test_jobs import database_url

    m.EngineFolderMark.objects.all().delete()  # a new install whose engine folder is on the small disk
    engine = small_disk("256k") / "engine"
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine),
           "LETHE_VAR_DIR": str(tmp_path / "var"), "LETHE_DEMO_PASSWORD": "demo-pass-123",
           "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    command = [sys.executable, "manage.py", "seed_demo", "--conversations", "30", "--messages", "300", "--seed", "1",
               "--anchor", ANCHOR.isoformat()]
    full = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert (full.returncode, full.stdout, full.stderr.splitlines()) == (2, "", [
        f"CommandError: io_error: {engine}: No space left on device. Nothing was seeded; free space on its disk, "
        "then try again."]), full.stderr[-3000:]
    assert not get_user_model().objects.exists() and not m.Conversation.objects.exists()
    assert not m.Item.objects.exists() and not m.Account.objects.exists()
    assert _engine_files(engine) == [] and _fleet_rows(engine) == []
    assert (engine / engine_folder.MARK_NAME).exists()  # the folder stays this database's

    small_disk("16m")
    again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and "Seeded 30 conversations" in again.stdout, again.stderr[-3000:]
    assert "admin / demo-pass-123" in again.stdout
    assert m.Conversation.objects.count() == 30 and get_user_model().objects.count() == 2


def test_a_failed_seed_removes_only_the_folders_it_made(tmp_path, monkeypatch):
    """A seed that fails after writing its conversations' files removes them (no rows hold
    them), but never a folder that was there before it (a killed run's, which a rerun
    rewrites, or any other): those stay as they were."""
    import errno

    from django.db import transaction

    from lifecycle import fleet as fleet_file

    home = EngineHome(tmp_path / "engine")
    with transaction.atomic():  # the ids the seed will give its conversations (the same seed, the same ids)
        probe = Seeder(seed=3, anchor=ANCHOR, messages=6, home=home)
        keys = [c.storage_key for c in probe.conversations(2, *probe.owners())]
        transaction.set_rollback(True)
    there = home.root / "threads" / keys[0]
    there.mkdir(parents=True)
    (there / "keep.txt").write_text("not the seed's")

    def full(**kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fleet_file, "update_fleet", full)  # the disk fills as the run ends
    with pytest.raises(OSError):
        Seeder(seed=3, anchor=ANCHOR, messages=6, home=home).run(2)
    assert not m.Conversation.objects.exists()
    assert (there / "keep.txt").read_text() == "not the seed's"  # kept
    assert not any((home.root / area / keys[1]).exists() for area in ("threads", "sessions", "artifacts"))
