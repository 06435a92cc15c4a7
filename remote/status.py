"""What a bound delete is waiting for, in words."""

from __future__ import annotations

from django.utils import timezone
from django.utils.translation import gettext as _

from console.templatetags.lethe import with_zone
from remote.models import BoundDelete


def waiting_text(op: BoundDelete, stopped: dict | None) -> str:
    """`stopped`: `ops.health.cluster_stopped()`, read by the caller (None: a job cluster runs)."""
    if op.state != "pending":
        return ""
    if stopped:
        # This console's job cluster sends the request, follows the engine's erasure and
        # acknowledges its receipt: none of it happens while no cluster runs (r129: "is being
        # sent", "tried again within a minute" were said all the while).
        if stopped["since"] is None:
            return _("Waiting for this console: no job has finished recently, so its job cluster seems to be "
                     "stopped; nothing is sent to the engine or read from it until it runs again.")
        return _("Waiting for this console: no job has finished since %(when)s, so its job cluster seems to be "
                 "stopped; nothing is sent to the engine or read from it until it runs again.") % {
            "when": with_zone(timezone.localtime(stopped["since"]))}
    if op.waiting_on == "console":
        if op.last_error == "engine_credentials_refused":
            return _("Waiting for this console: the engine refused its token.")
        return _("Waiting for this console: the engine's receipt is in and is being acknowledged.")
    if op.last_error and op.next_attempt_at:
        # What the last try met: no answer, an answer that could not be used, or an error.
        kind = {"engine_unreachable": "unreachable", "engine_bad_answer": "bad_answer"}.get(op.last_error, "error")
        if op.next_attempt_at <= timezone.now():
            # Due already: the minute sweep takes it (a time in the past would read as a missed retry).
            return {
                "unreachable": _("Waiting for the engine: it cannot be reached; it is tried again within a minute."),
                "bad_answer": _("Waiting for the engine: its last answer could not be used; it is tried again "
                                "within a minute."),
                "error": _("Waiting for the engine: it answered with an error; it is tried again within a minute."),
            }[kind]
        when = with_zone(timezone.localtime(op.next_attempt_at))
        # The time in brackets: an English time ends with "a.m." or "p.m.", so no period follows it
        return {
            "unreachable": _("Waiting for the engine: it cannot be reached (next retry: %(when)s)."),
            "bad_answer": _("Waiting for the engine: its last answer could not be used (next retry: %(when)s)."),
            "error": _("Waiting for the engine: it answered with an error (next retry: %(when)s)."),
        }[kind] % {"when": when}
    if op.last_error == "engine_stalled":
        return _("Waiting for the engine: its erasure stopped retrying by itself; the engine's operator can "
                 "retry it there.")
    if op.engine_operation:
        return _("Waiting for the engine: it is erasing the conversation.")
    return _("Waiting for the engine: the request is being sent.")
