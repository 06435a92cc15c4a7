from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from django.db import transaction

from lifecycle.enginefs import EngineHome, EnginePathError, UnsafeEnginePath, open_regular
from lifecycle.errors import ActionRefused
from lifecycle.fence import lock_writable
from lifecycle.models import Conversation

log = logging.getLogger(__name__)


def _logs(home: EngineHome, conversation: Conversation) -> list[Path]:
    key = conversation.storage_key
    return [home.events_path(key), home.receipts_path(key)]


def _torn(path: Path) -> bool:
    """Whether the log ends in a torn line. Missing, empty, or not a regular file (a link, a
    FIFO: never followed nor waited on, see `open_regular`): not torn."""
    try:
        with os.fdopen(open_regular(path), "rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except (OSError, UnsafeEnginePath):  # missing, empty, or not a regular file
        return False


def _set_aside_unfinished(path: Path) -> bool:
    """Whether a recovery of the log was killed after saving its torn tail aside (its pending
    file is there): the log may already be cut, so it no longer looks torn (r21: such a tail
    stayed hidden until the conversation's next append)."""
    return os.path.lexists(path.with_name(f".{path.name}.torn-pending"))


def recover_torn_logs(conversation: Conversation, *, home: EngineHome | None = None) -> int:
    """The engine's crash recovery for one conversation: set torn last lines of its logs aside.

    A recovery path like any other write: refused once a delete intent exists, and done
    under the conversation's row lock so it cannot write into a folder being erased.
    """
    home = home or EngineHome()
    recovered = 0
    with transaction.atomic():
        lock_writable(conversation)
        for path in _logs(home, conversation):
            if home.recover_torn_tail(path) is not None:
                recovered += 1
    return recovered


def recover_all_torn_logs(*, home: EngineHome | None = None) -> int:
    """Every live conversation whose log ends in a torn line (checked without a lock first)."""
    home = home or EngineHome()
    recovered = 0
    for conversation in Conversation.objects.live().only("pk", "public_id", "state").iterator():
        try:
            if any(_torn(p) or _set_aside_unfinished(p) for p in _logs(home, conversation)):
                recovered += recover_torn_logs(conversation, home=home)
        except ActionRefused:
            continue  # a delete intent arrived meanwhile; the erasure owns the folder now
        except EnginePathError:
            continue  # a symlink on the way or a log that is not a regular file: never written through
        except OSError as error:  # a read-only or full engine folder: the other logs, and recovery, go on
            log.warning("torn log of %s not set aside: %s", conversation.public_id,
                        errno.errorcode.get(error.errno, type(error).__name__))
    return recovered
