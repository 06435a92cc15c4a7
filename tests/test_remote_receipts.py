"""The engine's receipts of completed bound deletes, read again while the facts they keep
expire (remote.receipts), against a real engine process over HTTP."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from console.models import ApiToken
from lifecycle.registry import FINGERPRINT_DAYS
from remote import delivery, receipts
from remote.models import BoundDelete, EngineBinding
from remote.sync import refresh
from tests import factories
from tests.remote_engine import EngineProcess, running_engine, use_engine

HOST = {"HTTP_HOST": "127.0.0.1"}
THREADS = {
    "expires": {"thread_id": "t-expires"},
    "stopped": {"thread_id": "t-stopped"},
    "forged": {"thread_id": "t-forged"},
    "poisoned": {"thread_id": "t-poisoned"},
    "killed-1": {"thread_id": "t-killed-1"},
    "killed-2": {"thread_id": "t-killed-2"},
}
EXPIRE_ON_ENGINE = (
    "from datetime import timedelta; from django.utils import timezone; "
    "from lifecycle.actions.expire_facts import expire_facts; "
    "print(expire_facts(now=timezone.now() + timedelta(days=4000)))"
)


@pytest.fixture(scope="module")
def engine():
    with running_engine(THREADS, "lethe-remote-receipts-") as process:
        yield process


@pytest.fixture
def remote(settings, engine):
    return use_engine(settings, engine)


def completed(engine: EngineProcess, name: str) -> BoundDelete:
    refresh("")
    binding = EngineBinding.objects.get(engine_url="", engine_id=engine.seeded["threads"][name])
    op = delivery.request_bound_delete(binding, key=f"receipts-{name}", actor=None)
    assert delivery.deliver(op.pk, budget=60) == "completed"
    op.refresh_from_db()
    return op


def kept(op: BoundDelete) -> dict[str, tuple]:
    return {e["store"]: (e["action"], e.get("records"), bool(e.get("expired_at"))) for e in op.receipt["kept"]}


@pytest.mark.django_db(transaction=True)
def test_facts_the_engine_expired_show_as_expired_and_are_not_read_again(remote):
    op = completed(remote, "expires")
    audit_facts = kept(op)["lifecycle.AuditFact"][1]
    assert kept(op)["lifecycle.AuditFact"] == ("kept", audit_facts, False) and audit_facts >= 1  # the engine's
    days = {e["store"]: e.get("days") for e in op.receipt["kept"]}
    assert days["lifecycle.AuditFact"] == 365  # the engine's period, given on its receipt
    # The erasure check's fingerprints, a week: the first period to run out.
    assert (kept(op)["lifecycle.ErasureFingerprint"], days["lifecycle.ErasureFingerprint"]) == (("kept", 1, False), 7)
    # First read just after the first period given runs out (the engine expires hourly), not before.
    expected = op.receipt_at + timedelta(days=FINGERPRINT_DAYS) + receipts.SLACK
    assert op.receipt_next_read_at == expected and op.receipt_read_at is None
    assert receipts.read_again() == dict.fromkeys(receipts.OUTCOMES, 0)

    # Meanwhile the engine re-checked the erasure: its receipt says so; the kept facts are as they were.
    remote.manage("verify_erasure", op.engine_operation)
    assert receipts.read_again(expected)["updated"] == 1
    op.refresh_from_db()
    assert op.receipt["verification"] != {} and kept(op)["lifecycle.AuditFact"] == ("kept", audit_facts, False)
    assert (op.receipt_read_at, op.receipt_next_read_at) == (expected, expected + receipts.FIRST_WAIT)

    remote.manage("shell", "-c", EXPIRE_ON_ENGINE)  # the engine's hourly job, its periods run out
    stored_before = copy.deepcopy(op.receipt)
    again = expected + receipts.FIRST_WAIT
    assert receipts.read_again(again)["updated"] == 1
    op.refresh_from_db()
    assert kept(op)["lifecycle.AuditFact"] == ("expired", audit_facts, True)
    assert kept(op)["lifecycle.ErasureFingerprint"] == ("expired", 1, True)
    assert op.receipt["stores"] == stored_before["stores"]  # the erased figures as they were
    assert (op.receipt_read_at, op.receipt_next_read_at) == (again, None)  # nothing left to expire
    assert receipts.read_again(again + timedelta(days=3000))["updated"] == 0  # never asked again

    admin = factories.make_user(admin=True)
    client = Client(**HOST)
    client.force_login(admin)
    page = client.get(f"/engine/deletes/{op.public_id}/").content.decode()
    assert f"{audit_facts} records, removed on" in page and 'data-testid="receipt-read"' in page
    assert "Receipt as the engine reported it on" in page
    assert "1 call to the engine." in page and "so far" not in page  # not while it is over
    spanish = client.get(f"/engine/deletes/{op.public_id}/", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "Comprobante tal como lo informó el motor el" in spanish
    _token, raw = ApiToken.issue(admin)
    body = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", **HOST).get(f"/api/v1/bound-deletes/{op.public_id}").json()
    assert parse_datetime(body["receipt_read_at"]) == again
    assert {e["store"]: e["action"] for e in body["receipt"]["kept"]}["lifecycle.AuditFact"] == "expired"


@pytest.mark.django_db(transaction=True)
def test_an_engine_that_cannot_be_reached_leaves_every_receipt_due_and_unchanged(remote):
    op = completed(remote, "stopped")
    stored = copy.deepcopy(op.receipt)
    due_at = op.receipt_next_read_at
    remote.stop()
    try:
        counts = receipts.read_again(due_at)
        assert counts["unreachable"] == 1 and counts["updated"] == counts["not_taken"] == 0
        op.refresh_from_db()
        assert (op.receipt, op.receipt_read_at, op.receipt_next_read_at) == (stored, None, due_at)
    finally:
        remote.start()
    # Back: read again (its receipt as before, or changed by the engine's own jobs since its
    # restart, such as its recovery's re-check: seen once on a loaded machine).
    again = receipts.read_again(due_at)
    assert again["unchanged"] + again["updated"] == 1 and again["unreachable"] == again["not_taken"] == 0, again
    op.refresh_from_db()
    assert op.receipt_read_at == due_at


@pytest.mark.django_db(transaction=True)
def test_one_receipt_that_cannot_be_read_or_an_engine_gone_never_holds_up_the_others(remote):
    """A receipt whose operation the engine no longer knows waits longer; the receipts of an
    engine this console has no address for any more are left due; neither keeps this
    engine's other receipts from being read in the same run."""
    good = completed(remote, "poisoned")
    at = good.receipt_next_read_at
    same = {"owner_kind": "account", "owner_id": 1, "scope": "bound", "state": "completed", "receipt": good.receipt,
            "receipt_at": good.receipt_at, "acknowledged_at": at, "completed_at": good.completed_at}
    unknown = BoundDelete.objects.create(
        key="k-unknown", binding_ref="b_u", engine_id=good.engine_id, thread_id="t-u",
        engine_operation="op_" + "0" * 20, receipt_next_read_at=at - timedelta(hours=1), **same)
    BoundDelete.objects.bulk_create([
        BoundDelete(key=f"k-gone-{n}", binding_ref="b_g", engine_url="http://removed.example", engine_id="c_" + "9" * 20,
                    thread_id="t-g", engine_operation="op_" + "1" * 20, receipt_next_read_at=at - timedelta(hours=2),
                    **same)
        for n in range(receipts.BATCH + 1)])
    counts = receipts.read_again(at)
    assert (counts["unreachable"], counts["not_taken"], counts["unchanged"]) == (1, 1, 1)
    good.refresh_from_db()
    unknown.refresh_from_db()
    assert good.receipt_read_at == at
    assert unknown.receipt_read_at is None and unknown.receipt_next_read_at > at  # waits, the others went on
    assert set(BoundDelete.objects.filter(engine_url="http://removed.example").values_list(
        "receipt_next_read_at", "receipt_read_at")) == {(at - timedelta(hours=2), None)}  # left due


@pytest.mark.django_db(transaction=True)
def test_an_answer_that_is_not_this_receipt_later_on_is_not_taken(remote):
    """The stored receipt is changed here (as if the engine's had been another): the engine's
    answer then differs in its erased figures, which never change later, so it is not taken."""
    op = completed(remote, "forged")
    forged = copy.deepcopy(op.receipt)
    forged["stores"][0]["records"] += 1
    BoundDelete.objects.filter(pk=op.pk).update(receipt=forged)
    when = op.receipt_next_read_at
    assert receipts.read_again(when)["not_taken"] == 1
    op.refresh_from_db()
    assert (op.receipt, op.receipt_read_at) == (forged, None)
    # It waits as long as it has been since the delete (a week: the fingerprints' period), longer each time.
    assert timedelta(days=7) <= op.receipt_next_read_at - when <= timedelta(days=7) + 2 * receipts.SLACK


@pytest.mark.django_db
def test_a_receipt_that_keeps_nothing_that_expires_is_set_aside_without_asking_the_engine(settings):
    settings.ENGINE_URL = "http://127.0.0.1:9"  # nothing listens: asking would count as unreachable
    now = timezone.now()
    receipt = {"stores": [], "kept": [{"store": "lifecycle.AuditFact", "action": "expired", "records": 2,
                                       "expired_at": now.isoformat()},
                                      {"store": "lifecycle.UsageFact", "action": "kept", "records": 0},
                                      {"store": "lifecycle.WorkspaceFile", "action": "kept", "records": 4}]}
    assert receipts.first_read_at(receipt, now, now) is None
    op = BoundDelete.objects.create(key="k-settled", binding_ref="b_x", engine_id="c_" + "a" * 20, owner_kind="account",
                                    owner_id=1, scope="bound", thread_id="t-x", state="completed", receipt=receipt,
                                    acknowledged_at=now, completed_at=now, receipt_next_read_at=now)
    assert receipts.read_again(now + timedelta(seconds=1))["settled"] == 1
    op.refresh_from_db()
    assert (op.receipt, op.receipt_read_at, op.receipt_next_read_at) == (receipt, None, None)
    # Still keeping facts longer after its delete than any period lasts: an engine that does
    # not mark them; not asked again either.
    receipt["kept"][1]["records"] = 5
    assert receipts.first_read_at(receipt, now, now) == now + receipts.FIRST_WAIT
    long_ago = now - timedelta(days=3652)
    BoundDelete.objects.filter(pk=op.pk).update(receipt=receipt, completed_at=long_ago, receipt_next_read_at=now)
    assert receipts.read_again(now + timedelta(seconds=1))["settled"] == 1
    op.refresh_from_db()
    assert (op.receipt_read_at, op.receipt_next_read_at) == (None, None)


def test_when_a_receipt_is_read_next():
    now = timezone.now()
    done = now - timedelta(days=10)

    def receipt(*entries):
        return {"stores": [], "kept": [{"store": store, "action": "kept", "records": 1, **extra}
                                       for store, extra in entries]}

    # Each period given: just after the first one runs out, but at least monthly: an engine
    # admin may shorten a period meanwhile (the engine then removes those facts within the hour).
    given = receipt(("lifecycle.AuditFact", {"days": 365}), ("lifecycle.BillingFact", {"days": 2555}))
    assert receipts.next_read(given, done, now, last=now) == now + receipts.LONGEST_WAIT
    soon = done + timedelta(days=335)
    assert receipts.next_read(given, done, soon, last=soon) == soon + receipts.LONGEST_WAIT
    almost = done + timedelta(days=350)
    assert receipts.next_read(given, done, almost, last=almost) == done + timedelta(days=365) + receipts.SLACK
    recent = now - timedelta(days=5)
    week = receipt(("lifecycle.AuditFact", {"days": 7}))
    assert receipts.next_read(week, recent, now, last=now) == recent + timedelta(days=7) + receipts.SLACK
    # Past it and still kept (a period made longer): a wait that doubles, from a day to a month.
    later = done + timedelta(days=365) + receipts.SLACK
    assert receipts.next_read(given, done, later, last=later) == later + receipts.FIRST_WAIT
    assert receipts.next_read(given, done, later + timedelta(days=5), last=later) == later + timedelta(days=10)
    assert receipts.next_read(given, done, later + timedelta(days=90), last=later) == \
        later + timedelta(days=90) + receipts.LONGEST_WAIT
    # No period given (an engine that does not say): the same doubling wait from the last read.
    silent = receipt(("lifecycle.UsageFact", {}))
    assert receipts.next_read(silent, done, now, last=now) == now + receipts.FIRST_WAIT
    assert receipts.next_read(silent, done, now, last=now - timedelta(days=4)) == now + timedelta(days=4)
    # The sooner of the two kinds, and nothing to read for stores that do not expire.
    assert receipts.next_read(receipt(("lifecycle.UsageFact", {}), ("lifecycle.AuditFact", {"days": 365})),
                              done, now, last=now) == now + receipts.FIRST_WAIT
    assert receipts.next_read(receipt(("lifecycle.WorkspaceFile", {"days": 1})), done, now, last=now) is None


@pytest.mark.parametrize(("change", "taken"), [
    (lambda r: r["kept"][0].update(action="expired", expired_at="2036-01-01T00:00:00+00:00"), True),
    (lambda r: None, True),  # unchanged
    (lambda r: r["kept"][0].update(action="expired"), False),  # no date
    (lambda r: r["kept"][0].update(action="expired", expired_at="2036-01-01", records=0), False),  # a count changed
    (lambda r: r["kept"].pop(), False),  # an entry gone
    (lambda r: r["kept"].append({"store": "x", "action": "kept"}), False),  # an entry added
    (lambda r: r["stores"][0].update(bytes=1), False),  # the erased figures changed
    (lambda r: r.update(engine="other"), False),
    (lambda r: r.update(stores=[]), False),
    (lambda r: r.update(verification={"logical": "clean"}, physical={"state": "erased"}), True),  # moved on
])
def test_only_the_same_receipt_later_on_is_taken(change, taken):
    stored = {"engine": "sqlite", "stores": [{"store": "lifecycle.Item", "action": "erased", "records": 3, "bytes": 9}],
              "kept": [{"store": "lifecycle.AuditFact", "action": "kept", "records": 1},
                       {"store": "lifecycle.UsageFact", "action": "kept", "records": 2}]}
    answered = copy.deepcopy(stored)
    change(answered)
    assert receipts.later_receipt(stored, answered) is taken
    expired_back = copy.deepcopy(stored)
    expired_back["kept"][0].update(action="expired", expired_at="2036-01-01T00:00:00+00:00")
    assert receipts.later_receipt(expired_back, stored) is False  # expired never comes back as kept


@pytest.mark.django_db
def test_the_hourly_job_forgets_who_asked_for_a_bound_delete_after_the_audit_period(settings, admin_user):
    from remote import tasks
    from tests.test_facts_and_recovery import recorded_expiries

    settings.ENGINE_URL = "http://127.0.0.1:9"
    now = timezone.now()

    def bound(name: str, state: str, days: int) -> BoundDelete:
        done = state != "pending"
        return BoundDelete.objects.create(
            key=f"k-{name}", binding_ref="b_x", engine_id=f"c_{name:0>20}", owner_kind="account", owner_id=1,
            scope="bound", thread_id=f"t-{name}", state=state, requested_by=admin_user,
            requested_at=now - timedelta(days=days), receipt={"stores": [], "kept": []} if done else None,
            acknowledged_at=now if state == "completed" else None, completed_at=now if done else None)

    old, recent, refused = bound("1", "completed", 366), bound("2", "completed", 300), bound("3", "refused", 400)
    pending = bound("4", "pending", 400)
    assert tasks.hourly()["requesters_forgotten"] == 2
    named = dict(BoundDelete.objects.values_list("pk", "requested_by_id"))
    assert (named[old.pk], named[refused.pk]) == (None, None)
    assert named[recent.pk] == named[pending.pk] == admin_user.pk
    assert recorded_expiries() == {"remote.BoundDelete.requested_by": 2}
    assert tasks.hourly()["requesters_forgotten"] == 0


@pytest.mark.django_db(transaction=True)
def test_a_read_killed_with_sigkill_before_and_after_storing_ends_with_every_receipt_read_once(remote, tmp_path):
    """The job in its own process, SIGKILLed at each point once (a receipt read but not
    stored; one stored), then run again: every receipt ends read and stored, none left due."""
    import os
    import signal
    import subprocess
    import sys

    from tests.test_jobs import ROOT, database_url

    ops = [completed(remote, name) for name in ("killed-1", "killed-2")]
    remote.manage("shell", "-c", EXPIRE_ON_ENGINE)
    BoundDelete.objects.filter(pk__in=[op.pk for op in ops]).update(receipt_next_read_at=timezone.now())
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "DJANGO_SETTINGS_MODULE": "console.settings_test",
           "ENGINE_URL": remote.url, "ENGINE_TOKEN": remote.token,
           "LETHE_TEST_KILL_AT": "remote.receipts.read,remote.receipts.stored", "LETHE_TEST_KILL_DIR": str(kills)}
    outcomes = []
    for _ in range(5):
        run = subprocess.run([sys.executable, "manage.py", "shell", "-c",
                              "from remote.receipts import read_again; print(read_again())"],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        outcomes.append(run.returncode)
        if run.returncode == 0:
            break
        assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert outcomes == [-signal.SIGKILL, -signal.SIGKILL, 0], outcomes
    assert sorted(p.name for p in kills.iterdir()) == ["remote.receipts.read", "remote.receipts.stored"]
    for op in ops:
        op.refresh_from_db()
        assert kept(op)["lifecycle.AuditFact"][0] == "expired" and op.receipt_read_at is not None
        assert op.receipt_next_read_at is None  # nothing left to expire: not due again
    assert receipts.read_again(timezone.now() + timedelta(days=3000)) == dict.fromkeys(receipts.OUTCOMES, 0)
