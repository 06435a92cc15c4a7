"""What a log line is about: the request, the operation and the job it belongs to.

Context variables, so each request thread (and each job in a worker) sees only its own: the
request middleware binds `request_id`; the job hooks bind `job_id`, `job` (the task function)
and `operation_id` (from a task argument named `operation_id`), and the id of the request
that queued the job; code that acts on an operation outside a job binds it with
`bind(operation_id=...)`. Only identifiers live here, never content.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Iterator
from contextvars import ContextVar, Token
from typing import Any

FIELDS = ("request_id", "operation_id", "job_id", "job")
_vars: dict[str, ContextVar[Any]] = {name: ContextVar(f"lethe_{name}", default=None) for name in FIELDS}

# A request id we accept from the caller (a proxy or a client): short, printable, no spaces.
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")


def sane_request_id(raw: str | None) -> str:
    """The caller's X-Request-ID when it is sane, otherwise a new one."""
    if raw and _SANE_REQUEST_ID.fullmatch(raw):
        return raw
    return uuid.uuid4().hex


def current() -> dict[str, Any]:
    """The bound fields (only those that are set)."""
    return {name: var.get() for name, var in _vars.items() if var.get() is not None}


def set_fields(**fields: Any) -> dict[str, Token]:
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise TypeError(f"unknown log context fields: {sorted(unknown)}")
    return {name: _vars[name].set(None if value is None else str(value)) for name, value in fields.items()}


def reset(tokens: dict[str, Token]) -> None:
    for name, token in tokens.items():
        _vars[name].reset(token)


def clear(*names: str) -> None:
    for name in names or FIELDS:
        _vars[name].set(None)


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Bind fields for the duration of a block: `with bind(operation_id=op.pk): ...`."""
    tokens = set_fields(**fields)
    try:
        yield
    finally:
        reset(tokens)
