"""Who started a tool payload operation: kept when that user is deleted, never the schedule."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps

from retention import jobs, service
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests import factories
from tests.conftest import token_client
from tests.test_api_tool_payloads import BASE, finish, send
from tests.test_tool_payload_jobs import enable

pytestmark = pytest.mark.django_db
HOST = {"HTTP_HOST": "127.0.0.1"}
PAGE = "/settings/system/data-storage/"


def test_it_keeps_the_name_of_a_deleted_user_who_started_an_analysis(api, admin_client):
    carol = factories.make_user("carol", admin=True)
    answer = send(token_client(carol), "post", "/analyze", {"age": {"value": 3, "unit": "months"}})
    op = finish(answer.json()["operation_id"])
    assert (op.started_by_id, op.started_by_name) == (carol.pk, "carol")

    carol.delete()
    op.refresh_from_db()
    assert (op.started_by_id, op.started_by_name) == (None, "carol")
    entry = api.get(BASE).json()["history"][0]
    assert (entry["id"], entry["started_by"]) == (op.pk, "carol")
    assert api.get(BASE).json()["last_analysis"]["started_by"] == "carol"

    card = admin_client.get(PAGE, **HOST).content.decode()
    assert "started by carol" in card and "daily schedule" not in card
    operations = admin_client.get("/operations/", **HOST).content.decode()
    assert "by carol" in operations and "daily schedule" not in operations


@pytest.mark.django_db(transaction=True)  # a backup runs outside any transaction
def test_a_cleanup_that_follows_a_backup_keeps_its_starters_name(admin_user, settings, tmp_path):
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    enable(admin_user, choice="create")
    backup = finish(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert backup.state == "succeeded", backup.error_message
    follow = ToolPayloadOperation.objects.get(kind="cleanup")
    assert (follow.started_by_id, follow.started_by_name) == (admin_user.pk, "alice")
    admin_user.delete()
    assert {op["started_by"] for op in service.status_document(with_database=False)["history"]} == {"alice"}


@pytest.mark.django_db(transaction=True)
def test_a_starter_deleted_while_the_backup_runs_still_gets_the_cleanup_that_follows(
        admin_user, settings, tmp_path, monkeypatch):
    from retention import backups

    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    enable(admin_user, choice="create")
    backup_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    made = backups.create_backup

    def delete_the_starter_meanwhile(**kwargs):
        receipt = made(**kwargs)
        admin_user.delete()  # the job read its operation (the user's id with it) before this
        return receipt

    monkeypatch.setattr(backups, "create_backup", delete_the_starter_meanwhile)  # the job imports it when it runs
    backup = finish(backup_id)
    assert backup.state == "succeeded", backup.error_message
    follow = ToolPayloadOperation.objects.get(kind="cleanup")
    assert (follow.started_by_id, follow.started_by_name) == (None, "alice")
    assert finish(follow.pk).state == "succeeded"


def test_the_first_run_a_save_makes_due_is_the_admins_and_the_next_ones_the_schedules(admin_user, api, admin_client):
    """Turning cleanup on makes the daily check due at once: the run it starts is the save's,
    credited to the admin who saved (r137: "started by the daily schedule" in both languages);
    the checks after it are the schedule's own."""
    enable(admin_user)
    assert jobs.daily_check().startswith("started")
    first = ToolPayloadOperation.objects.get()
    assert (first.started_by_id, first.started_by_name) == (admin_user.pk, "alice")
    assert "started by alice" in admin_client.get(PAGE, **HOST).content.decode()
    assert "by alice" in admin_client.get("/operations/", **HOST).content.decode()
    ToolPayloadOperation.objects.filter(pk=first.pk).update(state="succeeded", slot=None)  # as its run ends it
    assert jobs.daily_check().startswith("started")
    op = ToolPayloadOperation.objects.exclude(pk=first.pk).get()
    assert (op.started_by_id, op.started_by_name) == (None, "")
    assert api.get(BASE).json()["operation"]["started_by"] == "schedule"
    assert api.get(BASE).json()["operation"]["started_by_kind"] == "schedule"
    assert "started by the daily schedule" in admin_client.get(PAGE, **HOST).content.decode()
    assert "by the daily schedule" in admin_client.get("/operations/", **HOST).content.decode()


def test_a_user_named_schedule_is_not_read_as_the_schedule(admin_client):
    """A username is free text: a user named "schedule" is a user, in the API and on screens."""
    namesake = factories.make_user("schedule", admin=True)
    answer = send(token_client(namesake), "post", "/analyze", {"age": {"value": 3, "unit": "months"}})
    op = finish(answer.json()["operation_id"])
    assert (op.started_by_id, op.by_schedule) == (namesake.pk, False)
    entry = token_client(namesake).get(BASE).json()["history"][0]
    assert (entry["started_by"], entry["started_by_kind"]) == ("schedule", "user")
    card = admin_client.get(PAGE, **HOST).content.decode()
    assert "started by schedule" in card and "daily schedule" not in card
    operations = admin_client.get("/operations/", **HOST).content.decode()
    assert "daily schedule" not in operations

    namesake.delete()  # the name is kept: still a user
    op.refresh_from_db()
    assert (op.started_by_id, op.started_by_name, op.by_schedule) == (None, "schedule", False)
    assert "daily schedule" not in admin_client.get(PAGE, **HOST).content.decode()


def test_the_migration_names_the_users_that_still_exist_and_leaves_the_schedule(admin_user):
    fill_names = importlib.import_module("retention.migrations.0005_operation_started_by_name").fill_names
    mine = ToolPayloadOperation.objects.create(kind="analysis", slot=None, state="succeeded", started_by=admin_user)
    scheduled = ToolPayloadOperation.objects.create(kind="cleanup", slot=None, state="succeeded")
    assert mine.started_by_name == ""  # as rows made before the column were

    fill_names(apps, None)
    mine.refresh_from_db()
    scheduled.refresh_from_db()
    assert (mine.started_by_name, mine.starter) == ("alice", "alice")
    assert (scheduled.started_by_name, scheduled.starter) == ("", "schedule")


def test_the_first_run_of_an_admin_deleted_before_it_started_still_names_them(api):
    """The admin who turned cleanup on was deleted before the check their save made due ran:
    the run still names them (r139: it read as the daily schedule's once the user was gone)."""
    carol = factories.make_user("carol", admin=True)
    enable(carol)
    carol.delete()
    assert jobs.daily_check().startswith("started")
    op = ToolPayloadOperation.objects.get()
    assert (op.started_by_id, op.started_by_name, op.by_schedule) == (None, "carol", False)
    assert api.get(BASE).json()["operation"]["started_by"] == "carol"
    policy = ToolPayloadPolicy.load()
    assert (policy.woken_by_id, policy.woken_by_name) == (None, "")
