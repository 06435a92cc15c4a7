from __future__ import annotations

import errno

# Why the engine folder could not be written, by the system's errno: one code per fix (mount
# it writable, free space on its disk, anything else: its permissions or the disk itself).
ENGINE_FOLDER_READ_ONLY = "engine_folder_read_only"
ENGINE_FOLDER_FULL = "engine_folder_full"
ENGINE_FOLDER_NOT_WRITABLE = "engine_folder_not_writable"


class ActionRefused(Exception):
    """An action declined to change anything; `code` is stable, `message` is localized."""

    def __init__(self, code: str, message: str, *, status: int = 409) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


def engine_folder_code(error: OSError) -> str:
    """The code for an engine-folder write that failed with `error`."""
    if error.errno == errno.EROFS:
        return ENGINE_FOLDER_READ_ONLY
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return ENGINE_FOLDER_FULL
    return ENGINE_FOLDER_NOT_WRITABLE


def engine_folder_refusal(error: OSError) -> ActionRefused:
    """An action's refusal for an engine-folder write that failed (a read-only mount, a full
    disk), with the system's reason in the reader's words, never a 500."""
    from django.utils.translation import gettext as _

    from retention.errors import os_reason

    return ActionRefused(engine_folder_code(error),
                         _("The engine folder could not be written: %(reason)s. Ask again once it can be.")
                         % {"reason": os_reason(error)})
