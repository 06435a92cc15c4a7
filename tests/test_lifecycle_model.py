"""The lifecycle against a model of it: random sequences of what the runtime, the admins and the
daily jobs do to a few conversations, each checked against the stored outcome after every step.

Nothing is lost that should stay, nothing stays that should go: every text written to a live
conversation is still in the database or its engine folder, every text of a deleted conversation
(and every tool output a cleanup removed) is in no table and no engine file, and each
conversation's state is what the model says. The writes go through the actions the console, the
API and the engine use; the erasure and the cleanup run the functions the job cluster runs.
"""

from __future__ import annotations

import itertools
import secrets
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings as django_settings
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lifecycle.actions.append_item import append_item
from lifecycle.actions.append_log import append_log
from lifecycle.actions.request_deletion import request_deletion
from lifecycle.actions.set_archived import set_archived
from lifecycle.actions.set_closed import set_closed
from lifecycle.actions.update_item import update_item
from lifecycle.actions.write_artifact import write_artifact
from lifecycle.deletion import executor, verify
from lifecycle.errors import ActionRefused
from lifecycle.fence import CODE as FENCED
from lifecycle.models import (
    Conversation,
    ConversationState,
    DeleteOperation,
    DeleteState,
    Item,
    Turn,
    TurnState,
)
from retention import jobs, service
from retention.models import ToolPayloadOperation, ToolPayloadPolicy
from tests import factories

pytestmark = pytest.mark.django_db

_serial = itertools.count(1)


def _text() -> str:
    """A unique text no other row or file holds by chance."""
    return f"mdl{next(_serial)}x{secrets.token_hex(8)}"


def _stored_text() -> str:
    """Every row of every table, as text: where a marker is, if it is anywhere in the database."""
    rows = []
    for model in apps.get_models():
        rows.extend(repr(row) for row in model.objects.all().values_list())
    return "\n".join(rows)


def _engine_bytes() -> bytes:
    """Every file under the engine folder, names and content."""
    found = []
    for path in sorted(Path(django_settings.ENGINE_HOME).rglob("*")):
        found.append(str(path).encode())
        if path.is_file() and not path.is_symlink():
            found.append(path.read_bytes())
    return b"\n".join(found)


class _Model:
    """What the model knows of one conversation."""

    def __init__(self, conversation: Conversation) -> None:
        self.pk = conversation.pk
        self.state = ConversationState.LIVE
        self.archived = False
        self.closed = False
        self.running_turn = False
        self.old = False  # last active long before the cleanup's cutoff
        self.items = 0
        self.kept: set[str] = set()  # texts the database or the engine folder must hold
        self.outputs: dict[int, str] = {}  # tool item id -> the output text a cleanup removes

    @property
    def live(self) -> bool:
        return self.state == ConversationState.LIVE


class LifecycleMachine(RuleBasedStateMachine):
    conversations = Bundle("conversations")

    def __init__(self) -> None:
        super().__init__()
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        self.models: dict[int, _Model] = {}
        self.gone: set[str] = set()  # texts no table and no engine file may hold any more
        self.admin = factories.make_user(f"admin{next(_serial)}", admin=True)

    def teardown(self) -> None:
        self.nothing_lost_nothing_left()
        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)

    def _conversation(self, model: _Model) -> Conversation:
        return Conversation.objects.get(pk=model.pk)

    _REFUSED = object()

    def _attempt(self, model: _Model, call, *, texts=()):
        """A write: made while the conversation is live (its result), else refused by the fence
        with nothing stored, its `texts` then in no table and no file (`_REFUSED`)."""
        if model.live:
            return call()
        with pytest.raises(ActionRefused) as refused:
            call()
        assert refused.value.code == FENCED
        self.gone.update(texts)
        return self._REFUSED

    # ---- The runtime -------------------------------------------------------------------

    @rule(target=conversations)
    def new_conversation(self) -> _Model:
        title = _text()
        conversation = factories.make_conversation(title=title)
        model = _Model(conversation)
        model.kept.add(title)
        self.models[model.pk] = model
        return model

    @rule(model=conversations, role=st.sampled_from(["user", "assistant"]))
    def append_message(self, model: _Model, role: str) -> None:
        content = _text()
        if self._attempt(model, lambda: append_item(self._conversation(model), role=role, content=content),
                         texts=[content]) is self._REFUSED:
            return
        model.items += 1
        model.old = False
        model.kept.add(content)

    @rule(model=conversations)
    def append_tool_call(self, model: _Model) -> None:
        title, output = _text(), _text()
        payload = {"command": "make test", "cwd": "/w", "exit_code": 1, "stdout": output + " ok" * 900,
                   "stderr": ""}
        item = self._attempt(model, lambda: append_item(
            self._conversation(model), role="tool", tool_kind="shell", payload=payload,
            tool_call_id=f"call_{next(_serial)}", status="completed", title=title), texts=[title, output])
        if item is self._REFUSED:
            return
        model.items += 1
        model.old = False
        model.kept.add(title)
        model.outputs[item.pk] = output

    @rule(model=conversations, data=st.data())
    def retitle_tool_call(self, model: _Model, data) -> None:
        """A runtime's late update of a tool call's title: the old title goes, the new one stays."""
        if not model.outputs:
            return
        item = Item.objects.get(pk=data.draw(st.sampled_from(sorted(model.outputs))))
        old, new = item.title, _text()
        if self._attempt(model, lambda: update_item(item, title=new), texts=[new]) is self._REFUSED:
            return
        model.old = False
        model.kept.discard(old)
        model.kept.add(new)
        self.gone.add(old)

    @rule(model=conversations)
    def write_engine_files(self, model: _Model) -> None:
        event, artifact = _text(), _text()
        conversation = self._conversation(model)
        logged = self._attempt(model, lambda: append_log(
            conversation, log="events", records=[{"type": "turn.completed", "note": event}]), texts=[event])
        written = self._attempt(model, lambda: write_artifact(
            conversation, name=f"{artifact}.txt", data=artifact.encode() * 2), texts=[artifact])
        if self._REFUSED in (logged, written):
            return
        model.kept.update({event, artifact})

    @rule(model=conversations)
    def start_turn(self, model: _Model) -> None:
        if not model.live or model.closed or model.running_turn:
            return
        factories.start_turn(self._conversation(model))
        model.running_turn = True

    @rule(model=conversations)
    def finish_turn(self, model: _Model) -> None:
        if not model.running_turn or not model.live:
            return
        Turn.objects.filter(conversation_id=model.pk, state=TurnState.RUNNING).update(
            state=TurnState.DONE, finished_at=timezone.now())
        model.running_turn = False

    @rule(model=conversations)
    def idle_for_months(self, model: _Model) -> None:
        """Time passes for one conversation: its last activity moves 200 days back."""
        if not model.live:
            return
        Conversation.objects.filter(pk=model.pk).update(last_activity_at=timezone.now() - timedelta(days=200))
        model.old = True

    # ---- The admins ----------------------------------------------------------------------

    @rule(model=conversations, archived=st.booleans())
    def archive(self, model: _Model, archived: bool) -> None:
        if self._attempt(model, lambda: set_archived(self._conversation(model), archived=archived,
                                                     acting_user=self.admin)) is self._REFUSED:
            return
        model.archived = archived

    @rule(model=conversations, closed=st.booleans())
    def close(self, model: _Model, closed: bool) -> None:
        if self._attempt(model, lambda: set_closed(self._conversation(model), closed=closed,
                                                   acting_user=self.admin)) is self._REFUSED:
            return
        if closed and not model.closed:
            model.running_turn = False  # Close interrupts the running turn
        model.closed = closed

    @rule(model=conversations)
    def delete(self, model: _Model) -> None:
        conversation = self._conversation(model)
        op = request_deletion(conversation, key=f"k{next(_serial)}", acting_user=self.admin)
        if not model.live:  # asked again: the same completed delete answers
            assert op.state == DeleteState.COMPLETED
            return
        if model.running_turn:
            assert (op.state, op.reason) == (DeleteState.REFUSED, "conversation_turn_active")
            return  # refused, recorded, and the conversation stays as it was
        assert op.state == DeleteState.PENDING
        model.state = ConversationState.PENDING_DELETE
        assert executor.run_erasure(op.pk) == "completed"
        model.state = ConversationState.DELETED
        self.gone.update(model.kept | {o for o in model.outputs.values() if o})
        model.kept.clear()
        model.outputs.clear()
        model.items = 0
        report = verify.verify(DeleteOperation.objects.get(pk=op.pk), record=False)
        assert report.logical == []
        self.nothing_lost_nothing_left()

    # ---- The daily job -------------------------------------------------------------------

    # Only when an idle conversation holds a tool output (due, or kept by a running turn): a run
    # with nothing to look at checks nothing (r145: two runs in seventy removed anything).
    @precondition(lambda self: any(m.live and m.old and any(m.outputs.values()) for m in self.models.values()))
    @rule()
    def tool_payload_cleanup(self) -> None:
        policy = ToolPayloadPolicy.load()
        if not policy.enabled:
            policy = service.save_policy(user=self.admin, enabled=True, age_value=3, age_unit="months",
                                         revision=policy.revision, backup_choice="skip")
        op_id = service.start_run(user=self.admin, revision=policy.revision)
        for _ in range(100):
            if jobs.run_operation(op_id) != "more":
                break
        assert ToolPayloadOperation.objects.get(pk=op_id).state == "succeeded"
        for model in self.models.values():
            if model.live and model.old and not model.running_turn:
                self.gone.update(o for o in model.outputs.values() if o)  # the output goes, the title stays
                model.outputs = dict.fromkeys(model.outputs, "")
        self.nothing_lost_nothing_left()

    # ---- What must hold -------------------------------------------------------------

    @invariant()
    def stored_states_are_the_models(self) -> None:
        for model in self.models.values():
            conversation = Conversation.objects.get(pk=model.pk)
            assert conversation.state == model.state
            if model.live:
                assert (conversation.archived_at is not None, conversation.closed_at is not None) == (
                    model.archived, model.closed)
            assert Item.objects.filter(conversation_id=model.pk).count() == model.items
            if model.state == ConversationState.DELETED:
                assert conversation.title == ""

    def nothing_lost_nothing_left(self) -> None:
        """Checked after each delete and cleanup, and at the end (reading every table takes a
        while; a text lost or left stays so until the end)."""
        stored, files = _stored_text(), _engine_bytes()
        for model in self.models.values():
            for text in model.kept | {o for o in model.outputs.values() if o}:
                assert text in stored or text.encode() in files, f"lost: {text}"
        for text in self.gone:
            assert text not in stored, f"left in the database: {text}"
            assert text.encode() not in files, f"left in the engine folder: {text}"


def test_random_lifecycles_lose_nothing_and_leave_nothing():
    run_state_machine_as_test(LifecycleMachine, settings=settings(
        max_examples=80, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]))
