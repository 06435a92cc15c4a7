"""Background jobs of the lifecycle. Each takes ids (or nothing), re-reads state and is safe to
run twice: django-q2 delivers at least once, and a killed worker's job comes back only after
`retry` seconds, so recovery does not wait for it."""

from __future__ import annotations

import logging
import time

from console.schedules import pull_in_far_runs
from lifecycle.deletion import executor

log = logging.getLogger(__name__)
RECOVERY_BUDGET = 240


def erase(operation_id: int) -> str:
    return executor.run_erasure(operation_id)


def recover() -> dict[str, int]:
    """Finish subagent resolutions cut short, outstanding delete intents and checkpoints still
    pending (every minute, and at worker start). First, every schedule's next run is brought to
    at most one interval away."""
    started = time.monotonic()
    done = {"operations": 0, "physical": 0, "subagents": 0}
    try:
        pull_in_far_runs()
    except Exception:  # the recovery of deletes goes on regardless
        log.exception("could not bring the schedules' next runs in")
    # Subagent resolutions cut short first: one may have made rows a conversation's whose
    # delete is outstanding, and its fact is to come before that delete's erasure.
    try:
        from lifecycle.actions.resolve_subagent import settle_resolutions

        done["subagents"] = settle_resolutions()
    except Exception:  # the recovery of deletes is not held up by the fleet files
        log.exception("could not settle the subagent resolutions cut short")
    for pk in executor.outstanding():
        if time.monotonic() - started > RECOVERY_BUDGET:
            break
        if executor.run_erasure(pk) != "busy":
            done["operations"] += 1
    for pk in executor.unfinished_physical():
        done["physical"] += int(executor.finish_physical(pk))
    return done


def startup() -> dict[str, int]:
    """At worker start: set torn log tails aside (live conversations only), then recover."""
    from lifecycle.actions.recover_torn_logs import recover_all_torn_logs

    torn = recover_all_torn_logs()
    return {"torn": torn, **recover()}


def expire_facts() -> dict[str, int]:
    """Hourly: the retained facts whose period ran out, the sign-in throttle's keys whose
    window and lock are over, and the sessions past their expiry (r142: Django leaves removing
    them to the application, and they stayed for good, each naming its user; both counted
    apart: they are no retained facts)."""
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    from console.throttle import forget_past
    from lifecycle.actions.expire_facts import expire_facts as expire

    expired = expire()
    forgotten = forget_past()
    sessions = Session.objects.filter(expire_date__lt=timezone.now()).delete()[0]
    return {**expired, **({"console.throttle": forgotten} if forgotten else {}),
            **({"sessions": sessions} if sessions else {})}


def on_worker_spawn(sender=None, proc_name: str = "", **kwargs) -> None:
    """django-q2's post_spawn: every (re)started worker queues the startup recovery."""
    from django_q.tasks import async_task

    try:
        async_task("lifecycle.tasks.startup", q_options={"ack_failure": True, "task_name": "lifecycle-startup"})
    except Exception:  # never keep a worker from starting
        log.exception("could not queue the lifecycle startup recovery")
