"""The retention class registry: one declaration per store that can hold conversation data.

The delete preview, the confirmation panel, the erasure executor, the residue verifier and
docs/retention-classes.md are all generated from STORES. A model that refers to a
conversation and is missing here fails the `lifecycle.E001` system check.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import models
from django.utils.translation import gettext_lazy as _


class RetentionClass(models.TextChoices):
    ERASE = "erase", _("Erase")
    COMPACT = "compact", _("Compact")
    RETAIN_DETACH = "retain_detach", _("Keep, detach")
    SHARED = "shared", _("Shared copy")
    RETAIN = "retain", _("Keep")
    RETAIN_FACTS = "retain_facts", _("Keep facts for a period")
    OUT_OF_SCOPE = "out_of_scope", _("Out of scope")


@dataclass(frozen=True)
class Store:
    key: str
    kind: str  # "table", "file" or "external"
    label: str
    retention: RetentionClass
    on_delete: str
    model: str = ""  # app_label.ModelName for tables
    pattern: str = ""  # path under ENGINE_HOME for files; <thread> is the storage key


def table(model: str, label, retention: RetentionClass, on_delete) -> Store:
    return Store(key=model, kind="table", label=label, retention=retention, on_delete=on_delete, model=model)


def files(key: str, pattern: str, label, retention: RetentionClass, on_delete) -> Store:
    return Store(key=key, kind="file", label=label, retention=retention, on_delete=on_delete, pattern=pattern)


E, C = RetentionClass.ERASE, RetentionClass.COMPACT

STORES: tuple[Store, ...] = (
    table("lifecycle.Conversation", _("Conversation record"), E,
          _("Title erased; the identity row stays as a content-free tombstone.")),
    table("lifecycle.Turn", _("Turns"), E, _("Gone.")),
    table("lifecycle.Item", _("Messages and tool calls"), E, _("Gone.")),
    files("events", "threads/<thread>/", _("Event log"), E, _("Gone.")),
    table("lifecycle.Goal", _("Goals"), E, _("Gone.")),
    table("lifecycle.MailEnvelope", _("Mail envelopes"), E, _("Gone.")),
    table("lifecycle.SessionDocument", _("Saved session documents"), E, _("Gone.")),
    table("lifecycle.BranchJournalEntry", _("Branch journal"), E, _("Gone.")),
    table("lifecycle.Checkpoint", _("Checkpoints"), E, _("Gone.")),
    table("lifecycle.RecoveryMaterial", _("Pre-import archives and recovery material"), E, _("Gone.")),
    files("approval_receipts", "sessions/<thread>/", _("Approval receipt log and recovery files"), E,
          _("Gone.")),
    files("artifacts", "artifacts/<thread>/", _("Large outputs and tool artifacts"), E, _("Gone.")),
    table("lifecycle.RuntimeClaim", _("Runtime claims (approvals, input, jobs)"), E, _("Gone.")),
    table("lifecycle.ProcessLease", _("Process lease"), E, _("Gone.")),
    table("lifecycle.OperationBinding", _("Turn-operation bindings"), C,
          _("Compacted to operation id, target id, timestamp and outcome.")),
    table("lifecycle.HistoryReceipt", _("History-operation receipts"), C,
          _("Compacted to operation id, target id, timestamp and outcome.")),
    files("subagents", "state/subagents.v1.json", _("Settled subagent rows"), C,
          _("This conversation's settled rows are removed under the fleet lock; other rows stay.")),
    files("legacy_subagents", "legacy-state/subagents.v1.json", _("Legacy subagent rows"), C,
          _("Rows attributed to this conversation are removed; rows of unknown origin make delete unavailable.")),
    table("lifecycle.Export", _("Exports you saved"), RetentionClass.RETAIN_DETACH,
          _("Files are kept; their link to the conversation is cut.")),
    table("lifecycle.SharedLink", _("Shared links and published copies"), RetentionClass.SHARED,
          _("Revoked where the publisher supports it; otherwise the shared copy remains.")),
    table("lifecycle.WorkspaceFile", _("Workspace files the agent wrote"), RetentionClass.RETAIN,
          _("Untouched.")),
    table("lifecycle.MemoryEntry", _("Project and learned memory"), RetentionClass.RETAIN,
          _("Untouched unless removed separately.")),
    table("lifecycle.UsageFact", _("Usage and metering"), RetentionClass.RETAIN_FACTS,
          _("Content-free; kept for the declared period, then expired.")),
    table("lifecycle.BillingFact", _("Billing"), RetentionClass.RETAIN_FACTS,
          _("Content-free; kept for the declared period, then expired.")),
    table("lifecycle.AuditFact", _("Audit"), RetentionClass.RETAIN_FACTS,
          _("Content-free; kept for the declared period, then expired.")),
    Store(key="provider", kind="external", label=_("Provider-retained inputs"),
          retention=RetentionClass.OUT_OF_SCOPE,
          on_delete=_("Provider retention follows provider terms.")),
)


def stores_by_model() -> dict[str, Store]:
    return {s.model.lower(): s for s in STORES if s.kind == "table"}


def markdown_table() -> str:
    """The documentation table, in English, as docs/retention-classes.md holds it."""
    from django.utils import translation

    with translation.override("en"):
        lines = [
            "# Retention classes",
            "",
            "Generated from `lifecycle/registry.py` by `manage.py retention_table`; do not edit by hand.",
            "",
            "| Store | Where | Class | On delete |",
            "| --- | --- | --- | --- |",
        ]
        for s in STORES:
            where = {"table": f"table `{s.model}`", "file": f"engine folder `{s.pattern}`"}.get(
                s.kind, "outside Lethe"
            )
            lines.append(f"| {s.label} | {where} | {s.retention.value} | {s.on_delete} |")
    return "\n".join(lines) + "\n"
