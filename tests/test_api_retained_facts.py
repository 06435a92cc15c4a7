"""GET|PUT /api/v1/system/retained-facts: the retained-fact periods, with the card's rules."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from lifecycle.models import AuditFact, RetainedFactsPolicy

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
URL = "/api/v1/system/retained-facts"
GOOD = {"audit_days": 30, "usage_days": 60, "billing_days": 3650, "revision": 1}


def put(client: Client, body) -> object:
    data = body if isinstance(body, str) else json.dumps(body)
    return client.put(URL, data=data, content_type="application/json")


def stored() -> tuple[int, int, int, int]:
    p = RetainedFactsPolicy.load()
    return p.audit_days, p.usage_days, p.billing_days, p.revision


def test_it_reads_and_saves_the_periods_with_an_audit_fact(api, admin_user):
    read = api.get(URL).json()
    assert {k: read[k] for k in ("audit_days", "usage_days", "billing_days", "revision")} == {
        "audit_days": 365, "usage_days": 400, "billing_days": 2555, "revision": 1}
    answer = put(api, GOOD)
    assert answer.status_code == 200
    assert answer.json()["revision"] == 2 and answer.json()["audit_days"] == 30
    assert stored() == (30, 60, 3650, 2)
    fact = AuditFact.objects.get(action="retained_facts_policy.saved")
    assert fact.actor == admin_user and fact.new_value == {"audit_days": 30, "usage_days": 60, "billing_days": 3650}
    # The same values again change nothing, not even the revision.
    assert put(api, {**GOOD, "revision": 2}).json()["revision"] == 2
    assert AuditFact.objects.filter(action="retained_facts_policy.saved").count() == 1


@pytest.mark.parametrize(("body", "code"), [
    ({**GOOD, "audit_days": 0}, "invalid_value"),
    ({**GOOD, "usage_days": 3651}, "invalid_value"),
    ({**GOOD, "billing_days": -1}, "invalid_value"),
    ({**GOOD, "audit_days": "30"}, "invalid_type"),
    ({**GOOD, "audit_days": 30.0}, "invalid_type"),
    ({**GOOD, "audit_days": True}, "invalid_type"),
    ({**GOOD, "audit_days": None}, "invalid_type"),
    ({**GOOD, "extra": 1}, "unknown_field"),
    ({**GOOD, "revision": 0}, "invalid_value"),
    ({**GOOD, "revision": 10**40}, "invalid_value"),
    ({k: v for k, v in GOOD.items() if k != "usage_days"}, "missing_field"),
    ('{"audit_days": 30, "audit_days": 31, "usage_days": 60, "billing_days": 90, "revision": 1}', "duplicate_key"),
    ('{"audit_days": NaN, "usage_days": 60, "billing_days": 90, "revision": 1}', None),
    ("[]", "invalid_body"),
])
def test_bad_input_is_refused_and_changes_nothing(api, body, code):
    answer = put(api, body)
    assert answer.status_code == 400
    if code:
        assert answer.json()["code"] == code
    assert stored() == (365, 400, 2555, 1)
    assert not AuditFact.objects.filter(action="retained_facts_policy.saved").exists()


def test_a_stale_revision_is_409_and_a_member_403(api, member_api):
    assert put(api, GOOD).status_code == 200
    stale = put(api, {**GOOD, "audit_days": 31, "revision": 1})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_revision"
    refused = put(member_api, {**GOOD, "audit_days": 32, "revision": 2})
    assert refused.status_code == 403
    assert member_api.get(URL).status_code == 200  # members read
    assert stored() == (30, 60, 3650, 2)
    # The same values again, read at revision 1 (a client that lost the first answer): no change, no refusal
    again = put(api, {**GOOD, "revision": 1})
    assert again.status_code == 200 and stored() == (30, 60, 3650, 2)


def test_the_published_description_names_the_expirys_real_interval(client):
    """The schema tells apps when a shorter period takes effect: at the next run of the expiry
    job, whose schedule is hourly (lifecycle.schedules), not daily."""
    from lifecycle.schedules import SCHEDULES

    assert SCHEDULES["lifecycle-expire-facts"]["minutes"] == 60
    doc = client.get("/v1/openapi.json", **HOST).json()
    description = doc["paths"][URL]["put"]["description"]
    assert "next hourly run" in description
    assert "daily" not in description
