"""The engine-client seam: every engine-side effect the console asks for goes through here.

The console (screens, console API, operator commands) never changes conversations, the
engine folder or the fleet file itself; it asks an `EngineClient`:

    engine = get_engine()
    engine.set_archived("c_...", True, actor=user)          # -> thread JSON
    engine.set_closed("c_...", True, actor=user)            # stop workers, release the lease
    engine.preview_delete("c_...")                          # what a delete would do
    op = engine.request_delete("c_...", key="...", actor=user)   # -> OperationView
    engine.operation(op.id)                                 # state, step, receipt
    engine.operations(state="pending", position=page.next)  # a page, newest first
    engine.wait(op.id, progress=show)                       # until it is no longer pending
    engine.resolve_subagent("sa_...", action="clear", conversation_id=None, actor=user)

Every answer is plain data shaped like the engine API's JSON (`GET /v1/operations/{id}`
and friends), and every refusal is an `ActionRefused` with the API's code and status, so an
implementation that talks HTTP to a remote engine (issue 7: `ENGINE_URL`, a second Lethe
serving `/v1/`, with the console-side leased job that keeps the binding until the engine's
receipt is acknowledged) is one more class here and nothing else changes.
`InProcessEngine` is the embedded default: it calls the lifecycle's actions directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from lifecycle.moments import read_moment


def _text(value: Any) -> str | None:
    """A text field of an engine's answer, or None when it is not text (left out, as the
    docstring below says of every part a page reads)."""
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class OperationView:
    """A delete operation as the engine reports it (the JSON of GET /v1/operations/{id})."""

    id: str
    target: str
    state: str
    code: str | None
    message: str | None
    step: str | None
    attempts: int
    error: str | None
    error_message: str | None
    requested_at: datetime | None
    completed_at: datetime | None
    reasons: list[str] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    receipt: dict[str, Any] | None = None
    way_out: dict[str, Any] | None = None
    stalled: bool = False
    data: dict[str, Any] = field(default_factory=dict)
    # Set by request_delete: True when the request joined a delete requested before it (it
    # did nothing more), None when the engine cannot tell.
    joined: bool | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OperationView:
        """An operation as an engine answered it. The parts pages read into are taken only in
        the shape they are read in (a remote engine's answer is not trusted to have it): a
        receipt and a way out that are objects, steps that name their store and state, reasons
        that are words; anything else is left out, never a server error later."""
        steps, reasons, receipt, way_out = data.get("steps"), data.get("reasons"), data.get("receipt"), data.get("way_out")
        attempts = data.get("attempts", 0)
        return cls(
            id=data["id"], target=data["target"], state=data["state"], code=_text(data.get("code")),
            message=_text(data.get("message")), step=_text(data.get("step")),
            attempts=attempts if isinstance(attempts, int) and not isinstance(attempts, bool) else 0,
            error=_text(data.get("error")), error_message=_text(data.get("error_message")),
            requested_at=read_moment(data.get("requested_at")), completed_at=read_moment(data.get("completed_at")),
            reasons=[r for r in reasons if isinstance(r, str)] if isinstance(reasons, list) else [],
            steps=[s for s in steps if isinstance(s, dict) and isinstance(s.get("store"), str)
                   and isinstance(s.get("state"), str)] if isinstance(steps, list) else [],
            receipt=receipt if isinstance(receipt, dict) else None,
            way_out=way_out if isinstance(way_out, dict) else None,
            # an engine from before the flag said "stalled" as its error
            stalled=data.get("stalled") is True or data.get("error") == "stalled", data=data,
        )

    @property
    def is_pending(self) -> bool:
        return self.state == "pending"


@dataclass(frozen=True)
class OperationPage:
    """A page of delete operations, newest first. `next` (older) and `previous` (newer) are
    the positions to ask for next, opaque, or None where nothing lies that way."""

    rows: list[OperationView]
    next: str | None = None
    previous: str | None = None


class EngineClient(Protocol):
    def set_archived(self, public_id: str, archived: bool, *, actor) -> dict[str, Any]: ...

    def set_closed(self, public_id: str, closed: bool, *, actor) -> dict[str, Any]: ...

    def preview_delete(self, public_id: str) -> dict[str, Any]: ...

    def request_delete(self, public_id: str, *, key: str | None, actor, seen: str | None = None) -> OperationView:
        """`seen`: the digest of the preview a confirmation showed (lifecycle.deletion.preview):
        a live conversation that changed since is refused, 409 `changed_since_shown`."""
        ...

    def operation(self, operation_id: str) -> OperationView: ...

    def operations_named(self, operation_ids: list[str]) -> list[OperationView]:
        """The operations with these ids, in the order asked; an id that names none is left out."""
        ...

    def operations(self, *, state: str | None = None, limit: int = 50, position: str | None = None) -> OperationPage:
        """`position`: a page's `next` or `previous`, or a number of rows to skip (the old
        contract); an unusable one is ActionRefused("invalid_cursor", status=400)."""
        ...

    def retry_operation(self, operation_id: str, *, actor) -> OperationView: ...

    def resolve_subagent(self, agent_id: str, *, action: str, conversation_id: str | None, actor) -> None: ...

    def wait(self, operation_id: str, *, progress=None, timeout: float | None = None) -> OperationView:
        """Until the operation is no longer pending (or `timeout`); `progress(done, total, step)`."""
        ...


def get_engine() -> EngineClient:
    """The engine this console talks to. Embedded (in-process) unless ENGINE_URL names another
    Lethe serving the engine API (`lifecycle.engine.http.HttpEngine`)."""
    from django.conf import settings

    if settings.ENGINE_URL:
        from lifecycle.engine.http import HttpEngine

        return HttpEngine()
    from lifecycle.engine.inprocess import InProcessEngine

    return InProcessEngine()
