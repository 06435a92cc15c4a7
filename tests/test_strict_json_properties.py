"""Properties of the strict JSON reader: it never crashes, refuses only with known codes, and
gives back exactly what a well-formed body holds."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from console.api import ApiError, loads_strict

CODES = {"malformed_json", "duplicate_key", "invalid_number", "too_deep", "invalid_text"}

# Text a database can hold: no NUL, no lone surrogates.
clean_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | clean_text,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(clean_text, children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_it_never_crashes_on_arbitrary_bytes(raw):
    try:
        loads_strict(raw, max_depth=64)
    except ApiError as exc:
        assert exc.status == 400 and exc.code in CODES


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_it_never_crashes_on_arbitrary_text(text):
    try:
        loads_strict(text.encode("utf-8", "surrogatepass"), max_depth=64)
    except ApiError as exc:
        assert exc.code in CODES


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_it_gives_back_exactly_what_a_clean_body_holds(value):
    for raw in (json.dumps(value), json.dumps(value, ensure_ascii=False)):
        parsed = loads_strict(raw.encode("utf-8"), max_depth=64)
        assert json.dumps(parsed, sort_keys=True) == json.dumps(value, sort_keys=True)


@settings(max_examples=200, deadline=None)
@given(json_values, st.sampled_from(["\x00", "\ud800", "\udfff"]))
def test_it_refuses_any_text_a_database_cannot_hold(value, bad):
    raw = json.dumps({"ok": value, "bad": [f"a{bad}b"]})  # json.dumps escapes both as \uXXXX
    try:
        loads_strict(raw.encode(), max_depth=64)
    except ApiError as exc:
        assert exc.code == "invalid_text"
    else:
        raise AssertionError("accepted text with NUL or a lone surrogate")


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=300))
def test_it_refuses_nesting_past_the_limit_and_only_then(depth):
    raw = ("[" * depth + "]" * depth).encode()
    if depth <= 64:
        assert loads_strict(raw, max_depth=64) is not None
    else:
        try:
            loads_strict(raw, max_depth=64)
        except ApiError as exc:
            assert exc.code == "too_deep"
        else:
            raise AssertionError("accepted nesting past the limit")
