"""The embedded engine: the lifecycle's actions, called in this process."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from django.utils.formats import number_format
from django.utils.translation import gettext as _

from lifecycle.actions.request_deletion import joined, request_deletion
from lifecycle.actions.resolve_subagent import resolve_subagent
from lifecycle.actions.set_archived import set_archived
from lifecycle.actions.set_closed import set_closed
from lifecycle.deletion import executor
from lifecycle.deletion.preview import preview
from lifecycle.engine import OperationPage, OperationView
from lifecycle.errors import ActionRefused
from lifecycle.item_payload import has_bad_text
from lifecycle.models import Conversation, DeleteOperation
from lifecycle.operation_paging import (
    MAX_OFFSET,
    OffsetTooLarge,
    operation_slice,
    parse_position,
    scope_of,
)
from lifecycle.paging import InvalidCursor
from lifecycle.serializers import OperationReads, operation_json, thread_json, with_steps


def visible_conversations(actor=None):
    """The conversations a caller may see. Everyone signed in sees every owner's today; an
    id outside this set is answered exactly like an unknown one."""
    return Conversation.objects.all()


def not_found() -> ActionRefused:
    return ActionRefused("not_found", _("Nothing with that id exists here."), status=404)


class InProcessEngine:
    def _conversation(self, public_id: str, actor=None) -> Conversation:
        if has_bad_text(public_id):  # no id holds a NUL or a lone surrogate (PostgreSQL cannot compare one)
            raise not_found()
        conversation = visible_conversations(actor).with_activity().with_delete_operation().filter(public_id=public_id).first()
        if conversation is None:
            raise not_found()
        return conversation

    def _operation(self, operation_id: str) -> DeleteOperation:
        if has_bad_text(operation_id):
            raise not_found()
        op = DeleteOperation.objects.select_related("conversation").filter(public_id=operation_id).first()
        if op is None:
            raise not_found()
        return op

    def set_archived(self, public_id: str, archived: bool, *, actor) -> dict[str, Any]:
        changed = set_archived(self._conversation(public_id, actor), archived=archived, acting_user=actor).changed
        return {**thread_json(self._conversation(public_id, actor)), "changed": changed}

    def set_closed(self, public_id: str, closed: bool, *, actor) -> dict[str, Any]:
        changed = set_closed(self._conversation(public_id, actor), closed=closed, acting_user=actor).changed
        return {**thread_json(self._conversation(public_id, actor)), "changed": changed}

    def preview_delete(self, public_id: str) -> dict[str, Any]:
        return preview(self._conversation(public_id))

    def request_delete(self, public_id: str, *, key: str | None, actor, seen: str | None = None) -> OperationView:
        conversation = self._conversation(public_id, actor)
        op = request_deletion(conversation, key=key, acting_user=actor, seen=seen)
        view = OperationView.from_json(operation_json(self._operation(op.public_id)))
        return replace(view, joined=joined(op, key))

    def operation(self, operation_id: str) -> OperationView:
        return OperationView.from_json(operation_json(self._operation(operation_id)))

    def operations_named(self, operation_ids: list[str]) -> list[OperationView]:
        """In a constant number of queries, the policy and the fleet files read once (a page
        polls its pending deletes every few seconds)."""
        wanted = [op_id for op_id in operation_ids if not has_bad_text(op_id)]
        found = {op.public_id: op for op in with_steps(DeleteOperation.objects.filter(public_id__in=wanted))}
        reads = OperationReads()
        return [OperationView.from_json(operation_json(found[op_id], reads)) for op_id in wanted if op_id in found]

    def operations(self, *, state: str | None = None, limit: int = 50, position: str | None = None) -> OperationPage:
        try:
            start = parse_position(position, scope_of(state))
        except OffsetTooLarge:
            raise ActionRefused("invalid_cursor", _("An offset skips at most %(max)s rows: follow the pages' next "
                                                    "instead.") % {"max": number_format(MAX_OFFSET, force_grouping=True)},
                                status=400) from None
        except InvalidCursor:
            from lifecycle.api import cursor_of_another_list

            refused = cursor_of_another_list()  # the words every list's cursor has (r153)
            raise ActionRefused(refused.code, refused.message, status=400) from None
        qs = with_steps(DeleteOperation.objects.all())
        if state:
            qs = qs.filter(state=state)
        page = operation_slice(qs, start, limit, scope_of(state))
        reads = OperationReads()  # the policy and the fleet files, read once for the page
        rows = [OperationView.from_json(operation_json(op, reads)) for op in page.rows]
        return OperationPage(rows=rows, next=page.next, previous=page.previous)

    def retry_operation(self, operation_id: str, *, actor) -> OperationView:
        op = self._operation(operation_id)
        executor.retry(op.pk)
        from django_q.tasks import async_task

        async_task("lifecycle.tasks.erase", op.pk, q_options={"ack_failure": True})
        return self.operation(operation_id)

    def resolve_subagent(self, agent_id: str, *, action: str, conversation_id: str | None, actor) -> None:
        conversation = self._conversation(conversation_id, actor) if conversation_id else None
        resolve_subagent(agent_id, action=action, conversation=conversation, acting_user=actor)

    def wait(self, operation_id: str, *, progress=None, timeout: float | None = None) -> OperationView:
        """The embedded engine drives the erasure itself (under the operation's lease, so a
        worker of the cluster doing the same meanwhile is harmless) and reports each step."""
        op = self._operation(operation_id)
        deadline = None if timeout is None else time.monotonic() + timeout

        def report(_op, step, done, total) -> None:
            if progress:
                progress(done, total, step.key)

        while op.state == "pending" and (deadline is None or time.monotonic() < deadline):
            outcome = executor.run_erasure(op.pk, progress=report)
            op = self._operation(operation_id)
            if outcome == "pending" and op.last_error:
                break  # stopped on an error: report it; the recovery job retries
            if outcome == "busy":
                if executor.stalled(op):
                    break
                time.sleep(0.5)  # another worker holds it: wait for it to finish
        return self.operation(operation_id)
