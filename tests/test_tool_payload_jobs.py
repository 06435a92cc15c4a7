"""Tool payload cleanup jobs: policy rules, analysis, cleanup batches, guards and crash safety.

Jobs run in-process here through `retention.jobs.run_operation` (the same function the
cluster runs); the crash test at the end runs them on a real django-q2 cluster.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from lifecycle.actions.append_item import append_item
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.models import Conversation, Item, Turn, TurnState
from retention import jobs, service
from retention.models import OperationState, ToolPayloadOperation, ToolPayloadPolicy
from retention.reducer import apply, encoded_size
from retention.service import CleanupError
from tests import factories

OLD = 200  # days idle: past any 3-month cutoff


def age(conversation: Conversation, days: float) -> None:
    Conversation.objects.filter(pk=conversation.pk).update(last_activity_at=timezone.now() - timedelta(days=days))


def shell(n: int) -> dict:
    return {"command": f"make test {n}", "cwd": "/w", "exit_code": n % 3, "stdout": "ok\n" * (200 + n),
            "stderr": "warn" * n, "truncated": False}


def old_conversation(title: str, tools: int = 3, *, days: float = OLD) -> Conversation:
    conversation = factories.make_conversation(title=title)
    factories.add_message(conversation, "user", f"Please look at {title}")
    for n in range(tools):
        factories.add_tool(conversation, "shell", shell(n), tool_call_id=f"{title}-{n}", title=f"Step {n}")
    factories.add_tool(conversation, "read_file", {"path": "/w/a.py", "content": "print(1)\n" * 300,
                                                   "line_count": 300}, tool_call_id=f"{title}-r")
    factories.add_tool(conversation, "plan", {"steps": ["one", "two"]}, tool_call_id=f"{title}-p")
    factories.add_tool(conversation, "todo", {"items": [{"text": "x", "done": False}]}, tool_call_id=f"{title}-t")
    factories.add_message(conversation, "assistant", f"Done with {title}")
    age(conversation, days)
    return conversation


def skipped_for_activity(op: ToolPayloadOperation) -> dict:
    """A run's skips as its batches counted them (recent activity, changed), without what it
    leaves alone for the item's kind or data from the start (the conversations' plans and
    todos, "protected"; test_a_run_counts_what_it_leaves_alone_as_the_analysis_does)."""
    found = json.loads(op.skipped_json)
    found.pop("protected", None)
    return found


def run(operation_id: int) -> ToolPayloadOperation:
    for _ in range(1000):
        if jobs.run_operation(operation_id) != "more":
            break
    return ToolPayloadOperation.objects.get(pk=operation_id)


def snapshot() -> list[tuple]:
    return list(Item.objects.order_by("id").values_list(
        "id", "payload", "payload_bytes", "removable_bytes", "payload_skip", "revision", "updated_at",
        "details_removed_at"))


def enable(user, *, choice: str = "skip", value: int = 3, unit: str = "months") -> ToolPayloadPolicy:
    policy = ToolPayloadPolicy.load()
    return service.save_policy(user=user, enabled=True, age_value=value, age_unit=unit,
                               revision=policy.revision, backup_choice=choice)


# ---- Cutoff ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("now", "value", "unit", "expected"), [
    ("2026-05-31T10:00:00", 3, "months", "2026-02-28T10:00:00"),
    ("2024-03-31T23:59:59", 1, "months", "2024-02-29T23:59:59"),
    ("2026-01-15T00:00:00", 13, "months", "2024-12-15T00:00:00"),
    ("2026-12-31T12:00:00", 120, "months", "2016-12-31T12:00:00"),
    ("2026-03-01T00:00:00", 2, "weeks", "2026-02-15T00:00:00"),
])
def test_the_cutoff_uses_calendar_months_clamped_to_the_month_end_in_utc(now, value, unit, expected):
    moment = datetime.fromisoformat(now).replace(tzinfo=UTC)
    assert jobs.cutoff_for(moment, value, unit) == datetime.fromisoformat(expected).replace(tzinfo=UTC)


@pytest.mark.django_db
def test_activity_exactly_at_the_cutoff_is_protected_and_a_microsecond_earlier_is_not():
    cutoff = datetime(2026, 2, 28, 10, 0, tzinfo=UTC)
    at, before = factories.make_conversation(title="at"), factories.make_conversation(title="before")
    Conversation.objects.filter(pk=at.pk).update(last_activity_at=cutoff)
    Conversation.objects.filter(pk=before.pk).update(last_activity_at=cutoff - timedelta(microseconds=1))
    assert list(jobs.eligible_conversations(cutoff).values_list("id", flat=True)) == [before.pk]


# ---- Policy ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_enabling_re_enabling_and_shortening_need_the_backup_choice(admin_user):
    policy = ToolPayloadPolicy.load()
    with pytest.raises(CleanupError) as refused:
        service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months",
                            revision=policy.revision, backup_choice=None)
    assert (refused.value.code, refused.value.status) == ("backup_choice_required", 400)
    assert ToolPayloadPolicy.load().enabled is False and ToolPayloadPolicy.load().revision == policy.revision
    saved = enable(admin_user, choice="create")
    assert (saved.enabled, saved.backup_choice, saved.preparation_state) == (True, "create", "none")
    # Lengthening needs no choice; shortening does.
    saved = service.save_policy(user=admin_user, enabled=True, age_value=6, age_unit="months",
                                revision=saved.revision, backup_choice=None)
    assert saved.age_value == 6
    with pytest.raises(CleanupError) as shorter:
        service.save_policy(user=admin_user, enabled=True, age_value=20, age_unit="weeks",
                            revision=saved.revision, backup_choice=None)
    assert shorter.value.code == "backup_choice_required"
    saved = service.save_policy(user=admin_user, enabled=False, age_value=6, age_unit="months",
                                revision=saved.revision, backup_choice=None)
    with pytest.raises(CleanupError) as again:
        service.save_policy(user=admin_user, enabled=True, age_value=6, age_unit="months",
                            revision=saved.revision, backup_choice=None)
    assert again.value.code == "backup_choice_required"
    saved = service.save_policy(user=admin_user, enabled=True, age_value=6, age_unit="months",
                                revision=saved.revision, backup_choice="skip")
    assert (saved.enabled, saved.backup_choice, saved.preparation_state) == (True, "skip", "ready")


def test_a_period_spans_its_fewest_and_most_days_and_is_shorter_if_it_is_on_some_day():
    assert jobs.period_days(4, "weeks") == (28, 28)
    assert jobs.period_days(1, "months") == (28, 31)
    assert jobs.period_days(3, "months") == (89, 92)
    assert jobs.period_days(12, "months") == (365, 366)
    assert jobs.may_be_shorter(4, "weeks", 1, "months")  # from the 29th of most months
    assert not jobs.may_be_shorter(1, "months", 4, "weeks")  # never fewer than 28 days
    assert jobs.may_be_shorter(13, "weeks", 3, "months") and jobs.may_be_shorter(3, "months", 13, "weeks")
    assert not jobs.may_be_shorter(14, "weeks", 3, "months") and not jobs.may_be_shorter(3, "months", 3, "months")
    assert jobs.may_be_shorter(2, "months", 3, "months") and not jobs.may_be_shorter(4, "months", 3, "months")


@pytest.mark.django_db
def test_a_change_of_unit_that_can_shorten_the_period_needs_the_choice_whatever_the_day(admin_user, monkeypatch):
    """r34: saved on 10 March 2027, 1 month to 4 weeks needed no backup choice (that day 4 weeks
    reach back further than 1 month), though from the 29th of most months 4 weeks remove
    what 1 month keeps; whether the choice was asked depended on the day of the save."""
    monkeypatch.setattr(timezone, "now", lambda: datetime(2027, 3, 10, 12, tzinfo=UTC))
    saved = enable(admin_user, value=1, unit="months")
    with pytest.raises(CleanupError) as refused:
        service.save_policy(user=admin_user, enabled=True, age_value=4, age_unit="weeks",
                            revision=saved.revision, backup_choice=None)
    assert refused.value.code == "backup_choice_required"
    assert (ToolPayloadPolicy.load().age_value, ToolPayloadPolicy.load().age_unit) == (1, "months")
    saved = enable(admin_user, value=4, unit="weeks")
    # 4 weeks to 1 month never removes more: no choice asked
    saved = service.save_policy(user=admin_user, enabled=True, age_value=1, age_unit="months",
                                revision=saved.revision, backup_choice=None)
    assert (saved.age_value, saved.age_unit) == (1, "months")


@pytest.mark.django_db
@pytest.mark.parametrize(("value", "unit"), [(0, "months"), (121, "months"), (521, "weeks"), (3, "days"),
                                             (True, "weeks"), ("3", "months")])
def test_an_invalid_period_saves_nothing(admin_user, value, unit):
    before = ToolPayloadPolicy.load()
    with pytest.raises(CleanupError) as refused:
        service.save_policy(user=admin_user, enabled=False, age_value=value, age_unit=unit,
                            revision=before.revision, backup_choice=None)
    assert (refused.value.code, refused.value.status) == ("invalid_age", 400)
    after = ToolPayloadPolicy.load()
    assert (after.revision, after.age_value, after.age_unit) == (before.revision, before.age_value, before.age_unit)


@pytest.mark.django_db
def test_a_stale_revision_and_a_member_change_nothing(admin_user, member_user):
    policy = ToolPayloadPolicy.load()
    with pytest.raises(CleanupError) as stale:
        service.save_policy(user=admin_user, enabled=False, age_value=5, age_unit="months",
                            revision=policy.revision + 1, backup_choice=None)
    assert (stale.value.code, stale.value.status) == ("stale_revision", 409)
    for call in (
        lambda: service.save_policy(user=member_user, enabled=False, age_value=5, age_unit="months",
                                    revision=policy.revision, backup_choice=None),
        lambda: service.start_analysis(user=member_user, age_value=3, age_unit="months"),
        lambda: service.start_run(user=member_user, revision=policy.revision),
        lambda: service.retry_preparation(user=member_user),
        lambda: service.cancel(user=member_user, operation_id=1),
        lambda: service.start_compact(user=member_user),
    ):
        with pytest.raises(CleanupError) as forbidden:
            call()
        assert (forbidden.value.code, forbidden.value.status) == ("forbidden", 403)
    assert ToolPayloadPolicy.load().revision == policy.revision
    assert ToolPayloadOperation.objects.count() == 0


@pytest.mark.django_db
def test_a_save_marks_analyses_of_other_settings_stale(admin_user):
    old_conversation("stale")
    six = run(service.start_analysis(user=admin_user, age_value=6, age_unit="months"))
    three = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    enable(admin_user, value=3, unit="months")
    six.refresh_from_db()
    three.refresh_from_db()
    assert (six.stale, three.stale) == (True, False)
    doc = service.status_document()
    assert doc["analysis_state"] == "completed" and doc["last_analysis"]["id"] == three.pk


# ---- One operation at a time ----------------------------------------------------------------


@pytest.mark.django_db
def test_one_operation_at_a_time_is_a_rule_of_the_database(admin_user):
    first = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    with pytest.raises(CleanupError) as busy:
        service.start_compact(user=admin_user)
    assert (busy.value.code, busy.value.status) == ("busy", 409)
    with pytest.raises(IntegrityError), transaction.atomic():  # the constraint, not Python, refuses
        ToolPayloadOperation.objects.create(kind="cleanup")
    assert ToolPayloadOperation.objects.count() == 1
    run(first)
    assert ToolPayloadOperation.objects.get(pk=first).slot is None
    assert service.start_compact(user=admin_user) > first


# ---- Analysis -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_analysis_counts_exactly_what_cleanup_removes_and_changes_nothing(admin_user):
    eligible = [old_conversation(f"old-{n}", tools=n + 1) for n in range(3)]
    recent = old_conversation("recent", days=10)
    working = old_conversation("working")
    Turn.objects.create(conversation=working, seq=1, state=TurnState.QUEUED)
    doomed = old_conversation("doomed")
    request_deletion(doomed, key="doomed-key", acting_user=admin_user)
    before = snapshot()

    op = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert snapshot() == before  # not one item row changed
    expected = Item.objects.filter(conversation__in=eligible, removable_bytes__gt=0)
    assert op.state == OperationState.SUCCEEDED
    assert op.scanned == 3 and op.eligible_conversations == 3
    assert op.eligible_messages == expected.count() == 3 * 1 + (1 + 2 + 3)
    assert op.payload_bytes == expected.aggregate(s=Sum("removable_bytes"))["s"] > 0
    assert json.loads(op.skipped_json) == {"protected": 6}
    assert op.cutoff is not None and op.progress_done == op.progress_total == 3
    assert service.status_document()["analysis_state"] == "completed"

    enable(admin_user)
    stored_before = Item.objects.aggregate(s=Sum("payload_bytes"))["s"]
    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert cleanup.state == OperationState.SUCCEEDED, cleanup.error_message
    assert cleanup.removed_messages == op.eligible_messages
    assert cleanup.payload_bytes == op.payload_bytes
    assert stored_before - Item.objects.aggregate(s=Sum("payload_bytes"))["s"] == op.payload_bytes
    # recent, working and doomed conversations are untouched
    for conversation in (recent, working):
        assert not Item.objects.filter(conversation=conversation, details_removed_at__isnull=False).exists()
    # what the database now holds equals the payloads' canonical size, to the byte
    from retention.reducer import encoded_size

    for item in Item.objects.filter(conversation__in=eligible, role="tool"):
        assert item.payload_bytes == encoded_size(item.payload)
    again = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert (again.eligible_messages, again.payload_bytes) == (0, 0)
    assert service.status_document()["analysis_state"] == "empty"


@pytest.mark.django_db
def test_cleanup_keeps_titles_order_statuses_summaries_prose_plans_and_todos(admin_user):
    conversation = old_conversation("keep", tools=4)
    archived_at = timezone.now() - timedelta(days=OLD)
    Conversation.objects.filter(pk=conversation.pk).update(archived_at=archived_at)
    keep = ["id", "seq", "role", "title", "status", "tool_call_id", "tool_kind", "content", "created_at", "turn_id"]
    before = list(Item.objects.filter(conversation=conversation).order_by("seq").values(*keep))
    protected = list(Item.objects.filter(conversation=conversation, tool_kind__in=["plan", "todo"])
                     .order_by("id").values_list("payload", "revision"))
    conversation.refresh_from_db()
    enable(admin_user)
    op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert op.state == OperationState.SUCCEEDED and op.removed_messages == 5
    assert list(Item.objects.filter(conversation=conversation).order_by("seq").values(*keep)) == before
    assert list(Item.objects.filter(conversation=conversation, tool_kind__in=["plan", "todo"])
                .order_by("id").values_list("payload", "revision")) == protected
    after = Conversation.objects.get(pk=conversation.pk)
    assert (after.title, after.last_activity_at, after.archived_at, after.state) == (
        conversation.title, conversation.last_activity_at, conversation.archived_at, conversation.state)
    for item in Item.objects.filter(conversation=conversation, tool_kind="shell"):
        assert "stdout" not in item.payload and "stderr" not in item.payload
        assert item.payload["command"].startswith("make test") and "exit_code" in item.payload
        assert item.details_removed_at is not None and item.payload_skip == "already_removed"
    reduced = Item.objects.get(conversation=conversation, tool_kind="read_file")
    assert reduced.payload["path"] == "/w/a.py" and "content" not in reduced.payload


@pytest.mark.django_db
def test_cleanup_keeps_no_digest_of_a_removed_payload_and_a_later_retry_still_replays(admin_user):
    """An append's Idempotency-Key digest is taken over its payload: cleanup removes it with the
    details (SQL and Python rewrites alike), and the retry is then compared with what the item
    holds, as for items older than the digests."""
    conversation = old_conversation("keyed", tools=0)
    sent = {"shell": shell(7), "read_file": {"path": "/w/b.py", "content": "print(2)\n" * 300, "line_count": 300},
            "plan": {"steps": ["kept"]}}
    keyed = {kind: append_item(conversation, role="tool", tool_kind=kind, tool_call_id=f"key-{kind}", status="completed",
                               title=kind, payload=payload, client_key=f"key-{kind}")
             for kind, payload in sent.items()}
    age(conversation, OLD)
    assert all(Item.objects.get(pk=item.pk).client_key_digest for item in keyed.values())
    enable(admin_user)
    op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert op.state == OperationState.SUCCEEDED, op.error_message
    for kind in ("shell", "read_file"):
        item = Item.objects.get(pk=keyed[kind].pk)
        assert item.payload_skip == "already_removed" and item.client_key_digest == "", kind
        again = append_item(conversation, role="tool", tool_kind=kind, tool_call_id=f"key-{kind}", status="completed",
                            title=kind, payload=sent[kind], client_key=f"key-{kind}")
        assert again.pk == item.pk and again.replayed
    assert Item.objects.get(pk=keyed["plan"].pk).client_key_digest  # a plan is not reduced: its digest stays
    assert Item.objects.filter(conversation=conversation, client_key__isnull=False).count() == 3


# ---- Guards between batches -----------------------------------------------------------------


@pytest.mark.django_db
def test_disabling_mid_run_stops_later_batches_and_keeps_committed_removals(admin_user, monkeypatch):
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    conversation = old_conversation("long", tools=8)
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    op = jobs._claim(op_id, "t")
    assert jobs._cleanup_batch(op, "t") == "next"
    policy = ToolPayloadPolicy.load()
    service.save_policy(user=admin_user, enabled=False, age_value=3, age_unit="months",
                        revision=policy.revision, backup_choice=None)
    assert jobs._cleanup_batch(op, "t") == "disabled"
    op.refresh_from_db()
    assert (op.state, op.error_code, op.removed_messages, op.slot) == ("partial", "disabled", 2, None)
    removed = Item.objects.filter(conversation=conversation, details_removed_at__isnull=False)
    assert removed.count() == 2
    assert Item.objects.filter(conversation=conversation, removable_bytes__gt=0).count() == 7


@pytest.mark.django_db
def test_cancel_stops_after_the_current_batch(admin_user, monkeypatch):
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 1)
    old_conversation("cancel", tools=4)
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    op = jobs._claim(op_id, "t")
    assert jobs._cleanup_batch(op, "t") == "next"
    service.cancel(user=admin_user, operation_id=op_id)
    assert jobs._cleanup_batch(op, "t") == "cancelled"
    op.refresh_from_db()
    assert (op.state, op.removed_messages) == ("partial", 1)
    with pytest.raises(CleanupError) as finished:
        service.cancel(user=admin_user, operation_id=op_id)
    assert finished.value.code == "not_cancellable"
    with pytest.raises(CleanupError) as unknown:
        service.cancel(user=admin_user, operation_id=op_id + 99)
    assert (unknown.value.code, unknown.value.status) == ("not_found", 404)


def first_batch_done(admin_user, monkeypatch) -> tuple[ToolPayloadOperation, Conversation, Conversation]:
    """A run of 2-item batches over two idle conversations, `busy` (6 tool items) and `quiet`
    (2), with its first batch (the first two items of `busy`) committed: (the run, busy, quiet)."""
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    busy = old_conversation("busy", tools=6)
    quiet = old_conversation("quiet", tools=2)
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    op = jobs._claim(op_id, "t")
    assert jobs._cleanup_batch(op, "t") == "next"
    return op, busy, quiet


@pytest.mark.django_db(transaction=True)
def test_a_foreground_write_between_batches_protects_its_conversation(admin_user, monkeypatch):
    op, busy, quiet = first_batch_done(admin_user, monkeypatch)

    def foreground() -> None:  # a runtime appending on its own connection
        try:
            append_item(Conversation.objects.get(pk=busy.pk), role="assistant", content="still working")
        finally:
            connection.close()

    writer = threading.Thread(target=foreground)
    writer.start()
    writer.join()
    while jobs._cleanup_batch(op, "t") == "next":
        pass
    op.refresh_from_db()
    assert op.state == "succeeded"
    removed = Item.objects.filter(details_removed_at__isnull=False)
    assert removed.filter(conversation=busy).count() == 2  # only the batch before the write
    assert removed.filter(conversation=quiet).count() == 3
    assert Item.objects.filter(conversation=busy, removable_bytes__gt=0).count() == 5
    assert skipped_for_activity(op) == {"recent_activity": 5}
    assert op.removed_messages == 5
    # r34: it went through both conversations it counted (one left alone as active again);
    # it said it had scanned 1 of 2 while it said it had succeeded
    assert op.scanned == op.eligible_conversations == 2
    assert service.status_document()["last_run"]["scanned"] == 2



@pytest.mark.django_db(transaction=True)
def test_an_item_written_after_the_run_counted_is_not_the_runs(admin_user, monkeypatch):
    """A tool item appended mid-run (its conversation active again) is neither removed nor
    counted by the run: removed plus skipped is what the run counted, and progress never
    passes its total."""
    op, busy, quiet = first_batch_done(admin_user, monkeypatch)  # counted, two items of `busy` removed
    op.refresh_from_db()
    counted = op.eligible_messages
    late = append_item(Conversation.objects.get(pk=busy.pk), role="tool", tool_kind="shell",
                       tool_call_id="late-1", payload=shell(99))
    assert late.removable_bytes > 0 and late.pk > op.last_item
    while jobs._cleanup_batch(op, "t") == "next":
        pass
    op.refresh_from_db()
    doc = service.status_document()["last_run"]
    assert op.state == "succeeded"
    assert op.removed_messages + skipped_for_activity(op)["recent_activity"] == counted
    assert (op.progress_done, op.progress_total) == (counted, counted)
    assert doc["removed_messages"] + sum(n for reason, n in doc["skipped"].items() if reason != "protected") == counted
    late.refresh_from_db()
    assert late.removable_bytes > 0 and late.details_removed_at is None  # the next run's
    assert Item.objects.filter(conversation=quiet, details_removed_at__isnull=False).count() > 0

def raced_item_run(admin_user, kind: str):
    """An idle conversation of shell items and one edit_file item, cleanup enabled and a run
    claimed; the item of `kind` a runtime's write will race (its plan stored or not)."""
    conversation = old_conversation("cas", tools=2)
    factories.add_tool(conversation, "edit_file", {"path": "/w/b.py", "changes": [
        {"old_content": "a" * 900, "new_content": "b" * 900, "line": 3}]}, tool_call_id="cas-e")
    age(conversation, OLD)
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    target = Item.objects.filter(conversation=conversation, tool_kind=kind).order_by("id").first()
    assert (target.removal_plan is not None) == (kind == "shell")
    return conversation, op, target


def assert_the_write_won(conversation, op, target) -> None:
    """The raced item is as the runtime left it, counted as changed; the others reduced once."""
    op.refresh_from_db()
    target.refresh_from_db()
    assert target.status == "failed" and target.details_removed_at is None and target.removable_bytes > 0
    assert "retention" not in target.payload
    assert skipped_for_activity(op) == {"changed": 1} and op.removed_messages == 3
    others = Item.objects.filter(conversation=conversation, details_removed_at__isnull=False)
    assert others.count() == 3 and target.pk not in set(others.values_list("id", flat=True))


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["shell", "edit_file"])  # rewritten in SQL from its plan / in Python
def test_a_concurrent_item_write_wins_over_the_batch(admin_user, monkeypatch, kind):
    """SQLite: the runtime's write lands between the batch's read and its write transaction."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite plans before its write transaction; PostgreSQL: the test after this one")
    conversation, op, target = raced_item_run(admin_user, kind)
    real = jobs._plan_items
    raced = []

    def racing(items, removed_at):
        planned = real(items, removed_at)
        if not raced:  # the runtime updates this item between the batch's read and its write
            raced.append(Item.objects.filter(pk=target.pk).update(revision=F("revision") + 1, status="failed"))
        return planned

    monkeypatch.setattr(jobs, "_plan_items", racing)
    while jobs._cleanup_batch(op, "t") == "next":
        pass
    assert raced == [1]
    assert_the_write_won(conversation, op, target)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["shell", "edit_file"])  # rewritten in SQL from its plan / in Python
def test_on_postgresql_a_write_that_holds_an_item_while_the_batch_writes_wins(admin_user, kind):
    """PostgreSQL reads a batch's items in the statement that writes them, its conversations
    locked. A writer that holds an item's row without that lock (a raw UPDATE, not the
    console's write path) makes the batch's UPDATE wait; once it commits, the batch's
    compare-and-swap finds the new revision and leaves the row as the writer left it,
    counted as changed, and the totals stay exact."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's row locks; SQLite: the test before this one")
    from django.db import connections

    conversation, op, target = raced_item_run(admin_user, kind)
    holding, outcome = threading.Event(), []

    def writer():
        other = connections.create_connection("default")
        try:
            with other.cursor() as cursor:
                cursor.execute("BEGIN")
                cursor.execute("UPDATE lifecycle_item SET revision = revision + 1, status = 'failed' WHERE id = %s",
                               [target.pk])
                cursor.execute("SELECT pg_backend_pid()")
                pid = cursor.fetchone()[0]
                holding.set()
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:  # until the batch waits for this row
                    cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND %s = ANY(pg_blocking_pids(pid))",
                                   [pid])
                    if cursor.fetchone()[0]:
                        outcome.append("waited")
                        break
                    time.sleep(0.02)
                cursor.execute("COMMIT")
        finally:
            other.close()

    thread = threading.Thread(target=writer)
    thread.start()
    assert holding.wait(30)
    while jobs._cleanup_batch(op, "t") == "next":
        pass
    thread.join()
    assert outcome == ["waited"]
    assert_the_write_won(conversation, op, target)


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_run_whose_connection_ends_mid_batch_goes_on_with_exact_totals(admin_user, monkeypatch):
    """The server ends the job's session as the run claims it and while a batch writes (a
    restart, a failover, an operator's pg_terminate_backend): the batch's transaction is lost,
    the run is not. It goes on from its committed cursor on a new connection, and ends with
    every removable item removed and counted once (r94: it ended failed as an unexpected
    error; r97: a claim on the ended session failed the task, and the run stood still until
    its lease ran out)."""
    if connection.vendor != "postgresql":
        pytest.skip("a server ending a session; SQLite has no server")
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    monkeypatch.setattr(jobs, "LOST_CONNECTION_PAUSE", 0)
    for n in range(2):
        old_conversation(f"lost-{n}", tools=3)
    enable(admin_user)
    expected = Item.objects.filter(removable_bytes__gt=0).count()
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    write, ended = jobs._write_span, []

    def ending(*args, **kwargs):
        if not ended:
            ended.append(factories.end_database_session())
        return write(*args, **kwargs)

    monkeypatch.setattr(jobs, "_write_span", ending)
    factories.end_database_session()  # before the run's claim too (r97: the task failed there)
    op = run(op_id)
    assert ended and connection.connection.info.backend_pid != ended[0]  # went on in a new session
    removed = Item.objects.filter(details_removed_at__isnull=False).count()
    assert (op.state, op.error_code, op.removed_messages, removed) == ("succeeded", "", expected, expected)
    assert op.attempts == 0  # no lease was left to run out and be taken over
    assert expected == 8 and not Item.objects.filter(removable_bytes__gt=0).exists()


@pytest.mark.django_db(transaction=True)
def test_a_write_between_a_batchs_read_and_its_write_is_kept_and_the_totals_stay_exact(admin_user, monkeypatch):
    """A runtime's write to an item after the batch read it (here without touching the
    conversation, so the conversation stays eligible). SQLite planned the item before the
    write transaction: the compare-and-swap leaves it as the runtime wrote it, counted as
    changed. PostgreSQL reads the item in the statement that writes it: the item is reduced
    as the runtime left it (its new status kept). Either way the write is not lost and every
    item counted at the start is accounted for once."""
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    conversations = [old_conversation(f"ahead-{n}", tools=3) for n in range(3)]
    eligible = Item.objects.filter(conversation__in=conversations, removable_bytes__gt=0)
    expected = eligible.aggregate(n=Count("id"), b=Sum("removable_bytes"))
    enable(admin_user)
    real = jobs._read_batch
    raced: list[int] = []

    def reading(*args, **kwargs):
        read = real(*args, **kwargs)
        if not raced and len(read.conversations) and read.batch_bytes:
            ids = Item.objects.filter(conversation_id=read.conversations[0], removable_bytes__gt=0)
            after = read.cursor[1] if read.cursor[0] == read.conversations[0] else 0
            target = ids.filter(id__gt=after).order_by("id").values_list("id", flat=True).first()
            raced.append(target)
            Item.objects.filter(pk=target).update(revision=F("revision") + 1, status="failed")
        return read

    monkeypatch.setattr(jobs, "_read_batch", reading)
    op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert op.state == "succeeded" and len(raced) == 1
    target = Item.objects.get(pk=raced[0])
    assert target.status == "failed"
    if connection.vendor == "sqlite":
        assert target.details_removed_at is None and "retention" not in target.payload
        assert skipped_for_activity(op) == {"changed": 1}
        assert op.removed_messages == expected["n"] - 1
        assert op.payload_bytes == expected["b"] - target.removable_bytes
        assert not eligible.exclude(pk=target.pk).exists()  # every other item reduced, once
    else:
        assert target.details_removed_at is not None and "stdout" not in target.payload
        assert skipped_for_activity(op) == {}
        assert (op.removed_messages, op.payload_bytes) == (expected["n"], expected["b"])
        assert not eligible.exists()


@pytest.mark.django_db
def test_a_batch_that_runs_out_of_time_commits_what_it_handled_and_the_next_goes_on_from_there(
        admin_user, monkeypatch):
    """With a pause between batches (SQLite's default) a batch stops writing once it has held
    the lock for its time: the cursor moves only over the items it handled, the rest are read
    again, and the totals end exact, nothing counted twice. (PostgreSQL's writers wait only
    for the batch's own conversations, and it writes a batch in one statement: it never
    stops early.)"""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's one write lock; PostgreSQL writes a batch in one statement")
    monkeypatch.setattr(jobs, "PAUSE_SET", True)
    monkeypatch.setattr(jobs, "SQLITE_PAUSE", 0.001)
    monkeypatch.setattr(jobs, "BATCH_SECONDS_SET", True)
    monkeypatch.setattr(jobs, "BATCH_SECONDS", 1e-9)
    monkeypatch.setattr(jobs._Pace, "write_limit", lambda self: 0.0)  # every batch is out of time after one chunk
    monkeypatch.setattr(jobs, "WRITE_CHUNK", 2)
    conversations = [old_conversation(f"slow-{n}", tools=3) for n in range(2)]
    eligible = Item.objects.filter(conversation__in=conversations, removable_bytes__gt=0)
    expected = eligible.aggregate(n=Count("id"), b=Sum("removable_bytes"))
    assert expected["n"] == 8
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    cursors = []

    def after_batch(_result):
        fresh = ToolPayloadOperation.objects.get(pk=op.pk)
        cursors.append((fresh.cursor_conversation, fresh.cursor_item, fresh.removed_messages))

    assert jobs._cleanup_step(op, "t", after_batch=after_batch) == "done"
    done = ToolPayloadOperation.objects.get(pk=op.pk)
    assert done.state == "succeeded"
    assert (done.removed_messages, done.payload_bytes) == (expected["n"], expected["b"])
    assert done.progress_done == expected["n"] and skipped_for_activity(done) == {}
    assert not eligible.exists()
    # two items a batch, each batch's cursor on the last item it handled
    assert [removed for _c, _i, removed in cursors[:4]] == [2, 4, 6, 8]
    ids = list(Item.objects.filter(conversation__in=conversations, details_removed_at__isnull=False)
               .order_by("conversation_id", "id").values_list("conversation_id", "id"))
    assert [(c, i) for c, i, _removed in cursors[:3]] == [ids[1], ids[3], ids[5]]


@pytest.mark.django_db
def test_a_byte_budget_smaller_than_one_item_still_takes_one_item_a_batch(admin_user, monkeypatch):
    """The byte budget never stops a batch before its first item (no item is skipped for its
    size): with a budget of one byte every batch takes exactly one item, its cursor on it,
    and the totals end exact."""
    monkeypatch.setattr(jobs, "FIRST_BATCH_BYTES", 1)
    monkeypatch.setattr(jobs, "BATCH_BYTES", 1)
    conversations = [old_conversation(f"budget-{n}", tools=2) for n in range(2)]
    eligible = Item.objects.filter(conversation__in=conversations, removable_bytes__gt=0)
    expected = eligible.aggregate(n=Count("id"), b=Sum("removable_bytes"))
    ids = list(eligible.order_by("conversation_id", "id").values_list("conversation_id", "id"))
    assert expected["n"] == len(ids) > 4
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    cursors = []

    def after_batch(_result):
        fresh = ToolPayloadOperation.objects.get(pk=op.pk)
        cursors.append(((fresh.cursor_conversation, fresh.cursor_item), fresh.removed_messages))

    assert jobs._cleanup_step(op, "t", after_batch=after_batch) == "done"
    done = ToolPayloadOperation.objects.get(pk=op.pk)
    assert done.state == "succeeded" and skipped_for_activity(done) == {}
    assert (done.removed_messages, done.payload_bytes) == (expected["n"], expected["b"])
    assert [cursor for cursor, _removed in cursors[:len(ids) - 1]] == ids[:-1]  # one item a batch
    assert [removed for _cursor, removed in cursors[:len(ids)]] == list(range(1, len(ids) + 1))
    assert not eligible.exists()


@pytest.mark.django_db
def test_a_conversation_active_again_before_the_run_reaches_it_is_counted_as_skipped(admin_user, monkeypatch):
    """Its items were counted at the start; the run never reaches it as eligible. They are
    skipped as recent activity, so the finished run has nothing left over (it showed them as
    remaining work of a succeeded run)."""
    monkeypatch.setattr(jobs, "CONVERSATIONS_PER_BATCH", 1)
    first, second = old_conversation("first", tools=2), old_conversation("second", tools=2)
    theirs = Item.objects.filter(conversation=second, removable_bytes__gt=0).count()
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    woken = []

    def after_batch(_result):
        if not woken:
            woken.append(factories.add_message(second, "user", "back again"))  # the runtime writes
            Conversation.objects.filter(pk=second.pk).update(last_activity_at=timezone.now())

    assert jobs._cleanup_step(op, "t", after_batch=after_batch) == "done"
    done = ToolPayloadOperation.objects.get(pk=op.pk)
    assert done.state == "succeeded"
    assert skipped_for_activity(done) == {"recent_activity": theirs}
    assert done.progress_done == done.progress_total == done.removed_messages + theirs
    assert not Item.objects.filter(conversation=second, details_removed_at__isnull=False).exists()
    assert not Item.objects.filter(conversation=first, removable_bytes__gt=0).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["shell_job", "approval", "user_input", "dynamic_tool", "task", "automation"])
def test_open_runtime_work_protects_an_old_conversation_from_analysis_and_cleanup(admin_user, kind):
    """AC-TPR-001.3: active work is protected at any age, not only a queued or running turn
    (r150: a live shell job that wrote nothing for months had its output removed while it ran).
    Resolved, the claim protects nothing any more."""
    from lifecycle.models import RuntimeClaim

    held, free = old_conversation("held", tools=2), old_conversation("free", tools=2)
    claim = RuntimeClaim.objects.create(conversation=held, kind=kind)
    before = {i.pk: i.payload for i in Item.objects.filter(conversation=held)}
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert analysis.eligible_conversations == 1
    enable(admin_user)
    cleaned = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert cleaned.state == "succeeded" and cleaned.eligible_conversations == 1
    assert {i.pk: i.payload for i in Item.objects.filter(conversation=held)} == before
    assert not Item.objects.filter(conversation=held, details_removed_at__isnull=False).exists()
    assert Item.objects.filter(conversation=free, details_removed_at__isnull=False).count() == 3

    RuntimeClaim.objects.filter(pk=claim.pk).update(resolved_at=timezone.now())
    assert jobs.eligible_conversations(timezone.now()).filter(pk=held.pk).exists()
    # A run counted while the claim was open does not take the conversation later
    was_open = claim.opened_at + timedelta(microseconds=1)
    assert not jobs.eligible_conversations(timezone.now(), as_of=was_open).filter(pk=held.pk).exists()


def _analysis_with(user, monkeypatch, *, after_read) -> ToolPayloadOperation:
    """An analysis run to its end, `after_read()` called each time a batch has read its
    conversations (before it records them); the operation as stored."""
    op = jobs._claim(service.start_analysis(user=user, age_value=3, age_unit="months"), "t")
    original = jobs._skip_counts

    def counting(items):
        found = original(items)
        after_read()
        return found

    monkeypatch.setattr(jobs, "_skip_counts", counting)
    while jobs._analysis_step(op, "t") != "done":
        op.refresh_from_db()
    return ToolPayloadOperation.objects.get(pk=op.pk)


@pytest.mark.django_db
def test_an_analysis_that_leaves_out_a_conversation_no_longer_idle_still_ends_its_count(admin_user, monkeypatch):
    """r156: a conversation counted, then with work opened and ended before its batch, was left
    out by the batches (as it should), and the analysis succeeded at 'done 1 of 2'."""
    from lifecycle.models import RuntimeClaim

    monkeypatch.setattr(jobs, "ANALYSIS_BATCH", 1)
    old_conversation("first", tools=2)
    second = old_conversation("second", tools=2)
    def work_came_and_went():  # after the count, before the second conversation's batch
        if not RuntimeClaim.objects.exists():
            now = timezone.now()
            RuntimeClaim.objects.create(conversation=second, kind="shell_job", opened_at=now, resolved_at=now)

    done = _analysis_with(admin_user, monkeypatch, after_read=work_came_and_went)
    assert (done.state, done.progress_total, done.progress_done, done.scanned) == ("succeeded", 2, 2, 1)
    assert done.eligible_conversations == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["run", "analysis"])
def test_work_that_began_after_the_count_and_ended_before_the_batch_leaves_the_conversation_out(
        admin_user, monkeypatch, kind):
    """r154: a claim opened after the run's count time (the count's snapshot is a moment later,
    or a writer's clock runs ahead) kept the conversation out of the count; once resolved, the
    batches took it: done 9 of 6. Work that ended after the count time leaves it out, whenever
    it began; the analysis scans only what it counted too (it scanned 7 of 6)."""
    from lifecycle.models import RuntimeClaim

    monkeypatch.setattr(jobs, "CONVERSATIONS_PER_BATCH", 1)
    monkeypatch.setattr(jobs, "ANALYSIS_BATCH", 1)
    old_conversation("first", tools=2)
    second = old_conversation("second", tools=2)
    later = timezone.now() + timedelta(seconds=30)  # opened after the count's time
    claim = RuntimeClaim.objects.create(conversation=second, kind="shell_job", opened_at=later)
    resolved = []

    def resolve(*_args):
        if not resolved:
            resolved.append(RuntimeClaim.objects.filter(pk=claim.pk).update(resolved_at=later + timedelta(seconds=1)))

    if kind == "analysis":
        done = _analysis_with(admin_user, monkeypatch, after_read=resolve)  # the work ends after the first read
        assert (done.state, done.progress_total, done.scanned, done.progress_done) == ("succeeded", 1, 1, 1)
        assert done.eligible_conversations == 1
        return
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    assert jobs._cleanup_step(op, "t", after_batch=resolve) == "done"
    done = ToolPayloadOperation.objects.get(pk=op.pk)
    assert done.state == "succeeded" and done.eligible_conversations == 1
    assert done.progress_done == done.progress_total == done.removed_messages == 3
    assert not Item.objects.filter(conversation=second, details_removed_at__isnull=False).exists()


@pytest.mark.django_db
def test_a_run_counts_what_it_leaves_alone_as_the_analysis_does(admin_user):
    """Unknown or unsupported data stays intact and is counted as skipped (AC-TPR-002.5), in the
    run's own results too (002.6), as the analysis counted it; details removed by an earlier
    run are done, not skipped."""
    conversation = old_conversation("mixed", tools=2)  # its plan and todo are protected
    factories.add_tool(conversation, "generic", {"output": "not a known shape", "x": [1, 2]}, tool_call_id="g-1")
    factories.add_tool(conversation, "shell", ["not", "an", "object"], tool_call_id="s-bad")
    age(conversation, OLD)
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    expected = json.loads(analysis.skipped_json)
    assert expected.get("protected") == 2 and sum(expected.values()) >= 3, expected
    enable(admin_user)
    first = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert first.state == "succeeded" and json.loads(first.skipped_json) == expected
    # Each reduced row's updated_at is the removal's time (a late update relies on it)
    reduced = Item.objects.filter(conversation=conversation, details_removed_at__isnull=False)
    assert reduced.count() == 3 and not reduced.exclude(updated_at=F("details_removed_at")).exists()
    # A second run: the same left alone, the items reduced by the first are not "skipped"
    second = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert second.removed_messages == 0 and json.loads(second.skipped_json) == expected


def test_a_list_of_conversations_read_from_further_on_is_not_used_for_an_earlier_cursor():
    """The pace keeps the eligible conversations it last read and where it read them from; a
    cursor before that (a batch committed another cursor than the read-ahead expected) reads
    again instead of taking the list, which would skip the conversations in between."""
    pace = jobs._Pace.__new__(jobs._Pace)
    pace.window = (5, [5, 6, 9])
    assert pace.candidates_from(6) == [6, 9]
    assert pace.candidates_from(5) == [5, 6, 9]
    assert pace.candidates_from(3) is None  # 3 and 4 may be eligible: not in this list
    assert pace.candidates_from(10) is None  # past it


@pytest.mark.django_db(transaction=True)
def test_batches_that_stop_early_skip_no_conversation(admin_user, monkeypatch):
    """Batches that run out of time (a pause set; on SQLite they stop after a chunk) commit an
    earlier cursor than their read expected: the next batch starts from the committed cursor,
    not from the conversations read before (that once skipped the rest of a conversation as
    recent activity, and the conversations in between silently). On PostgreSQL no batch stops
    early (one statement each); there the same settings run the same data to the same end."""
    monkeypatch.setattr(jobs, "CONVERSATIONS_PER_BATCH", 3)
    monkeypatch.setattr(jobs, "PAUSE_SET", True)
    monkeypatch.setattr(jobs, "SQLITE_PAUSE", 0.001)
    monkeypatch.setattr(jobs, "BATCH_SECONDS_SET", True)
    monkeypatch.setattr(jobs, "BATCH_SECONDS", 1e-9)
    monkeypatch.setattr(jobs._Pace, "write_limit", lambda self: 0.0)  # every batch stops after a chunk
    monkeypatch.setattr(jobs, "WRITE_CHUNK", 3)
    conversations = [old_conversation(f"early-{n}", tools=tools) for n, tools in enumerate([4, 12, 2, 2, 2])]
    eligible = Item.objects.filter(conversation__in=conversations, removable_bytes__gt=0)
    expected = eligible.aggregate(n=Count("id"), b=Sum("removable_bytes"))
    enable(admin_user)
    done = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert done.state == "succeeded"
    assert skipped_for_activity(done) == {}  # every conversation stayed idle
    assert (done.removed_messages, done.payload_bytes) == (expected["n"], expected["b"])
    assert not eligible.exists()


# ---- Fail closed ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_unreadable_state_is_shown_as_an_error_and_nothing_runs(admin_user):
    old_conversation("closed")
    enable(admin_user)
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="sideways")
    doc = service.status_document()
    assert doc["error"]["code"] == "state_unreadable"
    for call in (
        lambda: service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision),
        lambda: service.start_analysis(user=admin_user, age_value=3, age_unit="months"),
        lambda: service.start_compact(user=admin_user),
    ):
        with pytest.raises(CleanupError) as refused:
            call()
        assert refused.value.code == "state_unreadable"
    assert jobs.daily_check() == "state_unreadable"
    assert ToolPayloadOperation.objects.count() == 0
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="ready")
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    ToolPayloadOperation.objects.filter(pk=op_id).update(skipped_json="{not json")
    assert service.status_document()["error"]["code"] == "state_unreadable"
    assert run(op_id).state == "failed"
    assert ToolPayloadOperation.objects.get(pk=op_id).error_code == "state_unreadable"


# ---- Preparation ----------------------------------------------------------------------------


@pytest.mark.django_db
def test_run_with_backup_chosen_waits_for_preparation_and_an_interrupted_one_blocks(admin_user):
    old_conversation("prep")
    enable(admin_user, choice="create")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert op.kind == "backup" and op.then_cleanup
    assert ToolPayloadPolicy.load().preparation_state == "preparing"
    # The worker running the backup dies: its lease expires, and the next run finds it.
    ToolPayloadOperation.objects.filter(pk=op_id).update(
        state="running", lease="dead", heartbeat_at=timezone.now() - timedelta(seconds=jobs.LEASE_SECONDS + 5))
    op = run(op_id)
    assert (op.state, op.error_code) == ("failed", "interrupted")
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed" and policy.preparation_error
    with pytest.raises(CleanupError) as blocked:
        service.start_run(user=admin_user, revision=policy.revision)
    assert (blocked.value.code, blocked.value.status) == ("preparation_required", 409)
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()
    service.cancel(user=admin_user, operation_id=op_id)  # Cancel on the failed preparation
    assert ToolPayloadPolicy.load().preparation_state == "cancelled"
    with pytest.raises(CleanupError):
        service.start_run(user=admin_user, revision=policy.revision)
    retry = service.retry_preparation(user=admin_user)
    assert ToolPayloadOperation.objects.get(pk=retry).kind == "backup"
    assert ToolPayloadPolicy.load().preparation_state == "preparing"
    doc = service.status_document()
    assert doc["operation"]["id"] == retry and doc["preparation"]["state"] == "preparing"


@pytest.mark.django_db
def test_a_heartbeat_from_before_the_clock_was_set_back_is_no_sign_of_life(admin_user):
    """r103: a run killed on a host whose clock was then set back an hour left a heartbeat an
    hour ahead: it stayed "running", not stalled, never taken over, and every other operation
    was refused as busy for the hour. Within a lease ahead (clocks of two hosts) it still holds."""
    old_conversation("clock")
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    ahead = timezone.now() + timedelta(seconds=jobs.LEASE_SECONDS // 2)
    ToolPayloadOperation.objects.filter(pk=op_id).update(state="running", lease="other-host", heartbeat_at=ahead)
    assert jobs._claim(op_id, "second") is None  # a live holder a little ahead keeps it
    assert service._progress_signs(ToolPayloadOperation.objects.get(pk=op_id))["stalled"] is False
    ToolPayloadOperation.objects.filter(pk=op_id).update(heartbeat_at=timezone.now() + timedelta(hours=1))
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert service._progress_signs(op)["stalled"] is True and jobs.quiet_since(op) > jobs.LEASE_SECONDS
    assert jobs.recover() == 1  # the minute's recovery queues its run
    taken = jobs._claim(op_id, "second")
    assert taken is not None and (taken.lease, taken.attempts) == ("second", op.attempts + 1)
    assert abs((taken.heartbeat_at - timezone.now()).total_seconds()) < 5
    jobs._release(op_id, "second")
    assert run(op_id).state == "succeeded"  # and it finishes


@pytest.mark.django_db
def test_a_fresh_lease_keeps_a_second_delivery_out(admin_user):
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    assert jobs._claim(op_id, "first") is not None
    assert jobs.run_operation(op_id) == "busy"
    assert ToolPayloadOperation.objects.get(pk=op_id).lease == "first"


@pytest.mark.django_db
def test_the_schedules_exist_once_and_the_daily_check_starts_a_cleanup(admin_user):
    from django_q.models import Schedule

    from retention.schedules import ensure_schedules

    ensure_schedules()
    ensure_schedules()
    assert Schedule.objects.filter(name=jobs.DAILY).count() == 1
    assert jobs.daily_check() == "disabled"
    old_conversation("daily")
    enable(admin_user)
    assert jobs.daily_check().startswith("started")
    op = ToolPayloadOperation.objects.get()
    # The check the save made due starts the save's first run: its admin's (r137: "the schedule's")
    assert (op.kind, op.started_by) == ("cleanup", admin_user)
    assert service.status_document()["operation"]["started_by"] == "alice"
    assert jobs.daily_check() == "busy"
    assert run(op.pk).removed_messages == 4
    assert service.status_document()["next_check_at"] is not None
    old_conversation("the next day")
    assert jobs.daily_check().startswith("started")  # the next checks are the schedule's own
    assert ToolPayloadOperation.objects.latest("pk").started_by is None
    assert service.status_document()["operation"]["started_by"] == "schedule"


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["analyze", "save"])
def test_it_keeps_a_due_daily_check_due_when_an_admin_analyzes_or_saves(admin_user, action):
    """The cluster was stopped two days: the check is "Due since ...". An analysis or a save
    (wake_schedule) put it off to a day from now; it stays due, to run at the next pass."""
    from django_q.models import Schedule

    from retention.schedules import ensure_schedules

    ensure_schedules()
    enable(admin_user)
    overdue = timezone.now() - timedelta(days=2)
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=overdue)
    if action == "analyze":
        service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    else:
        enable(admin_user, value=4)
    assert jobs.next_check_at() == overdue
    assert jobs.check_is_due(jobs.next_check_at())


@pytest.mark.django_db
def test_turning_cleanup_on_makes_its_first_run_due_now_and_it_starts_with_the_backup(admin_user):
    """AC-TPR-002.6 (r90): enabled with Create backup, nothing started until the daily check,
    up to a day later. Turning it on, or shortening the period, makes the check due at the
    cluster's next pass, which starts the backup, then the cleanup; other saves do not."""
    from django_q.models import Schedule

    from retention.schedules import ensure_schedules

    ensure_schedules()
    later = timezone.now() + timedelta(hours=20)
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=later)
    old_conversation("first-run")
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="create")
    assert jobs.next_check_at() <= timezone.now()
    assert jobs.daily_check().startswith("started")
    backup = ToolPayloadOperation.objects.get()  # (its run, then the cleanup's: tests/test_backups.py)
    assert (backup.kind, backup.started_by, ToolPayloadPolicy.load().preparation_state) == (
        "backup", admin_user, "preparing")  # the save's first run, credited to the admin who saved (r137)
    assert ToolPayloadPolicy.load().woken_by is None
    ToolPayloadOperation.objects.filter(pk=backup.pk).update(state="cancelled", slot=None)
    # A longer period is no first run: the check stays where it was
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=later)
    service.save_policy(user=admin_user, enabled=True, age_value=4, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice=None)
    assert jobs.next_check_at() == later and ToolPayloadPolicy.load().woken_by is None
    # A shorter one is
    service.save_policy(user=admin_user, enabled=True, age_value=2, age_unit="months",
                        revision=ToolPayloadPolicy.load().revision, backup_choice="skip")
    assert jobs.next_check_at() <= timezone.now() and ToolPayloadPolicy.load().woken_by == admin_user
    # Run now starts that first run itself: the check then is the schedule's again
    service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    assert ToolPayloadPolicy.load().woken_by is None


@pytest.mark.django_db
def test_it_gives_a_daily_check_with_no_next_run_or_a_far_one_a_run_within_a_day(admin_user):
    from django_q.models import Schedule

    from retention.schedules import ensure_schedules

    ensure_schedules()
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=None)
    jobs.wake_schedule()
    assert jobs.next_check_at() <= timezone.now()
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=timezone.now() + timedelta(days=9))
    jobs.wake_schedule()
    assert jobs.next_check_at() <= timezone.now() + timedelta(days=1)


# ---- Crash safety on a real cluster ---------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_cleanup_killed_with_sigkill_resumes_on_a_real_cluster_with_exact_totals(
        admin_user, engine_home, tmp_path):
    import os
    import subprocess
    import sys
    import time

    from tests.test_erasure_crash import stop_group
    from tests.test_jobs import ROOT, database_url

    conversations = [old_conversation(f"crash-{n}", tools=6) for n in range(4)]
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert analysis.eligible_messages == 4 * 7
    stored_before = Item.objects.aggregate(s=Sum("payload_bytes"))["s"]
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    kills = tmp_path / "kills"
    kills.mkdir()
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1",
           # Small batches and long pauses: the run lasts long enough to be killed mid-way
           # even when a loaded machine slows this test's polling.
           "LETHE_TOOL_CLEANUP_BATCH": "2", "LETHE_TOOL_CLEANUP_PAUSE": "1.0",
           "LETHE_TOOL_JOB_LEASE_SECONDS": "2", "LETHE_TOOL_JOB_STEP_SECONDS": "600",
           "LETHE_TEST_KILL_AT": "tool-cleanup-mid-batch,tool-cleanup-after-batch", "LETHE_TEST_KILL_DIR": str(kills)}

    def start():
        return subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def op() -> ToolPayloadOperation:
        return ToolPayloadOperation.objects.get(pk=op_id)

    cluster = start()
    try:
        # The worker kills itself mid-batch (rolled back) and after a batch (committed);
        # each time the cluster replaces it and the startup recovery takes the run over.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                len(list(kills.iterdir())) == 2 and op().removed_messages >= 6):
            time.sleep(0.1)
        assert op().state == "running", op().error_message
        # Now the whole cluster dies with SIGKILL in the middle of the run, and starts again.
        os.killpg(cluster.pid, 9)
        cluster.wait()
        committed = op().removed_messages
        assert 0 < committed < 28
        cluster = start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and op().state == "running":
            time.sleep(0.2)
    finally:
        stop_group(cluster)
    final = op()
    assert sorted(p.name for p in kills.iterdir()) == ["tool-cleanup-after-batch", "tool-cleanup-mid-batch"]
    # three takeovers of a dead run's lease, each followed by a batch: none counts against the run
    assert (final.state, final.attempts) == ("succeeded", 0), final.error_message
    assert final.removed_messages == analysis.eligible_messages == 28  # nothing counted twice
    assert final.scanned == final.eligible_conversations == analysis.eligible_conversations  # nor conversations
    assert final.payload_bytes == analysis.payload_bytes
    assert stored_before - Item.objects.aggregate(s=Sum("payload_bytes"))["s"] == analysis.payload_bytes
    # What the run left alone counted once across the kills (the plans and todos, as the
    # analysis counted them), and nothing skipped for activity
    assert json.loads(final.skipped_json) == json.loads(analysis.skipped_json) == {"protected": 8}
    for conversation in conversations:
        assert not Item.objects.filter(conversation=conversation, removable_bytes__gt=0).exists()
        assert Item.objects.filter(conversation=conversation, details_removed_at__isnull=False).count() == 7


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("point", ["tool-backup-copied", "tool-backup-published"])
def test_a_backup_killed_with_sigkill_on_a_real_cluster_blocks_or_counts_and_removes_nothing(
        admin_user, engine_home, settings, tmp_path, point):
    """The worker making the preparation backup dies with SIGKILL: with a whole copy written but
    not published, or just after publishing it (before its job recorded anything). The cluster
    replaces it and the recovery takes the job over: unpublished, the preparation is interrupted
    (Retry or Cancel), the copy is gone from the folder, and nothing is listed; published, the
    backup counts as made, once. Either way no cleanup starts and no row changes."""
    import os
    import subprocess
    import sys
    import time

    from retention.backups import list_backups
    from tests.test_erasure_crash import stop_group
    from tests.test_jobs import ROOT, database_url

    folder = tmp_path / "backups"
    settings.LETHE_BACKUP_DIR = str(folder)
    kills = tmp_path / "kills"
    kills.mkdir()
    old_conversation("backed-up", tools=3)
    before = snapshot()
    enable(admin_user, choice="create")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    env = {**os.environ, "DATABASE_URL": database_url(), "ENGINE_HOME": str(engine_home),
           "LETHE_BACKUP_DIR": str(folder), "DJANGO_SETTINGS_MODULE": "console.settings_test", "Q_WORKERS": "1",
           "LETHE_TOOL_JOB_LEASE_SECONDS": "2", "LETHE_TEST_KILL_AT": point, "LETHE_TEST_KILL_DIR": str(kills)}
    cluster = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and ToolPayloadOperation.objects.get(pk=op_id).state in ("queued", "running"):
            time.sleep(0.2)
    finally:
        stop_group(cluster)
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert [p.name for p in kills.iterdir()] == [point]  # the worker was killed there, once
    assert op.attempts == 1  # one takeover of the dead run's lease
    policy = ToolPayloadPolicy.load()
    listed = list_backups()
    if point == "tool-backup-copied":
        assert (op.state, op.error_code, op.backup_name) == ("failed", "interrupted", ""), op.error_message
        assert policy.preparation_state == "failed" and policy.preparation_error
        assert listed == []
        # the killed run's whole copy of the database is not left behind
        assert sorted(p.name for p in folder.iterdir()) == [".lock"]
    else:
        assert op.state == "succeeded", op.error_message
        assert [r.name for r in listed] == [op.backup_name] and listed[0].sha256 == op.backup_sha256
        assert (policy.preparation_state, policy.backup_receipt_name) == ("ready", op.backup_name)
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    assert snapshot() == before


# ---- Preparation with a real backup ---------------------------------------------------------


@pytest.fixture
def backup_dir(settings, tmp_path):
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    return tmp_path / "backups"


@pytest.mark.django_db(transaction=True)
def test_a_verified_backup_comes_first_then_cleanup_follows(admin_user, backup_dir):
    conversation = old_conversation("backed-up", tools=2)
    enable(admin_user, choice="create")
    backup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert backup.kind == "backup" and backup.state == "succeeded", backup.error_message
    assert (backup_dir / backup.backup_name).is_file() and len(backup.backup_sha256) == 64
    policy = ToolPayloadPolicy.load()
    assert (policy.preparation_state, policy.backup_receipt_name) == ("ready", backup.backup_name)
    cleanup = ToolPayloadOperation.objects.get(kind="cleanup")
    assert cleanup.started_by_id == admin_user.pk and cleanup.state == "queued"
    assert run(cleanup.pk).removed_messages == 3
    assert Item.objects.filter(conversation=conversation, details_removed_at__isnull=False).count() == 3
    doc = service.status_document()
    assert [b["name"] for b in doc["backups"]] == [backup.backup_name]
    assert [op["kind"] for op in doc["history"]] == ["cleanup", "backup"]
    assert doc["history"][1]["backup"]["sha256"] == backup.backup_sha256


@pytest.mark.django_db(transaction=True)
def test_a_backup_published_before_its_run_was_lost_counts_as_made_without_a_cleanup(admin_user, backup_dir):
    """A backup job killed after it published its copy, or a database restored from that very
    copy (which shows the backup still running): the backup is done, the preparation is ready,
    and nothing is removed until someone asks."""
    from retention.backups import create_backup

    conversation = old_conversation("published", tools=2)
    removable = Item.objects.filter(conversation=conversation, removable_bytes__gt=0).count()
    before = snapshot()
    enable(admin_user, choice="create")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    assert jobs._claim(op_id, "dead-run") is not None
    receipt = create_backup(operation=op_id)  # the dead run's copy, published with its receipt
    ToolPayloadOperation.objects.filter(pk=op_id).update(
        heartbeat_at=timezone.now() - timedelta(seconds=jobs.LEASE_SECONDS + 5))
    op = run(op_id)
    assert (op.state, op.backup_name, op.backup_sha256, op.backup_size) == (
        "succeeded", receipt.name, receipt.sha256, receipt.size), op.error_message
    policy = ToolPayloadPolicy.load()
    assert (policy.preparation_state, policy.backup_receipt_name) == ("ready", receipt.name)
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists() and snapshot() == before
    cleanup = run(service.start_run(user=admin_user, revision=policy.revision))
    assert (cleanup.kind, cleanup.state, cleanup.removed_messages) == ("cleanup", "succeeded", removable)



@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cancelled", [False, True])
def test_a_published_backup_that_no_longer_checks_out_fails_the_preparation_saying_why(admin_user, backup_dir,
                                                                                      cancelled):
    import os

    from retention.backups import create_backup

    old_conversation("damaged", tools=2)
    before = snapshot()
    enable(admin_user, choice="create")
    retry = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    assert jobs._claim(retry, "dead-run") is not None
    damaged = create_backup(operation=retry)
    stat = damaged.path.stat()
    with damaged.path.open("r+b") as handle:  # one byte changed in place, the time put back
        handle.seek(stat.st_size // 2)
        byte = handle.read(1)
        handle.seek(stat.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(damaged.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    ToolPayloadOperation.objects.filter(pk=retry).update(
        heartbeat_at=timezone.now() - timedelta(seconds=jobs.LEASE_SECONDS + 5))
    if cancelled:  # r148: a Cancel accepted meanwhile said "nothing was kept" of the copy that stays
        service.cancel(user=admin_user, operation_id=retry)
        ToolPayloadOperation.objects.filter(pk=retry).update(
            heartbeat_at=timezone.now() - timedelta(seconds=jobs.LEASE_SECONDS + 5))
        ended = run(retry)
        assert (ended.state, ended.error_code) == ("cancelled", "cancelled")
        assert "nothing was kept" not in ended.error_message and "the copy stays" in ended.error_message
        assert damaged.path.exists() and ToolPayloadPolicy.load().preparation_state == "cancelled"
        assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists() and snapshot() == before
        return
    failed = run(retry)
    # r146: said as "interrupted", the reason dropped; it says why the copy does not verify
    assert (failed.state, failed.error_code, failed.backup_name) == ("failed", "backup_unverified", "")
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed"
    assert "does not verify" in policy.preparation_error and "interrupted" not in policy.preparation_error
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists() and snapshot() == before


@pytest.mark.django_db(transaction=True)
def test_after_a_restore_from_the_preparation_backup_that_backup_is_done(admin_user, backup_dir):
    """SQLite, restored as the page says: the database file replaced by the backup. The copy
    was taken while its own job ran, so it shows that job running; the job finds its receipt."""
    import shutil

    if connection.vendor != "sqlite":
        pytest.skip("a file copy is SQLite's restore; PostgreSQL's (pg_restore into a new database) "
                    "leaves the same rows, which the test above builds on both engines")
    conversation = old_conversation("restored", tools=2)
    removable = Item.objects.filter(conversation=conversation, removable_bytes__gt=0).count()
    enable(admin_user, choice="create")
    backup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert backup.state == "succeeded"
    assert run(ToolPayloadOperation.objects.get(kind="cleanup").pk).removed_messages == removable
    database = Path(connection.settings_dict["NAME"])
    connection.close()
    # As the restore steps say: the database and its -wal and -shm moved aside (a file of its
    # own: any connection still open elsewhere in this process keeps the old one), the backup
    # copied in its place.
    aside = [path.rename(path.with_name(path.name + ".aside"))
             for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")) if path.exists()]
    shutil.copyfile(backup_dir / backup.backup_name, database)
    for path in aside:
        path.unlink()
    restored = ToolPayloadOperation.objects.get(pk=backup.pk)
    assert restored.state == "running" and restored.lease  # as the copy found it
    assert ToolPayloadPolicy.load().preparation_state == "preparing"
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    ToolPayloadOperation.objects.filter(pk=backup.pk).update(  # the cluster starts after the lease ran out
        heartbeat_at=timezone.now() - timedelta(seconds=jobs.LEASE_SECONDS + 5))
    done = run(backup.pk)
    assert (done.state, done.backup_name, done.backup_sha256) == ("succeeded", backup.backup_name,
                                                                  backup.backup_sha256)
    assert ToolPayloadPolicy.load().preparation_state == "ready"
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    assert Item.objects.filter(conversation=conversation, removable_bytes__gt=0).count() == removable  # back, kept


@pytest.mark.django_db(transaction=True)
def test_a_failed_or_cancelled_backup_blocks_cleanup_until_retried(admin_user, backup_dir):
    import fcntl
    import os

    old_conversation("blocked", tools=2)
    before = snapshot()
    enable(admin_user, choice="create")
    backup_dir.mkdir(mode=0o700)
    holder = os.open(backup_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another backup holds the folder: this one fails for real
    try:
        failed = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    finally:
        os.close(holder)
    assert (failed.state, failed.error_code) == ("failed", "busy")
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed" and policy.preparation_error
    with pytest.raises(CleanupError) as blocked:
        service.start_run(user=admin_user, revision=policy.revision)
    assert blocked.value.code == "preparation_required"
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists() and snapshot() == before

    retry = service.retry_preparation(user=admin_user)
    service.cancel(user=admin_user, operation_id=retry)
    cancelled = run(retry)
    assert (cancelled.state, cancelled.error_code) == ("cancelled", "cancelled")
    assert ToolPayloadPolicy.load().preparation_state == "cancelled"
    assert [p.name for p in backup_dir.iterdir() if not p.name.startswith(".")] == []  # nothing kept
    assert snapshot() == before

    done = run(service.retry_preparation(user=admin_user))
    assert done.state == "succeeded"
    cleanup = run(ToolPayloadOperation.objects.get(kind="cleanup").pk)
    assert cleanup.state == "succeeded" and cleanup.removed_messages == 3


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_backup_whose_connection_ends_stops_for_retry_saying_why(admin_user, backup_dir,
                                                                                 monkeypatch):
    """The backup's database session ends while it copies: the copy is dropped, the backup fails
    saying the database could not be reached (not "unexpected", r94) and the preparation offers
    Retry, which then makes the backup and the cleanup follows."""
    if connection.vendor != "postgresql":
        pytest.skip("a server ending a session; SQLite has no server")
    from retention import backups

    monkeypatch.setattr(jobs, "LOST_CONNECTION_PAUSE", 0)
    old_conversation("cut-short", tools=2)
    before = snapshot()
    enable(admin_user, choice="create")
    create = backups.create_backup

    def session_ends(**kwargs):
        factories.end_database_session()
        return create(**kwargs)

    monkeypatch.setattr(backups, "create_backup", session_ends)
    failed = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (failed.state, failed.error_code) == ("failed", "database_unavailable")
    assert "could not be reached during the backup" in failed.error_message
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed" and "could not be reached" in policy.preparation_error
    assert [p.name for p in backup_dir.iterdir() if not p.name.startswith(".")] == []  # no copy kept
    assert snapshot() == before and not ToolPayloadOperation.objects.filter(kind="cleanup").exists()

    monkeypatch.setattr(backups, "create_backup", create)
    done = run(service.retry_preparation(user=admin_user))
    assert done.state == "succeeded"
    cleanup = run(ToolPayloadOperation.objects.get(kind="cleanup").pk)
    assert cleanup.state == "succeeded" and cleanup.removed_messages == 3


@pytest.mark.django_db(transaction=True)
def test_cleanup_verifies_the_receipt_again_before_its_first_batch(admin_user, backup_dir):
    old_conversation("tampered", tools=2)
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(enabled=False)  # prepare only: no cleanup follows
    backup = run(service.retry_preparation(user=admin_user))
    assert backup.state == "succeeded" and not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    ToolPayloadPolicy.objects.filter(id=1).update(enabled=True)
    with (backup_dir / backup.backup_name).open("r+b") as archive:
        archive.seek(100)
        archive.write(b"\0" * 64)  # the backup changed on disk after it was made
    before = snapshot()
    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (cleanup.kind, cleanup.state, cleanup.error_code) == ("cleanup", "failed", "preparation_required")
    assert snapshot() == before
    assert ToolPayloadPolicy.load().preparation_state == "failed"


def remove_backups(folder: Path) -> list[str]:
    """What an operator does with old backups (docs/operations.md: Lethe never deletes one)."""
    removed = sorted(p.name for p in folder.iterdir() if p.name.startswith("lethe-"))
    for name in removed:
        (folder / name).unlink()
    return removed


@pytest.mark.django_db(transaction=True)
def test_a_backup_removed_after_the_first_cleanup_blocks_no_later_cleanup(admin_user, backup_dir, monkeypatch):
    """The backup is required before the first cleanup under its preparation (AC-TPR-002.1/002.2),
    not before every one: once a run under it removed anything, the operator may remove the old
    backup, and later runs (Run now, the daily check) go on without reading it. A new
    preparation (re-enabling, shortening the period) needs its own backup again."""
    from retention.backups import names_in_folder, still_there

    old_conversation("first", tools=2)
    enable(admin_user, choice="create")
    backup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert backup.state == "succeeded", backup.error_message
    first = run(ToolPayloadOperation.objects.get(kind="cleanup").pk)
    assert (first.state, first.removed_messages) == ("succeeded", 3)
    assert jobs.preparation_used(backup.backup_name)
    # A later run, the backup still there, does not read it again (553 MB in a review, each run).
    import retention.backups as backups

    read = []
    monkeypatch.setattr(backups, "_sha256", lambda path: read.append(path) or (_ for _ in ()).throw(AssertionError))
    again = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (again.kind, again.state, again.removed_messages, read) == ("cleanup", "succeeded", 0, [])
    monkeypatch.undo()
    assert remove_backups(backup_dir) == [backup.backup_name, backup.backup_name + ".json"]
    assert still_there(backup.backup_name, names_in_folder()) is False

    second_conversation = old_conversation("second", tools=2)
    second = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (second.kind, second.state, second.error_code, second.removed_messages) == (
        "cleanup", "succeeded", "", 3), second.error_message
    assert Item.objects.filter(conversation=second_conversation, details_removed_at__isnull=False).count() == 3
    old_conversation("third", tools=1)
    assert jobs.daily_check().startswith("started")
    daily = run(ToolPayloadOperation.objects.filter(kind="cleanup").latest("pk").pk)
    assert (daily.state, daily.removed_messages, daily.started_by) == ("succeeded", 2, None)
    policy = ToolPayloadPolicy.load()
    assert (policy.preparation_state, policy.preparation_error) == ("ready", "")
    doc = service.status_document()
    assert doc["preparation"]["state"] == "ready" and doc["backups"] == []
    made = next(op for op in doc["history"] if op["kind"] == "backup")
    assert made["backup"]["name"] == backup.backup_name and made["backup"]["present"] is False

    # Shortening the period asks for the choice again: a new preparation, whose first run
    # needs its own backup, verified (removed before that run: the run is refused).
    enable(admin_user, choice="create", value=1)
    old_conversation("fourth", tools=1, days=40)
    before = snapshot()
    newer = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert newer.kind == "backup" and newer.state == "succeeded" and newer.backup_name != backup.backup_name
    assert not jobs.preparation_used(newer.backup_name)
    assert remove_backups(backup_dir) == [newer.backup_name, newer.backup_name + ".json"]
    refused = run(ToolPayloadOperation.objects.filter(kind="cleanup").latest("pk").pk)
    assert (refused.state, refused.error_code) == ("failed", "preparation_required")
    assert "There is no backup with that name." in refused.error_message
    assert ToolPayloadPolicy.load().preparation_state == "failed" and snapshot() == before


@pytest.mark.django_db(transaction=True)
def test_compact_runs_as_a_job_and_records_the_sizes(admin_user):
    old_conversation("compact", tools=3)
    op = run(service.start_compact(user=admin_user))
    assert op.state == "succeeded", op.error_message
    assert op.before_bytes > 0 and op.after_bytes > 0 and op.after_reusable_bytes is not None
    last = service.status_document()["last_compact"]
    assert (last["id"], last["before_bytes"], last["after_bytes"]) == (op.pk, op.before_bytes, op.after_bytes)


@pytest.mark.django_db
def test_the_operations_page_lists_cleanup_history_with_figures_and_who(admin_user, admin_client):
    assert "No cleanup operations yet." in admin_client.get("/operations/", HTTP_HOST="127.0.0.1").content.decode()
    old_conversation("history", tools=2)
    enable(admin_user)
    run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    jobs.daily_check()
    page = admin_client.get("/operations/", HTTP_HOST="127.0.0.1").content.decode()
    assert "3 messages cleaned" in page and "by alice" in page
    assert "by the daily schedule" in page and "Queued" in page


TRICKY = [
    ("shell", {"command": "cat", "stdout": "漢字 ✓ 🚀 \u2028 \x7f é" * 40, "stderr": "\x01\x1f\n\t\"\\/" * 30,
               "exit_code": 2**70, "took": 1e16, "ratio": 1.5e-07, "neg": -0.0, "truncated": True}),
    ("shell", {"command": "true", "stdout": "y" * 400, "stderr": "", "zz_after": {"b": [1, {"a": None}]}}),
    ("shell", {"stdout": "o" * 300}),  # only one of the kind's fields
    ("generic", {"tool": "x", "input": {"q": "漢" * 90, "n": [1, 2.5, {"k": "v"}]}, "output": "done " * 50}),
    ("generic", {"tool": "y", "input": ["a" * 200, 3, None, True]}),
    ("http", {"url": "https://example.test/a?b=c", "status": 200, "response": "<p>" + "é" * 500 + "</p>"}),
    ("search", {"query": "needle", "matches": [{"path": "/w/x", "line": n, "text": "t" * 40} for n in range(20)]}),
    ("read_file", {"path": "/w/a.py", "content": "print('\\u00e9')\n" * 60, "line_count": 60}),
    ("edit_file", {"path": "/w/b.py", "changes": [{"old_content": "a" * 300, "new_content": "b" * 300,
                                                    "line": 1}, {"diff": "-x\n+y\n" * 40}]}),
]


@pytest.mark.django_db
def test_the_rewrite_in_the_database_equals_the_reducer_byte_for_byte(admin_user):
    """Items with a stored plan are rewritten in SQL, edit_file in Python: either way the
    stored payload is what the reducer makes, its size is the canonical size, and the bytes
    removed are the analysis figure."""
    from retention.reducer import apply, encoded_size, normalize

    conversation = factories.make_conversation(title="tricky")
    for n, (kind, payload) in enumerate(TRICKY):
        factories.add_tool(conversation, kind, payload, tool_call_id=f"tricky-{n}")
    age(conversation, OLD)
    items = list(Item.objects.filter(conversation=conversation).order_by("id"))
    assert [item.removal_plan is not None for item in items] == [kind != "edit_file" for kind, _p in TRICKY]
    before = {item.pk: (item.payload, item.payload_bytes, item.removable_bytes) for item in items}
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert analysis.eligible_messages == len(TRICKY)
    enable(admin_user)
    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert cleanup.state == OperationState.SUCCEEDED and cleanup.removed_messages == len(TRICKY)
    assert cleanup.payload_bytes == analysis.payload_bytes == sum(r for _p, _s, r in before.values())
    for item in Item.objects.filter(conversation=conversation).order_by("id"):
        payload, size, removable = before[item.pk]
        expected, _plan = apply(item.tool_kind, normalize(payload, vendor=connection.vendor),
                                removed_at=item.details_removed_at)
        assert item.payload == expected
        assert item.payload_bytes == encoded_size(item.payload) == size - removable
        assert (item.removable_bytes, item.payload_skip, item.removal_plan) == (0, "already_removed", None)
        assert item.revision == 2 and item.updated_at == item.details_removed_at


@pytest.mark.django_db
def test_an_item_whose_stored_plan_is_unreadable_is_reduced_in_python(admin_user):
    conversation = old_conversation("odd-plan", tools=2)
    odd = Item.objects.filter(conversation=conversation, tool_kind="shell").order_by("id").first()
    Item.objects.filter(pk=odd.pk).update(removal_plan='{"removed_bytes": 1, "removed_fields": ["stdout"]}')
    # valid JSON, but not the canonical text: an escaped name (json.loads reads "stdout")
    escaped = Item.objects.filter(conversation=conversation, tool_kind="shell").order_by("id").last()
    Item.objects.filter(pk=escaped.pk).update(
        removal_plan='{"removed_bytes":1,"removed_fields":["stderr","\\u0073tdout"]}')
    assert escaped.pk != odd.pk
    # what the reducer removes from this payload (the figure the stored plan would have had)
    reduced_payload, _result = apply("shell", escaped.payload, removed_at=datetime(2026, 1, 1, tzinfo=UTC))
    marker_bytes = reduced_payload["retention"]["removed_bytes"]
    # a plan on a kind that is reduced in Python is not followed either
    edit = factories.add_tool(conversation, "edit_file", {"path": "/w/c.py", "content": "z" * 500, "changes": [
        {"old_content": "a" * 300, "new_content": "b", "line": 1}]}, tool_call_id="odd-e")
    Item.objects.filter(pk=edit.pk).update(removal_plan='{"removed_bytes":502,"removed_fields":["content"]}')
    age(conversation, OLD)
    expected = Item.objects.filter(conversation=conversation, removable_bytes__gt=0).aggregate(
        n=Count("id"), b=Sum("removable_bytes"))
    enable(admin_user)
    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert (cleanup.removed_messages, cleanup.payload_bytes) == (expected["n"], expected["b"])
    odd.refresh_from_db()
    assert odd.payload["retention"]["removed_fields"] == ["stderr", "stdout"]
    assert odd.payload_bytes == encoded_size(odd.payload) and odd.removal_plan is None
    escaped.refresh_from_db()  # reduced from its payload, not from the escaped plan's text or figure
    assert escaped.payload["retention"]["removed_fields"] == ["stderr", "stdout"]
    assert escaped.payload["retention"]["removed_bytes"] == marker_bytes != 1
    assert escaped.payload_bytes == encoded_size(escaped.payload) and escaped.removal_plan is None
    edit.refresh_from_db()
    assert edit.payload["retention"]["removed_fields"] == ["content", "changes[0].new_content",
                                                         "changes[0].old_content"]
    assert edit.payload["changes"] == [{"line": 1}] and edit.payload_bytes == encoded_size(edit.payload)


@pytest.mark.django_db
@pytest.mark.parametrize("tamper", [
    lambda plan: "not json at all",
    lambda plan: plan.replace('"removed_bytes":', '"removed_bytes":0'),  # a leading zero: not JSON
    lambda plan: plan.replace('"removed_bytes":', '"removed_bytes":-'),
    lambda plan: '{"removed_bytes":12345678901,"removed_fields":["stderr","stdout"]}',  # eleven digits
    lambda plan: plan.replace('"removed_bytes":', '"removed_bytes":"') .replace(',"removed_fields"', '","removed_fields"'),
    lambda plan: plan.replace('"stderr","stdout"', '"cwd","stdout"'),  # a field the kind keeps
    lambda plan: plan.replace('"stderr","stdout"', ''),  # no field
    lambda plan: plan + " ",
    lambda plan: plan.replace('"stderr","stdout"', '"stdout","stderr"'),  # the kind's fields, not sorted
])
def test_a_stored_plan_not_in_the_reducers_form_never_stops_the_run(admin_user, tamper):
    """Whatever text a stored plan holds, the run finishes and the item's details go; a plan
    that is not in the form the reducer writes for the kind is not followed: the item is
    reduced from its payload (PostgreSQL checks the text in the statement that writes the
    batch: an unchecked cast of it to JSON would fail the whole batch). A plan in that form is
    trusted as the item's removable bytes are: both are written with the payload they
    describe, at the same revision."""
    conversation = old_conversation("tampered", tools=2)
    target = Item.objects.filter(conversation=conversation, tool_kind="shell").order_by("id").first()
    plan = target.removal_plan
    assert plan.startswith('{"removed_bytes":') and plan.endswith(',"removed_fields":["stderr","stdout"]}')
    Item.objects.filter(pk=target.pk).update(removal_plan=tamper(plan))
    reduced_payload, _result = apply("shell", target.payload, removed_at=datetime(2026, 1, 1, tzinfo=UTC))
    age(conversation, OLD)
    expected = Item.objects.filter(conversation=conversation, removable_bytes__gt=0).aggregate(
        n=Count("id"), b=Sum("removable_bytes"))
    enable(admin_user)
    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert cleanup.state == "succeeded"
    assert (cleanup.removed_messages, cleanup.payload_bytes) == (expected["n"], expected["b"])
    target.refresh_from_db()
    marker = target.payload["retention"]
    assert sorted(marker["removed_fields"]) == ["stderr", "stdout"] and "stdout" not in target.payload
    assert marker["removed_bytes"] == reduced_payload["retention"]["removed_bytes"]
    assert target.payload_bytes == encoded_size(target.payload) and target.removal_plan is None
    assert not Item.objects.filter(conversation=conversation, removable_bytes__gt=0).exists()


@pytest.mark.django_db
def test_on_postgresql_the_plan_check_accepts_exactly_the_plans_the_reducer_writes():
    """The span's statement reduces an item in SQL only when its stored plan is the text
    `plan_text` writes for its kind (every field subset, any figure up to ten digits)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's check in SQL; SQLite checks plans in Python (marker_from_plan)")
    from itertools import combinations

    from retention.reducer import REMOVED_FIELDS, SQL_KINDS, Plan, plan_text

    cases = []
    for kind in sorted(SQL_KINDS):
        names = sorted(REMOVED_FIELDS[kind])
        for size in range(1, len(names) + 1):
            for chosen in combinations(names, size):
                for figure in (0, 7, 9_999_999_999):
                    plan = plan_text(kind, Plan(removed_fields=chosen, removed_bytes=figure + 1, detail_bytes=figure))
                    cases.append((kind, plan, True))
                    cases.append(("shell" if kind != "shell" else "http", plan, False))  # another kind's fields
                    cases.append((kind, plan.replace(":", ": ", 1), False))
                    cases.append((kind, plan.replace(f":{figure},", f":{figure}.0,"), False))
                    cases.append((kind, plan.replace(f":{figure},", f":0{figure},"), False))
    cases += [("shell", None, False), ("shell", "", False), ("shell", '{"removed_bytes":', False),
              ("shell", '{"removed_bytes":,"removed_fields":["stdout"]}', False),
              ("shell", '{"removed_bytes":5,"removed_fields":["stdout"]}{"removed_bytes":5,"removed_fields":["stdout"]}',
               False)]
    with connection.cursor() as cursor:
        for kind, plan, accepted in cases:
            cursor.execute(
                "SELECT coalesce(" + jobs._plan_check_sql() + ", false) FROM (SELECT %s::text AS tool_kind, "
                "%s::text AS removal_plan) AS i CROSS JOIN LATERAL (SELECT strpos(i.removal_plan, "
                "',\"removed_fields\":') AS at) AS plan", [kind, plan])
            assert cursor.fetchone()[0] is accepted, (kind, plan)


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_the_wal_is_folded_back_while_the_batches_go_on_and_the_setting_restored(admin_user, monkeypatch):
    """Commits leave the WAL alone; a checkpoint beside the batches (its own connection, woken
    by each commit) folds it back into the file, so a removed output is gone from the database
    file while the run goes on, before the run ends."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: the WAL checkpoint beside the batches")
    from pathlib import Path

    monkeypatch.setattr(jobs, "BATCH_ITEMS", 1)
    conversation = factories.make_conversation(title="gap")
    secrets = [factories.marker(f"gap-{n}") for n in range(3)]
    for n, secret in enumerate(secrets):
        factories.add_tool(conversation, "shell", {"command": "cat", "stdout": (secret + "\n") * 20, "stderr": ""},
                           tool_call_id=f"gap-{n}")
    age(conversation, OLD)
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")

    def pragma(name: str):
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA {name}")
            return cursor.fetchone()[0]

    assert pragma("wal_checkpoint(TRUNCATE)") == 0  # the outputs are in the database file now
    database = Path(connection.settings_dict["NAME"])
    before = pragma("wal_autocheckpoint")
    seen = []

    def after_batch(_result):
        """After each commit: the setting, and whether the output just removed left the file
        (waiting up to 10 s for the checkpoint beside the batches; the next batch waits too)."""
        setting = pragma("wal_autocheckpoint")
        index = len(seen)
        gone = False
        if index < len(secrets):
            deadline = time.monotonic() + 10
            while not gone and time.monotonic() < deadline:
                gone = secrets[index].encode() not in database.read_bytes()
                if not gone:
                    time.sleep(0.02)
        seen.append((setting, gone))

    assert jobs._cleanup_step(op, "t", after_batch=after_batch) == "done"
    assert {setting for setting, _gone in seen} == {0}  # commits leave the WAL to the checkpointer
    assert [gone for _setting, gone in seen[:3]] == [True, True, True]  # each gone before the next batch
    assert pragma("wal_autocheckpoint") == before > 0
    assert not any(s.encode() in database.read_bytes() for s in secrets)
    assert not [t for t in threading.enumerate() if t.name == "lethe-wal-checkpoint"]  # the thread ended
    assert ToolPayloadOperation.objects.get(pk=op.pk).removed_messages == 3


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_a_long_run_keeps_its_wal_a_few_batches_long(admin_user, monkeypatch):
    """The checkpoint beside the batches always runs just behind the next batch, so the WAL
    would never start again from its beginning and its file would grow by every page the run
    writes. Once it is RESTART_FRAMES long, the next batch waits for the checkpoint and starts
    it again: the file stays about that long. Two runs of the same size: one that keeps every
    frame (a reader holds the WAL), and one with a small RESTART_FRAMES."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: the WAL file")
    from pathlib import Path

    monkeypatch.setattr(jobs, "BATCH_ITEMS", 1)
    wal = Path(f"{connection.settings_dict['NAME']}-wal")
    # As on a large run: the checkpoint (copying a batch's pages, two fsyncs) takes longer
    # than the next batch's reading, so it is still running when that batch begins.
    checkpoint = jobs._Checkpointer._checkpoint

    def slow_checkpoint(self, frames):
        time.sleep(0.03)
        return checkpoint(self, frames)

    monkeypatch.setattr(jobs._Checkpointer, "_checkpoint", slow_checkpoint)

    def run_over(title: str, restart_frames: int, *, pinned: bool = False) -> int:
        conversation = factories.make_conversation(title=title)
        for n in range(60):  # each output spans several overflow pages
            factories.add_tool(conversation, "shell", {"command": "cat", "stdout": f"{title} {n} " * 2000,
                                                       "stderr": ""}, tool_call_id=f"{title}-{n}")
        age(conversation, OLD)
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert cursor.fetchone()[0] == 0
        assert wal.stat().st_size == 0
        monkeypatch.setattr(jobs._Checkpointer, "RESTART_FRAMES", restart_frames)
        reader = None
        if pinned:  # a read transaction from before the run: nothing is copied back, every frame stays
            import sqlite3

            reader = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM lifecycle_item").fetchone()
        try:
            op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
        finally:
            if reader is not None:
                reader.execute("COMMIT")
                reader.close()
        assert op.state == OperationState.SUCCEEDED and op.removed_messages == 60
        return wal.stat().st_size

    enable(admin_user)
    every_frame = run_over("grows", 10**9, pinned=True)  # what the run writes, all of it
    bounded = run_over("restarts", 40)
    page = 4096 + 24  # a frame: its page and header
    assert every_frame > 60 * 2 * page  # every batch's pages (a few each), one after the other
    assert bounded < every_frame / 2, (bounded, every_frame)
    assert not Item.objects.filter(removable_bytes__gt=0).exists()


@pytest.mark.django_db(transaction=True)
def test_removed_output_is_gone_from_the_rows_and_on_sqlite_from_the_file(admin_user):
    secret = factories.marker("stdout")
    conversation = factories.make_conversation(title="secret")
    factories.add_tool(conversation, "shell", {"command": "cat key", "cwd": "/w", "exit_code": 0,
                                               "stdout": (secret + "\n") * 40, "stderr": ""})
    age(conversation, OLD)
    enable(admin_user)
    assert run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)).removed_messages == 1
    assert not Item.objects.filter(payload__icontains=secret).exists()
    item = Item.objects.get(conversation=conversation)
    assert secret not in json.dumps(item.payload) and item.payload["command"] == "cat key"
    if connection.vendor == "sqlite":  # secure_delete stays on: no copy left in free space
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA secure_delete")
            assert cursor.fetchone()[0] == 1
            cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            assert cursor.fetchone()[0] == 0
        from pathlib import Path

        raw = Path(connection.settings_dict["NAME"]).read_bytes()
        assert secret.encode() not in raw


@pytest.mark.django_db
def test_a_cancelled_analysis_is_never_complete(admin_user, monkeypatch):
    """Cancelled before it scanned anything or part-way: no estimate ("not_analyzed", as the
    card says; "partial" said there were figures for part of the data)."""
    monkeypatch.setattr(jobs, "ANALYSIS_BATCH", 1)
    for n in range(3):
        old_conversation(f"partial-{n}")
    op_id = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    assert service.status_document()["analysis_state"] == "running"
    service.cancel(user=admin_user, operation_id=op_id)
    op = run(op_id)
    assert op.state == "cancelled" and op.scanned == 0
    doc = service.status_document()
    assert doc["analysis_state"] == "not_analyzed" and doc["last_analysis"]["state"] == "cancelled"
    assert doc["operation"] is None
    ToolPayloadOperation.objects.filter(pk=op_id).update(scanned=1, eligible_messages=1, payload_bytes=9)
    assert service.status_document()["analysis_state"] == "not_analyzed"  # as one cancelled after a batch


@pytest.mark.django_db(transaction=True)
def test_a_busy_database_backs_off_and_the_run_goes_on(admin_user):
    old_conversation("contended", tools=3)
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    holding, release = threading.Event(), threading.Event()

    def holder() -> None:  # another connection holds the lock the job needs
        try:
            with transaction.atomic():
                ToolPayloadOperation.objects.select_for_update().get(pk=op_id)
                if connection.vendor == "postgresql":
                    ToolPayloadOperation.objects.filter(pk=op_id).update(attempts=0)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    assert holding.wait(10)
    with connection.cursor() as cursor:  # this connection gives up waiting quickly
        cursor.execute("PRAGMA busy_timeout = 50" if connection.vendor == "sqlite" else "SET lock_timeout = '50ms'")
    timer = threading.Timer(0.4, release.set)
    timer.start()
    try:
        op = run(op_id)
    finally:
        release.set()
        thread.join()
        timer.cancel()
    assert (op.state, op.error_code, op.removed_messages) == ("succeeded", "", 4)


@pytest.mark.django_db
def test_an_analysis_is_stale_once_a_cleanup_removed_what_it_counted(admin_user):
    old_conversation("counted", tools=3)
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    assert analysis.eligible_messages > 0
    enable(admin_user)  # same period: the analysis still describes the data
    assert service.status_document()["analysis_state"] == "completed"
    cleanup = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert cleanup.removed_messages == analysis.eligible_messages
    # Its figures are gone from the data: the screen must not show them as current.
    assert ToolPayloadOperation.objects.get(pk=analysis.pk).stale is True
    assert service.status_document()["analysis_state"] == "stale"


@pytest.mark.parametrize("fixed, items_share", [(0.001, 0.009), (0.009, 0.005), (0.030, 0.005)])
def test_the_pace_sizes_batches_by_the_time_their_items_take(monkeypatch, fixed, items_share):
    """A batch's write transaction is a fixed part plus its items. The items get what the batch
    time leaves after the fixed part, but never less than half the batch time: on a slow core
    (fixed 9 or 30 ms of a 10 ms batch) batches used to shrink to the minimum, the fixed part
    then being nearly all a batch did (measured: 5 items a batch, a cleanup 28 times slower than
    the same rewrite as one statement)."""
    monkeypatch.setattr(jobs, "BATCH_SECONDS_SET", True)
    monkeypatch.setattr(jobs, "BATCH_SECONDS", 0.010)
    pace = jobs._Pace(pause=0.01)
    rate = 20_000_000  # payload bytes a second the item writes (and their commit) take
    for _batch in range(40):
        items = pace.budget / rate
        pace.record(pace.budget, fixed + items, items, share=0.25)
    assert pace.budget == pytest.approx(rate * items_share, rel=0.02)
    assert pace.budget > jobs.MIN_BATCH_BYTES
    assert pace.fixed == pytest.approx(fixed) and pace.commit_share == pytest.approx(0.25)
    assert pace.write_limit() == pytest.approx(max(0.010, fixed + 0.005))


@pytest.mark.django_db
def test_a_run_whose_lease_was_taken_over_writes_no_further_batch(admin_user, monkeypatch):
    """After the first batch the next ones read from the cursor they committed, without reading
    the operation row; the write transaction still finds the lease gone and writes nothing."""
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 2)
    conversation = old_conversation("taken", tools=4)
    removable = Item.objects.filter(conversation=conversation, removable_bytes__gt=0).count()
    assert removable > 3
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    batches = []

    def after_batch(result):
        batches.append(result)
        ToolPayloadOperation.objects.filter(pk=op.pk).update(lease="another-worker")

    with pytest.raises(jobs.LeaseLost):
        jobs._cleanup_step(op, "t", after_batch=after_batch)
    assert batches == ["next"]
    fresh = ToolPayloadOperation.objects.get(pk=op.pk)
    assert (fresh.removed_messages, fresh.lease) == (2, "another-worker")
    assert Item.objects.filter(conversation=conversation, details_removed_at__isnull=False).count() == 2
    assert Item.objects.filter(conversation=conversation, removable_bytes__gt=0).count() == removable - 2


@pytest.mark.django_db(transaction=True)
def test_a_conversation_that_turns_active_between_a_batchs_read_and_its_write_is_left_alone(admin_user, monkeypatch):
    """The batch's transaction rechecks its conversations over their id range: the one that a
    runtime wrote to after the batch was read keeps every detail and is counted as recent
    activity; the ones before and after it in the same batch are reduced."""
    first, middle, last = (old_conversation(name, tools=2) for name in ("first", "middle", "last"))
    per = Item.objects.filter(conversation=middle, removable_bytes__gt=0).count()
    enable(admin_user)
    real = jobs._read_batch
    woken = []

    def reading(*args, **kwargs):
        read = real(*args, **kwargs)
        touched = set(read.conversations)
        if not woken and {first.pk, middle.pk, last.pk} <= touched:
            woken.append(middle.pk)
            writer = threading.Thread(target=lambda: (append_item(Conversation.objects.get(pk=middle.pk),
                                                                  role="assistant", content="back"),
                                                      connection.close()))
            writer.start()
            writer.join()
        return read

    monkeypatch.setattr(jobs, "_read_batch", reading)
    op = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert woken == [middle.pk] and op.state == "succeeded"
    removed = Item.objects.filter(details_removed_at__isnull=False)
    assert not removed.filter(conversation=middle).exists()
    assert Item.objects.filter(conversation=middle, removable_bytes__gt=0).count() == per
    assert removed.filter(conversation=first).count() == per and removed.filter(conversation=last).count() == per
    assert skipped_for_activity(op) == {"recent_activity": per}
    assert op.removed_messages == 2 * per


@pytest.mark.django_db(transaction=True)
def test_a_disable_saved_while_a_batch_waits_returns_only_after_that_batch(admin_user, monkeypatch):
    """PostgreSQL: a batch holds the policy row (shared) from its recheck to its commit, so a
    save that turns cleanup off waits for it: once the save has returned, no batch checked
    against the enabled policy can still commit removals. (SQLite: one writer at a time.)"""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite's batch holds the database's one write lock: a save cannot overlap it")
    import psycopg
    from django.db import connections

    monkeypatch.setattr(jobs, "CONVERSATIONS_PER_BATCH", 1)  # a batch for each conversation
    first, second = old_conversation("held", tools=2), old_conversation("after", tools=2)
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    jobs._fix_cutoff(op, "t")
    dsn = connection.get_connection_params()
    holder = psycopg.connect(**{k: v for k, v in dsn.items() if k != "cursor_factory"})
    holder.execute("SELECT id FROM lifecycle_conversation WHERE id = %s FOR UPDATE", [first.pk])  # a runtime's write
    events: list[str] = []

    def batch():
        try:
            events.append(f"batch {jobs._cleanup_batch(op, 't')}")
        finally:
            connections.close_all()

    def disable():
        try:
            policy = ToolPayloadPolicy.load()
            service.save_policy(user=admin_user, enabled=False, age_value=policy.age_value, age_unit=policy.age_unit,
                                revision=policy.revision, backup_choice=None)
            events.append("saved")
        finally:
            connections.close_all()

    batch_thread = threading.Thread(target=batch)
    save_thread = threading.Thread(target=disable)
    batch_thread.start()
    try:
        waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype IN ('transactionid', 'tuple')"
        for _ in range(200):  # the batch is waiting for the conversation's row lock
            if holder.execute(waiting).fetchone()[0]:
                break
            time.sleep(0.02)
        else:
            raise AssertionError("the batch never waited for the conversation")
        save_thread.start()
        time.sleep(0.5)
        seen = list(events)
    finally:
        holder.rollback()  # the runtime's transaction ends (also when an assertion failed)
        batch_thread.join(30)
        if save_thread.ident:  # started
            save_thread.join(30)
        holder.close()
    assert seen == []  # the save waited for the batch
    assert events == ["batch next", "saved"]
    assert Item.objects.filter(conversation=first, details_removed_at__isnull=False).exists()  # the batch committed
    assert jobs._cleanup_batch(ToolPayloadOperation.objects.get(pk=op.pk), "t") == "disabled"  # and no later one
    assert not Item.objects.filter(conversation=second, details_removed_at__isnull=False).exists()


@pytest.mark.django_db
def test_run_that_loses_a_race_with_a_save_leaves_no_preparation_behind(admin_user, monkeypatch):
    """Run reads the policy (a backup to make first), then another admin's save (Continue
    without backup) commits before Run marks the preparation: Run is stale and queues
    nothing, instead of leaving a backup shown as being made that no job finishes."""
    service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=1,
                        backup_choice="create")
    read = service._load_checked_policy

    def then_a_save_commits():
        seen = read()
        monkeypatch.setattr(service, "_load_checked_policy", read)
        service.save_policy(user=admin_user, enabled=True, age_value=3, age_unit="months", revision=2,
                            backup_choice="skip")
        return seen

    monkeypatch.setattr(service, "_load_checked_policy", then_a_save_commits)
    with pytest.raises(service.CleanupError) as refused:
        service.start_run(user=admin_user, revision=2)
    assert refused.value.code == "stale_revision"
    policy = ToolPayloadPolicy.load()
    assert (policy.revision, policy.backup_choice, policy.preparation_state) == (3, "skip", "ready")
    assert not ToolPayloadOperation.objects.exists()
    assert service.start_run(user=admin_user, revision=3)  # the run the new settings allow
    assert ToolPayloadOperation.objects.get().kind == "cleanup"


# ---- From an outside review of the jobs: long checks, order of checks, failures ----------------


@pytest.mark.django_db(transaction=True)  # the heartbeat beats on its own connection
def test_a_backup_check_longer_than_the_lease_keeps_the_lease(admin_user, monkeypatch, settings, tmp_path):
    """Before the first batch the cleanup reads the whole backup again (SHA-256, integrity):
    on a large database that outlasts the lease, and a worker that stayed quiet that long
    was taken over again and again until the run failed as interrupted."""
    import retention.backups as backups

    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    monkeypatch.setattr(jobs, "LEASE_SECONDS", 1)
    old_conversation("big", tools=3)
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="ready", backup_receipt_name="x.sqlite3")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    taken_over = []

    def slow_verify(name):
        time.sleep(2.5)  # longer than the lease
        taken_over.append(jobs.tick())  # the minute's recovery finds the operation quiet, or not

    monkeypatch.setattr(backups, "verify_backup", slow_verify)
    op = run(op_id)
    assert taken_over == [0]
    assert (op.state, op.attempts, op.removed_messages) == ("succeeded", 0, 4)


@pytest.mark.django_db
def test_a_queued_cleanup_that_ends_before_it_starts_leaves_the_preparation_alone(admin_user):
    """Cancel, disable and a policy change end a queued run before it checks the backup: the
    check (failing here: the receipt is not on disk) would mark failed a preparation this run
    no longer needs."""
    old_conversation("q", tools=2)
    enable(admin_user, choice="create")
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="ready", backup_receipt_name="gone.sqlite3")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    enable(admin_user, choice="create", value=1)  # a shorter period: a new backup is due
    assert ToolPayloadPolicy.load().preparation_state == "none"
    op = run(op_id)
    assert (op.state, op.error_code) == ("cancelled", "policy_changed")
    assert ToolPayloadPolicy.load().preparation_state == "none"
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="ready", backup_receipt_name="gone.sqlite3")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    service.cancel(user=admin_user, operation_id=op_id)
    op = run(op_id)
    assert (op.state, op.error_code) == ("cancelled", "cancelled")
    assert ToolPayloadPolicy.load().preparation_state == "ready"
    assert not Item.objects.filter(details_removed_at__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_a_compaction_cancelled_before_it_starts_does_not_run(admin_user):
    from retention.storage import database_size

    conversation = old_conversation("x", tools=3)
    Item.objects.filter(conversation=conversation).delete()
    before = database_size().reusable_bytes
    op_id = service.start_compact(user=admin_user)
    service.cancel(user=admin_user, operation_id=op_id)
    op = run(op_id)
    assert (op.state, op.error_code, op.after_bytes) == ("cancelled", "cancelled", None)
    if connection.vendor == "sqlite":
        assert database_size().reusable_bytes == before > 0  # no VACUUM ran


@pytest.mark.django_db
def test_a_backup_that_fails_on_unreadable_state_fails_its_preparation_and_the_status_reads_again(admin_user):
    """The preparation waiting on a backup that failed for any reason is failed too (Retry and
    Cancel offered), and once the unreadable operation is failed the status reads cleanly."""
    old_conversation("u", tools=2)
    enable(admin_user, choice="create")
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    ToolPayloadOperation.objects.filter(pk=op_id).update(skipped_json="{not json")
    assert service.status_document()["error"]["code"] == "state_unreadable"
    op = run(op_id)
    assert (op.kind, op.state, op.error_code, op.slot, op.skipped_json) == (
        "backup", "failed", "state_unreadable", None, "{}")
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "failed" and policy.preparation_error
    doc = service.status_document()
    assert doc["error"] is None and doc["history"][0]["state"] == "failed"
    retried = service.retry_preparation(user=admin_user)
    assert ToolPayloadOperation.objects.get(pk=retried).kind == "backup"
    assert ToolPayloadPolicy.load().preparation_state == "preparing"


@pytest.mark.django_db
def test_a_run_takes_only_what_it_counted_so_its_figures_add_up(admin_user, monkeypatch):
    """One conversation becomes active before the run reaches it (its items are skipped for
    recent activity); another becomes eligible mid-run (Close interrupted its stale queued
    work, leaving its activity time alone). The run does not take the second (the next run
    will): taking it made its removals cancel out the first one's skips in the run's figures."""
    from lifecycle.actions.set_closed import set_closed
    from lifecycle.models import Turn, TurnState

    monkeypatch.setattr(jobs, "CONVERSATIONS_PER_BATCH", 1)
    old_conversation("first", tools=2)
    woken = old_conversation("woken", tools=2)
    stuck = old_conversation("stuck", tools=2)
    Turn.objects.create(conversation=stuck, seq=1, state=TurnState.QUEUED)
    theirs = Item.objects.filter(conversation=woken, removable_bytes__gt=0).count()
    stuck_items = Item.objects.filter(conversation=stuck, removable_bytes__gt=0).count()
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    woke = []

    def after_batch(_result):
        if not woke:
            woke.append(1)
            factories.add_message(woken, "user", "back again")
            set_closed(Conversation.objects.get(pk=stuck.pk), closed=True, acting_user=admin_user)

    assert jobs._cleanup_step(op, "t", after_batch=after_batch) == "done"
    done = ToolPayloadOperation.objects.get(pk=op.pk)
    assert Item.objects.filter(conversation=woken, removable_bytes__gt=0).count() == theirs
    assert Item.objects.filter(conversation=stuck, removable_bytes__gt=0).count() == stuck_items  # next run's
    skipped = json.loads(done.skipped_json)
    assert skipped.get("recent_activity") == theirs
    assert done.removed_messages == done.eligible_messages - theirs
    assert done.progress_done == done.progress_total == done.eligible_messages
    # The next run counts it and takes it.
    again = run(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision))
    assert again.removed_messages == stuck_items and again.eligible_messages == stuck_items


@pytest.mark.django_db(transaction=True)
def test_a_close_under_way_while_a_run_counts_is_counted_before_or_left_to_the_next_run(admin_user, monkeypatch):
    """A Close takes its time, then commits; a run's count in between saw its conversation's
    work still running (not counted), and its batches then saw the work finished before the
    count (taken): the run removed items it had never counted (done 5 of 0). The count now
    waits for the Close under way, and counts what it then finds idle."""
    from django.db import connections

    from lifecycle.actions import set_closed as closing

    stuck = old_conversation("stuck", tools=2)
    Turn.objects.create(conversation=stuck, seq=1, state=TurnState.RUNNING)
    theirs = Item.objects.filter(conversation=stuck, removable_bytes__gt=0).count()
    enable(admin_user)
    op = jobs._claim(service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision), "t")
    inside, release = threading.Event(), threading.Event()
    real = closing.audit.record

    def paused(*args, **kwargs):  # the Close has taken its time and marked the turn; not committed
        inside.set()
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(closing.audit, "record", paused)

    def close() -> None:
        try:
            closing.set_closed(Conversation.objects.get(pk=stuck.pk), closed=True, acting_user=admin_user)
        finally:
            connections.close_all()

    closer = threading.Thread(target=close)
    closer.start()
    assert inside.wait(30)
    timer = threading.Timer(0.5, release.set)
    timer.start()
    started = time.monotonic()
    jobs._fix_cutoff(op, "t")  # the run's count, while the Close is not committed
    waited = time.monotonic() - started
    closer.join(30)
    timer.join()
    counted = ToolPayloadOperation.objects.get(pk=op.pk)
    assert waited >= 0.4  # it waited for the Close
    assert counted.progress_total == counted.eligible_messages == theirs
    while jobs._cleanup_batch(counted, "t") == "next":
        pass
    done = ToolPayloadOperation.objects.get(pk=op.pk)
    assert done.state == "succeeded"
    assert done.progress_done == done.progress_total == done.removed_messages == theirs
    assert not Item.objects.filter(conversation=stuck, removable_bytes__gt=0).exists()


class _Died(BaseException):
    """A worker's death at a kill point (a BaseException: nothing in the job catches it)."""


def _die_at(monkeypatch, point: str) -> None:
    from lifecycle import faults

    real = faults.kill_point

    def kill_point(name: str) -> None:
        if name == point:
            raise _Died(name)
        real(name)

    monkeypatch.setattr(faults, "kill_point", kill_point)


def _expire_lease(op_id: int) -> None:
    """The dead run's lease, as the next worker finds it once it has expired."""
    ToolPayloadOperation.objects.filter(pk=op_id).update(
        heartbeat_at=timezone.now() - timedelta(seconds=jobs.LEASE_SECONDS + 1))


def _dies(op_id: int, times: int) -> None:
    """`times` runs of the operation, each dying at the kill point set (_die_at), each dead
    run's lease then expired for the next to take over."""
    for _ in range(times):
        with pytest.raises(_Died):
            jobs.run_operation(op_id)
        _expire_lease(op_id)


@pytest.mark.django_db
def test_a_run_killed_more_often_than_takeovers_allow_still_ends_when_each_takeover_moves_on(
        admin_user, monkeypatch):
    """Each takeover commits a batch before its worker dies again: that is progress, so the
    run is never ended as "interrupted too many times" (the count starts again at each batch)."""
    for n in range(2):
        old_conversation(f"moving-{n}", tools=6)
    stored_before = Item.objects.aggregate(s=Sum("payload_bytes"))["s"]
    analysis = run(service.start_analysis(user=admin_user, age_value=3, age_unit="months"))
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 1)
    _die_at(monkeypatch, "tool-cleanup-after-batch")
    deaths = jobs.MAX_TAKEOVERS + 3
    _dies(op_id, deaths)
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert op.state == "running", (op.state, op.error_code)
    assert op.removed_messages == deaths  # one batch of one item per takeover, each committed once
    monkeypatch.undo()
    final = run(op_id)
    assert (final.state, final.error_code) == ("succeeded", "")
    assert final.removed_messages == analysis.eligible_messages == 14
    assert stored_before - Item.objects.aggregate(s=Sum("payload_bytes"))["s"] == analysis.payload_bytes


@pytest.mark.django_db
def test_takeovers_with_no_batch_between_them_still_end_the_run_as_interrupted(admin_user, monkeypatch):
    old_conversation("stuck", tools=3)
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    _die_at(monkeypatch, "tool-cleanup-mid-batch")  # every run dies before its batch commits
    _dies(op_id, jobs.MAX_TAKEOVERS + 1)
    assert jobs.run_operation(op_id) == "done"
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert (op.state, op.error_code, op.removed_messages) == ("failed", "interrupted", 0)


@pytest.mark.django_db(transaction=True)
def test_a_compaction_killed_during_vacuum_reports_the_sizes_from_before_its_first_vacuum(admin_user, monkeypatch):
    """The server may finish a VACUUM whose client died: the run that takes over must not
    report from the file the interrupted run already shrank."""
    old_conversation("compact-kill", tools=3)
    op_id = service.start_compact(user=admin_user)
    _die_at(monkeypatch, "tool-compact-measured")
    _dies(op_id, 1)
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert op.state == "running" and op.before_bytes is not None and op.before_bytes > 0
    # As the first run measured a file its VACUUM (finished by the server) then shrank: the
    # takeover measures a smaller file, and must report from the first figures, not its own.
    first = (op.before_bytes + 8192, op.before_reusable_bytes + 8192)
    ToolPayloadOperation.objects.filter(pk=op_id).update(before_bytes=first[0], before_reusable_bytes=first[1])
    monkeypatch.undo()
    final = run(op_id)
    assert final.state == "succeeded"
    assert (final.before_bytes, final.before_reusable_bytes) == first
    assert final.after_bytes is not None


@pytest.mark.django_db
def test_a_run_interrupted_after_it_removed_details_is_partial_not_failed(admin_user, monkeypatch):
    old_conversation("half", tools=6)
    enable(admin_user)
    op_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    monkeypatch.setattr(jobs, "BATCH_ITEMS", 1)
    _die_at(monkeypatch, "tool-cleanup-after-batch")  # one batch committed, then the worker dies
    _dies(op_id, 1)
    _die_at(monkeypatch, "tool-cleanup-mid-batch")  # from then on every run dies before committing
    _dies(op_id, jobs.MAX_TAKEOVERS)
    assert jobs.run_operation(op_id) == "done"
    op = ToolPayloadOperation.objects.get(pk=op_id)
    assert (op.state, op.error_code, op.removed_messages) == ("partial", "interrupted", 1)
    assert Item.objects.filter(details_removed_at__isnull=False).count() == 1  # what it removed stays


@pytest.mark.django_db
def test_runs_done_in_one_piece_are_queued_with_the_long_time_limit(admin_user, settings):
    """A backup, a compaction and a cleanup's first step (it reads the backup back) are queued
    with LETHE_TOOL_JOB_LONG_TIMEOUT_SECONDS (r21: under the cluster's 10 minutes a large
    database's backup could never finish); an analysis and later cleanup steps keep the
    cluster's limit (tests/test_compact.py runs one on a real cluster)."""
    from django_q.models import OrmQ

    def queued_timeouts() -> dict[int, object]:
        return {job.task["args"][0]: job.task.get("timeout") for job in OrmQ.objects.all()}

    old_conversation("limits")
    analysis = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    assert queued_timeouts() == {analysis: None}
    ToolPayloadOperation.objects.filter(pk=analysis).update(state="succeeded", slot=None)
    enable(admin_user, choice="create")
    service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    backup = ToolPayloadOperation.objects.get(kind="backup")
    assert queued_timeouts()[backup.pk] == settings.TOOL_JOB_LONG_TIMEOUT_SECONDS
    cleanup = ToolPayloadOperation.objects.create(kind="cleanup", policy_revision=1, age_value=3, age_unit="months",
                                                  slot=None)
    assert jobs.one_piece(cleanup.pk)
    ToolPayloadOperation.objects.filter(pk=cleanup.pk).update(removed_messages=3, cutoff=timezone.now())
    assert not jobs.one_piece(cleanup.pk)
    assert not jobs.one_piece(analysis) and not jobs.one_piece(10**9)


@pytest.mark.django_db
@pytest.mark.parametrize("running", ["analysis", "compact"])
def test_a_daily_check_that_finds_an_analysis_or_a_compaction_running_comes_back_soon(admin_user, running):
    """r127: the check found the one slot taken by an analysis (or a compaction) and let the
    schedule go on a day: the first cleanup after turning cleanup on waited a day, and the card
    said only the next day's check. It comes back two minutes later, and runs once the slot is
    free; a check that finds a cleanup (or the backup a cleanup follows) running leaves it there."""
    from django_q.models import Schedule

    from retention.schedules import ensure_schedules

    ensure_schedules()
    old_conversation("busy-check")
    if running == "analysis":
        other = service.start_analysis(user=admin_user, age_value=3, age_unit="months")
    else:
        other = ToolPayloadOperation.objects.create(kind="compact", started_by=admin_user).pk
    enable(admin_user)
    tomorrow = timezone.now() + timedelta(days=1)
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=tomorrow)  # as the scheduler left it
    before = timezone.now()
    assert jobs.daily_check() == "busy: checked again in two minutes"
    assert before + jobs.BUSY_RETRY <= jobs.next_check_at() <= timezone.now() + jobs.BUSY_RETRY
    assert list(ToolPayloadOperation.objects.values_list("pk", flat=True)) == [other]
    assert service.status_document()["next_check_at"] is not None
    ToolPayloadOperation.objects.filter(pk=other).update(state="succeeded", slot=None)
    assert jobs.daily_check().startswith("started")
    cleanup = ToolPayloadOperation.objects.get(kind="cleanup")
    # A cleanup under way: today's run is that one; the schedule is left as it is.
    Schedule.objects.filter(name=jobs.DAILY).update(next_run=tomorrow)
    assert jobs.daily_check() == "busy"
    assert jobs.next_check_at() == tomorrow
    assert run(cleanup.pk).removed_messages == 4


def _restored_while_it_ran(op_id: int) -> None:
    """The backup operation as a database restored from its own copy shows it: running, its
    lease held by a run that is gone (the copy was taken while that run made it)."""
    from retention.models import SLOT

    ToolPayloadOperation.objects.filter(pk=op_id).update(
        state=OperationState.RUNNING, slot=SLOT, lease="gone", finished_at=None, error_code="",
        heartbeat_at=timezone.now() - timedelta(hours=1), attempts=0)
    ToolPayloadPolicy.objects.filter(id=1).update(preparation_state="preparing", backup_receipt_name="")


@pytest.mark.django_db(transaction=True)
def test_a_cancel_accepted_for_a_backup_a_restore_shows_running_ends_it_cancelled_and_removes_nothing(
        admin_user, settings, tmp_path):
    """r146: after a restore that showed the backup running, Cancel preparation was accepted, the
    run that took the backup over recorded its copy as made and the preparation ready, and the
    daily check's cleanup removed the tool details again. The cancel holds: the backup ends
    cancelled (its copy stays listed), the preparation is cancelled, no cleanup runs."""
    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    old_conversation("restored", tools=3)
    enable(admin_user, choice="create")
    backup_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    assert run(backup_id).state == OperationState.SUCCEEDED
    ToolPayloadOperation.objects.exclude(pk=backup_id).delete()  # the restored copy has no cleanup yet
    _restored_while_it_ran(backup_id)
    before = snapshot()
    service.cancel(user=admin_user, operation_id=backup_id)
    op = run(backup_id)
    assert (op.state, op.error_code) == (OperationState.CANCELLED, "cancelled")
    assert op.backup_name  # the copy it made stays, named
    policy = ToolPayloadPolicy.load()
    assert policy.preparation_state == "cancelled"
    assert jobs.daily_check() != "started" and not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    with pytest.raises(CleanupError) as refused:
        service.start_run(user=admin_user, revision=policy.revision)
    assert refused.value.code == "preparation_required"
    assert snapshot() == before


@pytest.mark.django_db(transaction=True)
def test_a_cancel_that_comes_as_the_copy_is_published_ends_the_backup_cancelled_and_no_cleanup_follows(
        admin_user, settings, tmp_path, monkeypatch):
    """The same rule without a restore: Cancel accepted after the copy was published but before
    the run recorded it (the copy no longer checks for a cancel) ended the backup succeeded, and
    the cleanup it was made for followed."""
    from retention import backups

    settings.LETHE_BACKUP_DIR = str(tmp_path / "backups")
    old_conversation("late cancel", tools=3)
    enable(admin_user, choice="create")
    backup_id = service.start_run(user=admin_user, revision=ToolPayloadPolicy.load().revision)
    made = backups.create_backup

    def then_cancelled(**kwargs):
        receipt = made(**kwargs)
        service.cancel(user=admin_user, operation_id=backup_id)
        return receipt

    monkeypatch.setattr(backups, "create_backup", then_cancelled)
    before = snapshot()
    op = run(backup_id)
    assert (op.state, op.error_code) == (OperationState.CANCELLED, "cancelled") and op.backup_name
    assert ToolPayloadPolicy.load().preparation_state == "cancelled"
    assert not ToolPayloadOperation.objects.filter(kind="cleanup").exists()
    assert snapshot() == before
