"""Whole-number fields (console.fields.WholeNumberField) answer a whole number out of range
with the range message, in English and Spanish: "-3" and a 22-digit number said "Enter a whole
number." ("Introduzca un número entero."), though they are whole numbers; that message is for
what is not one. Checked on the forms that use the field and on the pages that show them (API
tokens, Data & storage), where nothing is saved; the commands read their --days the same way."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import translation

from console.fields import WholeNumberField
from console.models import ApiToken
from console.tokens import TokenForm
from lifecycle.models import AuditFact, RetainedFactsPolicy
from retention.forms import CancelForm, RetainedFactsForm, RunForm, ToolPayloadPolicyForm
from retention.models import ToolPayloadPolicy

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HUGE = str(10**22)

MESSAGES = {
    "en": {"low": "Ensure this value is greater than or equal to 1.",
           "high": "Ensure this value is less than or equal to 3650.",
           "weeks": "Choose from 1 to 520 weeks.",
           "invalid": "Enter a whole number.",
           "required": "This field is required."},
    "es": {"low": "Asegúrese de que este valor es mayor o igual a 1.",
           "high": "Asegúrese de que este valor es menor o igual a 3650.",
           "weeks": "El valor debe estar entre 1 y 520 semanas.",
           "invalid": "Introduzca un número entero.",
           "required": "Este campo es obligatorio."},
}
# value -> the message of a days field (1 to 3650) and of the cleanup period in weeks (1 to 520)
CASES = [
    ("-3", "low", "weeks"),
    ("0", "low", "weeks"),
    (HUGE, "high", "weeks"),
    ("-" + HUGE, "low", "weeks"),
    ("9" * 5000, "high", "weeks"),  # longer than int() reads: still a whole number, out of range
    ("3651", "high", "weeks"),
    ("1.5", "invalid", "invalid"),
    ("abc", "invalid", "invalid"),
    ("", "required", "required"),
]


def errors_of(form, field: str) -> list[str]:
    assert not form.is_valid()
    return form.errors[field]


@pytest.mark.parametrize("lang", ["en", "es"])
@pytest.mark.parametrize(("value", "days", "weeks"), CASES, ids=lambda v: str(v)[:8])
def test_each_form_gives_the_range_message_for_a_whole_number_out_of_range(lang, value, days, weeks):
    words = MESSAGES[lang]
    with translation.override(lang):
        assert errors_of(TokenForm({"name": "x", "days": value}), "days") == [words[days]]
        facts = RetainedFactsForm({"audit_days": value, "usage_days": "30", "billing_days": "30", "revision": "1"})
        assert errors_of(facts, "audit_days") == [words[days]]
        tool = ToolPayloadPolicyForm({"age_value": value, "age_unit": "weeks", "revision": "1"})
        assert errors_of(tool, "age_value") == [words[weeks]]


@pytest.mark.parametrize("value", ["1", "3650", "0042", " 7 "])
def test_a_whole_number_in_range_is_taken(value):
    form = TokenForm({"name": "x", "days": value})
    assert form.is_valid() and form.cleaned_data["days"] == int(value)


@pytest.mark.parametrize("value", ["+3", "1_000", "٣", "３", "3e2", "0x10", "- 3", "--3", "-"])
def test_what_the_api_would_not_read_as_a_whole_number_is_still_not_one(value):
    assert errors_of(TokenForm({"name": "x", "days": value}), "days") == ["Enter a whole number."]


def test_a_field_with_one_bound_gets_the_other_so_what_passes_fits_the_database():
    """The hidden revision and an operation's id name rows: a number beyond 64 bits is refused
    by its range (it reached the database before only because such numbers were "not whole")."""
    for form, field in ((RunForm({"revision": HUGE}), "revision"), (CancelForm({"operation_id": HUGE}), "operation_id")):
        assert errors_of(form, field) == ["Ensure this value is less than or equal to 999999999999999999."]
    assert WholeNumberField(min_value=1).max_value == 10**18 - 1
    unbounded = WholeNumberField()  # the cleanup period: its form checks the range, per unit
    assert unbounded.min_value is None and unbounded.clean("-" + "9" * 40) == -(10**18)


@pytest.mark.parametrize("lang", ["en", "es"])
@pytest.mark.parametrize(("value", "days", "weeks"), CASES, ids=lambda v: str(v)[:8])
def test_the_pages_say_it_and_save_nothing(admin_client, lang, value, days, weeks):
    words = MESSAGES[lang]
    ask = {"HTTP_ACCEPT_LANGUAGE": lang, **HOST}
    token = admin_client.post("/settings/api-tokens/", {"name": "x", "days": value, "form_number": "a" * 20}, **ask)
    assert token.status_code == 422 and words[days] in token.content.decode()
    facts = admin_client.post("/settings/system/data-storage/retained-facts/", {
        "audit_days": value, "usage_days": "400", "billing_days": "2555", "revision": "1"}, HTTP_HX_REQUEST="true", **ask)
    assert facts.status_code == 422 and words[days] in facts.content.decode()
    tool = admin_client.post("/settings/system/data-storage/tool-payload-cleanup/", {
        "age_value": value, "age_unit": "weeks", "revision": "1", "enabled": "on"}, HTTP_HX_REQUEST="true", **ask)
    assert tool.status_code == 422 and words[weeks] in tool.content.decode()
    if days != "invalid":  # a whole number is never said not to be one
        assert words["invalid"] not in token.content.decode() + facts.content.decode() + tool.content.decode()
    assert ApiToken.objects.count() == 0 and AuditFact.objects.count() == 0
    assert (RetainedFactsPolicy.load().audit_days, RetainedFactsPolicy.load().revision) == (365, 1)
    assert (ToolPayloadPolicy.load().enabled, ToolPayloadPolicy.load().revision) == (False, 1)


@pytest.mark.parametrize(("value", "said"), [("-3", "greater than or equal to 1"),
                                             (HUGE, "less than or equal to 3650")])
def test_the_commands_give_the_range_message_too(admin_user, value, said):
    for command in (["api_tokens", "create", "alice", "--name", "n"], ["create_api_token", "alice"]):
        with pytest.raises(CommandError, match=said):
            call_command(*command, f"--days={value}", stdout=StringIO())
    assert ApiToken.objects.count() == 0
