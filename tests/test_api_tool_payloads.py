"""The tool payload cleanup API: status document, policy, analyze, run, cancel, compact."""

from __future__ import annotations

import json

import pytest

from lifecycle.models import Item
from retention import jobs, service
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests.test_tool_payload_jobs import old_conversation

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
BASE = "/api/v1/system/tool-payload-retention"


def send(client, method: str, path: str, body=None):
    data = body if isinstance(body, str) else json.dumps(body) if body is not None else ""
    return getattr(client, method)(BASE + path, data=data, content_type="application/json")


def finish(operation_id: int) -> ToolPayloadOperation:
    while jobs.run_operation(operation_id) == "more":
        pass
    return ToolPayloadOperation.objects.get(pk=operation_id)


def test_an_admin_analyzes_saves_with_a_choice_and_runs_with_exact_figures(api, admin_user):
    conversation = old_conversation("api", tools=3)
    status = api.get(BASE).json()
    assert status["policy"] == {"enabled": False, "age": {"value": 3, "unit": "months"}, "revision": 1,
                                "updated_at": status["policy"]["updated_at"]}
    assert status["analysis_state"] == "not_analyzed" and status["operation"] is None
    assert status["preparation"]["state"] == "none" and status["error"] is None
    started = send(api, "post", "/analyze", {"age": {"value": 3, "unit": "months"}})
    assert started.status_code == 202
    analysis = finish(started.json()["operation_id"])
    doc = api.get(BASE).json()
    assert doc["analysis_state"] == "completed"
    assert doc["last_analysis"]["payload_bytes"] == analysis.payload_bytes > 0
    assert doc["last_analysis"]["started_by"] == admin_user.username
    assert doc["last_analysis"]["cutoff"].endswith("Z")

    refused = send(api, "put", "", {"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1})
    assert (refused.status_code, refused.json()["code"]) == (400, "backup_choice_required")
    saved = send(api, "put", "", {"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1,
                                  "backup_choice": "skip"})
    assert saved.status_code == 200 and saved.json()["policy"]["revision"] == 2
    stale = send(api, "post", "/run", {"revision": 1})
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_revision")
    run = send(api, "post", "/run", {"revision": 2})
    assert run.status_code == 202
    busy = send(api, "post", "/compact")
    assert (busy.status_code, busy.json()["code"]) == (409, "busy")
    cleanup = finish(run.json()["operation_id"])
    assert cleanup.payload_bytes == analysis.payload_bytes
    assert Item.objects.filter(conversation=conversation, details_removed_at__isnull=False).count() == 4
    doc = api.get(BASE).json()
    assert doc["last_run"]["removed_messages"] == 4 and doc["last_run"]["state"] == "succeeded"
    assert [op["kind"] for op in doc["history"]] == ["cleanup", "analysis"]


@pytest.mark.parametrize(("body", "code"), [
    ({"enabled": True, "age": {"value": 0, "unit": "months"}, "revision": 1, "backup_choice": "skip"}, "invalid_age"),
    ({"enabled": True, "age": {"value": 3, "unit": "days"}, "revision": 1, "backup_choice": "skip"}, "invalid_age"),
    # any other unit is invalid_age, however long (not a length error of its own)
    ({"enabled": True, "age": {"value": 3, "unit": "fortnights_or_more"}, "revision": 1, "backup_choice": "skip"},
     "invalid_age"),
    ({"enabled": True, "age": {"value": 600, "unit": "weeks"}, "revision": 1, "backup_choice": "skip"},
     "invalid_age"),
    ({"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1, "backup_choice": "maybe"},
     "invalid_choice"),
    ({"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1, "extra": 1}, "unknown_field"),
    ({"enabled": "yes", "age": {"value": 3, "unit": "months"}, "revision": 1}, "invalid_type"),
    ({"enabled": True, "age": {"value": "3", "unit": "months"}, "revision": 1}, "invalid_type"),
    ({"enabled": True, "revision": 1}, "missing_field"),
    ({"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 2**31, "backup_choice": "skip"},
     "invalid_value"),
    ("{\"enabled\": true, \"enabled\": false}", "duplicate_key"),
    ("not json", "malformed_json"),
])
def test_bad_policy_bodies_are_refused_and_change_nothing(api, body, code):
    answer = send(api, "put", "", body)
    assert answer.status_code == 400 and answer.json()["code"] == code, answer.json()
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.revision) == (False, 1)


@pytest.mark.parametrize(("path", "body", "code"), [
    ("/analyze", {"age": {"value": 121, "unit": "months"}}, "invalid_age"),
    ("/analyze", {"age": {"value": 2, "unit": "m" * 5000}}, "invalid_age"),
    ("/analyze", {"age": {"value": 3, "unit": "months"}, "draft": True}, "unknown_field"),
    ("/analyze", {}, "missing_field"),
    ("/run", {"revision": "1"}, "invalid_type"),
    ("/run", {"revision": 10**40}, "invalid_value"),
    ("/cancel", {"operation_id": 12345}, "not_found"),
    ("/cancel", {"operation_id": 1.5}, "invalid_type"),
    # The actions that take no body refuse one they cannot accept, as strictly as any body
    ("/compact", {"junk": 1}, "unknown_field"),
    ("/compact", '{"deep": [[[[NaN]]]]}', "invalid_number"),
    ("/retry-preparation", {"junk": 1}, "unknown_field"),
])
def test_bad_action_bodies_are_refused_and_start_nothing(api, path, body, code):
    answer = send(api, "post", path, body)
    assert answer.status_code in (400, 404) and answer.json()["code"] == code, answer.json()
    assert ToolPayloadOperation.objects.count() == 0


def test_members_read_the_status_but_every_change_is_403(member_api):
    assert member_api.get(BASE).status_code == 200
    for method, path, body in [
        ("put", "", {"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1, "backup_choice": "skip"}),
        ("post", "/analyze", {"age": {"value": 3, "unit": "months"}}),
        ("post", "/run", {"revision": 1}),
        ("post", "/cancel", {"operation_id": 1}),
        ("post", "/compact", None),
        ("post", "/retry-preparation", None),
    ]:
        answer = send(member_api, method, path, body)
        assert (answer.status_code, answer.json()["code"]) == (403, "forbidden"), path
    assert ToolPayloadOperation.objects.count() == 0
    assert ToolPayloadPolicy.load().revision == 1


def test_run_waits_for_preparation_when_a_backup_was_chosen(api):
    send(api, "put", "", {"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1,
                          "backup_choice": "create"})
    answer = send(api, "post", "/run", {"revision": 2})
    assert answer.status_code == 202
    op = ToolPayloadOperation.objects.get(pk=answer.json()["operation_id"])
    assert op.kind == "backup"
    doc = api.get(BASE).json()
    assert doc["preparation"]["state"] == "preparing" and doc["operation"]["kind"] == "backup"
    again = send(api, "post", "/retry-preparation")  # the backup is being made: busy, not "nothing to retry"
    assert (again.status_code, again.json()["code"]) == (409, "busy")
    cancel = send(api, "post", "/cancel", {"operation_id": op.pk})
    assert (cancel.status_code, cancel["Content-Type"], cancel.json()) == (202, "application/json",
                                                                           {"operation_id": op.pk})
    assert ToolPayloadOperation.objects.get(pk=op.pk).cancel_requested


def test_not_enabled_run_is_refused(api):
    answer = send(api, "post", "/run", {"revision": 1})
    assert (answer.status_code, answer.json()["code"]) == (409, "not_enabled")
    retry = send(api, "post", "/retry-preparation")  # no backup was chosen
    assert (retry.status_code, retry.json()["code"]) == (409, "nothing_to_retry")


def test_an_empty_object_is_the_body_of_an_action_that_takes_none(api):
    answer = send(api, "post", "/compact", {})
    assert answer.status_code == 202, answer.json()
    assert ToolPayloadOperation.objects.get(pk=answer.json()["operation_id"]).kind == "compact"


def test_a_stale_revision_is_said_before_a_missing_backup_choice(api):
    saved = send(api, "put", "", {"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1,
                                  "backup_choice": "skip"})
    assert saved.status_code == 200
    # Shortening the period needs a choice, but this client saw revision 1: reload first
    answer = send(api, "put", "", {"enabled": True, "age": {"value": 1, "unit": "months"}, "revision": 1})
    assert (answer.status_code, answer.json()["code"]) == (409, "stale_revision")
    policy = ToolPayloadPolicy.load()
    assert (policy.age_value, policy.revision) == (3, 2)


def test_a_stale_save_turning_cleanup_on_without_a_choice_is_refused_even_when_the_values_match(api):
    """r24: A read revision 1 (cleanup off) and sent "on" without a backup choice; B meanwhile
    saved it on with "skip". A's request matched the stored values and answered 200: a choice A
    never made or saw answered for it. Refused as stale; the same request with a choice, or a
    form sent twice with its choice, still succeeds without a change."""
    on = {"enabled": True, "age": {"value": 3, "unit": "months"}}
    assert send(api, "put", "", {**on, "revision": 1}).json()["code"] == "backup_choice_required"
    assert send(api, "put", "", {**on, "revision": 1, "backup_choice": "skip"}).status_code == 200  # B
    stale = send(api, "put", "", {**on, "revision": 1})
    assert (stale.status_code, stale.json()["code"]) == (409, "stale_revision")
    again = send(api, "put", "", {**on, "revision": 1, "backup_choice": "skip"})  # B's request sent twice
    assert again.status_code == 200
    policy = ToolPayloadPolicy.load()
    assert (policy.enabled, policy.backup_choice, policy.revision) == (True, "skip", 2)


def test_a_jobs_stored_outcome_is_read_in_the_readers_language(api):
    old_conversation("lang", tools=2)
    send(api, "put", "", {"enabled": True, "age": {"value": 3, "unit": "months"}, "revision": 1,
                          "backup_choice": "skip"})
    run = send(api, "post", "/run", {"revision": 2}).json()["operation_id"]
    send(api, "post", "/cancel", {"operation_id": run})
    op = finish(run)
    assert (op.state, op.error_code) == ("cancelled", "cancelled")
    assert op.error_message == "Removals committed before the cancel stay."  # the worker's words
    english = api.get(BASE).json()["history"][0]["error"]
    spanish = api.get(BASE, HTTP_ACCEPT_LANGUAGE="es").json()["history"][0]["error"]
    assert english == {"code": "cancelled", "message": op.error_message}
    assert spanish["code"] == "cancelled" and spanish["message"].startswith("Lo eliminado antes de cancelar"), spanish


def test_a_save_that_changes_nothing_leaves_analyses_as_they_were(api):
    """Only a save that changes something bumps the revision and marks analyses of other
    settings stale (AC-TPR-001.5); sending the saved policy back is no save."""
    finish(send(api, "post", "/analyze", {"age": {"value": 2, "unit": "weeks"}}).json()["operation_id"])
    before = api.get(BASE).json()["analysis_state"]
    assert before in ("empty", "completed")
    answer = send(api, "put", "", {"enabled": False, "age": {"value": 3, "unit": "months"}, "revision": 1})
    assert answer.status_code == 200 and answer.json()["policy"]["revision"] == 1
    assert answer.json()["analysis_state"] == before
    assert not ToolPayloadOperation.objects.filter(kind="analysis", stale=True).exists()
    changed = send(api, "put", "", {"enabled": False, "age": {"value": 4, "unit": "months"}, "revision": 1})
    assert changed.json()["policy"]["revision"] == 2 and changed.json()["analysis_state"] == "stale"


def test_cancel_names_the_failed_backup_not_any_finished_one(api, admin_user):
    """Cancel on a finished operation changes nothing, unless it is the failed backup the
    preparation waits on: an older backup's id does not cancel a later one's failure."""
    older = ToolPayloadOperation.objects.create(kind="backup", state="succeeded", slot=None, started_by=admin_user)
    failed = ToolPayloadOperation.objects.create(kind="backup", state="failed", slot=None, started_by=admin_user,
                                                 error_code="io_error")
    ToolPayloadPolicy.load()
    ToolPayloadPolicy.objects.filter(id=1).update(backup_choice="create", preparation_state="failed", enabled=True)
    answer = send(api, "post", "/cancel", {"operation_id": older.pk})
    assert (answer.status_code, answer.json()["code"]) == (409, "not_cancellable")
    assert ToolPayloadPolicy.load().preparation_state == "failed"
    answer = send(api, "post", "/cancel", {"operation_id": failed.pk})
    assert answer.status_code == 202 and ToolPayloadPolicy.load().preparation_state == "cancelled"


@pytest.mark.parametrize("ending", ["cancelled", "failed"])
def test_an_analysis_with_no_estimate_is_never_called_stale(api, ending):
    """r72: a cancelled (or failed) analysis became "stale" in the API after a save of another
    period, an estimate out of date where none exists; the card says cancelled (or failed)."""
    op_id = send(api, "post", "/analyze", {"age": {"value": 2, "unit": "weeks"}}).json()["operation_id"]
    if ending == "cancelled":
        assert send(api, "post", "/cancel", {"operation_id": op_id}).status_code == 202
        finish(op_id)
    else:
        ToolPayloadOperation.objects.filter(pk=op_id).update(state="failed", error_code="unexpected")
    assert api.get(BASE).json()["analysis_state"] == {"cancelled": "not_analyzed", "failed": "failed"}[ending]
    saved = send(api, "put", "", {"enabled": False, "age": {"value": 4, "unit": "months"}, "revision": 1})
    assert ToolPayloadOperation.objects.get(pk=op_id).stale  # marked, as any analysis of other settings
    assert saved.json()["analysis_state"] == {"cancelled": "not_analyzed", "failed": "failed"}[ending]
    assert saved.json()["last_analysis"]["state"] == ending


def test_a_queued_compaction_can_be_cancelled_and_says_so_a_running_one_cannot(api, admin_client, member_client):
    """r72: a cancel of a queued compaction was 202 while the card went on saying it starts when a
    worker is free (it ended cancelled); one of a running compaction was 202 too, and VACUUM went
    on (a run taking over after a kill would have said "cancelled before it was compacted")."""
    op_id = send(api, "post", "/compact").json()["operation_id"]
    assert send(api, "post", "/cancel", {"operation_id": op_id}).status_code == 202
    assert api.get(BASE).json()["operation"]["cancel_requested"] is True
    for client, language, words in ((admin_client, "en", "Compaction cancelled: it ends without compacting when "
                                                         "a worker takes it."),
                                    (member_client, "es", "Compactación cancelada: termina sin compactar cuando un "
                                                          "proceso en segundo plano la tome.")):
        page = client.get("/settings/system/data-storage/", HTTP_ACCEPT_LANGUAGE=language).content.decode()
        state = page.split('data-testid="compact-state"', 1)[1].split("</p>", 1)[0]
        assert words in state and "Compaction queued" not in state and "Compactación en cola" not in state
    done = finish(op_id)
    assert (done.state, done.error_code, done.before_bytes) == ("cancelled", "cancelled", None)  # not compacted

    second = send(api, "post", "/compact").json()["operation_id"]
    ToolPayloadOperation.objects.filter(pk=second).update(state="running", lease="a-worker")
    refused = send(api, "post", "/cancel", {"operation_id": second})
    assert refused.status_code == 409 and refused.json()["code"] == "not_cancellable"
    assert not ToolPayloadOperation.objects.get(pk=second).cancel_requested


# ---- The stored policy sent again (r108) ----------------------------------------------------

ON = {"enabled": True, "age": {"value": 3, "unit": "months"}}


@pytest.mark.django_db(transaction=True)
def test_an_enabling_request_sent_again_once_the_backup_is_made_keeps_it(api, settings, tmp_path):
    """r108: a retry of an enabling PUT whose answer was lost, arriving once the cluster had made
    the backup, bumped the revision and dropped that backup (preparation none, receipt null): other
    clients' revision went stale and the next run made a whole new backup first. It changes
    nothing now, whatever revision it was read at, and the next run is the cleanup."""
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    old_conversation("made", tools=2)
    enabling = {**ON, "revision": 1, "backup_choice": "create"}
    assert send(api, "put", "", enabling).json()["policy"]["revision"] == 2  # its answer lost
    assert jobs.daily_check().startswith("started")  # due at once: the backup, then its cleanup
    backup = finish(ToolPayloadOperation.objects.get(kind="backup").pk)
    assert backup.state == "succeeded", backup.error_message
    assert finish(ToolPayloadOperation.objects.get(kind="cleanup").pk).state == "succeeded"
    made = {"state": "ready", "choice": "create", "error": None, "receipt": backup.backup_name}
    assert api.get(BASE).json()["preparation"] == made

    for revision in (1, 2):  # the request sent again, and the stored policy as read now
        again = send(api, "put", "", {**enabling, "revision": revision})
        assert again.status_code == 200, again.json()
        assert (again.json()["policy"]["revision"], again.json()["preparation"]) == (2, made)
    policy = ToolPayloadPolicy.load()
    assert (policy.revision, policy.preparation_state, policy.backup_receipt_name) == (2, "ready", backup.backup_name)
    run = send(api, "post", "/run", {"revision": 2})  # another client, holding revision 2
    assert run.status_code == 202, run.json()
    assert ToolPayloadOperation.objects.get(pk=run.json()["operation_id"]).kind == "cleanup"
    assert ToolPayloadOperation.objects.filter(kind="backup").count() == 1


@pytest.mark.parametrize("state", ["preparing", "failed", "cancelled"])
def test_the_stored_policy_sent_again_leaves_the_preparation_as_it_is(api, admin_user, state):
    """r108: while the backup was being made, the same values sent again left it made for nothing
    (preparation none: its end no longer made the preparation ready); after it failed or was
    cancelled, they cleared the failure and had the next run or daily check make a backup
    without anyone choosing Retry. The preparation stays as it is, and so does the revision."""
    assert send(api, "put", "", {**ON, "revision": 1, "backup_choice": "create"}).status_code == 200
    backup = service.start_run(user=admin_user, revision=2)
    if state != "preparing":
        ToolPayloadOperation.objects.filter(pk=backup).update(state="failed", slot=None, error_code="io_error")
        ToolPayloadPolicy.objects.filter(id=1).update(preparation_state=state, preparation_error="Disk full.")
    before = api.get(BASE).json()["preparation"]
    assert before["state"] == state
    for revision in (1, 2):
        again = send(api, "put", "", {**ON, "revision": revision, "backup_choice": "create"})
        assert again.status_code == 200, again.json()
        assert (again.json()["policy"]["revision"], again.json()["preparation"]) == (2, before)
    assert list(ToolPayloadOperation.objects.values_list("pk", flat=True)) == [backup]  # nothing started
    run = send(api, "post", "/run", {"revision": 2})
    assert (run.status_code, run.json()["code"]) == (409, "busy" if state == "preparing" else "preparation_required")


def test_a_new_choice_a_re_enable_or_a_shorter_period_still_starts_the_preparation_over(api):
    """What r108 keeps: a choice other than the stored one, and the choice asked for when cleanup
    is turned on again or the period shortened (AC-TPR-002.1), start a new preparation; the made
    backup does not answer for them."""
    def made(receipt: str = "lethe-sqlite-20260101T000000Z-abcdef.sqlite3") -> None:
        ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="ready", backup_receipt_name=receipt)

    def put(body: dict) -> dict:
        answer = send(api, "put", "", {**body, "revision": ToolPayloadPolicy.load().revision})
        assert answer.status_code == 200, answer.json()
        return answer.json()

    put({**ON, "backup_choice": "create"})
    made()
    doc = put({**ON, "backup_choice": "skip"})  # another choice
    assert (doc["policy"]["revision"], doc["preparation"]["state"], doc["preparation"]["receipt"]) == (3, "ready", None)
    doc = put({**ON, "backup_choice": "create"})  # and back: a new backup
    assert (doc["policy"]["revision"], doc["preparation"]["state"]) == (4, "none")
    made()
    doc = put({**ON, "enabled": False})  # off: the preparation is kept...
    assert (doc["policy"]["revision"], doc["preparation"]["state"]) == (5, "ready")
    doc = put({**ON, "backup_choice": "create"})  # ...and turning it on again asks for a new one
    assert (doc["policy"]["revision"], doc["preparation"]["state"], doc["preparation"]["receipt"]) == (6, "none", None)
    made()
    doc = put({**ON, "age": {"value": 2, "unit": "months"}, "backup_choice": "create"})  # shorter
    assert (doc["policy"]["revision"], doc["preparation"]["state"], doc["preparation"]["receipt"]) == (7, "none", None)
