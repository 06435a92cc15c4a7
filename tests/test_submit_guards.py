"""A form pressed twice before its answer arrives (a double tap on a slow network) goes once
(r122: a double-pressed Close showed "It was already closed: nothing changed." and lost the
first press's own answer). Plain POST forms say data-submit-once (lethe.js drops a second
submit); htmx-driven actions drop a second press with hx-sync. The browser side is in
e2e/test_double_press.py."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Not actions: a save bar's card (saved by lethe.js, one save at a time), the language and
# time zone switches (the same choice sent twice is the same choice), signing in and out (a
# second sign-in or sign-out sent before the first one's answer does the same again).
EXEMPT = ("data-contributor", "language-switch", "{% url 'login' %}", "{% url 'logout' %}")


def test_every_post_form_and_htmx_action_goes_once():
    unguarded = []
    for path in sorted((ROOT / "templates").rglob("*.html")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        for form in re.findall(r"<form\b[^>]*>", text):
            if 'method="post"' not in form or any(word in form for word in EXEMPT):
                continue
            guard = "hx-sync" if "hx-post" in form else "data-submit-once"
            if guard not in form:
                unguarded.append(f"{where}: {form}")
        for button in re.findall(r"<button\b[^>]*hx-post[^>]*>", text):
            if "hx-sync" not in button:
                unguarded.append(f"{where}: {button}")
    assert not unguarded, unguarded
