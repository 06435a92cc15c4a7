"""What a delete of a bound conversation would do, as its engine says it
(`GET /v1/threads/{id}/deletion-preview`): per store, this conversation's records, bytes,
shared copies that would remain, and the retained-facts periods.

Asked once per page view, without retries: the confirmation must not wait on an engine that
is away. An engine that cannot be asked (no address, unreachable, token refused, no such
call) or whose answer cannot be used (about another conversation, not a preview) gives None:
the page then says what a delete does with each kind of data, with no figures.
"""

from __future__ import annotations

import logging
from typing import Any

from lifecycle.deletion.executor import figure
from lifecycle.errors import ActionRefused
from remote.delivery import engine_for
from remote.models import EngineBinding

log = logging.getLogger(__name__)
FIGURES = ("records", "bytes", "remaining", "days")


def engine_preview(binding: EngineBinding) -> dict[str, Any] | None:
    try:
        engine = engine_for(binding.engine_url)
        engine.retries = 0
        answer = engine.preview_delete(binding.engine_id)
    except ActionRefused as exc:  # not configured, unreachable, refused, unsupported, a bad answer
        log.info("no deletion preview for %s from its engine: %s", binding.public_id, exc.code)
        return None
    if not preview_is_usable(answer, binding.engine_id):
        log.warning("the deletion preview for %s from its engine was not used", binding.public_id)
        return None
    return answer


def preview_is_usable(answer: Any, target: str) -> bool:
    """A preview of this conversation: its stores are objects with a text key and, where they
    give figures, whole non-negative numbers."""
    if not isinstance(answer, dict) or answer.get("target") != target or not isinstance(answer.get("stores"), list):
        return False
    for entry in answer["stores"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("store"), str):
            return False
        for key in FIGURES:
            value = entry.get(key)
            if value is not None and figure(value) is None:
                return False
    return True


def admission_of(preview: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the engine says a delete of the conversation would get now, when it would not be
    admitted: {"outcome": "refused" | "unavailable", "reasons": [{"code", "message"}]}, each
    reason in this console's words where it knows the code, else the engine's (one printable
    line). None when it would be admitted, or the preview does not say."""
    from lifecycle.deletion.reasons import message
    from lifecycle.engine.http import engine_text

    admission = preview.get("admission") if isinstance(preview, dict) else None
    if not isinstance(admission, dict) or admission.get("outcome") not in ("refused", "unavailable"):
        return None
    reasons = []
    for reason in admission.get("reasons") if isinstance(admission.get("reasons"), list) else []:
        if isinstance(reason, dict):
            code = reason.get("code") if isinstance(reason.get("code"), str) else ""
            reasons.append({"code": code, "message": message(code) or engine_text(reason.get("message") or "")})
    return {"outcome": admission["outcome"], "reasons": reasons}

