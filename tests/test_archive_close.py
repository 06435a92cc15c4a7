"""Archive / Unarchive and Close / Resume: reversible, audited, nothing erased."""

from __future__ import annotations

import pytest

from lifecycle import models as m
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.actions.set_archived import set_archived
from lifecycle.actions.set_closed import set_closed
from lifecycle.errors import ActionRefused
from tests import factories

pytestmark = pytest.mark.django_db


def test_it_archives_and_unarchives_with_an_audit_fact_each(admin_user):
    conversation = factories.make_conversation()
    factories.add_message(conversation, content="kept")
    set_archived(conversation, archived=True, acting_user=admin_user)
    assert list(m.Conversation.objects.recent()) == []
    assert list(m.Conversation.objects.archived()) == [conversation]
    set_archived(conversation, archived=False, acting_user=admin_user)
    assert list(m.Conversation.objects.recent()) == [conversation]
    facts = list(m.AuditFact.objects.order_by("pk").values_list("action", "old_value", "new_value", "actor"))
    assert facts == [
        ("conversation.archived", {"archived": False}, {"archived": True}, admin_user.pk),
        ("conversation.unarchived", {"archived": True}, {"archived": False}, admin_user.pk),
    ]
    assert m.Item.objects.get(conversation=conversation).content == "kept"


def test_a_repeated_archive_changes_nothing(admin_user):
    conversation = factories.make_conversation(archived=True)
    archived_at = conversation.archived_at
    set_archived(conversation, archived=True, acting_user=admin_user)
    conversation.refresh_from_db()
    assert conversation.archived_at == archived_at
    assert not m.AuditFact.objects.exists()


def test_close_stops_workers_releases_the_lease_and_keeps_history(admin_user):
    conversation = factories.make_conversation()
    factories.add_message(conversation, content="history")
    running = factories.start_turn(conversation, m.TurnState.RUNNING)
    queued = factories.start_turn(conversation, m.TurnState.QUEUED)
    m.ProcessLease.objects.create(conversation=conversation, holder="engine-1", workers=2)
    for kind in (m.ClaimKind.APPROVAL, m.ClaimKind.SHELL_JOB, m.ClaimKind.TASK):
        m.RuntimeClaim.objects.create(conversation=conversation, kind=kind)
    set_closed(conversation, closed=True, acting_user=admin_user)
    conversation.refresh_from_db()
    assert conversation.closed_at is not None
    assert {t.state for t in m.Turn.objects.filter(pk__in=[running.pk, queued.pk])} == {"interrupted"}
    assert not m.ProcessLease.objects.filter(conversation=conversation).exists()
    assert set(m.RuntimeClaim.objects.open().values_list("kind", flat=True)) == {"task"}
    assert m.Item.objects.get(conversation=conversation).content == "history"
    fact = m.AuditFact.objects.get(action="conversation.closed")
    assert fact.new_value == {"closed": True, "interrupted_turns": 2, "resolved_claims": 2, "released_lease": 1}
    # Resume reopens it; the engine takes a new lease when it runs.
    set_closed(conversation, closed=False, acting_user=admin_user)
    conversation.refresh_from_db()
    assert conversation.closed_at is None
    assert m.AuditFact.objects.filter(action="conversation.resumed").count() == 1


def test_both_stay_available_while_delete_is_refused(admin_user):
    conversation = factories.make_conversation()
    factories.start_turn(conversation)
    op = request_deletion(conversation, key="refused-1", acting_user=admin_user)
    assert op.state == "refused"
    set_archived(conversation, archived=True, acting_user=admin_user)
    set_closed(conversation, closed=True, acting_user=admin_user)
    # Close stopped the turn: a new request is admitted.
    assert request_deletion(conversation, key="after-close", acting_user=admin_user).state == "pending"


def test_both_are_refused_once_a_delete_intent_exists(admin_user):
    conversation = factories.make_conversation(closed=True)
    request_deletion(conversation, key="k", acting_user=admin_user)
    for change in (lambda: set_archived(conversation, archived=True, acting_user=admin_user),
                   lambda: set_closed(conversation, closed=False, acting_user=admin_user)):
        with pytest.raises(ActionRefused) as caught:
            change()
        assert caught.value.code == "conversation_deletion_pending"
    conversation.refresh_from_db()
    assert conversation.archived_at is None and conversation.closed_at is not None
