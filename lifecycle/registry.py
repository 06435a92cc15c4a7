"""The retention class registry: one declaration per store that can hold conversation data.

The delete preview, the confirmation panel, the erasure executor, the residue verifier, the
fence triggers and docs/retention-classes.md are all generated from STORES. Each entry
carries the code that finds one conversation's data in its store: for a table, the model and
the field that points at the conversation (`Store.rows`); for a file store, the `EngineHome`
locator that names the conversation's folder or the shared file it has rows in
(`Store.paths`). A new store is one model (or one locator) plus one entry here. A model that
refers to a conversation and is missing here fails the `lifecycle.E001` system check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from django.apps import apps
from django.db import models
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from lifecycle.enginefs import EngineHome
    from lifecycle.models import Conversation


class RetentionClass(models.TextChoices):
    ERASE = "erase", _("Erase")
    COMPACT = "compact", _("Compact")
    RETAIN_DETACH = "retain_detach", _("Keep, detach")
    SHARED = "shared", _("Shared copy")
    RETAIN = "retain", _("Keep")
    RETAIN_FACTS = "retain_facts", _("Keep facts for a period")
    OUT_OF_SCOPE = "out_of_scope", _("Out of scope")


# Classes whose stores a delete changes; the others are shown as kept.
ACTING = (RetentionClass.ERASE, RetentionClass.COMPACT, RetentionClass.RETAIN_DETACH, RetentionClass.SHARED)
CONTENT_FIELDS = (models.TextField, models.JSONField)


@dataclass(frozen=True)
class Store:
    key: str
    kind: str  # "table", "file" or "external"
    label: str
    retention: RetentionClass
    on_delete: str
    model: str = ""  # app_label.ModelName for tables
    pattern: str = ""  # path under ENGINE_HOME for files; <thread> is the storage key
    lookup: str = "conversation_id"  # tables: the column that holds the conversation's id
    content: tuple[str, ...] = ()  # tables: columns holding content (default: text and JSON columns)
    sized_by: tuple[tuple[str, str], ...] = ()  # tables: (content column, column already holding its size)
    tombstone: bool = False  # tables: the row stays, its content columns are blanked
    period: str = ""  # retain_facts: the RetainedFactsPolicy field counting days after the delete
    days: int = 0  # retain_facts without a setting: a fixed period, in days after the delete
    locator: str = ""  # files: the EngineHome method (folder per conversation) or property (shared file)
    shared_file: bool = False  # files: one file for all conversations; this one's rows are compacted out

    # Tables ------------------------------------------------------------------------------

    @property
    def model_class(self) -> type[models.Model]:
        return apps.get_model(self.model)

    @property
    def db_table(self) -> str:
        return self.model_class._meta.db_table

    def rows(self, conversation: Conversation | int) -> models.QuerySet:
        """This conversation's rows in the table."""
        ident = conversation if isinstance(conversation, int) else conversation.pk
        return self.model_class._default_manager.filter(**{self.lookup: ident})

    def content_columns(self) -> tuple[str, ...]:
        """The columns that hold conversation content: declared, else every text and JSON
        column and every free-text character column (not choices)."""
        if self.content:
            return self.content
        names = []
        for f in self.model_class._meta.concrete_fields:
            if isinstance(f, CONTENT_FIELDS) or (isinstance(f, models.CharField) and not f.choices):
                names.append(f.column)
        return tuple(names)

    @property
    def fenced(self) -> bool:
        """Tables whose rows the database fence guards (content tables a delete erases or
        compacts). The conversation row has a fence trigger of its own."""
        return self.kind == "table" and self.retention in (RetentionClass.ERASE, RetentionClass.COMPACT) \
            and not self.tombstone

    @property
    def acts(self) -> bool:
        """Whether a delete changes this store (and so has an erasure step for it)."""
        return self.retention in ACTING and self.kind != "external"

    # Files -------------------------------------------------------------------------------

    def paths(self, home: EngineHome, conversation: Conversation) -> list[Path]:
        """Where this conversation's files are: its own folder, or the shared file it has rows in."""
        target = getattr(home, self.locator)
        return [target] if self.shared_file else [target(conversation.storage_key)]


def table(model: str, label, retention: RetentionClass, on_delete, **extra) -> Store:
    return Store(key=model, kind="table", label=label, retention=retention, on_delete=on_delete, model=model,
                 **extra)


def files(key: str, pattern: str, label, retention: RetentionClass, on_delete, **extra) -> Store:
    return Store(key=key, kind="file", label=label, retention=retention, on_delete=on_delete, pattern=pattern,
                 **extra)


E, C = RetentionClass.ERASE, RetentionClass.COMPACT
FINGERPRINT_DAYS = 7  # the erasure check's fingerprints, at the latest (see ErasureFingerprint)
FINGERPRINTS_STORE = "lifecycle.ErasureFingerprint"
FACTS_KEPT = _("Content-free; kept for the declared period after the delete, then expired.")

STORES: tuple[Store, ...] = (
    table("lifecycle.Conversation", _("Conversation record"), E,
          _("Title erased; the identity row stays as a content-free tombstone."),
          lookup="id", content=("title", "search_title"), tombstone=True),  # the title and its search fold
    table("lifecycle.Turn", _("Turns"), E, _("Gone.")),
    table("lifecycle.Item", _("Messages and tool calls"), E, _("Gone."), sized_by=(("payload", "payload_bytes"),)),
    files("events", "threads/<thread>/", _("Event log"), E, _("Gone."), locator="thread_dir"),
    table("lifecycle.Goal", _("Goals"), E, _("Gone.")),
    table("lifecycle.MailEnvelope", _("Mail envelopes"), E, _("Gone.")),
    table("lifecycle.SessionDocument", _("Saved session documents"), E, _("Gone.")),
    table("lifecycle.BranchJournalEntry", _("Branch journal"), E, _("Gone.")),
    table("lifecycle.Checkpoint", _("Checkpoints"), E, _("Gone.")),
    table("lifecycle.RecoveryMaterial", _("Pre-import archives and recovery material"), E, _("Gone.")),
    files("approval_receipts", "sessions/<thread>/", _("Approval receipt log and recovery files"), E,
          _("Gone."), locator="session_dir"),
    files("artifacts", "artifacts/<thread>/", _("Large outputs and tool artifacts"), E, _("Gone."),
          locator="artifacts_dir"),
    table("lifecycle.RuntimeClaim", _("Runtime claims (approvals, input, jobs)"), E, _("Gone.")),
    table("lifecycle.ProcessLease", _("Process lease"), E, _("Gone.")),
    table("lifecycle.OperationBinding", _("Turn-operation bindings"), C,
          _("Compacted to operation id, target id, timestamp and outcome."), content=("request",)),
    table("lifecycle.HistoryReceipt", _("History-operation receipts"), C,
          _("Compacted to operation id, target id, timestamp and outcome."), content=("detail",)),
    files("subagents", "state/subagents.v1.json", _("Settled subagent rows"), C,
          _("This conversation's settled rows are removed under the fleet lock; other rows stay."),
          locator="fleet_path", shared_file=True),
    files("legacy_subagents", "legacy-state/subagents.v1.json", _("Legacy subagent rows"), C,
          _("Rows attributed to this conversation are removed; rows of unknown origin make delete unavailable."),
          locator="legacy_fleet_path", shared_file=True),
    table("lifecycle.Export", _("Exports you saved"), RetentionClass.RETAIN_DETACH,
          _("Files are kept; their link to the conversation is cut.")),
    table("lifecycle.SharedLink", _("Shared links and published copies"), RetentionClass.SHARED,
          _("Revoked where the publisher supports it; otherwise the shared copy remains.")),
    table("lifecycle.WorkspaceFile", _("Workspace files the agent wrote"), RetentionClass.RETAIN,
          _("Untouched.")),
    table("lifecycle.MemoryEntry", _("Project and learned memory"), RetentionClass.RETAIN,
          _("Untouched unless removed separately.")),
    table("lifecycle.UsageFact", _("Usage and metering"), RetentionClass.RETAIN_FACTS, FACTS_KEPT,
          period="usage_days"),
    table("lifecycle.BillingFact", _("Billing"), RetentionClass.RETAIN_FACTS, FACTS_KEPT,
          period="billing_days"),
    table("lifecycle.AuditFact", _("Audit"), RetentionClass.RETAIN_FACTS, FACTS_KEPT, period="audit_days"),
    table("lifecycle.DeleteOperation", _("Delete operation and erasure receipt"), RetentionClass.RETAIN_FACTS,
          _("Content-free (operation id, target, time, outcome, records and bytes per store, and who asked "
            "until the audit period after the request runs out); kept so a retry gets the same answer.")),
    table(FINGERPRINTS_STORE, _("Erasure check fingerprints"), RetentionClass.RETAIN_FACTS,
          _("Keyed digests of short samples of the erased content, made when the delete starts, to find any "
            "copy left in the files: removed once a clean physical check is recorded, and a week after the "
            "delete at the latest. Short, guessable content could be confirmed against them meanwhile."),
          days=FINGERPRINT_DAYS),
    Store(key="provider", kind="external", label=_("Provider-retained inputs"),
          retention=RetentionClass.OUT_OF_SCOPE,
          on_delete=_("Provider retention follows provider terms.")),
)


def stores_by_model() -> dict[str, Store]:
    return {s.model.lower(): s for s in STORES if s.kind == "table"}


def store(key: str) -> Store:
    for s in STORES:
        if s.key == key:
            return s
    raise KeyError(key)


def fenced_tables() -> list[Store]:
    return [s for s in STORES if s.fenced]


def content_tables() -> list[str]:
    """Every table a delete erases or compacts: each can hold a conversation's bytes in rows
    removed or rewritten before or by its delete (Close releasing the process lease, an item's
    update, the delete itself), which PostgreSQL keeps in the table's files until the table is
    rewritten. A delete is physically erased only once all of them have been."""
    return sorted({s.db_table for s in STORES if s.kind == "table"
                   and s.retention in (RetentionClass.ERASE, RetentionClass.COMPACT)})


def erasure_order() -> list[Store]:
    """The stores a delete changes, in the order it changes them.

    Registry order, except that a table is erased before any table it points at with a
    SET_NULL key (Django would otherwise rewrite the pointing rows, which the fence refuses),
    and the conversation record (the tombstone) comes last.
    """
    acting = [s for s in STORES if s.acts and not s.tombstone]
    tables = {s.model_class: s for s in acting if s.kind == "table"}

    def level(s: Store, seen: frozenset[str] = frozenset()) -> int:
        if s.kind != "table" or s.key in seen:
            return 0
        pointing = [tables[f.model] for f in _set_null_references(s.model_class) if f.model in tables]
        return 1 + max(level(p, seen | {s.key}) for p in pointing) if pointing else 0

    ordered = sorted(enumerate(acting), key=lambda pair: (level(pair[1]), pair[0]))
    return [s for _i, s in ordered] + [s for s in STORES if s.tombstone]


def _set_null_references(model: type[models.Model]):
    """Fields of other models that point at `model` with on_delete=SET_NULL."""
    for rel in model._meta.related_objects:
        if rel.on_delete is models.SET_NULL:
            yield rel.field


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
