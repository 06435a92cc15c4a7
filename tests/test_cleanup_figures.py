"""What the cleanup history, the Operations page and the restore instructions say, state by
state: figures only for an operation that finished with them; Analyze savings without the
script keeps the period it was sent with; commands shown as code.

Operations are made through `retention.service` and brought to each state as the job leaves
it (the row's state, slot and finish time; figures where an unfinished one may hold some).
"""

from __future__ import annotations

import re

import pytest
from django.utils import timezone, translation

from retention import service
from retention.backups import restore_instructions, restore_paragraphs
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests.test_cleanup_screens import ANALYZE, HOST, HX, PAGE, page, region, text_of
from tests.test_tool_payload_jobs import enable, old_conversation, run

pytestmark = pytest.mark.django_db
ES = {**HOST, "HTTP_ACCEPT_LANGUAGE": "es"}


def finish(op_id: int, state: str, **figures) -> None:
    """The operation as the job leaves it in that state (queued and running keep the slot)."""
    open_state = state in ("queued", "running")
    ToolPayloadOperation.objects.filter(pk=op_id).update(
        state=state, slot="busy" if open_state else None,
        started_at=None if state == "queued" else timezone.now(),
        finished_at=None if open_state else timezone.now(), **figures)


def history_rows(html: str) -> dict[int, str]:
    """Data & storage's history: each row's words, by operation id (newest first, as listed)."""
    rows = re.findall(r'<li class="history-row"[^>]*>(.*?)</li>', region(html, "cleanup-history"), re.S)
    ids = list(ToolPayloadOperation.objects.values_list("id", flat=True))  # -id, as the history
    return dict(zip(ids, (text_of(row) for row in rows), strict=True))


def operations_rows(html: str) -> dict[int, str]:
    """The Operations page's cleanup section: each row's words, by operation id."""
    section = html[html.index('id="cleanup-history"'):]
    rows = re.findall(r'<li class="op-row">(.*?)</li>', section, re.S)
    ids = list(ToolPayloadOperation.objects.values_list("id", flat=True))
    return dict(zip(ids, (text_of(row) for row in rows), strict=True))


def analysis(user, state: str, **figures) -> int:
    op_id = service.start_analysis(user=user, age_value=3, age_unit="months")
    finish(op_id, state, **figures)
    return op_id


# ---- Figures only for what finished with them ---------------------------------------------------


def test_analyses_without_a_result_show_no_figures_in_either_list(admin_client, admin_user):
    """Queued, running, cancelled (even part-way, with sums) and failed analyses have no
    result; completed ones show theirs, an empty one says so, a partial one says it is partial."""
    old_conversation("figures")
    done = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert done.state == "succeeded" and done.eligible_messages > 0
    empty = run(service.start_analysis(user=admin_user, age_value=120, age_unit="months"))
    assert (empty.state, empty.eligible_messages) == ("succeeded", 0)
    partial = analysis(admin_user, "partial", scanned=5, eligible_messages=7, payload_bytes=4096)
    cancelled = analysis(admin_user, "cancelled", scanned=5, eligible_messages=2, payload_bytes=2048)
    cancelled_early = analysis(admin_user, "cancelled")
    failed = analysis(admin_user, "failed", error_code="internal", error_message="The disk said no.")
    queued = analysis(admin_user, "queued")

    history = history_rows(page(admin_client))
    listing = operations_rows(admin_client.get("/operations/", **HOST).content.decode())
    for op_id in (cancelled, cancelled_early, failed, queued):
        assert " message" not in history[op_id] and "bytes" not in history[op_id], history[op_id]
        assert "eligible" not in listing[op_id] and "bytes" not in listing[op_id], listing[op_id]
    assert "Cancelled" in history[cancelled] and "Queued" in history[queued] and "Queued" in listing[queued]
    assert "The disk said no." in history[failed] and "The disk said no." in listing[failed]
    shown = f"{done.eligible_messages} messages eligible"
    assert shown in listing[done.pk] and f"in {done.eligible_messages} messages" in history[done.pk]
    assert "No eligible payloads." in history[empty.pk] and "No eligible payloads." in listing[empty.pk]
    assert "0 bytes" not in history[empty.pk] and "0 messages" not in listing[empty.pk]
    assert "4.0 KB in 7 messages (part of the data only)" in history[partial]
    assert "7 messages eligible, 4.0 KB (part of the data only)" in listing[partial]

    spanish = history_rows(admin_client.get(PAGE, **ES).content.decode())
    spanish_listing = operations_rows(admin_client.get("/operations/", **ES).content.decode())
    for op_id in (cancelled, cancelled_early, failed, queued):
        assert "mensaje" not in spanish[op_id] and "bytes" not in spanish[op_id], spanish[op_id]
        assert "elegible" not in spanish_listing[op_id] and "bytes" not in spanish_listing[op_id]
    assert "Cancelado" in spanish[cancelled] and "En cola" in spanish_listing[queued]
    assert "(solo una parte de los datos)" in spanish[partial]
    assert "No hay datos de herramientas que cumplan el periodo." in spanish_listing[empty.pk]


def test_runs_backups_and_compactions_without_a_result_show_no_figures(admin_client, admin_user):
    """A run queued, cancelled or failed before it removed anything says nothing was counted
    (never "0 removed"); one that removed some and stopped is partial, with its figures."""
    old_conversation("runs")
    enable(admin_user)
    revision = ToolPayloadPolicy.load().revision
    done = run(service.start_run(user=admin_user, revision=revision))
    assert done.state == "succeeded" and done.removed_messages > 0
    ops = {}
    for state in ("cancelled", "failed", "partial"):
        ops[state] = service.start_run(user=admin_user, revision=revision)
        finish(ops[state], state, error_code="cancelled", error_message="Stopped.",
               **({"removed_messages": 3, "payload_bytes": 3072} if state == "partial" else {}))
    ops["backup"] = service.start_compact(user=admin_user)
    finish(ops["backup"], "cancelled")
    ToolPayloadOperation.objects.filter(pk=ops["backup"]).update(kind="backup")
    ops["compact"] = service.start_compact(user=admin_user)
    finish(ops["compact"], "failed", before_bytes=4096, error_code="internal", error_message="No room.")
    ops["queued"] = service.start_run(user=admin_user, revision=revision)  # the newest: the card's last run

    html = page(admin_client)
    history = history_rows(html)
    listing = operations_rows(admin_client.get("/operations/", **HOST).content.decode())
    for key in ("cancelled", "failed", "queued"):
        assert "removed" not in history[ops[key]] and "cleaned" not in listing[ops[key]], key
    assert "3.0 KB removed from 3 messages" in history[ops["partial"]]
    assert "3 messages cleaned, 3.0 KB removed" in listing[ops["partial"]]
    assert f"{done.removed_messages} messages cleaned" in listing[done.pk]
    assert "→" not in history[ops["compact"]] and "4.0 KB" not in listing[ops["compact"]]
    assert "No room." in history[ops["compact"]]
    # The card's last run is the queued one: its state, no figures
    last = text_of(region(html, "tool-run"))
    assert "Queued" in last and "removed from" not in last
    ToolPayloadOperation.objects.filter(pk=ops["queued"]).delete()
    ToolPayloadOperation.objects.filter(pk=ops["partial"]).delete()
    ToolPayloadOperation.objects.filter(pk=ops["failed"]).delete()  # the cancelled run is now the last
    last = region(page(admin_client), "tool-run")
    assert "Cancelled" in text_of(last) and "removed from" not in last

    spanish = history_rows(admin_client.get(PAGE, **ES).content.decode())
    assert "eliminado" not in spanish[ops["cancelled"]].replace("Cancelada", "")


def test_the_api_keeps_its_documented_whole_number_figures(admin_client, admin_user):
    """The status document's figures are whole numbers in the published schema (clients may
    add them up): a queued analysis keeps 0 there, its state saying it has no result yet."""
    analysis(admin_user, "queued")
    doc = admin_client.get("/api/v1/system/tool-payload-retention", **HOST).json()
    entry = doc["history"][0]
    assert (entry["state"], entry["eligible_messages"], entry["payload_bytes"]) == ("queued", 0, 0)
    schema = admin_client.get("/v1/openapi.json", **HOST).json()["components"]["schemas"]["OperationDoc"]
    assert schema["properties"]["eligible_messages"]["type"] == "integer"
    assert "no result" in schema["properties"]["eligible_messages"]["description"]


# ---- Analyze savings without the script ---------------------------------------------------------


def tool_field(html: str) -> tuple[str, str]:
    value = re.search(r'<input type="number" name="age_value"[^>]*\svalue="([^"]*)"', html).group(1)
    unit = re.search(r'<select name="age_unit".*?<option value="(\w+)" selected>', html, re.S).group(1)
    return value, unit


def test_analyze_without_the_script_shows_the_period_it_was_sent_with_and_saves_nothing(admin_client, admin_user):
    old_conversation("draft")
    sent = {"age_value": "5", "age_unit": "weeks", "revision": "1", "enabled": "on"}
    response = admin_client.post(ANALYZE, sent, **HOST)
    assert response.status_code == 302 and response["Location"] == PAGE
    op = ToolPayloadOperation.objects.get()
    assert (op.kind, op.age_value, op.age_unit) == ("analysis", 5, "weeks")
    html = page(admin_client)
    assert tool_field(html) == ("5", "weeks")
    assert 'id="id_enabled" checked' in html
    note = text_of(region(html, "tool-analysis"))
    assert ("Not saved: the settings above are the ones Analyze savings was sent with; reloading the page shows "
            "the saved ones (a period of 3 months). Save cleanup policy keeps them.") in note
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value, policy.age_unit, policy.revision) == (False, 3, "months", 1)
    # Once: the page loaded again shows the saved policy, and says the estimate is for other settings
    run(op.pk)
    html = page(admin_client)
    assert tool_field(html) == ("3", "months") and 'id="id_enabled" checked' not in html
    analysis_region = region(html, "tool-analysis")
    assert "Not saved:" not in analysis_region and "Analyzed" in analysis_region and "5 weeks" in analysis_region
    assert re.search(r'id="analysis-draft-stale" data-testid="analysis-draft-stale">This estimate is for other '
                     r"settings than the ones above", analysis_region)
    # Analyzed again from the page with the draft shown: the estimate is for the period shown
    admin_client.post(ANALYZE, sent, **HOST)
    run(ToolPayloadOperation.objects.first().pk)
    html = page(admin_client)
    assert tool_field(html) == ("5", "weeks")
    assert 'data-testid="analysis-draft-stale" hidden>' in region(html, "tool-analysis")
    # Spanish
    admin_client.post(ANALYZE, sent, **HOST)
    spanish = text_of(region(admin_client.get(PAGE, **ES).content.decode(), "tool-analysis"))
    assert ("Sin guardar: los ajustes de arriba son con los que se envió Analizar ahorro; al recargar la página se "
            "muestran los guardados (un periodo de 3 meses). Guardar política de limpieza los conserva.") in spanish


def test_the_estimate_for_the_saved_period_has_no_other_settings_note(admin_client, admin_user):
    old_conversation("same")
    run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    analysis_region = region(page(admin_client), "tool-analysis")
    assert 'data-testid="analysis-draft-stale" hidden>' in analysis_region
    assert "Not saved:" not in analysis_region
    # The status read (the script's poll) marks it against the saved policy too
    run(service.start_analysis(user=admin_user, age_value=2, age_unit="weeks"))
    polled = admin_client.get(PAGE + "status/", **HX).content.decode()
    assert 'data-testid="analysis-draft-stale">' in polled


def test_analyze_with_the_script_or_refused_keeps_no_draft_for_later(admin_client, admin_user):
    old_conversation("script")
    sent = {"age_value": "5", "age_unit": "weeks", "revision": "1"}
    assert admin_client.post(ANALYZE, sent, **HX).status_code == 202
    assert tool_field(page(admin_client)) == ("3", "months")  # the script keeps its own draft
    # Refused (one operation at a time) without the script: the page answers with the draft at once
    refused = admin_client.post(ANALYZE, {**sent, "age_value": "6"}, **HOST)
    assert refused.status_code == 409
    html = refused.content.decode()
    assert "one operation runs at a time, so nothing new was started" in html and tool_field(html) == ("6", "weeks")
    assert "Not saved:" in html
    assert tool_field(page(admin_client)) == ("3", "months")
    assert ToolPayloadOperation.objects.count() == 1 and ToolPayloadPolicy.load().revision == 1


# ---- Restore instructions ---------------------------------------------------------------------


@pytest.mark.parametrize("language", ["en", "es"])
@pytest.mark.parametrize("vendor", ["sqlite", "postgresql"])
def test_restore_instructions_give_commands_apart_without_backticks(vendor, language):
    with translation.override(language):
        paragraphs = restore_paragraphs(vendor)
        plain = restore_instructions(vendor)
    commands = [part.text for paragraph in paragraphs for part in paragraph if part.code]
    expected = ["manage.py migrate", "manage.py verify_erasure --all"]
    if vendor == "postgresql":
        placeholders = ("<new database>", "<backup file>") if language == "en" else (
            "<base de datos nueva>", "<archivo de la copia>")
        expected.insert(0, "pg_restore --no-owner --dbname={} {}".format(*placeholders))
        # a restore into a new database is a copy, which takes the engine folder over (r30)
        expected.insert(2, "manage.py engine_folder --adopt --take-from-other-database")
    assert commands == expected
    assert "`" not in plain and all(command in plain for command in commands)
    assert not any("%(" in part.text for paragraph in paragraphs for part in paragraph)


@pytest.mark.django_db(transaction=True)
def test_the_page_shows_the_restore_commands_as_code(admin_client, settings, tmp_path):
    from django.db import connection

    from retention.backups import create_backup

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    create_backup()
    for headers, pg_command in ((HOST, "pg_restore --no-owner --dbname=&lt;new database&gt; &lt;backup file&gt;"),
                                (ES, "pg_restore --no-owner --dbname=&lt;base de datos nueva&gt; "
                                     "&lt;archivo de la copia&gt;")):
        backups = region(admin_client.get(PAGE, **headers).content.decode(), "backups")
        assert "`" not in backups
        # each word of a command kept whole (a line may break after a hyphen), a space between
        commands = [re.sub(r"</?span>", "", code) for code in
                    re.findall(r'<code class="command">((?:<span>[^<]+</span> ?)+)</code>', backups)]
        assert commands[-1] == "manage.py verify_erasure --all"
        assert (pg_command in commands) == (connection.vendor == "postgresql")
        assert backups.count("<p>") >= 4  # a paragraph each, not one run of text
