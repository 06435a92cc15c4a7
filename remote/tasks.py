"""Jobs of bound deletes. Each takes ids (or nothing), re-reads state and is safe to run twice."""

from __future__ import annotations

import logging
import time

from remote import delivery, physical

log = logging.getLogger(__name__)
SWEEP_BUDGET = 240

def deliver(pk: int) -> str:
    return delivery.deliver(pk)


def sweep() -> int:
    """Every minute and at worker start: run the bound deletes that are due, then retry the
    checkpoint of those completed still physically pending (SQLite)."""
    started = time.monotonic()
    ran = 0
    for pk in delivery.due():
        remaining = SWEEP_BUDGET - (time.monotonic() - started)
        if remaining <= 0:
            break
        try:
            if delivery.deliver(pk, budget=min(remaining, delivery.SWEEP_EACH)) != "busy":
                ran += 1
        except Exception:  # one delete that fails never keeps the later ones from their turn
            log.exception("bound delete %s: the run stopped on an unexpected error", pk)
            delivery.postpone(pk)
    try:  # SQLite: a checkpoint a reader kept busy at the acknowledgement, tried again
        physical.checkpoint()
    except Exception:
        log.exception("the checkpoint of completed bound deletes failed")
    return ran


REQUESTERS = "remote.BoundDelete.requested_by"


def hourly() -> dict[str, int]:
    """Every hour: read again the engine's receipts that still keep facts that expire, and
    forget who asked for the bound deletes requested more than the audit period ago (as the
    lifecycle's hourly expiry does for this database's own deletes)."""
    from django.utils import timezone

    from lifecycle.actions.expire_facts import forget_requesters
    from remote.models import BoundDelete
    from remote.receipts import read_again

    now = timezone.now()
    # Forgetting first: an engine that fails the reads never holds it up.
    forgotten = forget_requesters(BoundDelete, now, key=REQUESTERS)
    return {**read_again(now), "requesters_forgotten": forgotten}


def read_engines() -> dict[str, str]:
    """Every hour (and at the first cluster start after migrate): queue a read of each configured
    engine's list of conversations (ENGINE_URL, then each engine in ENGINE_TOKENS), each its own
    job under its own time limit, so one slow or endless list never keeps the others from their
    read (r71: one job read them all, and one that used the job's time starved the rest).
    Returns the queued jobs' ids by engine."""
    from django_q.tasks import async_task

    from remote.sync import configured_engines

    # ack_failure: a read stopped by its time limit is not run again before the next hour (it is
    # recorded as unfinished: remote.models.EngineRead)
    return {url or "ENGINE_URL": async_task("remote.tasks.read_engine", url,
                                            q_options={"ack_failure": True, "task_name": f"remote-read-{n}"})
            for n, url in enumerate(configured_engines())}


def read_engine(url: str) -> dict[str, int] | str:
    """Read one engine's list of conversations into the bindings (remote.sync.refresh, which
    records the read); a failure is logged and waits for the next hour (or Read from the engine)."""
    from lifecycle.errors import ActionRefused
    from remote.sync import refresh

    try:
        return refresh(url)
    except ActionRefused as exc:
        log.warning("the read of the engine %s failed: %s", url or "at ENGINE_URL", exc.code)
        return exc.code


def on_worker_spawn(sender=None, proc_name: str = "", **kwargs) -> None:
    from django_q.tasks import async_task

    try:
        async_task("remote.tasks.sweep", q_options={"ack_failure": True, "task_name": "remote-startup"})
    except Exception:  # never keep a worker from starting
        log.exception("could not queue the bound delete sweep")

