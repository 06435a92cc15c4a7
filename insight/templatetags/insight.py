"""`{% storage_insight as insight %}`: the last measurement's figures, read from the snapshot
tables (never measured here: pages do no heavy work)."""

from __future__ import annotations

from typing import Any

from django import template
from django.core.cache import cache
from django.template.loader import render_to_string
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import get_language

from console.auth import is_admin
from insight import chart, figures
from insight.models import DailySize, Measurement
from lifecycle.models import ToolKind

register = template.Library()


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
    measurement = figures.measurement()
    insight: dict[str, Any] = {
        "measurement": measurement,
        "can_measure": request is not None and is_admin(request.user),
    }
    if measurement.measured_at is None:
        return insight
    insight.update(figures.lists(), chart_html=_chart_html(measurement))
    labels = dict(ToolKind.choices)
    insight["tool_kinds"] = [figures.Row(labels.get(row.name, row.name), row.size) for row in insight["tool_kinds"]]
    return insight
