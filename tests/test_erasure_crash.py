"""Crash safety: an erasure killed at any step resumes where it stopped, with an exact receipt."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest
from django.db import connection

from lifecycle import faults, fleet
from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.deletion import executor, stores, verify
from lifecycle.deletion.plan import step_keys, stores_by_key
from lifecycle.enginefs import EngineHome
from tests import factories
from tests.test_jobs import ROOT, database_url

# the steps, a folder half removed (lifecycle.enginefs.REMOVAL_KILL_POINT), completion, checkpoint
KILL_POINTS = [*step_keys(), "engine-folder-removal", "complete", "checkpoint"]


class Crash(BaseException):
    """A crash at a kill point; it passes every `except Exception` as a real kill would."""


def expected_receipt(conversation: m.Conversation) -> dict[str, tuple[int, int]]:
    home = EngineHome()
    return {key: (f.records, f.bytes) for key, s in stores_by_key().items()
            for f in [stores.measure(s, conversation, home)]}


def receipt_figures(op: m.DeleteOperation) -> dict[str, tuple[int, int]]:
    return {e["store"]: (e["records"], e["bytes"]) for e in op.receipt["stores"]}


def stop_group(process: subprocess.Popen, grace: float = 30) -> None:
    """SIGINT to the whole group, then SIGKILL to whatever of it is left, so no sentinel
    outlives the test."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        process.poll()
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def assert_erased(target: m.Conversation, twin: m.Conversation) -> None:
    home = EngineHome()
    assert verify.logical_findings(target, home) == []
    assert m.Item.objects.filter(conversation=twin).count() == 2
    assert all(p.exists() for p in home.conversation_paths(twin.storage_key))
    assert fleet.children(fleet.read_rows(home.fleet_path), twin)


@pytest.mark.django_db
@pytest.mark.parametrize("point", KILL_POINTS)
def test_it_resumes_after_a_crash_at_every_step_with_an_exact_receipt(point, monkeypatch):
    target = factories.make_conversation(title="Crash here")
    factories.fill_every_store(target)
    twin = factories.make_conversation(factories.make_computer(), thread_id=target.thread_id)
    factories.fill_every_store(twin)
    expected = expected_receipt(target)
    op = factories.erasure_stopped_in(target, point, key="crash", monkeypatch=monkeypatch)
    # Whatever happened before the crash stays done; the operation is still an intent.
    target.refresh_from_db()
    assert target.state in ("pending_delete", "deleted")
    if point != "checkpoint":
        assert op.state == "pending" and target.state == "pending_delete"
    if point in step_keys():
        # The operation names the step it died in (committed before the step's own transaction,
        # which the crash rolled back), as its page and the API show it.
        assert op.step == point
    # A killed worker leaves its lease behind: held by a process that no longer exists.
    m.DeleteOperation.objects.filter(pk=op.pk).update(lease_holder=f"{executor.holder_id().rsplit(':', 1)[0]}:999999999")
    monkeypatch.setattr(faults, "kill_point", lambda name: None)
    assert executor.run_erasure(op.pk) == "completed"
    op.refresh_from_db()
    assert receipt_figures(op) == expected
    # Killed after completing, only the checkpoint was left: the recovery job retries that alone.
    assert op.attempts == (1 if point == "checkpoint" else 2)
    assert_erased(target, twin)
    assert m.AuditFact.objects.filter(action="conversation.deleted").count() == 1


@pytest.mark.django_db
def test_it_leaves_a_live_lease_alone_and_stops_looping_on_a_step_without_progress(monkeypatch):
    target = factories.make_conversation()
    factories.fill_every_store(target)
    op = request_deletion(target, key="loop", acting_user=None)
    m.DeleteOperation.objects.filter(pk=op.pk).update(lease_holder=executor.holder_id(),
                                                      lease_expires_at=m.timezone.now() + m.timezone.timedelta(seconds=60))
    assert executor.run_erasure(op.pk) == "busy"  # held by a live worker (this very process)
    m.DeleteOperation.objects.filter(pk=op.pk).update(lease_holder="", lease_expires_at=None)

    def always(name: str) -> None:
        raise Crash(name)

    monkeypatch.setattr(faults, "kill_point", always)
    for _ in range(executor.MAX_STALLED):
        with pytest.raises(Crash):
            executor.run_erasure(op.pk)
        m.DeleteOperation.objects.filter(pk=op.pk).update(next_attempt_at=None)
    assert executor.run_erasure(op.pk) == "busy"
    op.refresh_from_db()
    # killed each time: no error recorded, and stalled for an admin's retry
    assert (op.state, op.last_error, op.attempts) == ("pending", "", executor.MAX_STALLED)
    assert executor.stalled(op) and op.pk not in executor.outstanding()
    # An admin's retry runs it again (and here, without the fault, to the end).
    monkeypatch.setattr(faults, "kill_point", lambda name: None)
    executor.retry(op.pk)
    assert executor.run_erasure(op.pk) == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_with_sigkill_at_every_step_finishes_on_a_real_cluster(engine_home, tmp_path):
    target = factories.make_conversation(title="Kill the worker")
    factories.fill_every_store(target)
    twin = factories.make_conversation(factories.make_computer(), thread_id=target.thread_id)
    factories.fill_every_store(twin)
    expected = expected_receipt(target)
    op = request_deletion(target, key="sigkill", acting_user=None)
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1",
           "LETHE_TEST_KILL_AT": "*", "LETHE_TEST_KILL_DIR": str(kills)}
    # Its own process group: the cluster's sentinel, pusher, monitor and workers all stop with it.
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            op.refresh_from_db()
            if op.state == "completed" and op.physical_state == ("erased" if connection.vendor == "sqlite" else "pending") \
                    and (kills / "checkpoint").exists():
                break
            time.sleep(0.5)
    finally:
        stop_group(cluster)
    killed_at = sorted(p.name for p in kills.iterdir())
    assert killed_at == sorted(KILL_POINTS)  # the worker really died at every point
    op.refresh_from_db()
    assert op.state == "completed"
    assert op.attempts == len(KILL_POINTS)  # one run per kill: each resumed past the last one
    assert receipt_figures(op) == expected
    assert_erased(target, twin)
    report = verify.verify(op, physical=True)
    assert report.logical == [] and report.physical_findings == []
    if connection.vendor == "sqlite":
        assert report.physical == "clean"


def test_the_kill_hook_is_inert_without_its_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("LETHE_TEST_KILL_AT", raising=False)
    faults.kill_point("lifecycle.Item")  # returns: this process is still here
    monkeypatch.setenv("LETHE_TEST_KILL_AT", "other")
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("LETHE_TEST_KILL_DIR", str(markers))
    faults.kill_point("lifecycle.Item")
    assert list(markers.iterdir()) == []
