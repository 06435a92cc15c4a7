from __future__ import annotations

import re

import pytest

from lifecycle.models import AuditFact, RetainedFactsPolicy
from retention.models import ToolPayloadPolicy

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}
PAGE = "/settings/system/data-storage/"
TOOL = PAGE + "tool-payload-cleanup/"
FACTS = PAGE + "retained-facts/"


def tool_form(**overrides):
    return {"age_value": "3", "age_unit": "months", "revision": "1", **overrides}


def facts_form(**overrides):
    return {"audit_days": "365", "usage_days": "400", "billing_days": "2555", "revision": "1", **overrides}


def test_it_shows_sizes_and_both_cards_with_defaults(admin_client):
    content = admin_client.get(PAGE, **HOST).content.decode()
    for text in ("Size on disk", "Reusable space", "Engine folder", "Tool payload cleanup", "Retained facts",
                 'data-contributor="tool"', 'data-contributor="facts"', 'id="save-bar"'):
        assert text in content, text
    assert ToolPayloadPolicy.load().enabled is False
    assert (RetainedFactsPolicy.load().audit_days, RetainedFactsPolicy.load().usage_days,
            RetainedFactsPolicy.load().billing_days) == (365, 400, 2555)
    ids = re.findall(r'\bid="([^"]+)"', content)
    assert not [i for i in set(ids) if ids.count(i) > 1]  # every id once (both forms have a revision)


def test_it_shows_members_a_read_only_page(member_client):
    content = member_client.get(PAGE, **HOST).content.decode()
    assert "Only admins can change them." in content
    assert 'id="save-bar"' not in content
    for control in ('name="enabled"', 'name="age_value"', 'name="age_unit"', 'name="audit_days"',
                    'name="usage_days"', 'name="billing_days"'):
        assert re.search(r"<(input|select)[^>]*" + control + r"[^>]*\bdisabled\b", content), control


def test_it_refuses_member_saves_and_changes_nothing(member_client):
    response = member_client.post(TOOL, tool_form(enabled="on"), **HOST)
    assert response.status_code == 403
    response = member_client.post(FACTS, facts_form(audit_days="30"), **HX)
    assert response.status_code == 403
    assert ToolPayloadPolicy.load().enabled is False
    assert RetainedFactsPolicy.load().audit_days == 365
    assert AuditFact.objects.count() == 0


def test_it_saves_the_tool_policy_with_an_audit_row(admin_client, admin_user):
    response = admin_client.post(TOOL, tool_form(enabled="on", age_value="6", age_unit="weeks", backup_choice="skip"),
                                 **HOST)
    assert response.status_code == 302
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value, policy.age_unit, policy.revision) == (True, 6, "weeks", 2)
    audit = AuditFact.objects.get(action="tool_payload_policy.saved")
    assert audit.actor == admin_user
    keys = ("enabled", "age_value", "age_unit")
    assert {k: audit.old_value[k] for k in keys} == {"enabled": False, "age_value": 3, "age_unit": "months"}
    assert {k: audit.new_value[k] for k in keys} == {"enabled": True, "age_value": 6, "age_unit": "weeks"}
    assert (audit.new_value["backup_choice"], policy.backup_choice) == ("skip", "skip")


def test_the_tool_forms_default_button_saves(admin_client):
    # Enter in a field presses the form's first submit button: Save, not Analyze savings.
    content = admin_client.get(PAGE, **HOST).content.decode()
    form = content[content.index('id="tool-form"'):]
    form = form[:form.index("</form>")]
    first = re.search(r"<button[^>]*>", form).group(0)
    assert 'type="submit"' in first and "formaction" not in first and "hx-post" not in first


def test_a_save_without_the_script_confirms_on_the_page_it_returns_to(admin_client):
    # A plain form post is answered with a redirect; the page it leads to says what was saved, once.
    response = admin_client.post(FACTS, facts_form(audit_days="31"), follow=True, **HOST)
    assert response.redirect_chain[-1][1] == 302
    assert response.content.decode().count("Retention periods saved.") == 1
    assert RetainedFactsPolicy.load().audit_days == 31
    again = admin_client.get(response.redirect_chain[-1][0], **HOST)
    assert "Retention periods saved." not in again.content.decode()


def test_it_returns_the_card_fragment_to_htmx(admin_client):
    response = admin_client.post(FACTS, facts_form(audit_days="30"), **HX)
    assert response.status_code == 200
    content = response.content.decode()
    assert content.strip().startswith('<section class="card" id="facts-card"')
    assert "Retention periods saved." in content and "<html" not in content
    assert RetainedFactsPolicy.load().audit_days == 30


@pytest.mark.parametrize(
    "bad",
    [
        {"age_value": "0"},
        {"age_value": "521", "age_unit": "weeks"},
        {"age_value": "121", "age_unit": "months"},
        {"age_value": "three"},
        {"age_unit": "days"},
        {"revision": ""},
    ],
)
def test_it_rejects_invalid_policy_input_and_saves_nothing(admin_client, bad):
    response = admin_client.post(TOOL, tool_form(enabled="on", **bad), **HX)
    assert response.status_code == 422
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value, policy.age_unit, policy.revision) == (False, 3, "months", 1)
    assert AuditFact.objects.count() == 0


@pytest.mark.parametrize("sent", [["off"], ["no"], ["false"], ["a\x00b"], ["on", "on"], ["on", ""], ["1"]])
def test_the_automatic_cleanup_switch_is_on_only_as_the_checkbox_sends_it(admin_client, sent):
    """r82: the switch took any word but "false" and "0" for on ("off" turned cleanup on)."""
    body = {**tool_form(backup_choice="skip"), "enabled": sent}
    response = admin_client.post(TOOL, body, **HX)
    assert response.status_code == 422
    html = response.content.decode()
    assert "The form arrived incomplete or altered, so nothing was changed." in html
    assert 'id="id_enabled">' in html  # shown as saved: off, not as the altered form had it
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.revision) == (False, 1) and AuditFact.objects.count() == 0


def test_the_switch_is_on_when_ticked_and_off_when_absent_or_empty(admin_client):
    assert admin_client.post(TOOL, tool_form(enabled="on", backup_choice="skip"), **HX).status_code == 200
    assert ToolPayloadPolicy.load().enabled is True
    assert admin_client.post(TOOL, tool_form(revision="2"), **HX).status_code == 200
    assert ToolPayloadPolicy.load().enabled is False
    assert admin_client.post(TOOL, tool_form(enabled="", revision="3", age_value="4"), **HX).status_code == 200
    assert (ToolPayloadPolicy.load().enabled, ToolPayloadPolicy.load().age_value) == (False, 4)


@pytest.mark.parametrize("field", ["age_unit", "backup_choice"])
@pytest.mark.parametrize("language", ["en", "es"])
def test_a_choice_not_offered_is_refused_without_repeating_it(admin_client, field, language):
    """r82: Django's message repeated the value sent: a megabyte came back whole, NUL and
    direction characters included."""
    admin_client.cookies["django_language"] = language
    sent = "a\x00b<i>x</i>\u202eRTL" + "A" * 1_000_000
    response = admin_client.post(TOOL, {**tool_form(enabled="on", backup_choice="skip"), field: sent}, **HX)
    assert response.status_code == 422
    html = response.content.decode()
    assert len(html) < 100_000 and "AAAA" not in html and "\u202e" not in html and "\x00" not in html
    said = {("age_unit", "en"): "Choose weeks or months.", ("age_unit", "es"): "Elija semanas o meses.",
            ("backup_choice", "en"): "Choose Create backup or Continue without backup.",
            ("backup_choice", "es"): "Elija Crear copia de seguridad o Continuar sin copia de seguridad."}
    assert said[field, language] in html
    assert (ToolPayloadPolicy.load().enabled, ToolPayloadPolicy.load().revision) == (False, 1)


@pytest.mark.parametrize("spelled", ["1_000", "+365", "365.0", " 365.0", "٣٦٥", "３６５", "3e2", "0x10"])
def test_a_number_the_api_refuses_is_refused_by_the_forms_too(admin_client, spelled):
    """The forms take whole numbers in ASCII digits only, as the API does: int() took "1_000",
    "+365", other scripts' digits, and Django "365.0", and saved them. (A whole number out of
    range, "-3" or 19 nines, gets the range message: tests/test_whole_number_field.py.)"""
    facts = admin_client.post(FACTS, facts_form(audit_days=spelled), **HX)
    tool = admin_client.post(TOOL, tool_form(enabled="on", age_value=spelled), **HX)
    assert (facts.status_code, tool.status_code) == (422, 422)
    assert "Enter a whole number." in facts.content.decode()
    assert RetainedFactsPolicy.load().audit_days == 365 and RetainedFactsPolicy.load().revision == 1
    assert (ToolPayloadPolicy.load().enabled, ToolPayloadPolicy.load().revision) == (False, 1)
    assert AuditFact.objects.count() == 0


def test_it_accepts_the_range_limits(admin_client):
    assert admin_client.post(TOOL, tool_form(age_value="520", age_unit="weeks"), **HX).status_code == 200
    assert admin_client.post(TOOL, tool_form(age_value="120", age_unit="months", revision="2"), **HX).status_code == 200
    assert (ToolPayloadPolicy.load().age_value, ToolPayloadPolicy.load().age_unit) == (120, "months")


def test_it_refuses_a_stale_revision(admin_client):
    admin_client.post(FACTS, facts_form(audit_days="100"), **HX)
    response = admin_client.post(FACTS, facts_form(audit_days="200"), **HX)
    assert response.status_code == 409
    assert "Someone else saved" in response.content.decode()
    assert RetainedFactsPolicy.load().audit_days == 100


def test_it_changes_nothing_when_saved_twice_with_the_same_values(admin_client):
    admin_client.post(FACTS, facts_form(usage_days="500"), **HX)
    admin_client.post(FACTS, facts_form(usage_days="500", revision="2"), **HX)
    assert RetainedFactsPolicy.load().revision == 2
    assert AuditFact.objects.filter(action="retained_facts_policy.saved").count() == 1


@pytest.mark.parametrize("card", ["facts", "tool"])
def test_a_form_sent_twice_without_the_script_is_one_save_and_no_error(admin_client, card):
    """r23: the second of two identical posts (a double click without the page's script) read
    revision 1 like the first: it answered 409 "Someone else saved these settings meanwhile",
    the answer the browser shows, after a save that worked. Equal values are no change and no
    refusal, whatever revision they were read at; different ones still are refused."""
    url, form = (FACTS, facts_form(audit_days="100")) if card == "facts" else (
        TOOL, tool_form(enabled="on", backup_choice="skip"))
    first, second = admin_client.post(url, form, **HOST), admin_client.post(url, form, **HOST)
    assert (first.status_code, second.status_code) == (302, 302)
    assert "Someone else saved" not in admin_client.get(PAGE, **HOST).content.decode()
    model, action = ((RetainedFactsPolicy, "retained_facts_policy.saved") if card == "facts"
                     else (ToolPayloadPolicy, "tool_payload_policy.saved"))
    assert model.load().revision == 2
    assert AuditFact.objects.filter(action=action).count() == 1
    changed = {**form, "audit_days": "200"} if card == "facts" else {**form, "age_value": "4"}
    assert admin_client.post(url, changed, **HX).status_code == 409
    assert model.load().revision == 2


def test_it_saves_each_card_independently(admin_client):
    bad = admin_client.post(TOOL, tool_form(age_value="0"), **HX)
    good = admin_client.post(FACTS, facts_form(billing_days="3000"), **HX)
    assert (bad.status_code, good.status_code) == (422, 200)
    assert RetainedFactsPolicy.load().billing_days == 3000
    assert ToolPayloadPolicy.load().revision == 1


def test_it_rejects_out_of_range_days(admin_client):
    for value in ("0", "3651", "-5"):
        assert admin_client.post(FACTS, facts_form(audit_days=value), **HX).status_code == 422
    assert RetainedFactsPolicy.load().audit_days == 365


def test_it_no_longer_says_it_stores_the_policy_only(member_client):
    content = member_client.get(PAGE, **HOST).content.decode()
    assert "stores the policy only" not in content and "not available yet" not in content
    assert "counts from when a conversation's delete completed" in content  # facts do expire now
    # The expiry runs hourly: the card says so, and nothing on the page calls it daily.
    assert "a job that runs every hour removes the facts" in content and "at the next hourly run" in content
    assert "daily job removes" not in content and "next daily run" not in content
    assert "Last cleanup" in content and "Never" in content


def test_what_shrinks_is_told_for_the_engine_in_use(admin_client):
    from django.db import connection

    page = admin_client.get(PAGE, **HOST).content.decode()
    if connection.vendor == "sqlite":
        # VACUUM rewrites the file: compaction is what shrinks it.
        assert "Compact database rewrites the file so it shrinks to what it holds." in page
        assert "The files seldom shrink" not in page
    else:
        # A plain VACUUM keeps the files' size: the page must not promise a smaller file.
        assert "rewrites the file" not in page and "only shrinks with Compact database" not in page
        assert "The files seldom shrink" in page and "its files seldom shrink" in page


def test_the_facts_card_names_the_console_audit_facts_that_are_recorded(admin_user):
    """A sign-in that succeeds records no audit fact; a failed one does. The card says which of
    the console's own audit facts expire, so it names failed sign-ins, not sign-ins."""
    from django.test import Client

    client = Client(REMOTE_ADDR="10.0.0.9")
    client.post("/accounts/login/", {"username": "alice", "password": "wrong"}, **HOST)
    assert list(AuditFact.objects.values_list("action", flat=True)) == ["login_failed"]
    assert client.post("/accounts/login/", {"username": "alice", "password": "pw-for-tests"},
                       **HOST).status_code == 302
    assert list(AuditFact.objects.values_list("action", flat=True)) == ["login_failed"]
    english = client.get(PAGE, **HOST).content.decode()
    assert "(failed sign-ins and lockouts, API tokens, settings changes)" in english
    assert "(sign-ins," not in english
    spanish = client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "(inicios de sesión fallidos y bloqueos, tokens de API, cambios de configuración)" in spanish


def test_reading_the_settings_writes_no_row(member_client, member_api, admin_client):
    """The policies' rows are made at migrate time; a page view, a status poll or an API read
    of a database without them (a restored partial copy, say) shows the defaults and writes
    nothing, and the first save creates the row."""
    from retention.models import StorageSnapshot

    ToolPayloadPolicy.objects.all().delete()
    RetainedFactsPolicy.objects.all().delete()
    StorageSnapshot.objects.all().delete()
    audits = AuditFact.objects.count()
    for client, url in ((member_client, PAGE), (member_client, PAGE + "status/"),
                        (admin_client, PAGE), (admin_client, PAGE + "status/")):
        response = client.get(url, HTTP_HX_REQUEST="true" if url.endswith("status/") else "", **HOST)
        assert response.status_code == 200, url
    for url in ("/api/v1/system/tool-payload-retention", "/api/v1/system/retained-facts"):
        response = member_api.get(url)
        assert response.status_code == 200, url
    assert member_api.get("/api/v1/system/retained-facts").json()["audit_days"] == 365
    assert (ToolPayloadPolicy.objects.count(), RetainedFactsPolicy.objects.count(),
            StorageSnapshot.objects.count(), AuditFact.objects.count()) == (0, 0, 0, audits)

    response = admin_client.post(FACTS, facts_form(audit_days="400"), **HOST)
    assert response.status_code in (200, 302)
    stored = RetainedFactsPolicy.objects.get(id=1)
    assert (stored.audit_days, stored.revision) == (400, 2)
    assert ToolPayloadPolicy.objects.count() == 0


def test_migrate_makes_the_policy_rows_with_their_defaults():
    import importlib

    from django.apps import apps

    ToolPayloadPolicy.objects.all().delete()
    RetainedFactsPolicy.objects.all().delete()
    for module in ("retention.migrations.0008_policy_row", "lifecycle.migrations.0016_facts_policy_row"):
        importlib.import_module(module).create_policy(apps, None)
        importlib.import_module(module).create_policy(apps, None)  # once only
    assert list(ToolPayloadPolicy.objects.values_list("id", "revision", "enabled", "age_value", "age_unit")) == [
        (1, 1, False, 3, "months")]
    assert list(RetainedFactsPolicy.objects.values_list("id", "revision", "audit_days")) == [(1, 1, 365)]


def test_a_remote_consoles_facts_card_names_the_deletes_it_asked_for(admin_client, settings):
    """A console of a remote engine records who asked for each delete as its own audit fact;
    the card names those among the facts that expire (an embedded console has none)."""
    assert "the deletes it asked the engine for" not in admin_client.get(PAGE, **HOST).content.decode()
    settings.ENGINE_URL = "http://127.0.0.1:9"
    english = admin_client.get(PAGE, **HOST).content.decode()
    assert "(failed sign-ins and lockouts, API tokens, settings changes, the deletes it asked the engine for)" in english
    assert "The conversations and their facts are on the engine" in english
    assert "Each period counts from when a conversation's delete completed" not in english  # not here
    spanish = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "las eliminaciones que pidió al motor)" in spanish


def test_a_remote_console_claims_no_engine_folder_of_its_own(admin_client, settings):
    """The engine folder is on the engine: the console's Database and Storage cards say so
    instead of measuring, checking or missing a folder it does not keep."""
    from django.utils import timezone

    from insight.models import Measurement

    Measurement.objects.update_or_create(id=1, defaults={"measured_at": timezone.now(), "engine_missing": True})
    local = admin_client.get(PAGE, **HOST).content.decode()
    assert "Not found when measured" in local and 'data-testid="engine-health"' in local
    settings.ENGINE_URL = "http://127.0.0.1:9"
    page = admin_client.get(PAGE, **HOST).content.decode()
    assert page.count("On the engine: this console keeps no engine folder of its own.") == 2
    assert "These figures are this console's own store." in page
    assert 'data-testid="insight-remote"' not in local
    for claim in ("Not found when measured", 'data-testid="engine-health"', "The fleet files read correctly",
                  "Engine files outside conversations"):
        assert claim not in page, claim
