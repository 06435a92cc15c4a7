"""Template access to the tool payload cleanup history (the Operations page's cleanup section)."""

from __future__ import annotations

from django import template

from retention.errors import said
from retention.models import ToolPayloadOperation

register = template.Library()

# The Operations page's badge styles, by operation state.
BADGE = {"queued": "pending", "running": "pending", "succeeded": "completed", "failed": "refused",
         "partial": "unavailable", "cancelled": "unavailable"}


@register.simple_tag
def cleanup_history(limit: int = 50) -> list[dict]:
    """The last operations (analysis, backup, cleanup, compaction), newest first, with who
    started each (None for the daily schedule), its badge style, its error in the reader's
    language and, for a backup made, whether its file is still in the backup folder (a stat)."""
    from retention.backups import names_in_folder, still_there

    names = names_in_folder()  # one listing for the page, not two stats a row
    rows = []
    for op in ToolPayloadOperation.objects.select_related("started_by")[:limit]:
        rows.append({
            "op": op,
            "badge": BADGE.get(op.state, "unavailable"),
            "by": None if op.by_schedule else op.starter,
            "when": op.started_at or op.created_at,
            "error": said(op.error_message),
            "backup_present": still_there(op.backup_name, names) if op.backup_name else None,
        })
    return rows
