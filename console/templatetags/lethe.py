"""Template helpers: times shown in the viewer's zone (see console.viewer), operators' commands,
and stored names shown as they are (isolated, their invisible characters written out)."""

from __future__ import annotations

from datetime import datetime
from functools import cache

from django import template
from django.template.defaultfilters import date as format_date
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from console.shown import visible_format, written_out
from console.viewer import zone_choices

register = template.Library()


@cache
def _zone_options() -> str:
    # An option's value is its text when it has no value attribute: half the bytes, twice a page.
    return "".join(f"<option>{escape(z)}</option>" for z in zone_choices())


@register.simple_tag(takes_context=True)
def timezone_options(context) -> SafeString:
    """The time zone picker's options: "Automatic" (what the browser reports) and every zone,
    with the viewer's current choice selected. Built once; about 490 options."""
    name, chosen = context.get("timezone_name", "UTC"), context.get("timezone_chosen", False)
    automatic = format_html(
        '<option value=""{}>{}</option>',
        "" if chosen else mark_safe(" selected"),  # noqa: S308 (a constant)
        _("%(zone)s (automatic)") % {"zone": name} if not chosen else _("Automatic"),
    )
    options = _zone_options()
    if chosen:
        marker = f"<option>{escape(name)}</option>"
        if marker in options:
            options = options.replace(marker, f"<option selected>{escape(name)}</option>", 1)
        else:  # an alias the list leaves out, such as US/Eastern
            options = f"<option selected>{escape(name)}</option>" + options
    return mark_safe(automatic + options)  # noqa: S308 (escaped above)


@register.filter(expects_localtime=True)
def with_zone(value, fmt: str = "DATETIME_FORMAT") -> str:
    """An absolute time with its zone, e.g. "Nov. 30, 2026, 2:05 p.m. CET". The zone is the
    time's own (Django's "T" gives none inside the hour a clock change repeats, where it alone
    tells the hour's two moments apart: r87, "2:30 a.m." shown twice an hour apart)."""
    if not value:
        return ""
    zone = value.tzname() if isinstance(value, datetime) else None
    shown = format_date(value, fmt)
    return f"{shown} {zone}" if zone else shown


@register.simple_tag
def command(*words) -> SafeString:
    """An operator's command, `manage.py` and its words, to copy as it stands: one block that
    wraps only between words (a browser would otherwise break `--erase-residue` at its
    hyphens on a phone), and that page translators leave alone."""
    parts = format_html_join(" ", "<span>{}</span>", ((str(word),) for word in ("manage.py", *words)))
    return format_html('<code class="cmd" translate="no">{}</code>', parts)


@register.filter(expects_localtime=True)
def machine_time(value) -> str:
    """A time for `<time datetime="...">`: ISO 8601 to the second with its offset (Django's
    "c" writes microseconds, six digits, which HTML does not take: at most three, r119)."""
    if not value:
        return ""
    if isinstance(value, datetime):
        return value.isoformat(timespec="seconds")
    return value.isoformat()


@register.filter
def visible_controls(value) -> str:
    """A stored name with its invisible format characters written out ("[U+202E]"), so a title
    such as "Invoice <U+202E>FDP.exe" cannot show as "Invoice exe.PDF" (for text-only places:
    the page's <title>); a lone surrogate too (console.shown)."""
    return visible_format(value)


@register.filter
def isolated(value) -> SafeString:
    """A stored name (a conversation's or a tool call's title) as the page shows it: its invisible
    format characters written out, and isolated (<bdi>) so a right-to-left name does not reorder
    the words and quotes around it."""
    return format_html("<bdi>{}</bdi>", visible_controls(value))


@register.filter
def isolated_id(value) -> SafeString:
    """An id a runtime wrote (a subagent row's), isolated, with its control characters written
    out as well ("sa[U+0009]x"): a tab or a line break in it is not shown as a space, which
    would make it read as another row's (console.shown.written_out)."""
    return format_html("<bdi>{}</bdi>", written_out(value))
