"""The one shape of a refusal in the retention app: a stable `code` and a message, and the
messages the jobs store, said in the language of whoever reads them.

A job stores its outcome long before anyone reads it, in a worker whose language is not the
reader's. So a stored message is its catalog msgid and its details, never text: a msgid alone
as it is (the form stored before details were kept apart), a msgid with details as JSON
(`{"msgid": ..., "params": {...}}`), a detail that is itself a message (the reason a backup
does not verify) or a size in bytes as an object of its own. Reading translates every level
then. Text stored by earlier versions (English with its details filled in) reads as stored.
"""

from __future__ import annotations

import errno
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from django.template.defaultfilters import filesizeformat
from django.utils.formats import number_format
from django.utils.html import avoid_wrapping
from django.utils.translation import gettext, gettext_noop, ngettext

log = logging.getLogger(__name__)

# Characters kept of one detail in another party's words (the operating system's, pg_dump's)
DETAIL_LIMIT = 1000


@dataclass(frozen=True)
class Size:
    """A number of bytes, formatted for the reader ("1.5 MB", "1,5 MB"), or every byte
    ("1,048,576 bytes") when `exact` (see `sizes_short`)."""

    bytes: int
    exact: bool = False

    def __str__(self) -> str:
        if not self.exact:
            return filesizeformat(self.bytes)
        grouped = number_format(self.bytes, force_grouping=True)
        return avoid_wrapping(ngettext("%(size)s byte", "%(size)s bytes", self.bytes) % {"size": grouped})


def _as_shown(count: int) -> float:
    """The figure `filesizeformat` shows for `count` bytes (one decimal of its unit), in bytes."""
    for unit in (1 << 50, 1 << 40, 1 << 30, 1 << 20, 1 << 10):
        if count >= unit:
            return round(count / unit, 1) * unit
    return count


def sizes_short(free: int, needed: int, reserve: int) -> tuple[Size, Size, Size]:
    """The free, needed and reserve figures of a refusal for lack of room (free < needed +
    reserve), rounded as usual unless the rounded figures would not show the shortfall (1.0 MB
    needed, 1.0 MB free): then every byte of each."""
    exact = _as_shown(needed) + _as_shown(reserve) <= _as_shown(free)
    return Size(free, exact), Size(needed, exact), Size(reserve, exact)


@dataclass(frozen=True)
class Message:
    """A catalog msgid with its named details, translated when it is turned into text.

    Build it with the msgid marked for the catalog: `Message(gettext_noop("... %(error)s"),
    {"error": exc})`. Details other than messages, sizes and numbers are kept as text."""

    msgid: str
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", {name: _detail(value) for name, value in self.params.items()})

    def __str__(self) -> str:
        if not self.params:
            return gettext(self.msgid)
        details = {name: str(value) for name, value in self.params.items()}
        try:
            return gettext(self.msgid) % details
        except (KeyError, TypeError, ValueError):  # a translation that names other details
            log.warning("translation of %r does not take its details", self.msgid)
            return self.msgid % details

    def as_json(self) -> dict[str, Any]:
        return {"msgid": self.msgid, "params": {name: _detail_json(value) for name, value in self.params.items()}}

    def stored(self) -> str:
        """The column's value: the msgid alone when it has no details, else JSON."""
        return json.dumps(self.as_json(), ensure_ascii=False) if self.params else self.msgid

    @classmethod
    def from_json(cls, value: Any) -> Message:
        if not isinstance(value, dict) or not isinstance(value.get("msgid"), str):
            raise ValueError("not a stored message")
        params = value.get("params", {})
        if not isinstance(params, dict):
            raise ValueError("not a stored message")
        return cls(value["msgid"], {name: _detail_from_json(detail) for name, detail in params.items()})


def _detail(value: Any) -> Message | Size | int | str:
    if isinstance(value, Message | Size) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    return str(value)[:DETAIL_LIMIT]


def _detail_json(value: Message | Size | int | str) -> Any:
    if isinstance(value, Message):
        return value.as_json()
    if isinstance(value, Size):
        return {"bytes": value.bytes, "exact": True} if value.exact else {"bytes": value.bytes}
    return value


def _detail_from_json(value: Any) -> Message | Size | int | str:
    if isinstance(value, dict) and "msgid" in value:
        return Message.from_json(value)
    if isinstance(value, dict) and isinstance(value.get("bytes"), int):
        return Size(value["bytes"], value.get("exact") is True)
    if isinstance(value, int | str) and not isinstance(value, bool):
        return value
    raise ValueError("not a stored detail")


def stored(message: Message | str) -> str:
    """What a job writes to an error column for `message` ("" for none)."""
    return message.stored() if isinstance(message, Message) else message


def said(value: str) -> str:
    """A stored message in the active language (see the module's docstring); "" for none."""
    if not value:
        return value
    if value.startswith("{"):
        try:
            return str(Message.from_json(json.loads(value)))
        except ValueError:
            return value  # text an earlier version stored: shown as stored
    return gettext(value)


class CodedError(Exception):
    """A refusal: a stable `code`, and `message` in the active language when it is read
    (`text` keeps it untranslated, for a job to store)."""

    def __init__(self, code: str, message: Message | str) -> None:
        super().__init__(message)
        self.code = code
        self.text = message

    @property
    def message(self) -> str:
        return str(self.text)


# The operating system's reasons, in the reader's words: strerror is English (and the
# server's locale), never the reader's.
OS_REASONS = {
    errno.EEXIST: gettext_noop("something else is already at that path"),
    errno.ENOTDIR: gettext_noop("a part of that path is not a folder"),
    errno.EACCES: gettext_noop("permission denied"),
    errno.EPERM: gettext_noop("permission denied"),
    errno.ENOSPC: gettext_noop("no space is left on the disk"),
    errno.EROFS: gettext_noop("the file system is read-only"),
    errno.ENOENT: gettext_noop("not found"),
    errno.EISDIR: gettext_noop("that path is a folder"),
    errno.ENOTEMPTY: gettext_noop("the folder is not empty"),
    errno.EIO: gettext_noop("the disk reported a read or write error"),
    errno.EDQUOT: gettext_noop("the disk quota is used up"),
    errno.ELOOP: gettext_noop("a link is in the way (links are not followed)"),
    errno.ENAMETOOLONG: gettext_noop("a name in that path is too long"),
    errno.EBUSY: gettext_noop("the file or folder is in use"),
    errno.EMFILE: gettext_noop("too many files are open"),
    errno.ENFILE: gettext_noop("too many files are open"),
    errno.EXDEV: gettext_noop("that path is on another disk"),
}


class BackupFolderUnreadable(OSError):
    """Something is at the backup folder's path that cannot be read as a folder: no backup
    list (nor an erasure receipt naming the backups) can be made until it is fixed."""


def os_reason(error: OSError) -> Message | str:
    """Why a file operation failed, for a message: a localized description of the common
    errno values, else the errno's name (EIO), never the system's English prose."""
    if error.errno in OS_REASONS:
        return Message(OS_REASONS[error.errno])
    return errno.errorcode.get(error.errno, type(error).__name__) if error.errno else type(error).__name__
