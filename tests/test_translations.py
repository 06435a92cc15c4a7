"""Spanish is complete: every string in the sources has a translation, and the compiled
catalog that ships in the repository matches the .po file it was built from."""

from __future__ import annotations

import gettext
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import translation

ROOT = Path(__file__).resolve().parent.parent
# The project's own apps, derived from INSTALLED_APPS so a new app's strings are checked too.
SOURCES = (*(app for app in settings.INSTALLED_APPS if (ROOT / app).is_dir()), "templates", "static", "locale")
SOURCE_FILES = ("manage.py", "pyproject.toml")
ES_PO = ROOT / "locale" / "es" / "LC_MESSAGES" / "django.po"
ES_MO = ROOT / "locale" / "es" / "LC_MESSAGES" / "django.mo"


# ---- A small .po reader ------------------------------------------------------------------

_ESCAPES = {
    "n": "\n",
    "t": "\t",
    "r": "\r",
    '"': '"',
    "\\": "\\",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
}
_KEYWORD = re.compile(r'^(msgctxt|msgid_plural|msgid|msgstr(?:\[(\d+)\])?)\s+"(.*)"\s*$')
_CONTINUATION = re.compile(r'^"(.*)"\s*$')


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), text)


@dataclass
class Entry:
    msgid: str = ""
    msgctxt: str | None = None
    msgid_plural: str | None = None
    msgstr: dict[int, str] = field(default_factory=dict)
    flags: set[str] = field(default_factory=set)
    line: int = 0

    @property
    def is_header(self) -> bool:
        return self.msgid == "" and self.msgctxt is None

    @property
    def is_fuzzy(self) -> bool:
        return "fuzzy" in self.flags

    @property
    def is_untranslated(self) -> bool:
        return not self.msgstr or any(value == "" for value in self.msgstr.values())

    def label(self) -> str:
        context = f"[{self.msgctxt}] " if self.msgctxt is not None else ""
        return f"{context}{self.msgid!r} (line {self.line})"


def parse_po(path: Path) -> list[Entry]:
    """Entries of a .po file, in order; obsolete (#~) entries are left out."""
    entries: list[Entry] = []
    current: Entry | None = None
    flags: set[str] = set()
    target: tuple[str, int | None] | None = None

    def value(entry: Entry, key: tuple[str, int | None], text: str) -> None:
        name, index = key
        if name == "msgstr":
            entry.msgstr[index or 0] = entry.msgstr.get(index or 0, "") + text
        elif name == "msgid":
            entry.msgid += text
        else:
            setattr(entry, name, (getattr(entry, name) or "") + text)

    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("#,"):
                flags |= {flag.strip() for flag in line[2:].split(",") if flag.strip()}
            continue  # references, comments, previous msgids and obsolete entries
        keyword = _KEYWORD.match(line)
        if keyword:
            name, index, text = keyword.group(1), keyword.group(2), keyword.group(3)
            if name.startswith("msgstr"):
                name, key_index = "msgstr", int(index) if index is not None else None
            else:
                key_index = None
            # A new entry starts at its msgctxt, or at a msgid not preceded by a msgctxt.
            starts = name == "msgctxt" or (
                name == "msgid" and (target is None or target[0] != "msgctxt")
            )
            if starts:
                current = Entry(flags=flags, line=number)
                entries.append(current)
                flags = set()
            if current is None:
                raise ValueError(f"{path}:{number}: {name} outside an entry")
            target = (name, key_index)
            if name == "msgctxt":
                current.msgctxt = ""
            value(current, target, _unescape(text))
            continue
        continuation = _CONTINUATION.match(line)
        if continuation and current is not None and target is not None:
            value(current, target, _unescape(continuation.group(1)))
            continue
        raise ValueError(f"{path}:{number}: cannot read {raw!r}")
    return entries


def _header(entries: list[Entry]) -> dict[str, str]:
    header = next(e for e in entries if e.is_header)
    pairs = (line.split(":", 1) for line in header.msgstr.get(0, "").splitlines() if ":" in line)
    return {key.strip(): val.strip() for key, val in pairs}


# ---- Tests -------------------------------------------------------------------------------


@pytest.fixture
def restore_language():
    yield
    translation.activate(settings.LANGUAGE_CODE)


def test_it_reads_po_files_with_context_plurals_and_continuations(tmp_path):
    po = tmp_path / "django.po"
    po.write_text(
        "\n".join(
            [
                "#, fuzzy",
                'msgid ""',
                'msgstr ""',
                '"Language: es\\n"',
                "",
                "#: a.py:1",
                "#, python-format",
                'msgid ""',
                '"Two "',
                '"lines %(n)s"',
                'msgstr "Dos \\"líneas\\" %(n)s"',
                "",
                'msgctxt "menu"',
                'msgid "Open"',
                'msgstr ""',
                "",
                "#, fuzzy, python-format",
                'msgid "%(counter)s file"',
                'msgid_plural "%(counter)s files"',
                'msgstr[0] "%(counter)s archivo"',
                'msgstr[1] ""',
                "",
                '#~ msgid "Old"',
                '#~ msgstr "Viejo"',
            ]
        ),
        encoding="utf-8",
    )
    header, lines, menu, plural = parse_po(po)
    assert header.is_header and header.is_fuzzy
    assert _header([header]) == {"Language": "es"}
    assert lines.msgid == "Two lines %(n)s"
    assert lines.msgstr == {0: 'Dos "líneas" %(n)s'}
    assert lines.flags == {"python-format"} and not lines.is_untranslated
    assert (menu.msgctxt, menu.msgid) == ("menu", "Open") and menu.is_untranslated
    assert plural.msgid_plural == "%(counter)s files"
    assert plural.is_fuzzy and plural.is_untranslated


def test_it_has_a_spanish_translation_for_every_string(tmp_path):
    copy = tmp_path / "src"
    copy.mkdir()
    for name in SOURCES:
        shutil.copytree(ROOT / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in SOURCE_FILES:
        shutil.copy2(ROOT / name, copy / name)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "console.settings_test"}
    env.pop("DATABASE_URL", None)
    env["LETHE_VAR_DIR"] = str(tmp_path / "var")
    env["ENGINE_HOME"] = str(tmp_path / "engine")

    result = subprocess.run(
        [sys.executable, "manage.py", "makemessages", "-l", "es", "--no-obsolete", "--add-location", "file"],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr

    entries = parse_po(copy / "locale" / "es" / "LC_MESSAGES" / "django.po")
    strings = [e for e in entries if not e.is_header]
    assert strings, "makemessages found no strings at all"
    missing = [f"missing: {e.label()}" for e in strings if e.is_untranslated]
    fuzzy = [f"fuzzy:   {e.label()}" for e in strings if e.is_fuzzy and not e.is_untranslated]
    assert not missing + fuzzy, (
        "Strings without a reviewed Spanish translation (translate them in "
        "locale/es/LC_MESSAGES/django.po, then run compilemessages):\n" + "\n".join(missing + fuzzy)
    )


def test_it_ships_compiled_catalogs_matching_the_sources():
    entries = parse_po(ES_PO)
    header = _header(entries)
    assert header.get("Language") == "es"
    assert header.get("Plural-Forms") == "nplurals=2; plural=(n != 1);"
    assert "charset=UTF-8" in header.get("Content-Type", "")
    fuzzy = [e.label() for e in entries if e.is_fuzzy]
    assert not fuzzy, "Fuzzy entries in locale/es:\n" + "\n".join(fuzzy)
    for language in ("en", "es"):
        assert (ROOT / "locale" / language / "LC_MESSAGES" / "django.mo").is_file()

    with ES_MO.open("rb") as handle:
        catalog = gettext.GNUTranslations(handle)

    stale = []
    for entry in entries:
        if entry.is_header:
            continue
        if entry.msgid_plural is None:
            expected = entry.msgstr.get(0) or entry.msgid
            if entry.msgctxt is None:
                found = catalog.gettext(entry.msgid)
            else:
                found = catalog.pgettext(entry.msgctxt, entry.msgid)
            if found != expected:
                stale.append(f"{entry.label()}: .po {expected!r}, .mo {found!r}")
            continue
        for n, index, fallback in ((1, 0, entry.msgid), (2, 1, entry.msgid_plural)):
            expected = entry.msgstr.get(index) or fallback
            if entry.msgctxt is None:
                found = catalog.ngettext(entry.msgid, entry.msgid_plural, n)
            else:
                found = catalog.npgettext(entry.msgctxt, entry.msgid, entry.msgid_plural, n)
            if found != expected:
                stale.append(f"{entry.label()} n={n}: .po {expected!r}, .mo {found!r}")
    assert not stale, (
        "locale/es/LC_MESSAGES/django.mo does not match django.po; run compilemessages:\n"
        + "\n".join(stale)
    )


def test_it_serves_spanish_when_the_browser_asks(admin_client, restore_language):
    response = admin_client.get("/conversations/", HTTP_ACCEPT_LANGUAGE="es", HTTP_HOST="127.0.0.1")
    page = response.content.decode()
    assert response.status_code == 200
    assert '<html lang="es"' in page
    assert "Conversaciones" in page
    # Each language's name is in its own language, and marked so (r119: "English" on a Spanish
    # page was read with Spanish rules)
    assert '<option value="en" lang="en">English</option>' in page
    assert '<option value="es" lang="es" selected>Español</option>' in page

    cookie = settings.LANGUAGE_COOKIE_NAME
    response = admin_client.post(
        "/i18n/setlang/", {"language": "es", "next": "/conversations/"}, HTTP_HOST="127.0.0.1"
    )
    assert response.status_code == 302
    assert response.cookies[cookie].value == "es"
    page = admin_client.get("/conversations/", HTTP_HOST="127.0.0.1").content.decode()
    assert '<html lang="es"' in page
    assert "Conversaciones" in page

    response = admin_client.post(
        "/i18n/setlang/", {"language": "en", "next": "/conversations/"}, HTTP_HOST="127.0.0.1"
    )
    assert response.status_code == 302
    assert response.cookies[cookie].value == "en"
    # The cookie wins over the browser's preference.
    page = admin_client.get(
        "/conversations/", HTTP_ACCEPT_LANGUAGE="es", HTTP_HOST="127.0.0.1"
    ).content.decode()
    assert '<html lang="en"' in page
    assert "Conversations" in page
    assert "Conversaciones" not in page


def test_one_english_word_with_two_meanings_gets_the_glossarys_two_spanish_words():
    """"Search" as the list's field label is "Buscar"; as a tool kind, "Búsqueda" (GLOSSARY-es)."""
    from django.template import Context, Template

    from lifecycle.models import ToolKind

    with translation.override("es"):
        label = Template('{% load i18n %}{% translate "Search" context "field label" %}').render(Context())
        assert (label, str(ToolKind.SEARCH.label)) == ("Buscar", "Búsqueda")


@pytest.mark.django_db
def test_figures_are_grouped_as_the_readers_language_writes_them(admin_client, restore_language):
    """The delete preview's billing period (2,555 days by default): grouped per language."""
    from tests import factories

    conversation = factories.make_conversation()
    url = f"/conversations/{conversation.public_id}/delete/"
    english = admin_client.get(url, HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="en").content.decode()
    assert "kept for 2,555 days" in english and "2555" not in english
    spanish = admin_client.get(url, HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "2\xa0555" in spanish and "2555" not in spanish  # Django's Spanish format groups with a no-break space
