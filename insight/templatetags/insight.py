"""`{% storage_insight as insight %}`: the last measurement's figures, read from the snapshot
tables (never measured here: pages do no heavy work)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import template
from django.core.cache import cache
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language

from console.auth import is_admin
from insight import chart
from insight.models import (
    ConversationSize,
    DailySize,
    Measurement,
    OwnerKind,
    OwnerSize,
    ToolKindSize,
)
from lifecycle.models import Account, Computer, Conversation, ConversationState, Scope, ToolKind

register = template.Library()
TOP = 20


@dataclass
class Row:
    name: Any
    size: Any


def _deleted_since() -> dict[tuple[str, int], list[ConversationSize]]:
    """(owner kind, owner id) -> the measured sizes of its conversations deleted since the
    measurement (one read for both kinds, and for the tool kinds' note)."""
    deleted = Conversation.objects.filter(state=ConversationState.DELETED)
    gone = {s.conversation_id: s for s in ConversationSize.objects.filter(conversation_id__in=deleted.values("pk"))}
    owned: dict[tuple[str, int], list[ConversationSize]] = {}
    rows = deleted.filter(pk__in=list(gone)).values_list("pk", "scope", "account_id", "computer_id")
    for pk, scope, account_id, computer_id in rows:
        owner = (OwnerKind.ACCOUNT, account_id) if scope == Scope.BOUND else (OwnerKind.COMPUTER, computer_id)
        owned.setdefault(owner, []).append(gone[pk])
    return owned


def _owners(kind: str, model, deleted: dict[tuple[str, int], list[ConversationSize]]) -> list[Row]:
    """The largest owners, without the conversations deleted since the measurement (r53: the
    conversation list dropped a deleted conversation at once, its owner's figures kept it)."""
    deleted = {owner_id: sizes for (owner_kind, owner_id), sizes in deleted.items() if owner_kind == kind}
    sizes = list(OwnerSize.objects.filter(kind=kind).order_by("-total_bytes", "owner_id")[:TOP + len(deleted)])
    for size in sizes:
        for gone in deleted.get(size.owner_id, ()):
            size.conversations = max(size.conversations - 1, 0)
            size.db_bytes = max(size.db_bytes - gone.db_bytes, 0)
            size.engine_bytes = max(size.engine_bytes - gone.engine_bytes, 0)
            size.total_bytes = max(size.total_bytes - gone.total_bytes, 0)
    sizes = sorted((s for s in sizes if s.conversations), key=lambda s: (-s.total_bytes, s.owner_id))[:TOP]
    names = model.objects.in_bulk([s.owner_id for s in sizes])
    return [Row(names[s.owner_id], s) for s in sizes if s.owner_id in names]


def _conversations() -> list[Row]:
    shown = Conversation.objects.exclude(state=ConversationState.DELETED).values("pk")
    sizes = list(ConversationSize.objects.filter(conversation_id__in=shown, total_bytes__gt=0)
                 .order_by("-total_bytes", "conversation_id")[:TOP])
    found = Conversation.objects.select_related("account", "computer").in_bulk([s.conversation_id for s in sizes])
    return [Row(found[s.conversation_id], s) for s in sizes if s.conversation_id in found]


def _chart_html(measurement: Measurement) -> SafeString:
    """The chart and its table, rendered once per measurement and language: 400 days of
    markers and table rows cost tens of milliseconds, and they change only when a
    measurement writes new days."""
    key = f"insight-chart:{measurement.measured_at.isoformat()}:{get_language()}"
    html = cache.get(key)
    if html is None:
        html = render_to_string("insight/_size_chart.html", {"c": chart.build(list(DailySize.objects.order_by("day")))})
        cache.set(key, html, 24 * 3600)
    return mark_safe(html)  # noqa: S308 (our own template's output)


@register.simple_tag(takes_context=True)
def storage_insight(context) -> dict[str, Any]:
    request = context.get("request")
    measurement = Measurement.objects.filter(id=1).first() or Measurement(id=1)
    labels = dict(ToolKind.choices)
    insight: dict[str, Any] = {
        "measurement": measurement,
        "can_measure": request is not None and is_admin(request.user),
    }
    if measurement.measured_at is None:
        return insight
    deleted = _deleted_since()
    insight.update(
        conversations=_conversations(),
        accounts=_owners(OwnerKind.ACCOUNT, Account, deleted),
        computers=_owners(OwnerKind.COMPUTER, Computer, deleted),
        tool_kinds=[Row(labels.get(k.tool_kind, k.tool_kind), k)
                    for k in ToolKindSize.objects.order_by("-payload_bytes", "tool_kind")],
        # The tool kinds' figures are the whole measurement's (no per-conversation split is
        # kept): they do not follow a delete made since, and the list says so (r55)
        deleted_since=sum(len(sizes) for sizes in deleted.values()),
        chart_html=_chart_html(measurement),
    )
    return insight
