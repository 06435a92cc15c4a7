"""The tool payload cleanup card on Data & storage: every state, the actions, members.

States are built through `retention.service` and the job runner (`retention.jobs.run_operation`,
what the cluster runs), except where a state cannot be reached on demand (a failed or partial
operation, a failed backup): there the operation row is set as the job would leave it.
"""

from __future__ import annotations

import io
import json
import re

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection
from django.db.models import Sum
from django.template.defaultfilters import filesizeformat

from lifecycle.models import Item
from retention import service
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from retention.storage import database_size
from tests import factories
from tests.test_tool_payload_jobs import OLD, age, enable, old_conversation, run

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
HX = {"HTTP_HX_REQUEST": "true", **HOST}
PAGE = "/settings/system/data-storage/"
STATUS = PAGE + "status/"
TOOL = PAGE + "tool-payload-cleanup/"
ANALYZE, RUN, CANCEL = TOOL + "analyze/", TOOL + "run/", TOOL + "cancel/"
UNAVAILABLE = '<p class="alert alert-error">Current status unavailable.'
RETRY, CANCEL_PREP, COMPACT = TOOL + "retry/", TOOL + "cancel-preparation/", PAGE + "compact/"


def page(client) -> str:
    response = client.get(PAGE, **HOST)
    assert response.status_code == 200
    return response.content.decode()


def region(html: str, element_id: str) -> str:
    """The markup of one live region (up to the next region or the end)."""
    start = html.index(f' id="{element_id}"')
    following = [html.find(f' id="{other}"', start + 1) for other in
                 ("tool-analysis", "tool-run", "tool-poll", "db-compact", "backups", "cleanup-history")]
    ends = [i for i in following if i > start]
    return html[start:min(ends) if ends else len(html)]


def text_of(html: str) -> str:
    """The words of some markup, tags out and spaces collapsed."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).replace(" .", ".").replace(" :", ":").strip()


def state_of(html: str, element_id: str, attribute: str = "data-state") -> str:
    match = re.search(rf'id="{element_id}"[^>]*?{attribute}="([^"]*)"', html)
    assert match, (element_id, attribute)
    return match.group(1)


def removable_bytes() -> int:
    return Item.objects.filter(payload_skip="").aggregate(total=Sum("removable_bytes"))["total"] or 0


# ---- Analysis (UI-01, UI-03) ------------------------------------------------------------------


def test_it_shows_not_analyzed_never_run_and_no_polling_when_idle(admin_client):
    html = page(admin_client)
    assert state_of(html, "tool-analysis") == "none"
    assert "Estimate: not analyzed." in html
    run_region = region(html, "tool-run")
    assert "Never" in run_region and "Disabled" in run_region
    assert re.search(r'<button[^>]*formaction="/settings/system/data-storage/tool-payload-cleanup/run/"[^>]*disabled',
                     run_region)
    assert "Turn on automatic cleanup and save to run it." in run_region
    assert 'id="tool-poll" data-poll="0">' in html  # idle and off: no status reads at all
    assert "stores the policy only" not in html
    assert ToolPayloadOperation.objects.count() == 0  # opening the page starts nothing


def test_it_analyzes_the_unsaved_draft_without_saving_it(admin_client):
    old_conversation("draft")
    response = admin_client.post(ANALYZE, {"age_value": "2", "age_unit": "weeks", "enabled": "on",
                                           "revision": "1"}, **HX)
    assert response.status_code == 202 and response["HX-Reswap"] == "none"
    op = ToolPayloadOperation.objects.get()
    assert (op.kind, op.state, op.age_value, op.age_unit) == ("analysis", "queued", 2, "weeks")
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.age_value, policy.age_unit, policy.revision) == (False, 3, "months", 1)
    html = response.content.decode()
    assert 'id="tool-analysis"' in html and 'hx-swap-oob="true"' in html
    assert state_of(html, "tool-analysis") == "running"
    assert f'name="operation_id" value="{op.pk}"' in region(html, "tool-analysis")
    assert 'hx-trigger="every 1s"' in html  # something runs: read the status every second


def test_the_estimate_counts_one_conversation_as_one_in_english_and_spanish(admin_client, admin_user):
    """r15: each count has its own plural ("across 1 conversations" / "en 1 conversaciones")."""
    old_conversation("only")
    op = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert op.state == "succeeded" and op.eligible_conversations == 1 and op.eligible_messages == 4
    analysis = region(page(admin_client), "tool-analysis")
    assert "4 tool messages across 1 conversation<" in analysis and "1 conversations" not in analysis
    assert analysis.count("4 tool messages across 1 conversation") == 2  # shown, and said by the live region
    spanish = region(admin_client.get(PAGE, **HOST, HTTP_ACCEPT_LANGUAGE="es").content.decode(), "tool-analysis")
    assert "4 mensajes de herramienta en 1 conversación<" in spanish and "conversaciones" not in spanish


@pytest.mark.parametrize("kind", ["analysis", "cleanup"])
def test_progress_counts_one_as_one_in_english_and_spanish(admin_client, admin_user, kind):
    """r67: "0 of 1 conversations scanned" / "0 de 1 conversaciones revisadas" while running."""
    old_conversation("only")
    if kind == "analysis":
        op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
        shown, wrong = "0 of 1 conversation scanned.", "0 of 1 conversations scanned."
        spanish_shown = "0 de 1 conversación revisada."
    else:
        enable(admin_user, choice="skip")
        op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
        shown, wrong = "0 of 1 message processed.", "0 of 1 messages processed."
        spanish_shown = "0 de 1 mensaje procesado."
    ToolPayloadOperation.objects.filter(pk=op_id).update(state="running", progress_total=1, progress_done=0)
    english = text_of(page(admin_client))
    assert shown in english and wrong not in english
    spanish = text_of(admin_client.get(PAGE, **HOST, HTTP_ACCEPT_LANGUAGE="es").content.decode())
    assert spanish_shown in spanish


def test_a_completed_analysis_shows_the_exact_estimate_counts_and_cutoff(admin_client, admin_user):
    old_conversation("one")
    old_conversation("two")
    op = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert op.state == "succeeded" and op.payload_bytes == removable_bytes() > 0
    html = page(admin_client)
    assert state_of(html, "tool-analysis") == "completed"
    analysis = region(html, "tool-analysis")
    assert filesizeformat(op.payload_bytes) in analysis
    assert f"{op.eligible_messages} tool messages across 2 conversations" in analysis
    assert "Last active before" in analysis and f'data-bytes="{op.payload_bytes}"' in analysis
    assert "Skipped: protected (plans, to-dos, tasks, background work, monitors, structured tool output)" in analysis
    assert 'data-age-key="3-months"' in html


def test_an_analysis_with_nothing_old_enough_is_empty(admin_client, admin_user):
    old_conversation("recent", days=10)
    run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    html = page(admin_client)
    assert state_of(html, "tool-analysis") == "empty"
    assert "No eligible payloads." in html and "Estimated payload savings" not in html


def test_an_empty_analysis_with_old_protected_items_does_not_say_there_are_none(admin_client, admin_user):
    """Old tool items that cleanup leaves alone (protected kinds) are older than the period:
    the empty result says nothing older has details cleanup removes, not that nothing is older."""
    conversation = factories.make_conversation(title="only-protected")
    factories.add_tool(conversation, "plan", {"steps": ["a", "b"]}, tool_call_id="p-1")
    age(conversation, OLD)
    run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    html = page(admin_client)
    analysis = text_of(region(html, "tool-analysis"))
    assert state_of(html, "tool-analysis") == "empty"
    assert ("No eligible payloads. Nothing older than this period has details that cleanup removes, so it would "
            "remove nothing now.") in analysis
    assert "1 item skipped" in analysis and "No tool details are older" not in analysis


def test_saving_other_settings_marks_the_analysis_stale(admin_client, admin_user):
    old_conversation("stale")
    run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    service.save_policy(user=admin_user, enabled=False, age_value=5, age_unit="months", revision=1,
                        backup_choice=None)
    analysis = region(page(admin_client), "tool-analysis")
    assert "Stale:" in analysis and "Analyze again" in analysis


@pytest.mark.parametrize(("state", "shown", "absent"), [
    ("failed", "Analysis failed:", "Estimated payload savings"),
    ("partial", "Partial analysis: these figures cover only part of the data.", "Analysis failed"),
    ("cancelled", "Analysis cancelled.", "Estimated payload savings"),
])
def test_failed_partial_and_cancelled_analyses_never_look_complete(admin_client, admin_user, state, shown, absent):
    old_conversation("broken")
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    ToolPayloadOperation.objects.filter(pk=op_id).update(
        state=state, slot=None, error_code="internal", error_message="The disk said no.", eligible_messages=4)
    html = page(admin_client)
    analysis = region(html, "tool-analysis")
    assert state_of(html, "tool-analysis") == state
    assert shown in analysis and absent not in analysis
    if state != "cancelled":
        assert "The disk said no." in analysis
    assert ("Retry analysis" in analysis) == (state == "failed")


# ---- Backup preparation and runs (UI-02, UI-03) ------------------------------------------------


def test_the_backup_choice_is_offered_never_preselected_and_required(admin_client):
    html = page(admin_client)
    choice = html[html.index('id="backup-choice"'):html.index("</fieldset>", html.index('id="backup-choice"'))]
    assert 'value="create"' in choice and 'value="skip"' in choice and "checked" not in choice
    response = admin_client.post(TOOL, {"enabled": "on", "age_value": "3", "age_unit": "months", "revision": "1"}, **HX)
    assert response.status_code == 400
    assert "Choose Create backup or Continue without backup" in response.content.decode()
    assert ToolPayloadPolicy.load().enabled is False


def test_run_now_with_a_backup_shows_preparing_then_a_failed_backup_with_retry_and_cancel(admin_client, admin_user):
    old_conversation("prep")
    enable(admin_user, choice="create")
    html = page(admin_client)
    assert state_of(html, "tool-poll", "data-poll") == "30"  # on and idle: slow reads for the daily check
    response = admin_client.post(RUN, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    assert response.status_code == 202
    backup = ToolPayloadOperation.objects.get()
    assert backup.kind == "backup"
    html = response.content.decode()
    assert state_of(html, "tool-run", "data-prep") == "preparing"
    assert "Preparing backup:" in html and f'value="{backup.pk}"' in region(html, "tool-run")
    # The worker's backup fails: the job records it on the operation and the policy.
    ToolPayloadOperation.objects.filter(pk=backup.pk).update(state="failed", slot=None, error_code="backup_failed",
                                                             error_message="No space left for the backup.")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed",
                                                  preparation_error="No space left for the backup.")
    html = page(admin_client)
    run_region = region(html, "tool-run")
    assert state_of(html, "tool-run", "data-prep") == "failed"
    assert "Backup failed:" in run_region and "No space left for the backup." in run_region
    assert "Retry backup" in run_region and ">Cancel</button>" in run_region
    assert "The backup is not ready" in run_region  # and Run cleanup now waits
    response = admin_client.post(RETRY, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    assert response.status_code == 202
    assert ToolPayloadOperation.objects.filter(kind="backup", state="queued").count() == 1
    assert ToolPayloadPolicy.load().preparation_state == "preparing"
    # Run cleanup now waits for that backup, named (r15: it said "another operation")
    run_region = text_of(region(page(admin_client), "tool-run"))
    assert "The backup for cleanup is waiting to start; cleanup can run once it is verified." in run_region
    assert "Another operation" not in run_region
    ToolPayloadOperation.objects.filter(kind="backup").update(state="running")
    assert "The backup for cleanup is being made; cleanup can run once it is verified." in text_of(
        region(page(admin_client), "tool-run"))


def test_cancel_after_a_failed_backup_turns_cleanup_off_and_removes_nothing(admin_client, admin_user):
    old_conversation("prep")
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="cancelled")
    assert "Backup preparation cancelled." in page(admin_client)
    response = admin_client.post(CANCEL_PREP, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    assert response.status_code == 202
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.preparation_state) == (False, "none")
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()


def test_cancel_sent_twice_says_cancelled_twice_and_a_cancel_after_a_new_save_is_refused(admin_client, admin_user):
    """r23: the second of two Cancel posts (a double click without the page's script) said "The
    backup was started again meanwhile", and nothing had been started. It finds cleanup off as
    the first left it: the same answer. Once the settings were saved on again meanwhile there
    is nothing left to cancel, and it says so."""
    old_conversation("prep")
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed", preparation_error="Disk full.")
    shown = {"revision": str(ToolPayloadPolicy.load().revision)}
    first, second = admin_client.post(CANCEL_PREP, shown, **HOST), admin_client.post(CANCEL_PREP, shown, **HOST)
    assert (first.status_code, second.status_code) == (302, 302)
    html = page(admin_client)
    assert "started again" not in html and "Backup preparation cancelled: automatic cleanup is off" in html
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.preparation_state, policy.revision) == (False, "none", int(shown["revision"]) + 1)
    assert ToolPayloadOperation.objects.count() == 0

    enable(admin_user, choice="create")  # saved on again by someone: a new choice, nothing failed
    refused = admin_client.post(CANCEL_PREP, shown, **HX)
    assert refused.status_code == 409
    assert "No failed backup waits to be cancelled any more: it was retried, or the settings were saved, meanwhile." \
        in refused.content.decode()
    assert ToolPayloadPolicy.load().enabled is True
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()


def test_cancel_from_a_page_shown_before_another_admins_retry_leaves_the_backup_being_made(admin_client, admin_user):
    """Admin A retried the failed backup; admin B's page still offered Cancel for the failure.
    B's Cancel turned cleanup off and left A's backup running unseen: it is refused now."""
    from retention import service

    old_conversation("prep")
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed", preparation_error="Disk full.")
    shown_revision = ToolPayloadPolicy.load().revision
    backup = service.retry_preparation(user=admin_user)  # the other admin's Retry
    response = admin_client.post(CANCEL_PREP, {"revision": str(shown_revision)}, **HX)
    assert response.status_code == 409
    assert "The backup was started again meanwhile." in response.content.decode()
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.preparation_state) == (True, "preparing")
    assert ToolPayloadOperation.objects.get(pk=backup).state == "queued"
    assert "Preparing backup:" in region(page(admin_client), "tool-run")


def test_retry_from_a_page_shown_before_another_admins_cancel_starts_no_backup(admin_client, admin_user):
    """r134: admin B cancelled the failed backup (cleanup off, nothing removed); admin A's page
    still offered Retry, and A's Retry made a full backup nobody wanted then (every later delete
    named it as holding its conversation). Refused now, in words, with the page's status as it is."""
    old_conversation("prep")
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed", preparation_error="Disk full.")
    shown = str(ToolPayloadPolicy.load().revision)
    assert admin_client.post(CANCEL_PREP, {"revision": shown}, **HX).status_code == 202  # the other admin's Cancel
    response = admin_client.post(RETRY, {"revision": shown}, **HX)
    assert response.status_code == 409
    html = response.content.decode()
    assert "The backup preparation was cancelled or the settings were saved meanwhile, so no backup was started." \
        in html
    assert 'id="tool-run"' in html and "Retry backup" not in html  # the status as it is now: nothing to retry
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.preparation_state) == (False, "none")
    assert ToolPayloadOperation.objects.count() == 0
    spanish = admin_client.post(RETRY, {"revision": shown}, HTTP_ACCEPT_LANGUAGE="es", **HX)
    assert spanish.status_code == 409 and "no se inició ninguna copia de seguridad" in spanish.content.decode()
    # A page shown as things are now still retries (the backup is chosen, none is made).
    assert admin_client.post(RETRY, {"revision": str(policy.revision)}, **HX).status_code == 202
    assert ToolPayloadOperation.objects.get().kind == "backup"


def test_the_policy_form_sent_again_once_the_backup_is_made_keeps_it(admin_client, admin_user):
    """r108: Save cleanup policy sent twice (a double click without the page's script, or the
    form posted again), the second after the backup was made: it bumped the revision and dropped
    that backup, and Run cleanup now made a whole new one first. It changes nothing now."""
    old_conversation("made")
    form = {"enabled": "on", "age_value": "3", "age_unit": "months", "backup_choice": "create", "revision": "1"}
    assert admin_client.post(TOOL, form, **HOST).status_code == 302
    backup = service.start_run(user=admin_user, revision=2)
    receipt = "lethe-sqlite-20260101T000000Z-abcdef.sqlite3"  # as the backup job leaves it
    ToolPayloadOperation.objects.filter(pk=backup).update(state="succeeded", slot=None, backup_name=receipt)
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="ready", backup_receipt_name=receipt)
    for revision in ("1", "2"):  # the form sent again, and the same values from the page as shown now
        assert admin_client.post(TOOL, {**form, "revision": revision}, **HOST).status_code == 302
    policy = ToolPayloadPolicy.load()
    assert (policy.revision, policy.preparation_state, policy.backup_receipt_name) == (2, "ready", receipt)
    assert "Cleanup policy saved." in page(admin_client)
    assert admin_client.post(RUN, {"revision": "2"}, **HX).status_code == 202
    assert ToolPayloadOperation.objects.exclude(pk=backup).get().kind == "cleanup"


def test_cancel_after_a_failed_backup_with_cleanup_off_already_starts_the_preparation_over(admin_client, admin_user):
    """Cancel sends the stored choice again with the stored settings; cleanup off already (a Retry
    while it was off, which failed), that is still a new preparation, not a save that changes
    nothing (r108)."""
    enable(admin_user, choice="create")
    service.save_policy(user=admin_user, enabled=False, age_value=3, age_unit="months", revision=2,
                        backup_choice=None)
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed", preparation_error="Disk full.")
    response = admin_client.post(CANCEL_PREP, {"revision": "3"}, **HX)
    assert response.status_code == 202
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.preparation_state, policy.preparation_error, policy.revision) == (
        False, "none", "", 4)


def test_an_operation_no_worker_moves_is_said_to_have_stalled(admin_client, admin_user):
    """The job cluster was killed mid-run: within a minute or two the card says no worker has
    shown progress since the last batch (it said "Cleanup running" for the five minutes the
    readiness rule waits), and the API says `stalled` with the time."""
    import json as json_module
    from datetime import timedelta

    from django.utils import timezone

    from ops.models import JobStat

    old_conversation("stall")
    enable(admin_user, choice="skip")
    JobStat.objects.create(func="ops.jobs.heartbeat", runs=1, last_finished_at=timezone.now())  # a cluster ran
    admin_client.post(RUN, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    run = ToolPayloadOperation.objects.get()
    last = timezone.now() - timedelta(seconds=45)
    ToolPayloadOperation.objects.filter(pk=run.pk).update(state="running", started_at=last, heartbeat_at=last)
    assert 'data-testid="operation-stalled"' not in page(admin_client)  # within twice the lease
    last = timezone.now() - timedelta(seconds=90)
    ToolPayloadOperation.objects.filter(pk=run.pk).update(heartbeat_at=last)
    html = page(admin_client)
    note = region(html, "tool-status-note")
    assert 'data-testid="operation-stalled"' in note and "Cleanup: no worker has shown progress since" in note
    assert "It goes on where it stopped once a worker takes it." in note
    assert 'data-testid="cluster-stopped"' not in html
    # r26: a backup cut short does not go on (the run that takes it over marks it failed), a
    # compaction starts over, and one never taken starts: each note says its own.
    for kind, state, said in (
            ("backup", "running", "A backup cut short does not go on: once a worker takes it, it is marked failed"),
            ("compact", "running", "Once a worker takes it, the compaction starts over and finishes."),
            ("cleanup", "queued", "queued since")):
        ToolPayloadOperation.objects.filter(pk=run.pk).update(kind=kind, state=state)
        note = region(page(admin_client), "tool-status-note")
        assert said in note and "It goes on where it stopped" not in note, kind
    ToolPayloadOperation.objects.filter(pk=run.pk).update(kind="cleanup", state="running")
    doc = json_module.loads(admin_client.get("/api/v1/system/tool-payload-retention", **HOST).content)
    assert doc["operation"]["stalled"] is True and doc["operation"]["last_progress_at"]
    assert doc["history"][0]["stalled"] is True
    ToolPayloadOperation.objects.filter(pk=run.pk).update(state="succeeded", slot=None, finished_at=timezone.now())
    doc = json_module.loads(admin_client.get("/api/v1/system/tool-payload-retention", **HOST).content)
    assert (doc["history"][0]["stalled"], doc["history"][0]["last_progress_at"]) == (False, None)


def test_an_analysis_cancelled_before_it_measured_anything_is_not_called_partial_or_analyzed(admin_client,
                                                                                             admin_user):
    import json as json_module

    from django.utils import timezone

    from retention import service

    old_conversation("cancelled")
    op = service.start_analysis(user=admin_user, age_value=3, age_unit="weeks")
    ToolPayloadOperation.objects.filter(pk=op).update(state="cancelled", slot=None, finished_at=timezone.now())
    doc = json_module.loads(admin_client.get("/api/v1/system/tool-payload-retention", **HOST).content)
    assert doc["analysis_state"] == "not_analyzed"
    analysis = text_of(region(page(admin_client), "tool-analysis"))
    assert "Analysis cancelled." in analysis and "Analyzed" not in analysis and "Cancelled " in analysis
    ToolPayloadOperation.objects.filter(pk=op).update(scanned=1200, eligible_messages=5, payload_bytes=10)
    doc = json_module.loads(admin_client.get("/api/v1/system/tool-payload-retention", **HOST).content)
    # cancelled part-way: still no estimate, on the card and in the API alike (the API said
    # "partial" while the card said "No estimate")
    assert doc["analysis_state"] == "not_analyzed" and doc["last_analysis"]["state"] == "cancelled"
    analysis = region(page(admin_client), "tool-analysis")
    assert "<dd>1,200</dd>" in analysis and "No estimate" in text_of(analysis)
    # r26: no figure, and nothing calling it an estimate, for what gave none
    ToolPayloadOperation.objects.filter(pk=op).update(stale=True, skipped_json='{"protected": 7}')
    for state in ("cancelled", "failed"):
        ToolPayloadOperation.objects.filter(pk=op).update(state=state)
        analysis = text_of(region(page(admin_client), "tool-analysis"))
        for claim in ("Payload bytes, exact", "Stale:", "This estimate is", "skipped", "Estimated payload savings"):
            assert claim not in analysis, (state, claim)
        assert "Conversations scanned 1,200" in analysis, analysis

def test_a_run_shows_progress_with_cancel_then_completed_with_its_figures(admin_client, admin_user):
    old_conversation("run")
    expected = removable_bytes()
    enable(admin_user, choice="skip")
    response = admin_client.post(RUN, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    assert response.status_code == 202
    cleanup = ToolPayloadOperation.objects.get()
    html = response.content.decode()
    assert state_of(html, "tool-run", "data-run") == "running"
    assert "Cleanup queued:" in html and "Cancel run" in html and "Completed" not in region(html, "tool-run")
    run(cleanup.pk)
    html = page(admin_client)
    assert state_of(html, "tool-run", "data-run") == "succeeded"
    last = region(html, "tool-run")
    assert "Completed" in last and filesizeformat(expected) in last
    assert Item.objects.filter(details_removed_at__isnull=False).count() == cleanup.__class__.objects.get(
        pk=cleanup.pk).removed_messages > 0
    history = region(html, "cleanup-history")
    assert 'data-kind="cleanup" data-state="succeeded"' in history and "started by alice" in history


@pytest.mark.parametrize(("state", "label"), [("partial", "Partial"), ("failed", "Failed"), ("queued", "Queued")])
def test_partial_failed_and_pending_runs_are_never_shown_as_completed(admin_client, admin_user, state, label):
    old_conversation("odd")
    enable(admin_user, choice="skip")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    finished = state != "queued"
    ToolPayloadOperation.objects.filter(pk=op_id).update(
        state=state, slot=None if finished else "busy", error_code="internal" if finished else "",
        error_message="Stopped after 2 batches." if finished else "", eligible_messages=9, removed_messages=4)
    html = page(admin_client)
    run_region = region(html, "tool-run")
    assert label in run_region and "Completed" not in run_region
    if finished:
        assert "Stopped after 2 batches." in run_region and "5 remaining" in run_region
        # r26: the period saved since (the run ended policy_changed) leaves none of that work
        # under the saved policy: no "remaining" for it
        policy = ToolPayloadPolicy.load()
        ToolPayloadPolicy.objects.filter(pk=policy.pk).update(revision=policy.revision + 1, age_value=6)
        run_region = region(page(admin_client), "tool-run")
        assert label in run_region and "remaining" not in run_region


def test_a_run_that_stopped_part_way_says_how_far_it_went_and_what_it_counted_at_its_start(
        admin_client, admin_user, monkeypatch):
    """r47: a run disabled after its first conversation listed all of its conversations and
    the protected items of all of them as if it had gone through them."""
    from retention import jobs

    monkeypatch.setattr(jobs, "CONVERSATIONS_PER_BATCH", 1)
    for n in range(3):
        old_conversation(f"part-{n}")
    enable(admin_user, choice="skip")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    op = jobs._claim(op_id, "t")
    assert jobs._cleanup_batch(op, "t") == "next"
    policy = ToolPayloadPolicy.load()
    service.save_policy(user=admin_user, enabled=False, age_value=3, age_unit="months", revision=policy.revision,
                        backup_choice=None)
    assert jobs._cleanup_batch(op, "t") == "disabled"
    op.refresh_from_db()
    assert (op.state, op.scanned, op.eligible_conversations) == ("partial", 1, 3)
    note = region(page(admin_client), "run-details")
    assert "It stopped before its end: it went through 1 of its 3 conversations." in text_of(note)
    spanish = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "recorrió 1 de sus 3 conversaciones" in text_of(region(spanish, "run-details"))
    ToolPayloadOperation.objects.filter(pk=op.pk).update(state="succeeded", scanned=3)  # a finished run: no note
    assert 'data-testid="run-unfinished"' not in page(admin_client)


def test_unreadable_stored_state_promises_no_next_check(admin_client, admin_user):
    """r47: the card said nothing runs, and below it "Next check: When the job cluster next runs"."""
    enable(admin_user, choice="skip")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="weird")
    html = page(admin_client)
    next_check = re.search(r'data-testid="next-check">([^<]*)<', html).group(1)
    assert next_check == "None until the stored state can be read"
    spanish = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert re.search(r'data-testid="next-check">([^<]*)<', spanish).group(1) == (
        "Ninguna hasta que se pueda leer el estado guardado")


def test_an_enabled_policy_shows_the_next_check(admin_client, admin_user):
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import Schedule

    from retention import jobs

    enable(admin_user, choice="skip")
    # The job cluster ran the day's check a little while ago (the schedules are made when the
    # test database is, which may be more than a minute before this test: then "due" is true).
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=timezone.now() + timedelta(hours=23))
    next_check = re.search(r'data-testid="next-check">([^<]*)<', page(admin_client)).group(1)
    assert next_check and next_check != "Disabled" and "Due since" not in next_check


def test_a_check_past_its_time_is_shown_due_not_as_a_time_to_come(admin_client, admin_user):
    """The job cluster is stopped: the daily check's time passes without it running."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.models import Schedule

    from retention import jobs

    enable(admin_user, choice="skip")
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=timezone.now() - timedelta(hours=2))
    next_check = re.search(r'data-testid="next-check">([^<]*)<', page(admin_client)).group(1)
    assert next_check.startswith("Due since ") and next_check.endswith("it runs when the job cluster next runs")
    spanish = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "Pendiente desde" in re.search(r'data-testid="next-check">([^<]*)<', spanish).group(1)
    from tests.test_tool_payloads_command import command

    assert "(due: it runs when the job cluster next runs)" in command("status")


def test_a_queued_compaction_says_queued_not_compacting(admin_client, admin_user, settings):
    """No worker has taken it (the job cluster is stopped): it is not shown as under way, the
    page says the cluster seems stopped and that the work starts once it runs, and Run cleanup
    now is blocked by an operation waiting to start, not by one running."""
    from django.utils import timezone

    from ops.models import JobStat

    enable(admin_user, choice="skip")
    settings.READYZ_HEARTBEAT_SECONDS = 300
    response = admin_client.post(COMPACT, {}, **HX)
    assert response.status_code == 202
    op = ToolPayloadOperation.objects.get(kind="compact")
    assert op.state == "queued" and op.started_at is None
    for html in (response.content.decode(), page(admin_client)):
        compact = region(html, "db-compact")
        assert 'data-testid="compact-state" data-state="queued"' in compact
        assert "Compaction queued: it starts once the job cluster runs again." in text_of(compact)
        assert "Compacting the database" not in compact
        assert ("No job has finished recently: the job cluster seems to be stopped. Queued work, backups and the daily "
                "check start once it runs again.") in html
    shown = page(admin_client)
    assert "Compact database is waiting to start; one operation runs at a time." in shown
    assert "Another operation" not in shown and "is running" not in text_of(region(shown, "tool-run"))
    spanish = admin_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert 'data-testid="cluster-stopped"' in spanish and "No job has finished" not in spanish
    # A cluster that runs (a job finished within the limit): the plain wording, no note
    JobStat.objects.create(func="ops.jobs.heartbeat", runs=1, last_finished_at=timezone.now())
    shown = page(admin_client)
    assert "Compaction queued: it starts when a background worker is free." in text_of(region(shown, "db-compact"))
    assert 'data-testid="cluster-stopped"' not in shown
    ToolPayloadOperation.objects.filter(pk=op.pk).update(state="running", started_at=op.created_at)
    compact = region(page(admin_client), "db-compact")
    assert 'data-state="running"' in compact and "Compacting the database…" in compact


@pytest.mark.django_db(transaction=True)  # VACUUM runs outside any transaction
def test_compact_database_runs_as_a_job_with_before_and_after_sizes(admin_client):
    response = admin_client.post(COMPACT, {}, **HX)
    assert response.status_code == 202
    op = run(ToolPayloadOperation.objects.get(kind="compact").pk)
    assert op.state == "succeeded" and op.after_bytes is not None
    compact = region(page(admin_client), "db-compact")
    assert "Last compacted" in compact and "its size on disk went from" in compact
    assert ('data-testid="compact-grew"' in compact) == (op.after_bytes > op.before_bytes)
    # Files that grew (PostgreSQL's maps of free space, on a small database) are said to have, and why (r115)
    ToolPayloadOperation.objects.filter(pk=op.pk).update(before_bytes=12_400_000, after_bytes=13_500_000)
    grew = region(page(admin_client), "db-compact")
    assert 'data-testid="compact-grew"' in grew and "It grew: the compaction marks free space" in grew
    ToolPayloadOperation.objects.filter(pk=op.pk).update(before_bytes=op.before_bytes, after_bytes=op.after_bytes)
    # The status read that shows the result carries the database's figures read again, so
    # they do not stay at their size before the compaction beside it.
    from retention.storage import database_size

    status = admin_client.get(STATUS, **HX).content.decode()
    figures = region(status, "db-figures")
    assert 'id="db-figures" hx-swap-oob="true"' in status
    assert str(filesizeformat(database_size().file_bytes)) in figures


@pytest.mark.django_db(transaction=True)
def test_compact_database_without_room_on_the_disk_fails_and_says_why(admin_client, settings):
    if connection.vendor != "sqlite":
        pytest.skip("the free-space check is SQLite's (PostgreSQL's VACUUM writes no copy)")
    settings.DISK_RESERVE_BYTES = 2**62
    assert admin_client.post(COMPACT, {}, **HX).status_code == 202
    op = run(ToolPayloadOperation.objects.get(kind="compact").pk)
    assert (op.state, op.error_code, op.after_bytes) == ("failed", "no_space", None)
    assert json.loads(op.error_message)["msgid"].startswith("Compacting needs about")  # said when read
    compact = region(page(admin_client), "db-compact")
    assert "Failed" in compact and "Compacting needs about" in compact and "Last compacted" not in compact


# ---- Status reads and action errors (AC-003.7 to 003.9) ---------------------------------------


def test_a_failed_status_read_says_so_keeps_the_regions_and_clears_on_the_next_read(admin_client, monkeypatch):
    def unreadable():
        raise DatabaseError("the database is locked")

    real = service.status_document
    monkeypatch.setattr(service, "status_document", unreadable)
    response = admin_client.get(STATUS, **HX)
    assert response.status_code == 200 and response["HX-Reswap"] == "none"
    html = response.content.decode()
    assert UNAVAILABLE in html
    # Only the note is swapped: the last analysis and every other region stay as shown.
    for other in ("tool-analysis", "tool-run", "tool-poll", "tool-action-error", "cleanup-history"):
        assert f'id="{other}"' not in html
    assert UNAVAILABLE in page(admin_client)
    monkeypatch.setattr(service, "status_document", real)
    html = admin_client.get(STATUS, **HX).content.decode()
    assert UNAVAILABLE not in html and 'id="tool-status-note"' in html
    assert 'id="tool-analysis"' in html
    assert 'id="tool-action-error"' not in html  # a status read never touches an action's error


def test_an_action_error_has_its_own_region_with_the_service_message(admin_client, admin_user):
    enable(admin_user, choice="skip")
    response = admin_client.post(RUN, {"revision": "1"}, **HX)  # saved revision is 2
    assert response.status_code == 409
    html = response.content.decode()
    assert 'id="tool-action-error"' in html and "The settings changed meanwhile." in html
    assert 'id="tool-status-note"' not in html and 'id="tool-analysis"' not in html
    assert ToolPayloadOperation.objects.count() == 0


def test_a_busy_refusal_and_bad_input_change_nothing(admin_client, admin_user):
    service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    response = admin_client.post(ANALYZE, {"age_value": "3", "age_unit": "months"}, **HX)
    assert response.status_code == 409
    assert "An analysis is waiting to start; one operation runs at a time, so nothing new was started." in \
        response.content.decode()
    for bad in ({"age_value": "0", "age_unit": "months"}, {"age_value": "121", "age_unit": "months"},
                {"age_value": "x", "age_unit": "weeks"}, {"age_value": "3", "age_unit": "days"}):
        assert admin_client.post(ANALYZE, bad, **HX).status_code == 400
    assert admin_client.post(CANCEL, {"operation_id": "abc"}, **HX).status_code == 400
    assert admin_client.post(CANCEL, {"operation_id": "999999"}, **HX).status_code == 404
    assert ToolPayloadOperation.objects.count() == 1


def test_a_refusal_for_an_operation_the_page_did_not_show_starts_following_it(admin_client, admin_user):
    """Cleanup off and nothing running: the page does not poll. Another admin's analysis starts;
    this page's Compact is refused as busy, and its answer brings the status (the analysis
    waiting, its Cancel) and the poller, so the page follows it from then on (r100: it never
    showed it)."""
    from retention.views import POLL_BUSY

    page = admin_client.get(PAGE, **HOST).content.decode()
    assert 'id="tool-poll" data-poll="0"' in page
    other = factories.make_user("bea", admin=True)
    op_id = service.start_analysis(user=other, age_value=3, age_unit="months")
    refused = admin_client.post(COMPACT, {}, **HX)
    assert refused.status_code == 409
    said = refused.content.decode()
    assert "An analysis is waiting to start; one operation runs at a time, so nothing new was started." in said
    assert f'id="tool-poll" data-poll="{POLL_BUSY}" hx-get="/settings/system/data-storage/status/"' in said
    assert f'name="operation_id" value="{op_id}"' in said  # its Cancel, in the status brought along
    assert ToolPayloadOperation.objects.count() == 1


def test_compact_database_sent_twice_names_the_compaction_in_the_way(admin_client):
    """r23: the second of two Compact database posts said "Another cleanup operation is running.
    Wait for it to finish or cancel it": it was the admin's own compaction, which has no Cancel."""
    assert admin_client.post(COMPACT, {}, **HOST).status_code == 302
    second = admin_client.post(COMPACT, {}, **HX)
    assert second.status_code == 409
    said = second.content.decode()
    assert "Compact database is waiting to start; one operation runs at a time, so nothing new was started." in said
    ToolPayloadOperation.objects.filter(kind="compact").update(state="running")
    third = admin_client.post(COMPACT, {}, **HX)
    assert "Compact database is running; one operation runs at a time" in third.content.decode()
    assert ToolPayloadOperation.objects.filter(kind="compact").count() == 1


def test_plain_form_posts_work_without_javascript(admin_client, admin_user):
    response = admin_client.post(ANALYZE, {"age_value": "4", "age_unit": "weeks"}, **HOST)
    assert response.status_code == 302 and response["Location"] == PAGE
    response = admin_client.post(ANALYZE, {"age_value": "4", "age_unit": "weeks"}, **HOST)
    assert response.status_code == 409
    assert "one operation runs at a time, so nothing new was started" in region(response.content.decode(), "tool-action-error") or \
        "one operation runs at a time, so nothing new was started" in response.content.decode()


def test_each_plain_form_action_says_what_it_started(admin_client, admin_user):
    """r23: without the page's script, Analyze, Run, Cancel, Retry and Compact redirected back
    with no word: only the page's state, read later, told whether anything happened."""
    old_conversation("said")
    said = lambda response: [str(m) for m in admin_client.get(response["Location"], **HOST).context["messages"]]  # noqa: E731
    analysis = admin_client.post(ANALYZE, {"age_value": "4", "age_unit": "weeks"}, **HOST)
    assert said(analysis) == ["Analysis requested: it runs in the background. Reload this page to follow it."]
    op = ToolPayloadOperation.objects.get(kind="analysis")
    cancel = admin_client.post(CANCEL, {"operation_id": str(op.pk)}, **HOST)
    assert said(cancel) == ["Cancel requested: the operation stops at its next check. Reload this page to see it "
                            "stopped."]
    ToolPayloadOperation.objects.filter(pk=op.pk).update(state="cancelled", slot=None)  # as its job ends it
    compact = admin_client.post(COMPACT, {}, **HOST)
    assert said(compact) == ["Compact database requested: it runs in the background. Reload this page to follow it."]
    ToolPayloadOperation.objects.filter(kind="compact").update(state="succeeded", slot=None)
    enable(admin_user, choice="create")
    run = admin_client.post(RUN, {"revision": str(ToolPayloadPolicy.load().revision)}, **HOST)
    assert said(run) == ["Cleanup requested: it runs in the background. Reload this page to follow it."]
    ToolPayloadOperation.objects.filter(kind="backup").update(state="failed", slot=None)
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="failed")
    retry = admin_client.post(RETRY, {"revision": str(ToolPayloadPolicy.load().revision)}, **HOST)
    assert said(retry) == ["Backup requested again: it runs in the background. Reload this page to follow it."]
    assert ToolPayloadOperation.objects.filter(kind="backup").count() == 2


def test_cancel_asks_the_running_operation_to_stop(admin_client, admin_user):
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    response = admin_client.post(CANCEL, {"operation_id": str(op_id)}, **HX)
    assert response.status_code == 202
    assert ToolPayloadOperation.objects.get(pk=op_id).cancel_requested is True
    # The answer (and every read after it) says the cancel was asked for, without a second
    # Cancel to press, until a worker takes the operation and ends it.
    for html in (response.content.decode(), page(admin_client)):
        analysis = region(html, "tool-analysis")
        assert state_of(html, "tool-analysis", "data-cancel") == "requested"
        assert "Cancel requested: the analysis stops at its next check." in text_of(analysis)
        assert 'id="cancel-analysis"' not in analysis


@pytest.mark.parametrize("kind", ["backup", "cleanup"])
def test_a_cancel_asked_for_a_queued_backup_or_run_is_acknowledged(admin_client, admin_user, kind):
    """A queued preparation (no worker has taken it yet) or run whose cancel was asked for says
    so, and offers no Cancel again, until a worker ends it."""
    old_conversation("queued-cancel")
    enable(admin_user, choice="create" if kind == "backup" else "skip")
    admin_client.post(RUN, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    op = ToolPayloadOperation.objects.get(kind=kind)
    assert op.state == "queued"
    response = admin_client.post(CANCEL, {"operation_id": str(op.pk)}, **HX)
    assert response.status_code == 202
    html = response.content.decode()
    run_region = text_of(region(html, "tool-run"))
    assert state_of(html, "tool-run", "data-cancel") == "requested"
    said = {"backup": "Cancel requested: the backup stops at its next check.",
            "cleanup": "Cancel requested: the run stops before its next batch; nothing more is removed."}[kind]
    assert said in run_region
    assert "Cancel preparation" not in run_region and "Cancel run" not in run_region
    op.refresh_from_db()
    assert op.cancel_requested and op.state == "queued"  # nothing ended it yet: not shown as ended either


def test_a_status_read_names_each_operation_when_made_and_whether_it_was_asked_to_stop(admin_client, admin_user):
    """What the page compares after an action's answer was lost (lethe.js, r122): each history
    row's operation id, kind and creation time (epoch seconds, the server's clock), and its
    cancel; the saved policy's revision and the server's time of the read."""
    enable(admin_user, choice="skip")
    old_conversation("status-facts")
    admin_client.post(RUN, {"revision": str(ToolPayloadPolicy.load().revision)}, **HX)
    op = ToolPayloadOperation.objects.get(kind="cleanup")
    service.cancel(user=admin_user, operation_id=op.pk)
    response = admin_client.get(STATUS, **HX)
    html = response.content.decode()
    row = re.search(rf'<li class="history-row" data-kind="cleanup" data-state="queued" data-op="{op.pk}" '
                    r'data-created="(\d+)" data-cancel="requested">', html)
    assert row and int(row.group(1)) == int(op.created_at.timestamp())
    saved = re.search(r'<div id="tool-saved"[^>]*data-revision="(\d+)" data-now="(\d+)"', html)
    assert saved and int(saved.group(1)) == ToolPayloadPolicy.load().revision
    assert 0 <= int(saved.group(2)) - int(op.created_at.timestamp()) < 60
    # Ended as cancelled; an operation not asked to stop says nothing of a cancel.
    assert run(op.pk).state == "cancelled"
    compact = service.start_compact(user=admin_user)
    html = admin_client.get(STATUS, **HX).content.decode()
    assert re.search(rf'data-kind="cleanup" data-state="cancelled" data-op="{op.pk}" data-created="\d+" '
                     r'data-cancel="requested">', html)
    assert re.search(rf'data-kind="compact" data-state="queued" data-op="{compact}" data-created="\d+">', html)


# ---- Members --------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [ANALYZE, RUN, CANCEL, RETRY, CANCEL_PREP, COMPACT, TOOL])
@pytest.mark.parametrize("headers", [HX, HOST], ids=["htmx", "form"])
def test_members_are_refused_every_mutation_and_nothing_changes(member_client, admin_user, url, headers):
    enable(admin_user, choice="create")
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    before = ToolPayloadPolicy.load()
    body = {"age_value": "2", "age_unit": "weeks", "enabled": "", "revision": str(before.revision),
            "operation_id": str(op_id), "backup_choice": "skip"}
    response = member_client.post(url, body, **headers)
    assert response.status_code == 403
    after = ToolPayloadPolicy.load()
    assert (after.enabled, after.age_value, after.revision, after.preparation_state) == (
        before.enabled, before.age_value, before.revision, before.preparation_state)
    assert list(ToolPayloadOperation.objects.values_list("id", "state", "cancel_requested")) == [
        (op_id, "queued", False)]


def test_members_see_the_status_read_only_with_the_admins_only_note(member_client, admin_user):
    old_conversation("seen")
    run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    enable(admin_user, choice="skip")
    html = page(member_client)
    assert state_of(html, "tool-analysis") == "completed" and "Estimated payload savings" in html
    assert "only admins can analyze, change or run cleanup" in html
    for action in ("Analyze savings", "Run cleanup now", "Compact database</button>", "Cancel run", "Retry"):
        assert action not in html, action
    assert 'id="save-bar"' not in html
    # r53: where Compact database would be, the note says why (DESIGN 7)
    assert 'data-testid="compact-admins-only"' in html and "Admins only. An admin can compact the database." in html
    response = member_client.get(STATUS, **HX)
    assert response.status_code == 200 and "Run cleanup now" not in response.content.decode()


def test_members_are_not_told_to_do_what_only_admins_can(member_client, admin_client, admin_user):
    """r105: a member read "until a backup is ready or you cancel" beside no Cancel (and "analyze
    again when you are ready", "when you choose Create backup"): they are told who can."""
    old_conversation("members")
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    ToolPayloadOperation.objects.filter(pk=op_id).update(state="cancelled", slot=None)
    enable(admin_user, choice="create")
    ToolPayloadOperation.objects.filter(kind="backup").update(state="failed", slot=None)
    for prep in ("failed", "cancelled"):
        ToolPayloadPolicy.objects.filter(id=1).update(preparation_state=prep, preparation_error="Disk full.")
        member, admin = page(member_client), page(admin_client)
        assert "Cleanup is blocked until an admin retries the backup and it is ready, or cancels." in member
        assert "or you cancel" not in member and "Retry backup" not in member
        assert "Cleanup is blocked until a backup is ready or you cancel." in admin and "Retry backup" in admin
    assert "No estimate until an admin analyzes again." in member and "when you are ready" not in member
    assert "analyze again when you are ready" in admin
    assert "When an admin chooses Create backup" in member and "When you choose" not in member
    assert "When you choose Create backup" in admin
    spanish = member_client.get(PAGE, HTTP_ACCEPT_LANGUAGE="es", **HOST).content.decode()
    assert "usted cancele" not in spanish and "hasta que un administrador reintente" in spanish


@pytest.mark.django_db(transaction=True)
def test_backups_are_listed_with_size_time_checksum_and_how_to_restore(admin_client, settings, tmp_path):
    from retention.backups import create_backup, restore_instructions

    settings.LETHE_BACKUP_DIR = tmp_path / "backups"
    receipt = create_backup()
    html = page(admin_client)
    backups = region(html, "backups")
    assert receipt.name in backups and receipt.sha256 in backups
    assert filesizeformat(receipt.size) in backups
    assert "Restoring a backup replaces the whole database" in backups
    first_line = restore_instructions(receipt.vendor).splitlines()[0]
    assert first_line.replace("'", "&#x27;").replace('"', "&quot;")[:40] in backups
    assert 'data-testid="backup-changed"' not in backups
    assert admin_client.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()["backups"][0][
        "changed"] is False
    # A file changed after it was made is flagged on the page and in the API; nothing claims it is fine.
    with open(receipt.path, "ab") as handle:
        handle.write(b"X")
    backups = region(page(admin_client), "backups")
    assert 'data-testid="backup-changed"' in backups and "changed after it was made" in backups
    assert admin_client.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()["backups"][0][
        "changed"] is True


@pytest.mark.django_db(transaction=True)
def test_a_removed_backup_shows_as_removed_and_no_backup_failure(admin_client, admin_user, settings, tmp_path):
    """The operator removes the backup made for the first cleanup: the next run completes, the
    card shows no failed backup, and the history says the file is no longer there (English and
    Spanish; on the Operations page too)."""
    from tests.test_tool_payload_jobs import remove_backups

    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    old_conversation("first", tools=2)
    enable(admin_user, choice="create")
    backup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert run(ToolPayloadOperation.objects.get(kind="cleanup").pk).removed_messages == 3
    history = region(page(admin_client), "cleanup-history")
    assert backup.backup_name in history and 'data-testid="backup-gone"' not in history
    assert remove_backups(tmp_path / "backups")
    old_conversation("second", tools=2)
    second = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (second.state, second.removed_messages) == ("succeeded", 3), second.error_message
    html = page(admin_client)
    assert "Backup failed" not in html and "Cleanup is blocked" not in html
    assert state_of(html, "tool-run", "data-prep") == "ready"
    assert "no longer in the backup folder" in text_of(region(html, "cleanup-history"))
    assert "the ones made earlier were removed from it" in text_of(region(html, "backups"))
    assert "No backups yet" not in html
    spanish = admin_client.get(PAGE, HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "ya no está en la carpeta de copias de seguridad" in text_of(region(spanish, "cleanup-history"))
    listing = admin_client.get("/operations/", HTTP_HOST="127.0.0.1").content.decode()
    assert backup.backup_name in listing
    assert 'data-testid="backup-gone"' in listing and "no longer in the backup folder" in listing
    listing = admin_client.get("/operations/", HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert "ya no está en la carpeta de copias de seguridad" in listing
    api = admin_client.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()
    assert api["preparation"]["state"] == "ready"
    assert [op["backup"]["present"] for op in api["history"] if op["kind"] == "backup"] == [False]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("empty", [False, True], ids=["missing", "empty-mount-point"])
def test_a_backup_folder_that_is_not_there_says_nothing_of_its_backups_and_is_not_made(
        admin_client, admin_user, settings, tmp_path, empty):
    """r154: with the folder missing (a disk not mounted, a host without the shared folder) the
    card, its API and the Operations page said the backup was no longer in the folder, and the
    next delete made the folder, empty, and took the backup off the earlier receipt."""
    import shutil

    from lifecycle.actions.request_deletion import request_deletion
    from lifecycle.deletion import executor

    folder = tmp_path / "backups"
    settings.LETHE_BACKUP_DIR = str(folder)
    old_conversation("first", tools=2)
    held = factories.make_conversation(title="held")  # in the backup
    enable(admin_user, choice="create")
    backup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert run(ToolPayloadOperation.objects.get(kind="cleanup").pk).removed_messages == 3
    deleted = request_deletion(held, key="held", acting_user=admin_user)
    assert executor.run_erasure(deleted.pk) == "completed"
    deleted.refresh_from_db()
    assert [h["name"] for h in deleted.receipt["holders"] if h["kind"] == "backup"] == [backup.backup_name]

    shutil.move(folder, tmp_path / "unmounted")
    if empty:
        folder.mkdir()  # a disk not mounted leaves its empty mount point (r156)
    html = page(admin_client)
    assert 'data-testid="backup-gone"' not in html and "no longer in the backup folder" not in html
    listing = admin_client.get("/operations/", HTTP_HOST="127.0.0.1").content.decode()
    assert 'data-testid="backup-gone"' not in listing
    api = admin_client.get("/api/v1/system/tool-payload-retention", HTTP_HOST="127.0.0.1").json()
    assert [op["backup"]["present"] for op in api["history"] if op["kind"] == "backup"] == [None]
    other = request_deletion(factories.make_conversation(title="other"), key="other", acting_user=admin_user)
    assert executor.run_erasure(other.pk) == "completed"
    assert folder.exists() == empty and not any(folder.iterdir() if empty else ())
    out = io.StringIO()
    call_command("verify_erasure", "--all", stdout=out)
    deleted.refresh_from_db()
    assert not [h for h in deleted.receipt["holders"] if "removed_at" in h]
    assert [h["name"] for h in deleted.receipt["holders"] if h["kind"] == "backup"] == [backup.backup_name]


@pytest.mark.parametrize("data", [
    {"age_value": "3", "age_unit": "years", "revision": "1"},
    {"age_value": "3", "age_unit": "months", "revision": "x"},
    {"age_value": "3", "age_unit": "months"},
], ids=["unit", "revision-not-a-number", "no-revision"])
def test_a_refused_save_says_why_whatever_field_was_wrong(admin_client, data):
    """Fields the page sends itself (the unit's choices, the hidden revision) get a message
    too when a tampered or stale form sends something else; nothing is saved."""
    response = admin_client.post("/settings/system/data-storage/tool-payload-cleanup/", data, HTTP_HOST="127.0.0.1")
    assert response.status_code == 422
    html = response.content.decode()
    assert any(text in html for text in ("Choose weeks or months.", "Enter a whole number", "This field is required"))
    assert ToolPayloadPolicy.load().revision == 1


def test_spanish_history_agrees_with_each_kind(admin_client, admin_user, settings):
    """"Análisis" is masculine, the other kinds feminine: each state and "started by" agrees."""
    old_conversation("gender")
    enable(admin_user)
    run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    html = admin_client.get(PAGE, HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    history = region(html, "cleanup-history")
    assert re.search(r"<strong>Análisis</strong> <span[^>]*>Completado</span>.*?iniciado por alice", history, re.S)
    assert re.search(r"<strong>Limpieza</strong> <span[^>]*>Completada</span>.*?iniciada por alice", history, re.S)
    # the details' labels too: "Iniciado por" for the analysis, "Iniciada por" for the run
    assert "<dt>Iniciado por</dt>" in region(html, "tool-analysis")
    assert "<dt>Iniciada por</dt>" in region(html, "tool-run")
    listing = admin_client.get("/operations/", HTTP_HOST="127.0.0.1", HTTP_ACCEPT_LANGUAGE="es").content.decode()
    assert re.search(r"Análisis</span>\s*<span class=\"conv-meta\">\s*<span class=\"badge[^\"]*\">Completado<", listing)
    assert re.search(r"Limpieza</span>\s*<span class=\"conv-meta\">\s*<span class=\"badge[^\"]*\">Completada<", listing)


def test_the_poller_measures_the_database_at_most_every_few_seconds_and_after_an_operation_ends(
        admin_client, admin_user, monkeypatch):
    from retention import views

    measured = []

    def counted():
        measured.append(1)
        return database_size()

    monkeypatch.setattr(views, "database_size", counted)
    for _ in range(3):
        assert 'data-testid="db-size"' in admin_client.get(STATUS, **HX).content.decode()
    assert len(measured) == 1  # one measurement for three polls
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    admin_client.get(STATUS, **HX)
    assert len(measured) == 1  # nothing finished yet
    run(op_id)
    admin_client.get(STATUS, **HX)
    assert len(measured) == 2  # an operation ended: measured again
    page(admin_client)
    assert len(measured) == 3  # the page itself measures every time
    monkeypatch.setattr(views, "POLL_MEASURE_SECONDS", 0)
    admin_client.get(STATUS, **HX)
    assert len(measured) == 4


def test_the_last_cleanup_is_shown_however_many_analyses_came_after_it(admin_client, admin_user):
    old_conversation("run")
    enable(admin_user, choice="skip")
    cleanup = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    run(cleanup)
    ToolPayloadOperation.objects.create(kind="analysis", state="succeeded", slot=None)
    ToolPayloadOperation.objects.bulk_create(
        [ToolPayloadOperation(kind="analysis", state="succeeded", slot=None) for _ in range(service.HISTORY_LENGTH + 5)])
    status = service.status_document(with_database=False)
    assert status["last_run"]["id"] == cleanup and status["last_run"]["state"] == "succeeded"
    assert state_of(page(admin_client), "tool-run", "data-run") == "succeeded"
