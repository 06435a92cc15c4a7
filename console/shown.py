"""Stored text as Lethe shows it: the characters that would hide or fake what is around them
written out as "[U+XXXX]".

Two rules, one table:

- `visible_format` (a page's names and text): the invisible format characters (bidirectional
  embeddings, overrides and isolates, zero-width spaces, tags), except the joiners some scripts
  and emoji need and the plain direction marks of right-to-left text; and lone surrogates,
  which no page can be (it is UTF-8) and a runtime may write into an engine file. A browser
  shows a line break or a tab as a space, so a name keeps them.
- `written_out` (a terminal's lines, and ids on a page): also every control character (a line
  break, a tab, BEL, ESC: a terminal acts on them, so a stored title could ring, recolour the
  screen or fake a line of output) and the line and paragraph separators. On a page an id is
  told apart by them ("sa x" and "sa<TAB>x" are two rows).
"""

from __future__ import annotations

import re
import shlex
import sys
import unicodedata
from functools import cache

# The joiners some scripts and emoji need and the plain direction marks of right-to-left text:
# shown as they are, and taken in an API token's name too (console/tokens.py).
KEPT_FORMAT = frozenset("\u200c\u200d\u200e\u200f\u061c")


@cache
def _format_chars() -> str:
    """The format characters written out, from the Unicode database (read once per process)."""
    return "".join(chr(code) for code in range(0x80, sys.maxunicode + 1)
                   if unicodedata.category(chr(code)) == "Cf" and chr(code) not in KEPT_FORMAT)


@cache
def _hidden(controls: bool) -> re.Pattern:
    """The characters written out, as one character class: found by the regular expression
    engine, so a tool's output of megabytes is checked in milliseconds. The control characters
    (Cc) and the line and paragraph separators are these few ranges in every Unicode version."""
    extra = "\x00-\x1f\x7f-\x9f\u2028\u2029" if controls else ""
    return re.compile(f"[{re.escape(_format_chars())}{extra}\ud800-\udfff]")


def _written(text: str, controls: bool) -> str:
    return _hidden(controls).sub(lambda found: f"[U+{ord(found.group()):04X}]", text)


def visible_format(value) -> str:
    """A stored name with its invisible format characters and lone surrogates written out:
    "Invoice <U+202E>FDP.exe" reads "Invoice [U+202E]FDP.exe", not "Invoice exe.PDF"."""
    text = str(value)
    return text if text.isascii() else _written(text, False)


def written_out(value) -> str:
    """Text for a terminal or an id on a page: also its control characters written out, so
    "Bell<BEL> esc<ESC>[31mred" reads "Bell[U+0007] esc[U+001B][31mred" and a line break in a
    stored title cannot start a line of its own."""
    text = str(value)
    return text if text.isascii() and text.isprintable() else _written(text, True)


def shell_word(value: str) -> str:
    """An id as one word to paste into a shell (bash, zsh): as it is when plain, quoted when it
    holds what a shell reads (a space, a quote, $), and in $'...' with escapes when it holds a
    character written_out writes out (a tab, a line break, a direction mark), which a terminal
    would not show as itself."""
    if written_out(value) == value:
        return shlex.quote(value)
    return "$'" + "".join(_shell_escape(ch) for ch in value) + "'"


def _shell_escape(ch: str) -> str:
    if ch in "\\'":
        return "\\" + ch
    if written_out(ch) == ch:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
