"""Structured logs: one JSON object a line on stderr (`LOG_FORMAT=json`, the default), or the
same fields as readable text (`LOG_FORMAT=text`).

Every line has `time` (UTC, ISO 8601), `level`, `logger` and `message`, and the request id,
operation id and job id of what it belongs to when there is one (ops.context). Logs must
never hold conversation content, so:
- an exception is logged by its type and where it was raised (file, line, function), never
  by its message: database errors quote the rows they refused and validation errors the
  values they were given;
- a failed job's line from the job cluster is cut before the error text it appends (the
  error stays in the task's stored result, for admins);
- extra fields are kept only when they are plain numbers, text or flags (a request object,
  for one, is dropped).

This module is imported by the settings and by the application server's configuration, so
it uses only the standard library and ops.context.
"""

from __future__ import annotations

import json
import logging
import re
import traceback
from datetime import UTC, datetime
from typing import Any

from ops import context

FORMATS = ("json", "text")

# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", *context.FIELDS}
_DROPPED_EXTRAS = {"request", "server_time"}  # Django's: an object, and a time repeated in `time`
_Q_FAILURE = re.compile(r"^(Failed '[^']*' \([^)]*\)) - ", re.DOTALL)


class ContextFilter(logging.Filter):
    """Stamps each record with the bound context, and cuts error text out of the job
    cluster's failure lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in context.FIELDS:
            setattr(record, name, None)
        for name, value in context.current().items():
            setattr(record, name, value)
        if record.name == "django-q" and record.levelno == logging.INFO and str(record.msg).startswith("Enqueued "):
            # Every job queued (by a request, a command, a schedule) said so on a line of its own,
            # amid a command's output too (r22): a debug line now; the cluster logs the job's run.
            if not logging.getLogger().isEnabledFor(logging.DEBUG):
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        elif record.name == "django-q" and record.levelno >= logging.ERROR:
            message = record.getMessage()
            if match := _Q_FAILURE.match(message):
                record.msg, record.args = match.group(1) + " (the error is kept in the task's result)", None
        elif record.name.startswith("django.security.") and record.name != "django.security.csrf":
            # A refused request's text quotes what the client sent (a Host header, a field
            # count...): logged by kind only, as exceptions are (r22). CSRF refusals keep their
            # reason ("Origin checking failed", "CSRF cookie not set"): without it a proxy that
            # drops the Host header cannot be found (r24).
            kind = record.name.rsplit(".", 1)[1]
            record.msg, record.args = f"refused a suspicious request: {kind} (what it sent is not logged)", None
            record.exc_info = record.exc_text = None
        return True


def os_error(exc: OSError) -> str:
    """An OS error as a log line may name it: its type and error code, never its text (which
    quotes the path, and a path below a conversation's folder is a name the user chose)."""
    import errno

    code = errno.errorcode.get(exc.errno or 0)
    return f"{type(exc).__name__} ({code})" if code else type(exc).__name__


def _time(record: logging.LogRecord) -> str:
    moment = datetime.fromtimestamp(record.created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _exception(exc_info) -> dict[str, Any]:
    kind, value, tb = exc_info
    frames = traceback.extract_tb(tb)[-12:]
    found = {
        "type": f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__qualname__,
        "stack": [f"{frame.filename}:{frame.lineno} in {frame.name}" for frame in frames],
    }
    if code := error_code(value):
        found["code"] = code
    return found


def error_code(exc: BaseException | None) -> str | None:
    """A database or OS error's content-free name, when it has one: SQLite's (SQLITE_FULL),
    PostgreSQL's SQLSTATE (53100), an errno's (ENOSPC); never the message, which may quote rows."""
    for candidate in (exc, getattr(exc, "__cause__", None)):
        if candidate is None:
            continue
        if name := getattr(candidate, "sqlite_errorname", None):
            return str(name)
        if state := getattr(candidate, "sqlstate", None):
            return f"SQLSTATE {state}"
        if isinstance(candidate, OSError) and candidate.errno:
            import errno

            return errno.errorcode.get(candidate.errno)
    return None


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {
        key: value for key, value in record.__dict__.items()
        if key not in _STANDARD and key not in _DROPPED_EXTRAS and not key.startswith("_")
        and (value is None or isinstance(value, str | int | float | bool))
    }


def fields(record: logging.LogRecord) -> dict[str, Any]:
    line: dict[str, Any] = {
        "time": _time(record),
        "level": record.levelname,
        "logger": record.name,
        "message": record.getMessage(),
    }
    for name in context.FIELDS:
        value = getattr(record, name, None)
        if value is not None:
            line[name] = value
    line.update(_extras(record))
    if record.exc_info and record.exc_info[0] is not None:
        line["exception"] = _exception(record.exc_info)
    return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record), ensure_ascii=False, default=str)


# Line ends and the other control characters a client can put in a logged value (a request's
# decoded path): written as escapes, so no value starts a line of its own (r88: a path with
# %0D%0A forged a whole access line, time and level included).
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _one_line(value: object) -> str:
    return _CONTROLS.sub(lambda found: found[0].encode("unicode_escape").decode("ascii"), str(value))


class TextFormatter(logging.Formatter):
    """`time level logger [request_id=... job_id=...] message key=value...` on one line (a
    traceback, when there is one, follows as `  at file:line in function` lines); a control
    character in the message or a value is written as its escape."""

    def format(self, record: logging.LogRecord) -> str:
        line = fields(record)
        exception = line.pop("exception", None)
        head = [line.pop("time"), f"{line.pop('level'):<7}", line.pop("logger")]
        ids = " ".join(f"{name}={_one_line(line.pop(name))}" for name in context.FIELDS if name in line)
        message = _one_line(line.pop("message"))
        rest = " ".join(f"{key}={_one_line(value)}" for key, value in line.items())
        text = " ".join(part for part in (*head, f"[{ids}]" if ids else "", message, rest) if part)
        if exception:
            text += f"\n  {exception['type']} (message not logged)" + "".join(
                f"\n  at {frame}" for frame in exception["stack"])
        return text


def logging_config(log_format: str = "json", level: str = "INFO") -> dict[str, Any]:
    """The LOGGING setting: everything through one stderr handler in the chosen format."""
    if log_format not in FORMATS:
        raise ValueError(f"LOG_FORMAT must be one of {', '.join(FORMATS)}, not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "ops.logs.ContextFilter"}},
        "formatters": {
            "json": {"()": "ops.logs.JsonFormatter"},
            "text": {"()": "ops.logs.TextFormatter"},
        },
        "handlers": {
            "stderr": {"class": "logging.StreamHandler", "formatter": log_format, "filters": ["context"]},
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": {
            # Django's own handlers print plain text: everything goes through the one handler.
            "django": {"handlers": [], "level": "INFO", "propagate": True},
            # The development server's request lines repeat ours, query strings included.
            "django.server": {"handlers": [], "level": "CRITICAL", "propagate": True},
            # SQL with its parameters is content.
            "django.db.backends": {"handlers": [], "level": "WARNING", "propagate": True},
        },
    }
