"""`manage.py users`: the first admin of a new install, members, roles, passwords, and
deactivation, on the stored users (real processes for the password on standard input)."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.contrib.sessions.models import Session
from django.core.management import call_command
from django.core.management.base import CommandError

from console.models import ApiToken
from tests import factories
from tests.migrated import migrate

User = get_user_model()


def users(*args: str, password: str | bytes | None = None) -> str:
    """The command run here; `password` (text: one line, a newline added; bytes: as they are)
    on its standard input."""
    out = io.StringIO()
    stdin = sys.stdin
    if password is not None:
        raw = password if isinstance(password, bytes) else (password + "\n").encode()
        sys.stdin = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", errors="surrogateescape")
    try:
        call_command("users", *args, stdout=out)
    finally:
        sys.stdin = stdin
    return out.getvalue()


@pytest.mark.django_db
def test_a_new_install_gets_its_first_admin_and_a_member_who_can_sign_in(client):
    assert users("create", "ana", "--role", "admin", "--password-stdin", password="a long passphrase 1") == \
        "Created ana (admin).\n"
    assert users("create", "bo", "--role", "member", "--password-stdin", password="another passphrase") == \
        "Created bo (member).\n"
    ana, bo = User.objects.get(username="ana"), User.objects.get(username="bo")
    assert (ana.is_staff, ana.is_active, bo.is_staff, bo.is_active) == (True, True, False, True)
    assert ana.check_password("a long passphrase 1") and not ana.is_superuser
    assert client.login(username="bo", password="another passphrase")
    listed = users("list").splitlines()
    assert listed[0].split() == ["USERNAME", "ROLE", "STATE", "LAST", "SIGN-IN", "TOKENS"]
    assert listed[1].split()[:3] == ["ana", "admin", "active"] and listed[2].split()[:3] == ["bo", "member", "active"]


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "password", "message"), [
    (("create", "ana", "--role", "admin", "--password-stdin"), "short", "This password is too short"),
    (("create", "an a", "--role", "admin", "--password-stdin"), "a long passphrase 1", "Not a username"),
    (("create", "x" * 151, "--role", "admin", "--password-stdin"), "a long passphrase 1", "Not a username"),
    (("create", "ana\x00", "--role", "member", "--password-stdin"), "a long passphrase 1", "Not a username"),
    (("create", "ana", "--role", "member", "--password-stdin"), "", "No password on standard input."),
    # not UTF-8 (it ended in a traceback), a NUL or a tab inside (no one could sign in with it)
    (("create", "ana", "--role", "member", "--password-stdin"), b"\xff\xfeLongenough-pass-123\n",
     "not UTF-8 text; nothing was changed"),
    (("create", "ana", "--role", "member", "--password-stdin"), "Longenough-\x00pass-123", "control character"),
    (("create", "ana", "--role", "member", "--password-stdin"), "Longenough-\tpass-123", "control character"),
])
def test_bad_input_is_refused_and_makes_no_user(args, password, message):
    with pytest.raises(CommandError, match=message):
        users(*args, password=password)
    assert not User.objects.exists()


@pytest.mark.django_db
def test_a_taken_name_is_refused_and_the_user_kept_as_it_was():
    factories.make_user("ana", admin=False)
    with pytest.raises(CommandError, match="There is already a user named 'ana'."):
        users("create", "ana", "--role", "admin", "--password-stdin", password="a long passphrase 1")
    assert not User.objects.get(username="ana").is_staff


@pytest.mark.django_db
def test_the_last_active_admin_cannot_be_made_a_member_or_deactivated():
    factories.make_user("ana", admin=True)
    factories.make_user("bo", admin=False)
    for args in (("set-role", "ana", "member"), ("deactivate", "ana")):
        with pytest.raises(CommandError, match="ana is the only active admin: make another user an admin first"):
            users(*args)
    ana = User.objects.get(username="ana")
    assert (ana.is_staff, ana.is_active) == (True, True)
    assert users("set-role", "bo", "admin") == "bo is now an admin.\n"
    assert users("set-role", "ana", "member") == "ana is now a member.\n"
    assert not User.objects.get(username="ana").is_staff and User.objects.get(username="bo").is_staff
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        users("set-role", "nobody", "admin")


@pytest.mark.django_db
def test_deactivating_ends_sessions_and_tokens_at_once_and_activating_brings_them_back(client):
    factories.make_user("ana", admin=True)
    bo = factories.make_user("bo", admin=True)
    bo.set_password("bo's passphrase 1")
    bo.save()
    _token, raw = ApiToken.issue(bo, name="script")
    assert client.login(username="bo", password="bo's passphrase 1")
    assert client.get("/conversations/").status_code == 200
    assert client.get("/v1/threads", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    assert [s.get_decoded()["_auth_user_id"] for s in Session.objects.all()] == [str(bo.pk)]
    users("deactivate", "bo")
    assert not User.objects.get(username="bo").is_active
    assert not Session.objects.exists()  # bo's stored session is gone, not only refused
    assert client.get("/conversations/").status_code == 302  # signed out
    assert client.get("/v1/threads", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    assert not client.login(username="bo", password="bo's passphrase 1")
    assert "bo can sign in again." in users("activate", "bo")
    assert client.get("/v1/threads", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200
    # The session the cookie named ended with the deactivation: it does not come back (r96)
    assert client.get("/conversations/").status_code == 302
    assert client.login(username="bo", password="bo's passphrase 1")
    # Once more: said as it is (r22: "can sign in again" of a user who never stopped)
    assert "bo is active already: nothing changed." in users("activate", "bo")


@pytest.mark.django_db
def test_a_new_password_ends_the_users_sessions(client):
    factories.make_user("ana", admin=True)
    bo = factories.make_user("bo", admin=False)
    bo.set_password("old passphrase 1")
    bo.save()
    assert client.login(username="bo", password="old passphrase 1")
    assert client.get("/conversations/").status_code == 200
    assert users("set-password", "bo", "--password-stdin", password="new passphrase 2").startswith("New password set")
    assert client.get("/conversations/").status_code == 302
    assert client.login(username="bo", password="new passphrase 2")


def test_without_a_terminal_or_stdin_flag_it_asks_for_the_flag_and_changes_nothing(tmp_path):
    """A real process whose standard input is not a terminal: no prompt that waits for ever."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "engine"), DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    migrate(env)
    asked = subprocess.run([sys.executable, "manage.py", "users", "create", "ana", "--role", "admin"], cwd=root, env=env,
                           input="a long passphrase 1\n", capture_output=True, text=True, timeout=120)
    assert asked.returncode == 1 and "give the password with --password-stdin" in asked.stderr
    made = subprocess.run([sys.executable, "manage.py", "users", "create", "ana", "--role", "admin", "--password-stdin"],
                          cwd=root, env=env, input="a long passphrase 1\n", capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and made.stdout == "Created ana (admin).\n"
    listed = subprocess.run([sys.executable, "manage.py", "users", "list"], cwd=root, env=env, capture_output=True,
                            text=True, timeout=120)
    assert listed.stdout.splitlines()[1].split()[:3] == ["ana", "admin", "active"]


def test_end_of_input_at_the_password_prompt_is_one_line_and_changes_nothing(tmp_path):
    """Ctrl-D at "Password:" on a real terminal (a pseudo-terminal here): one line, exit 1, no
    user (r98: a traceback ending in EOFError)."""
    import os
    import pty
    import select
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(DJANGO_SETTINGS_MODULE="console.settings_test", LETHE_VAR_DIR=str(tmp_path / "var"),
               ENGINE_HOME=str(tmp_path / "engine"), DATABASE_URL=f"sqlite:///{tmp_path}/db.sqlite3")
    migrate(env)
    main, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "manage.py", "users", "create", "dave", "--role", "member"],
                               cwd=root, env=env, stdin=terminal, stdout=terminal, stderr=terminal,
                               start_new_session=True)
    os.close(terminal)
    said, deadline = b"", time.monotonic() + 60
    try:
        while b"Password: " not in said and time.monotonic() < deadline:
            if select.select([main], [], [], 0.5)[0]:
                said += os.read(main, 4096)
        os.write(main, b"\x04")  # Ctrl-D: end of input
        process.wait(timeout=60)
        while select.select([main], [], [], 0.2)[0]:
            try:
                said += os.read(main, 4096)
            except OSError:  # the terminal closed with the process
                break
    finally:
        os.close(main)
    assert process.returncode == 1
    text = said.decode()
    assert "No password was given (end of input); nothing was changed." in text and "Traceback" not in text
    listed = subprocess.run([sys.executable, "manage.py", "users", "list"], cwd=root, env=env, capture_output=True,
                            text=True, timeout=120)
    assert "dave" not in listed.stdout


@pytest.mark.django_db
def test_a_password_line_ending_in_crlf_is_the_password_without_it(client):
    """A password file written on Windows ends its line in CR LF: the CR was kept, and the
    password typed at sign-in never matched."""
    users("create", "ana", "--role", "admin", "--password-stdin", password=b"Longenough-pass-123\r\n")
    assert client.login(username="ana", password="Longenough-pass-123")
    users("set-password", "ana", "--password-stdin", password=b"Another-pass-456\r\n")
    assert client.login(username="ana", password="Another-pass-456")



# Names in the form the sign-in form reads them (r123) ----------------------------------------

def signs_in(username: str, password: str) -> bool:
    """A sign-in on the sign-in page, as a browser sends it (its form normalises the name)."""
    from django.test import Client

    answer = Client().post("/accounts/login/", {"username": username, "password": password},
                           HTTP_HOST="127.0.0.1")
    return answer.status_code == 302


@pytest.mark.django_db
def test_a_name_is_stored_in_the_form_the_sign_in_page_reads_and_signs_in():
    """ｆｕｌｌ was stored full-width and could never sign in (the sign-in form reads NFKC "full");
    a name with its accents typed as combining marks was refused while the composed one passed."""
    said = users("create", "ｆｕｌｌ", "--role", "member", "--password-stdin", password="a long passphrase 1")
    assert said == "Created full (member); typed as 'ｆｕｌｌ', it is kept in the form the sign-in page reads.\n"
    assert list(User.objects.values_list("username", flat=True)) == ["full"]
    assert signs_in("ｆｕｌｌ", "a long passphrase 1") and signs_in("full", "a long passphrase 1")
    users("create", "Je\u0301ro\u0302me", "--role", "admin", "--password-stdin", password="a long passphrase 2")
    assert User.objects.filter(username="J\u00e9r\u00f4me", is_staff=True).exists()
    assert signs_in("J\u00e9r\u00f4me", "a long passphrase 2") and signs_in("Je\u0301ro\u0302me", "a long passphrase 2")
    assert User.objects.count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize(("typed", "message"), [
    ("full", "There is already a user named 'full'."),
    ("ｆｕｌｌ", "There is already a user named 'full'."),
    ("FULL", "There is already a user named 'full', the same name but for case"),
    ("Ｆｕｌｌ", "There is already a user named 'full', the same name but for case"),
    ("J\u00c9R\u00d4ME", "There is already a user named 'J\u00e9r\u00f4me', the same name but for case"),
    ("JE\u0301RO\u0302ME", "There is already a user named 'J\u00e9r\u00f4me', the same name but for case"),
    ("J\u00e9r\u00f4me", "There is already a user named 'J\u00e9r\u00f4me'."),
])
def test_a_name_taken_but_for_case_width_or_composition_is_refused(typed, message):
    full = factories.make_user("full", admin=True)
    factories.make_user("J\u00e9r\u00f4me", admin=False)
    with pytest.raises(CommandError, match=re.escape(message)):
        users("create", typed, "--role", "member", "--password-stdin", password="a long passphrase 1")
    assert sorted(User.objects.values_list("username", flat=True)) == ["J\u00e9r\u00f4me", "full"]
    assert User.objects.get(pk=full.pk).is_staff


@pytest.mark.django_db
def test_every_command_finds_a_user_by_the_name_as_typed_in_any_form():
    ana = factories.make_user("ana", admin=True)
    jerome = factories.make_user("J\u00e9r\u00f4me", admin=False)
    assert users("set-role", "Je\u0301ro\u0302me", "admin") == "J\u00e9r\u00f4me is now an admin.\n"
    assert User.objects.get(pk=jerome.pk).is_staff
    assert users("set-role", "ａｎａ", "member") == "ana is now a member.\n"
    assert not User.objects.get(pk=ana.pk).is_staff
    users("set-password", "Je\u0301ro\u0302me", "--password-stdin", password="a new passphrase 3")
    assert signs_in("J\u00e9r\u00f4me", "a new passphrase 3")
    assert users("deactivate", "ａｎａ").startswith("ana is deactivated")
    assert not User.objects.get(pk=ana.pk).is_active
    assert users("activate", "ａｎａ") == "ana can sign in again.\n" and User.objects.get(pk=ana.pk).is_active
    raw = io.StringIO()
    call_command("api_tokens", "create", "Je\u0301ro\u0302me", "--name", "script", stdout=raw)
    assert ApiToken.objects.get().user_id == jerome.pk
    listed = io.StringIO()
    call_command("api_tokens", "list", "--user", "Je\u0301ro\u0302me", stdout=listed)
    assert "script" in listed.getvalue()


@pytest.mark.django_db
def test_a_name_stored_as_typed_before_is_still_found_and_still_taken():
    """A user made full-width before names were normalised (they cannot sign in) can still be
    deactivated by that name, and the name it would sign in as is not given to someone else."""
    old = User.objects.create(username="ｆｕｌｌ", is_staff=True, is_active=True)
    factories.make_user("admin", admin=True)
    assert users("deactivate", "ｆｕｌｌ").startswith("ｆｕｌｌ is deactivated")
    assert not User.objects.get(pk=old.pk).is_active
    with pytest.raises(CommandError, match="There is already a user named 'ｆｕｌｌ', the same name but for case"):
        users("create", "full", "--role", "member", "--password-stdin", password="a long passphrase 1")
    assert User.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_two_creates_at_once_of_names_differing_only_by_case_make_one_user(tmp_path):
    """Two `users create` at once, `ana` and `Ana`: each checked the names before the other
    saved, and on PostgreSQL both were made (the rows locked were the users already there; a name
    not yet saved has none). Here both processes are held at their transaction until each waits
    on the database (the users' rows held, or SQLite's write lock), then let go together: one is
    made, the other refused, and one user stands."""
    import os
    import time
    from pathlib import Path

    from django.db import connection

    from tests.test_jobs import database_url

    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test", "LETHE_VAR_DIR": str(tmp_path / "var"),
           "ENGINE_HOME": str(tmp_path / "engine"), "DATABASE_URL": database_url()}
    there = factories.make_user("there", admin=True)
    postgres = connection.vendor == "postgresql"
    if postgres:
        import psycopg

        s = connection.settings_dict
        holder = psycopg.connect(dbname=s["NAME"], user=s["USER"] or None, host=s["HOST"] or None,
                                 port=s["PORT"] or None, password=s["PASSWORD"] or None)
        holder.execute("SELECT id FROM auth_user WHERE id = %s FOR UPDATE", [there.pk])
    else:
        import sqlite3

        holder = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None, timeout=20)
        holder.execute("BEGIN IMMEDIATE")
    runs = [subprocess.Popen([sys.executable, "manage.py", "users", "create", name, "--role", "member",
                              "--password-stdin"], cwd=root, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for name in ("ana", "Ana")]
    try:
        for run in runs:
            run.stdin.write("a long passphrase 1\n")
            run.stdin.close()
        deadline = time.monotonic() + 90
        if postgres:  # until both wait on a lock (a row's, or the create lock)
            while time.monotonic() < deadline:
                holder.execute("SELECT pg_stat_clear_snapshot()")  # (read once a transaction, else)
                waiting = holder.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
                    [connection.settings_dict["NAME"]]).fetchone()[0]
                if waiting == 2 or any(run.poll() is not None for run in runs):
                    break
                time.sleep(0.1)
        else:  # SQLite says nothing of who waits: long enough for both to reach their transaction
            time.sleep(8)
        assert all(run.poll() is None for run in runs), [run.communicate() for run in runs]
    finally:
        holder.rollback() if postgres else holder.execute("ROLLBACK")
        holder.close()
    results = sorted((run.wait(120), run.stdout.read(), run.stderr.read()) for run in runs)
    assert [code for code, _out, _err in results] == [0, 1], results
    assert re.fullmatch(r"Created (ana|Ana) \(member\)\.\n", results[0][1])
    assert "the same name but for case or the width of its characters; nothing was changed" in results[1][2]
    assert sorted(User.objects.values_list("username", flat=True)) in (["Ana", "there"], ["ana", "there"])


@pytest.mark.django_db
def test_names_stored_before_they_were_normalised_are_brought_to_the_sign_in_form_unless_taken():
    """Users made before names were normalised (a full-width name, accents as combining marks)
    could never sign in. console 0005 stores their names in the form the sign-in page reads;
    one whose normal form is another user's name (but for case) keeps its own."""
    from tests.migrated import run_data_migration

    wide = User.objects.create(username="ｆｕｌｌ", is_active=True)
    wide.set_password("a long passphrase 1")
    wide.save()
    combining = factories.make_user("Je\u0301ro\u0302me", password="a long passphrase 2")
    User.objects.filter(pk=combining.pk).update(username="Je\u0301ro\u0302me")  # as stored then
    twin = User.objects.create(username="ａｎａ", is_active=True)
    ana = factories.make_user("Ana")
    plain = factories.make_user("bo")
    # nine characters whose normal form is 162 (U+FDFA is 18): more than a name may be (r130: a
    # DataError on PostgreSQL, and the whole migration undone)
    long = User.objects.create(username="\ufdfa" * 9, is_active=True)
    assert not signs_in("ｆｕｌｌ", "a long passphrase 1")
    run_data_migration("console", "0005_usernames_in_sign_in_form", "normal_form")
    stored = dict(User.objects.values_list("pk", "username"))
    assert stored == {wide.pk: "full", combining.pk: "J\u00e9r\u00f4me", twin.pk: "ａｎａ", ana.pk: "Ana",
                      plain.pk: "bo", long.pk: "\ufdfa" * 9}
    assert signs_in("ｆｕｌｌ", "a long passphrase 1") and signs_in("full", "a long passphrase 1")
    assert signs_in("J\u00e9r\u00f4me", "a long passphrase 2")
