"""What Lethe's commands share: `--json` refusals as JSON, and one line for a folder that cannot
be read or written.

`--json` commands answer a refusal as JSON too. A script that runs a command with `--json` reads its standard output as one JSON document; a
refusal (an unknown id, a reused key, busy...) came only as text on standard error. With `--json`
it is also one document on standard output, `{"error": {"code", "message"}}`, and the exit
status is the refusal's (1, or 2 where the command says so)."""

from __future__ import annotations

import errno
import json
import re

from django.conf import settings
from django.core.management.base import CommandError

from lifecycle.enginefs import written

_CODE = re.compile(r"[a-z][a-z_]*")


class JsonErrors:
    def execute(self, *args, **options):
        try:
            return super().execute(*args, **options)
        except CommandError as exc:
            if not options.get("json"):
                raise
            text = str(exc)
            code, sep, message = text.partition(": ")
            if getattr(exc, "json_code", None):  # its code given apart from its text (refusal())
                code, message = exc.json_code, text
            elif not (sep and _CODE.fullmatch(code)):
                code, message = "refused", text
            self.stdout.write(json.dumps({"error": {"code": code, "message": message}}, sort_keys=True))
            raise SystemExit(exc.returncode) from None


def refusal(code: str, message: str, *, returncode: int = 1) -> CommandError:
    """A refusal whose text stays `message` (`CommandError: message`) and whose --json document
    carries `code`."""
    error = CommandError(message, returncode=returncode)
    error.json_code = code
    return error


# What to do about a folder that could not be written, by errno (the fix differs).
_FIX = {errno.EROFS: "mount it read-write", errno.ENOSPC: "free space on its disk",
        errno.EDQUOT: "free space within its disk quota",
        errno.ENOTDIR: "a file stands where a folder of its path belongs: move it, or set ENGINE_HOME"}


def io_error(exc: OSError, outcome: str, *, returncode: int = 1) -> CommandError | BrokenPipeError:
    """One line, not a traceback, for a file or folder of the engine folder that could not be
    read or written (a read-only mount, a full disk, another user's folder); `outcome` says
    what was not done, and the advice fits the error. A reader of the output that went away
    (`| head -1`) is no folder's fault: that error is given back as it is, for manage.py to end
    the command quietly (r43: it blamed the engine folder, for a delete that had completed)."""
    if isinstance(exc, BrokenPipeError):
        return exc
    fix = _FIX.get(exc.errno, "fix the folder's permissions or mount")
    where = written(exc.filename) if exc.filename and isinstance(exc.filename, str | bytes) else settings.ENGINE_HOME
    return CommandError(f"io_error: {where}: {exc.strerror or exc}. {outcome}; "
                        f"{fix}, then try again.", returncode=returncode)


def require_lethe_tables() -> None:
    """Read one of Lethe's first tables, so a database never migrated (a mistyped SQLite path,
    an empty PostgreSQL database) stops serve and the job cluster before they start anything,
    as it stops every other command at its first query (manage.py's `not_migrated` words it)."""
    from lifecycle.models import Conversation

    Conversation.objects.exists()
