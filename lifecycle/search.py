"""Conversation search: one Python folding of text, the same on SQLite and PostgreSQL.

The databases disagree on case (SQLite's LIKE folds ASCII only) and neither ignores
accents without an extension, so the folding happens here: the title and the thread id are
folded into `Conversation.search_title` and `Conversation.search_thread` on every write, the
query is folded the same way, and the database only does a plain substring match on
already-folded text. The folded title is content (it is erased with the title); the folded
thread id is identity, like the thread id itself.

Folding: full Unicode case folding (so `ß` and `ss` match, and `Σ`, `σ`, `ς` match each
other), compatibility decomposition (`ﬁ` is `fi`, full-width letters are plain ones), and
accents removed (the combining diacritical marks, so `École` is `ecole` and `ελληνικά` is
`ελληνικα`), and the few Latin letters whose accent is drawn into the letter spelled out
(`ø` is `o`, `ł` is `l`, `œ` is `oe`). Marks that change a letter in other scripts
(Japanese voicing marks, Indic vowel signs, Hebrew points) are kept, so `が` does not match
`か`. The default-ignorable code points (Unicode's Default_Ignorable_Code_Point: the soft
hyphen, zero-width spaces and joiners, the byte order mark, direction marks, embeddings and
isolates, variation selectors, tags) are dropped: nothing shows them, so `Pro<U+200B>ject`
is `project` and a pasted query with a zero-width joiner inside finds the plain title (r123).
An emoji sequence is folded to its emoji without the joiners, the same for the title and the
query.

When the folding changes, a data migration folds the stored columns again (0028).
"""

from __future__ import annotations

import re
import unicodedata

# Combining diacritical marks and their supplements and extensions: the "accents".
_ACCENT_RANGES = ((0x0300, 0x036F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1DFF), (0x20D0, 0x20FF), (0xFE20, 0xFE2F))


# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt), unassigned ones included:
# invisible, so not part of what anyone types or reads. Not every format character (Cf) is one:
# the Arabic number signs (U+0600...) are drawn.
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)

# Letters with a stroke or ligatures that have no decomposition, folded the way people type them.
_SPELLED = str.maketrans({"ø": "o", "ł": "l", "đ": "d", "ħ": "h", "ŧ": "t", "ı": "i", "œ": "oe", "æ": "ae"})


def _is_accent(char: str) -> bool:
    point = ord(char)
    return any(low <= point <= high for low, high in _ACCENT_RANGES)


def fold(text: str) -> str:
    """Text as search compares it: case-folded, compatibility-decomposed, without accents or
    default-ignorable code points, every run of white space one space."""
    folded = _IGNORABLE.sub("", unicodedata.normalize("NFKD", text)).casefold().translate(_SPELLED)
    decomposed = unicodedata.normalize("NFKD", folded)
    kept = "".join(c for c in decomposed if not _is_accent(c))
    return " ".join(unicodedata.normalize("NFC", kept).split())
