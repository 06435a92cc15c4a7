"""Django reads `{# ... #}` as a comment only on one line: one spread over lines is printed
on the page (the delete operation page showed one, in English on Spanish pages too)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_no_template_has_a_comment_spread_over_lines():
    found = []
    for path in sorted((ROOT / "templates").rglob("*.html")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            rest = line
            while "{#" in rest:
                rest = rest.split("{#", 1)[1]
                if "#}" not in rest:
                    found.append(f"{path.relative_to(ROOT)}:{number}")
                    break
                rest = rest.split("#}", 1)[1]
    assert not found, "use {% comment %} for these: " + ", ".join(found)
