"""The console API for tool payload cleanup (DESIGN.md section 8), over `retention.service`.

The same rules as the screens: members read, admins change; bodies are strict (unknown
fields 400); refusals are `{code, message}` with the service's codes and statuses.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from pydantic import Field

from console.api import ApiError, Revision, Schema, endpoint
from lifecycle.actions.save_facts_policy import FIELDS as FACT_FIELDS
from lifecycle.actions.save_facts_policy import save_facts_policy
from lifecycle.models import RetainedFactsPolicy
from retention import service

BASE = "/api/v1/system/tool-payload-retention"


def _json(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def _call(fn, **kwargs):
    try:
        return fn(**kwargs)
    except service.CleanupError as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None


# ---- Shapes ---------------------------------------------------------------------------------


class AgeIn(Schema):
    value: int = Field(description="Whole weeks (1-520) or calendar months (1-120); anything else is 400 "
                                   "invalid_age.", json_schema_extra={"minimum": 1, "maximum": 520})
    # Declared as an enum, checked by the service so that any other unit, of any length (the
    # body's size limit bounds it), is `invalid_age`.
    unit: Annotated[str, Field(description='"weeks" or "months"; anything else is 400 invalid_age.',
                               json_schema_extra={"enum": ["weeks", "months"]})]


class PolicyIn(Schema):
    enabled: bool
    age: AgeIn
    revision: Revision
    backup_choice: Literal["create", "skip"] | None = Field(
        default=None,
        description="Required (never inferred) when enabling, re-enabling or shortening the period. Given on a "
                    "save that changes the switch or the period, or other than the stored one, it starts the "
                    "preparation over (`create`: a new verified backup before the next cleanup; `skip`: ready at "
                    "once). The stored choice sent again with the stored switch and period changes nothing.",
    )


class AnalyzeIn(Schema):
    age: AgeIn


class RunIn(Schema):
    revision: Revision


class CancelIn(Schema):
    operation_id: int


class AgeOut(Schema):
    value: int
    unit: str


class OperationErrorOut(Schema):
    code: str
    message: str


class ProgressOut(Schema):
    done: int
    total: int


class BackupReceiptOut(Schema):
    name: str
    sha256: str
    size: int | None
    present: bool | None = Field(None, description=(
        "Whether the backup folder still lists this backup (an operator may remove old backups; "
        "Lethe never does). Null when the folder could not be listed."))


FIGURES = (
    "Counted so far while queued (0) or running. An analysis's result once it succeeded, or partial "
    "(part of the data); a cancelled or failed analysis has no result, whatever it counted. A cleanup "
    "that removed anything before it stopped is partial, so a cancelled or failed one removed nothing.")


class OperationDoc(Schema):
    id: int
    kind: Literal["analysis", "backup", "cleanup", "compact"]
    state: Literal["queued", "running", "succeeded", "partial", "failed", "cancelled"]
    cutoff: str | None
    scanned: int = Field(description=FIGURES + (
        " An analysis counts the conversations it has read; a cleanup, those it counted at its start and "
        "has finished cleaning, and once it succeeded all of them (those found active again included, "
        "left alone: `skipped.recent_activity`)."))
    eligible_conversations: int = Field(description=FIGURES)
    eligible_messages: int = Field(description=FIGURES)
    removed_messages: int = Field(description=FIGURES)
    payload_bytes: int = Field(description=FIGURES)
    skipped: dict[str, int] = Field(description=(
        "Items left alone, by reason: the reducer's reasons stored with each item (protected, "
        "too_small, oversize...), `changed` (written meanwhile: the write won) and "
        "`recent_activity` (its conversation was no longer eligible when the run came to it: "
        "active again, or being deleted). A cleanup counts the reducer's reasons for all of its "
        "conversations when it starts: one that stopped before its end went through `scanned` of "
        "`eligible_conversations`."))
    created_at: str
    started_at: str | None
    finished_at: str | None
    error: OperationErrorOut | None
    started_by: str = Field(description='The username, or "schedule" (see started_by_kind).')
    started_by_kind: Literal["user", "schedule"] = Field(
        description='"schedule" when the daily schedule started it; "user" when a user did (one may be named "schedule").')
    progress: ProgressOut
    stale: bool
    cancel_requested: bool
    last_progress_at: str | None = Field(description=(
        "Queued or running: when a worker last showed progress (its last batch or heartbeat; "
        "for one no worker has taken yet, when it was queued). Null once it finished."))
    stalled: bool = Field(description=(
        "Queued or running with no progress for twice the job lease (60 s by default): no worker "
        "is working on it now (the job cluster may be stopped). Once one takes it, a queued one "
        "starts, an analysis or a cleanup goes on from its last batch, a compaction starts over, "
        "and a backup cut short is marked failed (unless its copy was already written and "
        "verified)."))
    age: AgeOut | None
    policy_revision: int
    before_bytes: int | None
    after_bytes: int | None
    before_reusable_bytes: int | None
    after_reusable_bytes: int | None
    backup: BackupReceiptOut | None


class PolicyOut(Schema):
    enabled: bool
    age: AgeOut
    revision: int
    updated_at: str


class PreparationOut(Schema):
    state: str
    choice: str | None
    error: str | None
    receipt: str | None


class DatabaseOut(Schema):
    engine: str
    file_bytes: int
    reusable_bytes: int
    reusable_is_estimate: bool
    reusable_measured_at: str | None = Field(
        None, description="When reusable_bytes was measured, when it was not measured for this answer (PostgreSQL).")


class BackupOut(Schema):
    name: str
    size: int
    created_at: str
    sha256: str
    changed: bool = Field(description="The file's size or modification time is no longer the one its receipt "
                                      "recorded: check its SHA-256 before restoring it.")


class StatusOut(Schema):
    policy: PolicyOut
    supported: bool
    preparation: PreparationOut
    operation: OperationDoc | None
    analysis_state: Literal["not_analyzed", "running", "completed", "empty", "partial", "failed", "stale"]
    last_analysis: OperationDoc | None
    last_run: OperationDoc | None
    last_compact: OperationDoc | None
    next_check_at: str | None
    history: list[OperationDoc] = Field(description="The last 50 operations, newest first.")
    database: DatabaseOut
    backups: list[BackupOut] = Field(description="The newest 20 backups, newest first.")
    older_backups: int = Field(0, description="Older backups in the backup folder, not listed.")
    error: OperationErrorOut | None = Field(description="Set when stored state is unreadable: nothing runs.")


class StartedOut(Schema):
    operation_id: int


# ---- Endpoints ------------------------------------------------------------------------------


@endpoint("GET", BASE, response=StatusOut, name="api-tool-payloads-status",
          summary="Tool payload cleanup: policy, preparation, current and past operations")
def status(request: HttpRequest) -> dict:
    return _json(service.status_document())


@endpoint("PUT", BASE, body=PolicyIn, response=StatusOut, admin=True, errors=(409,),
          name="api-tool-payloads-save", summary="Save the cleanup policy",
          description="400 `invalid_age` or `backup_choice_required`; 409 `stale_revision` when the values "
                      "differ from the stored ones. Every save that changes something bumps the revision and "
                      "marks analyses of other settings stale; one that changes nothing keeps the revision and "
                      "is no refusal, whatever revision it was read at (a request sent twice). The stored "
                      "`enabled`, `age` and `backup_choice` (or none) sent again change nothing, the preparation "
                      "included: a backup made for it is kept, one being made goes on, and a failed or cancelled "
                      "one waits for `retry-preparation` or another choice.")
def save(request: HttpRequest, body: PolicyIn) -> dict:
    _call(service.save_policy, user=request.user, enabled=body.enabled, age_value=body.age.value,
          age_unit=body.age.unit, revision=body.revision, backup_choice=body.backup_choice)
    return _json(service.status_document())


@endpoint("POST", BASE + "/analyze", body=AnalyzeIn, response={202: StartedOut}, admin=True, errors=(409,),
          name="api-tool-payloads-analyze", summary="Analyze a (draft) period; changes nothing")
def analyze(request: HttpRequest, body: AnalyzeIn) -> tuple[int, dict]:
    op = _call(service.start_analysis, user=request.user, age_value=body.age.value, age_unit=body.age.unit)
    return 202, {"operation_id": op}


@endpoint("POST", BASE + "/run", body=RunIn, response={202: StartedOut}, admin=True, errors=(409,),
          name="api-tool-payloads-run", summary="Run cleanup now under the saved, enabled policy",
          description="Answers the id of the operation queued: the cleanup's, or, when a backup was chosen and "
                      "none is verified yet, the backup's (kind `backup`), which runs first. Once that backup is "
                      "verified, the cleanup is queued as an operation of its own, with its own id; none follows "
                      "a backup that failed or was cancelled (`preparation` says so), nor one during which the "
                      "policy was changed or turned off. Find the cleanup in the status document: "
                      "`operation` is the backup, then the cleanup; `last_run` is the newest cleanup and "
                      "`history` lists both. 409 `stale_revision`, `busy`, `preparation_required` or "
                      "`not_enabled`.")
def run(request: HttpRequest, body: RunIn) -> tuple[int, dict]:
    return 202, {"operation_id": _call(service.start_run, user=request.user, revision=body.revision)}


@endpoint("POST", BASE + "/retry-preparation", response={202: StartedOut}, admin=True, errors=(409,),
          name="api-tool-payloads-retry", summary="Retry the backup after it failed or was cancelled",
          description="409 `busy` while the backup is being made, `nothing_to_retry` when no backup "
                      "was chosen or it is ready.")
def retry(request: HttpRequest) -> tuple[int, dict]:
    return 202, {"operation_id": _call(service.retry_preparation, user=request.user)}


@endpoint("POST", BASE + "/cancel", body=CancelIn, response={202: StartedOut}, admin=True, errors=(404, 409),
          name="api-tool-payloads-cancel", summary="Stop an operation after its current batch",
          description="Answers the operation's id; the operation ends after its current batch "
                      "(follow it in the status document). A compaction stops only while queued (it then "
                      "ends without compacting); once it runs, 409 `not_cancellable`, as for a finished one.")
def cancel(request: HttpRequest, body: CancelIn) -> tuple[int, dict]:
    _call(service.cancel, user=request.user, operation_id=body.operation_id)
    return 202, {"operation_id": body.operation_id}


@endpoint("POST", BASE + "/compact", response={202: StartedOut}, admin=True, errors=(409,),
          name="api-tool-payloads-compact", summary="Compact the database (VACUUM) as a job")
def compact(request: HttpRequest) -> tuple[int, dict]:
    return 202, {"operation_id": _call(service.start_compact, user=request.user)}


# ---- Retained facts: how long content-free facts stay after a delete ------------------------------

FACTS = "/api/v1/system/retained-facts"
Days = Annotated[int, Field(ge=RetainedFactsPolicy.MIN_DAYS, le=RetainedFactsPolicy.MAX_DAYS,
                            description=f"Whole days, {RetainedFactsPolicy.MIN_DAYS} to {RetainedFactsPolicy.MAX_DAYS}.")]


class FactsPolicyIn(Schema):
    audit_days: Days
    usage_days: Days
    billing_days: Days
    revision: Revision


class FactsPolicyOut(Schema):
    audit_days: int
    usage_days: int
    billing_days: int
    revision: int
    updated_at: str


def _facts(policy: RetainedFactsPolicy) -> dict:
    return _json({name: getattr(policy, name) for name in (*FACT_FIELDS, "revision", "updated_at")})


@endpoint("GET", FACTS, response=FactsPolicyOut, name="api-retained-facts",
          summary="How long usage, billing and audit facts are kept after a conversation's delete")
def facts_policy(request: HttpRequest) -> dict:
    return _facts(RetainedFactsPolicy.load())


@endpoint("PUT", FACTS, body=FactsPolicyIn, response=FactsPolicyOut, admin=True, errors=(409,),
          name="api-retained-facts-save", summary="Save the retention periods of content-free facts",
          description="Counted from each delete's completion; a shorter period removes the facts it no "
                      "longer covers at the next hourly run. 400 `invalid_value` outside 1-3650 days; 409 "
                      "`stale_revision` when the values differ from the stored ones. A save that changes nothing "
                      "keeps the revision and is no refusal, whatever revision it was read at.")
def facts_policy_save(request: HttpRequest, body: FactsPolicyIn) -> dict:
    values = {name: getattr(body, name) for name in FACT_FIELDS}
    return _facts(save_facts_policy(values=values, revision=body.revision, acting_user=request.user))
