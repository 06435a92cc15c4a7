"""Properties of the tool payload reducer over arbitrary JSON payloads of every kind: it never
crashes, what the write path measures is what apply removes (canonical sizes), apply is
idempotent, and every field it keeps is unchanged. The database round trip of numbers is
checked against the real database too."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle.models import ToolKind
from retention.reducer import (
    EDIT_CHANGE_FIELDS,
    MARKER_KEY,
    REMOVED_FIELDS,
    Skip,
    apply,
    encode,
    encoded_size,
    measure_item,
    normalize,
    plan,
)

clean_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)
scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=10**18, max_value=10**40)
           | st.floats(allow_nan=False, allow_infinity=False) | clean_text)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(clean_text, children, max_size=4),
    max_leaves=25,
)
KINDS = sorted({*ToolKind.values, "unknown_kind"})
field_names = st.sampled_from(sorted({f for fs in REMOVED_FIELDS.values() for f in fs}
                                     | {"command", "path", "url", "query", "exit_code", "tool_name"})) | clean_text
changes = st.lists(
    st.dictionaries(st.sampled_from([*EDIT_CHANGE_FIELDS, "path", "start_line"]) | clean_text, json_values, max_size=5)
    | json_values,
    max_size=3,
)
payloads = (
    st.dictionaries(field_names, json_values, max_size=6)
    | st.builds(lambda base, ch: {**base, "changes": ch}, st.dictionaries(field_names, json_values, max_size=4), changes)
    | json_values
)
times = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2999, 12, 31), timezones=st.just(UTC))


def _kept(kind: str, payload: dict) -> dict:
    removed = set(REMOVED_FIELDS.get(kind, ()))
    kept = {k: v for k, v in payload.items() if k not in removed}
    if kind == "edit_file" and isinstance(payload.get("changes"), list):
        kept["changes"] = [{k: v for k, v in c.items() if k not in EDIT_CHANGE_FIELDS} for c in payload["changes"]]
    return kept


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(KINDS), payloads, times, st.sampled_from(["sqlite", "postgresql"]))
def test_plan_and_apply_agree_to_the_byte_and_never_crash(kind, raw, removed_at, vendor):
    payload = normalize(raw, vendor=vendor)
    size, removable, skip = measure_item(kind, payload)
    assert skip in (*Skip.ALL, "")
    result = plan(kind, payload)
    if skip:
        assert removable == 0 and result.skip == skip
        with pytest.raises(ValueError, match=skip):
            apply(kind, payload, removed_at=removed_at)
        return
    reduced, applied = apply(kind, payload, removed_at=removed_at)
    # What the write path stored is what apply removes, marker included.
    assert size == encoded_size(payload)
    assert removable == applied.removed_bytes == encoded_size(payload) - encoded_size(reduced) > 0
    # Idempotent: the second plan skips it.
    assert plan(kind, reduced).skip == Skip.ALREADY_REMOVED
    # Kept fields unchanged (as canonical JSON, so 1 and 1.0 and True stay apart).
    marker = reduced.pop(MARKER_KEY)
    assert encode(reduced) == encode(_kept(kind, payload))
    assert marker["removed_at"] == removed_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert len(marker["removed_fields"]) == len(set(marker["removed_fields"])) > 0
    # A reduced payload holds nothing the stored form would change.
    assert normalize(reduced, vendor=vendor) == reduced


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_normalizing_is_stable(value):
    once = normalize(value, vendor="postgresql")
    assert encode(normalize(once, vendor="postgresql")) == encode(once)


@pytest.mark.django_db
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False) | st.integers(min_value=-10**30, max_value=10**30),
                max_size=6))
def test_normalize_predicts_what_the_database_gives_back(numbers):
    """What is stored is `normalize(payload)` (what sizes are measured on), the same on both
    engines: the real database gives it back unchanged, and PostgreSQL's jsonb gives exactly
    it back for the payload as sent too."""
    from lifecycle.models import Item

    field = Item._meta.get_field("payload")
    payload = {"n": numbers}
    stored = normalize(payload, vendor=connection.vendor)
    assert encode(stored) == encode(normalize(payload, vendor="sqlite"))  # one form on every engine
    cast = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    sent = [stored, payload] if connection.vendor == "postgresql" else [stored]
    for value in sent:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {cast}", [field.get_db_prep_value(value, connection)])
            back = field.from_db_value(cursor.fetchone()[0], None, connection)
        assert encode(back) == encode(stored)
