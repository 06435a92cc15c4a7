"""Turn stored items into transcript rows: a summary line and an output per tool kind.

Everything a tool row shows of a tool call (its summary values, its text and its output) is a
short preview there, cut between characters a reader sees as one (`preview`); the output's
rest is fetched on demand and the whole call is on its own page, so a page of a conversation
with megabytes of tool input or output stays small.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.translation import gettext as _

from lifecycle.models import Item, Role
from retention.reducer import MARKER_KEY, is_marker

PREVIEW_CHARS = 600  # an output's or a tool call's text
SUMMARY_CHARS = 300  # a summary value (command, path, query, URL, ...): a title's length

_ZWJ = "\u200d"
_MARKS = frozenset(("Mn", "Me", "Mc"))  # combining marks, variation selectors among them


def _extends(char: str) -> bool:
    """Whether this character belongs to the one before it: a combining mark or variation
    selector, an emoji skin tone, a joiner, or an emoji flag's tag character."""
    code = ord(char)
    return (char == _ZWJ or char == "\u200c" or 0x1F3FB <= code <= 0x1F3FF or 0xE0020 <= code <= 0xE007F
            or unicodedata.category(char) in _MARKS)


def _regional(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _joined(text: str, at: int) -> bool:
    """Whether a cut before text[at] would split what a reader sees as one character."""
    before, after = text[at - 1], text[at]
    if _extends(after) or before == _ZWJ or (before, after) == ("\r", "\n"):
        return True
    if _regional(before) and _regional(after):
        run = 0  # a flag is a pair of regional indicators: split only between two pairs
        while at - run - 1 >= 0 and _regional(text[at - run - 1]):
            run += 1
        return run % 2 == 1
    return False


def preview(text: str, limit: int) -> tuple[str, bool]:
    """At most `limit` characters of `text` and whether it was cut. The cut backs off to the
    start of a whole character as a reader sees it (é written e + U+0301, a family emoji joined
    with U+200D, a flag, a skin tone): never a bare accent or half an emoji. A run of marks
    longer than the preview itself is cut where the limit falls (nothing whole fits)."""
    if len(text) <= limit:
        return text, False
    at = limit
    while at > 0 and _joined(text, at):
        at -= 1
    return text[:at or limit], True


@dataclass
class Row:
    item: Item
    # (label, value, cut): the value a preview of SUMMARY_CHARS unless the row is `full`.
    summary: list[tuple[str, str, bool]] = field(default_factory=list)
    # A tool call's own text (Item.content), a preview like its output.
    content: str = ""
    content_cut: bool = False
    output: str = ""
    truncated: bool = False
    # The whole output's own size in UTF-8 bytes (not the payload's, which counts the input too).
    output_bytes: int = 0
    removed_on: Any = None

    @property
    def is_tool(self) -> bool:
        return self.item.role == Role.TOOL

    @property
    def inputs_cut(self) -> bool:
        """Whether the row shortened a summary value or the text: the call's page shows them whole."""
        return self.content_cut or any(cut for _label, _value, cut in self.summary)


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def _summary_and_output(kind: str, p: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    if kind == "shell":
        summary = [(_("Command"), _text(p.get("command"))), (_("Folder"), _text(p.get("cwd")))]
        if p.get("exit_code") is not None:
            summary.append((_("Exit code"), str(p["exit_code"])))
        output = _text(p.get("stdout"))
        if p.get("stderr"):
            output += ("\n" if output else "") + _text(p["stderr"])
        return summary, output
    if kind == "read_file":
        summary = [(_("Path"), _text(p.get("path")))]
        if p.get("line_count") is not None:
            summary.append((_("Lines"), str(p["line_count"])))
        return summary, _text(p.get("content"))
    if kind == "edit_file":
        changes = p.get("changes") if isinstance(p.get("changes"), list) else []
        paths = ", ".join(sorted({_text(c.get("path")) for c in changes if isinstance(c, dict)}))
        summary = [(_("Files"), paths), (_("Changes"), str(len(changes)))]
        output = "\n".join(_text(c.get("diff")) for c in changes if isinstance(c, dict) and c.get("diff"))
        return summary, output or _text(p.get("content"))
    if kind == "search":
        summary = [(_("Query"), _text(p.get("query"))), (_("Scope"), _text(p.get("scope")))]
        if p.get("file_count") is not None:
            summary.append((_("Files found"), str(p["file_count"])))
        return summary, _text(p.get("matches"))
    if kind == "http":
        summary = [(_("Request"), f"{_text(p.get('method'))} {_text(p.get('url'))}".strip())]
        if p.get("status") is not None:
            summary.append((_("Status"), str(p["status"])))
        return summary, _text(p.get("response"))
    if kind == "generic":
        return [(_("Tool"), _text(p.get("tool_name")))], _text(p.get("output"))
    # Plans, to-do lists, subagent tasks, background work and monitors: show them whole.
    return [], _text(p)


def removed_at(item: Item) -> datetime | None:
    """When cleanup removed this tool item's details, or None when they are still there."""
    if item.details_removed_at is not None:
        return item.details_removed_at
    payload = item.payload if isinstance(item.payload, dict) else {}
    marker = payload.get(MARKER_KEY)
    if not is_marker(marker):  # details there, or a field of the tool's own by that name
        return None
    return parse_datetime(marker["removed_at"]) or datetime.fromtimestamp(0, tz=UTC)


def kept_summary(item: Item) -> dict[str, Any]:
    """The payload fields a removal kept (command, exit code, path, query, URL, tool name, ...)."""
    payload = item.payload if isinstance(item.payload, dict) else {}
    return {k: v for k, v in payload.items() if k != MARKER_KEY}


def _payload_parts(item: Item) -> tuple[list[tuple[str, str]], str]:
    """A tool item's summary and output. A payload that is not an object (a runtime may send
    plain text or a list) has no fields to summarize: it is the output, whole."""
    if item.payload is None or isinstance(item.payload, dict):
        return _summary_and_output(item.tool_kind, item.payload or {})
    return [], _text(item.payload)


def full_output(item: Item) -> str:
    return _payload_parts(item)[1]


def item_rows(items: list[Item], *, full: bool = False) -> list[Row]:
    rows = []
    for item in items:
        row = Row(item=item)
        if item.role == Role.TOOL:
            summary, output = _payload_parts(item)
            row.summary = [(k, *_shown(v, SUMMARY_CHARS, full)) for k, v in summary if v]
            row.content, row.content_cut = _shown(item.content, PREVIEW_CHARS, full)
            row.removed_on = removed_at(item)
            if row.removed_on is not None:
                output = ""
            row.output_bytes = len(output.encode("utf-8", "surrogatepass"))
            row.output, row.truncated = _shown(output, PREVIEW_CHARS, full)
        rows.append(row)
    return rows


def _shown(text: str, limit: int, full: bool) -> tuple[str, bool]:
    return (text, False) if full else preview(text, limit)
