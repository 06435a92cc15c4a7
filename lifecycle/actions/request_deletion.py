from __future__ import annotations

import contextlib
import errno
import logging
import re

from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django_q.tasks import async_task

from lifecycle import audit, engine_folder, fleet
from lifecycle.actions.resolve_subagent import settle_resolutions
from lifecycle.deletion import reasons
from lifecycle.deletion.admission import Admission, admit
from lifecycle.deletion.plan import step_keys, stores_by_key
from lifecycle.deletion.preview import preview, preview_digest
from lifecycle.deletion.stores import measure
from lifecycle.enginefs import EngineHome, UnsafeEnginePath
from lifecycle.errors import ActionRefused, engine_folder_code
from lifecycle.models import (
    Conversation,
    ConversationState,
    DeleteOperation,
    DeleteState,
    DeleteStep,
    DeletionFence,
    OperationKey,
    StepState,
)

log = logging.getLogger(__name__)

# Printable ASCII, no spaces: what the API publishes as the Idempotency-Key's pattern too.
KEY_PATTERN = "^[!-~]{1,200}$"
KEY = re.compile(KEY_PATTERN)


def _step(operation: DeleteOperation, key: str, position: int, conversation: Conversation,
          home: EngineHome, by_key: dict) -> DeleteStep:
    """A step row; the fleet files' steps are measured now, under their locks (see above)."""
    step = DeleteStep(operation=operation, key=key, position=position)
    store = by_key.get(key)
    if store is not None and store.shared_file:
        figures = measure(store, conversation, home)
        step.state, step.records, step.bytes, step.detail = StepState.MEASURED, figures.records, figures.bytes, figures.detail
    return step


KEY_INVALID = gettext_lazy("The Idempotency-Key must be 1 to 200 printable ASCII characters without spaces.")


# A console form carries its key in a hidden field (no header): a key missing or broken there is
# a form sent incomplete or altered, said in the form's own words (r23).
FORM_KEY_BROKEN = gettext_lazy("The form arrived incomplete or altered, so nothing was deleted. "
                               "Reload the page and confirm again.")
KEY_CODES = ("idempotency_key_missing", "idempotency_key_invalid")

# A confirmation of a live conversation that changed after its page was shown (`seen`, the
# digest of what the page showed, differs from what the delete would do now): not taken.
CHANGED_CODE = "changed_since_shown"
CHANGED_SINCE_SHOWN = gettext_lazy(
    "This conversation changed after the page was shown, so your confirmation was not taken: what is erased, "
    "kept or left in backups is shown again below as it is now. Read it before you confirm.")


def form_message(exc: ActionRefused) -> str:
    """A delete refusal as a console form says it."""
    return str(FORM_KEY_BROKEN) if exc.code in KEY_CODES else str(exc.message)


def check_key(key: str | None) -> str:
    if key is None or key == "":
        raise ActionRefused("idempotency_key_missing", _("Send an Idempotency-Key header."), status=400)
    if not KEY.fullmatch(key):
        raise ActionRefused("idempotency_key_invalid", str(KEY_INVALID), status=400)
    return key


def request_deletion(conversation: Conversation, *, key: str, acting_user, seen: str | None = None) -> DeleteOperation:
    """Ask to delete a conversation under an operation key; returns the operation that answers.

    1. The same key answers with its recorded operation, whatever its outcome, ever after
       (422 when it was used for another conversation).
    2. A conversation with an intent already (Pending or Completed) answers with that
       operation; the new key is remembered for it.
    3. Admission: a refusal or an unavailable answer is recorded under the key, with no
       intent, and the conversation stays writable.
    4. Otherwise the intent: operation, steps, database fence, `pending_delete`, audit fact
       and the erasure job, in one transaction, before anything is erased.

    `seen`: the digest (`preview_digest`) of the preview a confirmation page showed. Compared
    under the conversation's row lock and the fleet files' locks, after 1 and 2 (a key or an
    intent that exists answers as before): a difference refuses with CHANGED_CODE (409) and
    records nothing, so what is erased is what was shown (an append waits for the lock, then
    finds the fence).
    """
    check_key(key)
    home = EngineHome()
    # A subagent resolution cut short may have changed the fleet files without its audit fact:
    # it is finished and recorded before admission reads them (an attribution that makes a row
    # this conversation's must be on record before the delete erases the row).
    settle_resolutions(home)
    held = contextlib.ExitStack()
    try:
        with held, transaction.atomic():
            return _request(conversation, key, acting_user, home, held, seen)
    except IntegrityError:
        # Two requests with one key raced; the first one's answer stands.
        recorded = OperationKey.objects.select_related("operation").filter(key=key).first()
        if recorded is None:
            raise
        return _recorded(recorded, conversation)


def joined(operation: DeleteOperation, key: str) -> bool:
    """Whether `key` joined a delete someone (or an earlier page) requested first: the
    operation's first key is not this one. Decided from the records, after the request, so a
    request racing another is told the truth whichever committed first (r134)."""
    first = OperationKey.objects.filter(operation=operation).order_by("pk").values_list("key", flat=True).first()
    return first is not None and first != key


def _recorded(recorded: OperationKey, conversation: Conversation) -> DeleteOperation:
    if recorded.operation.conversation_id != conversation.pk:
        raise ActionRefused(
            "idempotency_key_reused",
            _("This Idempotency-Key was already used for another conversation. Use a new key."),
            status=422,
        )
    return recorded.operation


def _request(conversation: Conversation, key: str, acting_user, home: EngineHome,
             held: contextlib.ExitStack, seen: str | None) -> DeleteOperation:
    locked = Conversation.objects.select_for_update().get(pk=conversation.pk)
    recorded = OperationKey.objects.select_related("operation").filter(key=key).first()
    if recorded is not None:
        return _recorded(recorded, locked)
    requester = acting_user if acting_user is not None and acting_user.is_authenticated else None
    intent = DeleteOperation.objects.intents().filter(conversation=locked).first()
    if intent is not None:
        OperationKey.objects.create(key=key, operation=intent)
        return intent
    # The fleet files stay locked until this transaction has committed (the ExitStack closes
    # after the atomic block): admission and the receipt's figures see exactly what the fence
    # then guards.
    # Checked before the fleet's locks are taken: taking them makes their folders, and would
    # put an empty engine folder where the database's is missing (lifecycle.engine_folder).
    # A folder it cannot write (a read-only mount, a full disk: the locks are files, and a
    # first delete writes the folder's mark) is Unavailable too, by its errno, never a 500.
    try:
        engine_folder.check(home)
        held.enter_context(fleet.locked_files(home))
    except (engine_folder.EngineFolderUnavailable, FileNotFoundError):  # not there (or gone since)
        admission = Admission(reasons=[reasons.ENGINE_FOLDER_UNAVAILABLE])
    except OSError as error:
        # Which file, for the operator (the answer names no path); a lock's name holds no content.
        log.warning("delete of %s unavailable: %s could not be written (%s)", locked.public_id, error.filename,
                    errno.errorcode.get(error.errno, type(error).__name__))
        admission = Admission(reasons=[engine_folder_code(error)])
    except UnsafeEnginePath:
        # A link or a FIFO where a fleet file's lock belongs: never followed nor waited on.
        log.warning("delete of %s unavailable: a fleet lock is not a regular file", locked.public_id)
        admission = Admission(reasons=[reasons.ENGINE_FOLDER_NOT_WRITABLE])
    else:
        admission = admit(locked, home)
    # (Not when only the engine folder's state stands in the way: it is not the conversation's
    # change, and the delete is recorded Unavailable with that reason, which the page then says;
    # r135: an engine folder gone at confirmation read as "this conversation changed".)
    if seen is not None and not reasons.folder_only(admission.reasons) and preview_digest(preview(locked, home)) != seen:
        raise ActionRefused(CHANGED_CODE, str(CHANGED_SINCE_SHOWN), status=409)
    if admission.outcome != "admitted":
        operation = DeleteOperation.objects.create(
            conversation=locked, requested_by=requester, state=admission.outcome,
            reason=admission.code, reasons=admission.reasons,
        )
        OperationKey.objects.create(key=key, operation=operation)
        return operation
    keys = step_keys()
    operation = DeleteOperation.objects.create(
        conversation=locked, requested_by=requester, state=DeleteState.PENDING, step=keys[0],
    )
    by_key = stores_by_key()
    DeleteStep.objects.bulk_create([_step(operation, k, n, locked, home, by_key) for n, k in enumerate(keys)])
    DeletionFence.objects.create(conversation_id=locked.pk, operation_id=operation.pk)
    Conversation.objects.filter(pk=locked.pk).update(state=ConversationState.PENDING_DELETE,
                                                     view_changed_at=timezone.now())
    OperationKey.objects.create(key=key, operation=operation)
    audit.record(
        "conversation.delete_requested", actor=acting_user, conversation=locked,
        old={"state": ConversationState.LIVE}, new={"state": ConversationState.PENDING_DELETE,
                                                    "operation": operation.public_id},
    )
    # The ORM broker stores the job in this same transaction: intent and job commit together.
    async_task("lifecycle.tasks.erase", operation.pk, q_options={"ack_failure": True})
    return operation
