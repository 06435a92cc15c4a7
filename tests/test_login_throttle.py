from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from console.models import ApiToken, Throttle
from lifecycle.models import AuditFact

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
POLICY = {"free_failures": 2, "delay_seconds": 1, "max_delay_seconds": 60, "user_lock_after": 4,
          "address_lock_after": 6, "lock_seconds": 900, "window_seconds": 900}
WRONG = "That username and password do not match"
THROTTLED = "Too many failed sign-in attempts"


@pytest.fixture(autouse=True)
def policy(settings):
    settings.LOGIN_THROTTLE = POLICY


def sign_in(username: str, password: str, address: str = "10.0.0.1", **extra):
    client = Client(REMOTE_ADDR=address)
    response = client.post("/accounts/login/", {"username": username, "password": password}, **HOST, **extra)
    return client, response


def expire_waits(**filters) -> None:
    """What waiting does: every short delay (not a lock) is over."""
    Throttle.objects.filter(locked=False, **filters).update(blocked_until=timezone.now() - timedelta(seconds=1))


def test_it_slows_down_then_locks_a_username_with_the_same_answer_for_unknown_users(admin_user):
    for username in ("alice", "nobody-by-this-name"):
        answers = []
        for attempt in range(6):
            _client, response = sign_in(username, "wrong", address=f"10.1.{attempt}.{len(username)}")
            answers.append((response.status_code, THROTTLED in response.content.decode()))
            expire_waits(key__startswith="login-user:")
        # Two free failures, two slowed ones, then the fourth failure locks the name.
        assert answers == [(200, False), (200, False), (200, False), (200, False), (429, True), (429, True)]
    # The lock refuses even the right password, and says the same thing for both names.
    _client, locked = sign_in("alice", "pw-for-tests", address="10.9.9.9")
    _client, unknown = sign_in("nobody-by-this-name", "pw-for-tests", address="10.9.9.8")
    assert locked.status_code == unknown.status_code == 429
    assert "15 minutes" in locked.content.decode() and "15 minutes" in unknown.content.decode()
    assert "_auth_user_id" not in _client.session


def test_a_slowed_down_attempt_is_refused_before_the_password_is_checked(admin_user):
    for _ in range(3):
        sign_in("alice", "wrong", address="10.2.0.1")
    client, response = sign_in("alice", "pw-for-tests", address="10.2.0.2")
    assert response.status_code == 429 and "1 second" in response.content.decode()
    assert client.get("/conversations/", **HOST).status_code == 302  # not signed in
    expire_waits()
    client, response = sign_in("alice", "pw-for-tests", address="10.2.0.2")
    assert response.status_code == 302 and client.get("/conversations/", **HOST).status_code == 200
    # Success clears the username's count, never the address's.
    assert not Throttle.objects.filter(key__startswith="login-user:").exists()
    assert Throttle.objects.get(key="login-addr:10.2.0.1").failures == 3


def test_it_locks_an_address_that_tries_many_usernames(admin_user):
    for n in range(6):
        sign_in(f"guess{n}", "wrong", address="10.3.0.1")
        expire_waits(key="login-addr:10.3.0.1")
    _client, response = sign_in("alice", "pw-for-tests", address="10.3.0.1")
    assert response.status_code == 429
    _client, elsewhere = sign_in("alice", "pw-for-tests", address="10.3.0.2")
    assert elsewhere.status_code == 302


def test_each_failure_and_each_lock_is_an_audit_fact_without_the_password(admin_user):
    for _ in range(4):
        sign_in("alice", "s3cret-guess", address="10.4.0.1")
        expire_waits()
    sign_in("ghost", "another-guess", address="10.4.0.2")
    facts = list(AuditFact.objects.order_by("pk"))
    assert [f.action for f in facts] == ["login_failed"] * 4 + ["login_locked", "login_failed"]
    assert facts[0].actor == admin_user and facts[0].new_value == {"address": "10.4.0.1", "account": "alice"}
    assert facts[4].new_value["scope"] == "login-user" and facts[4].new_value["seconds"] == 900
    assert facts[5].actor is None and facts[5].new_value == {"address": "10.4.0.2", "account": None}
    stored = " ".join(str(f.new_value) + str(f.old_value) for f in facts)
    assert "guess" not in stored and "ghost" not in stored


def test_the_throttled_message_is_localized(admin_user):
    for _ in range(4):
        sign_in("alice", "wrong", address="10.5.0.1")
        expire_waits()
    _client, response = sign_in("alice", "wrong", address="10.5.0.1", HTTP_ACCEPT_LANGUAGE="es")
    page = response.content.decode()
    assert response.status_code == 429 and THROTTLED not in page and "15 minutos" in page


def test_failures_older_than_the_window_are_forgotten(admin_user):
    for _ in range(3):
        sign_in("alice", "wrong", address="10.6.0.1")
        expire_waits()
    Throttle.objects.update(first_failure_at=timezone.now() - timedelta(seconds=901))
    sign_in("alice", "wrong", address="10.6.0.1")
    assert Throttle.objects.get(key="login-addr:10.6.0.1").failures == 1


def test_a_quiet_install_forgets_an_address_within_the_hour_after_its_window(admin_user):
    """r103: the keys were forgotten only when a later failure came: after one wrong password
    and a correct sign-in, the addresses stayed for good, past the failure's own audit fact.
    The hourly expiry job forgets them once their window and lock are over."""
    from lifecycle.tasks import expire_facts

    sign_in("alice", "wrong", address="10.6.1.1")
    sign_in(admin_user.username, "pw-for-tests", address="10.6.1.2")
    assert set(Throttle.objects.values_list("key", flat=True)) >= {"login-addr:10.6.1.1", "login-addr:10.6.1.2"}
    assert "console.throttle" not in expire_facts()  # within the window: kept
    assert Throttle.objects.filter(key="login-addr:10.6.1.1").exists()
    Throttle.objects.update(updated_at=timezone.now() - timedelta(seconds=900 + 61))
    assert expire_facts()["console.throttle"] >= 2
    assert not Throttle.objects.exists()


def test_it_reads_the_client_address_through_trusted_proxies_only(settings, admin_user):
    for n in range(6):
        sign_in(f"g{n}", "wrong", address="127.0.0.1", HTTP_X_FORWARDED_FOR=f"203.0.113.{n}")
    assert Throttle.objects.filter(key="login-addr:127.0.0.1").exists()  # the header is ignored by default
    settings.TRUSTED_PROXIES = 1
    sign_in("g9", "wrong", address="127.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.7, 203.0.113.9")
    assert Throttle.objects.filter(key="login-addr:203.0.113.9").exists()
    sign_in("g9", "wrong", address="2001:db8::1")
    assert Throttle.objects.filter(key="login-addr:2001:db8::/64").exists()


def _bad_token(results: list, address: str) -> None:
    response = Client(HTTP_AUTHORIZATION="Bearer lethe_wrong", REMOTE_ADDR=address).get("/v1/threads", **HOST)
    results.append(response.status_code)


def test_bad_api_tokens_are_throttled_per_address_and_audited(admin_user):
    statuses = []
    for _ in range(6):
        _bad_token(statuses, "10.7.0.1")
        expire_waits()
    assert statuses == [401] * 6
    locked = Client(HTTP_AUTHORIZATION="Bearer lethe_wrong", REMOTE_ADDR="10.7.0.1").get("/v1/threads", **HOST)
    assert locked.status_code == 429 and locked.json()["code"] == "too_many_attempts"
    assert int(locked["Retry-After"]) > 800
    # The lock is checked before any token: even a good one waits at that address.
    _token, raw = ApiToken.issue(admin_user, name="script")
    good = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", REMOTE_ADDR="10.7.0.1").get("/v1/threads", **HOST)
    assert good.status_code == 429
    assert Client(HTTP_AUTHORIZATION=f"bearer {raw}", REMOTE_ADDR="10.7.0.2").get("/v1/threads", **HOST).status_code == 200
    actions = list(AuditFact.objects.values_list("action", flat=True))
    assert actions == ["api_token_failed"] * 6 + ["api_token_locked"]
    assert AuditFact.objects.first().new_value == {"address": "10.7.0.1", "account": None, "reason": "unknown"}
    # The address's sign-in count is separate.
    assert not Throttle.objects.filter(key__startswith="login-").exists()


def sign_in_at_once(count: int, attempt) -> list[int]:
    """`count` sign-ins from as many threads, released together; attempt(n) -> (address,
    username, password). The answers' status codes."""
    start = threading.Barrier(count)
    answers = []

    def post(n: int) -> None:
        address, username, password = attempt(n)
        try:
            client = Client(REMOTE_ADDR=address)
            start.wait(10)
            response = client.post("/accounts/login/", {"username": username, "password": password}, **HOST)
            answers.append(response.status_code)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return answers


@pytest.mark.django_db(transaction=True)
def test_concurrent_failures_from_several_threads_are_all_counted(settings, admin_user):
    settings.LOGIN_THROTTLE = {**POLICY, "free_failures": 20, "address_lock_after": 50}
    failures = sign_in_at_once(5, lambda n: ("10.8.0.1", f"t{n}", "x"))
    assert sorted(failures) == [200] * 5
    assert Throttle.objects.get(key="login-addr:10.8.0.1").failures == 5
    assert AuditFact.objects.filter(action="login_failed").count() == 5


def test_an_empty_password_clears_nothing(admin_user):
    """A post with no password checks nothing, so it is no success: the username's count
    stays, and guesses between such posts still lock the name."""
    for n in range(8):
        _client, response = sign_in("alice", f"wrong{n}", address=f"10.10.{n}.1")
        expire_waits()
        if n % 2:
            _client, blank = sign_in("alice", "", address=f"10.10.{n}.2")
            assert blank.status_code in (200, 429) and "_auth_user_id" not in _client.session
    row = Throttle.objects.get(key__startswith="login-user:")
    assert row.locked and row.failures >= 4
    _client, right = sign_in("alice", "pw-for-tests", address="10.10.99.1")
    assert right.status_code == 429


def test_an_ipv4_address_written_as_ipv6_is_that_address(admin_user):
    """A dual-stack socket gives IPv4 clients as ::ffff:a.b.c.d: each is its own address, not
    one /64 shared by every IPv4 client."""
    for n in range(6):
        sign_in(f"guess{n}", "wrong", address="::ffff:10.11.0.1")
        expire_waits(key="login-addr:10.11.0.1")
    assert Throttle.objects.get(key="login-addr:10.11.0.1").locked
    assert not Throttle.objects.filter(key__startswith="login-addr:::").exists()
    _client, locked = sign_in("alice", "pw-for-tests", address="::ffff:10.11.0.1")
    _client, elsewhere = sign_in("alice", "pw-for-tests", address="::ffff:10.11.0.2")
    assert (locked.status_code, elsewhere.status_code) == (429, 302)


class SlowBackend:
    """The model backend after a pause, as a real password hash takes (about 0.3 s)."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        import time

        from django.contrib.auth.backends import ModelBackend

        time.sleep(0.3)
        return ModelBackend().authenticate(request, username=username, password=password, **kwargs)

    def get_user(self, user_id):
        from django.contrib.auth.backends import ModelBackend

        return ModelBackend().get_user(user_id)


@pytest.mark.django_db(transaction=True)
def test_attempts_at_the_same_moment_are_checked_one_after_the_other(settings, admin_user):
    """While the password hashes run, simultaneous guesses cannot all pass the same check:
    each is counted before its password is checked, so exactly as many are checked as one
    after the other (two free failures and the third, which starts the wait)."""
    settings.AUTHENTICATION_BACKENDS = ["tests.test_login_throttle.SlowBackend"]
    answers = sign_in_at_once(6, lambda n: (f"10.12.0.{n}", "alice", f"guess{n}"))
    assert sorted(answers) == [200, 200, 200, 429, 429, 429]
    assert Throttle.objects.get(key__startswith="login-user:").failures == 3
    assert AuditFact.objects.filter(action="login_failed").count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_correct_sign_in_takes_its_own_count_back(settings, admin_user):
    """Counted before its password was checked, a correct sign-in leaves the address's count
    as it found it (and the username's cleared), even when it came right at the wait."""
    for _ in range(2):
        sign_in("alice", "wrong", address="10.13.0.1")
    client, response = sign_in("alice", "pw-for-tests", address="10.13.0.1")
    assert response.status_code == 302
    row = Throttle.objects.get(key="login-addr:10.13.0.1")
    assert (row.failures, row.blocked_until) == (2, None)
    assert not Throttle.objects.filter(key__startswith="login-user:").exists()
    assert AuditFact.objects.filter(action="login_failed").count() == 2


def test_a_bad_token_is_counted_and_audited_together_or_not_at_all(monkeypatch, admin_user):
    from lifecycle import audit

    def broken(*args, **kwargs):
        raise RuntimeError("the audit could not be written")

    monkeypatch.setattr(audit, "record", broken)
    with pytest.raises(RuntimeError):
        Client(HTTP_AUTHORIZATION="Bearer lethe_wrong", REMOTE_ADDR="10.7.1.1").get("/v1/threads", **HOST)
    assert not Throttle.objects.filter(key="token-addr:10.7.1.1").exists()
    assert not AuditFact.objects.exists()
    monkeypatch.undo()
    _bad_token([], "10.7.1.1")
    assert Throttle.objects.get(key="token-addr:10.7.1.1").failures == 1
    assert list(AuditFact.objects.values_list("action", flat=True)) == ["api_token_failed"]


def test_the_hourly_expiry_removes_the_sessions_past_their_expiry_and_keeps_the_others(admin_user):
    """r142: nothing removed expired sessions (Django leaves it to the application): a year on,
    every sign-in's row was still there, naming its user."""
    from django.contrib.sessions.models import Session

    from lifecycle.tasks import expire_facts

    for n in range(3):
        assert sign_in(admin_user.username, "pw-for-tests", address=f"10.7.0.{n}")[1].status_code == 302
    live = Client()
    live.force_login(admin_user)
    assert Session.objects.count() == 4
    current = live.session.session_key
    Session.objects.exclude(session_key=current).update(expire_date=timezone.now() - timedelta(seconds=1))
    assert expire_facts()["sessions"] == 3
    assert list(Session.objects.values_list("session_key", flat=True)) == [current]
    assert live.get("/conversations/", HTTP_HOST="127.0.0.1").status_code == 200  # still signed in
    assert "sessions" not in expire_facts()
