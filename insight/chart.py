"""Size over time as coordinates for a server-rendered SVG line chart (no script)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from html import escape

from django.conf import settings
from django.template.defaultfilters import filesizeformat
from django.utils import formats
from django.utils.dateformat import format as format_date
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from insight.models import DailySize

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 8, 8, 12, 12

SERIES = (
    ("database_bytes", _("Database file"), "db"),
    ("engine_bytes", _("Engine folder"), "engine"),
    ("payload_bytes", _("Tool details"), "payload"),
)


class SizeFormat:
    """`filesizeformat`'s exact output with the locale looked up once, not per value (the
    figures table of 400 days formats 1,600 sizes; the filter alone took about 100 ms)."""

    UNITS = ((1 << 50, "%s PB"), (1 << 40, "%s TB"), (1 << 30, "%s GB"), (1 << 20, "%s MB"), (1 << 10, "%s KB"))

    def __init__(self) -> None:
        self.separator = formats.get_format("DECIMAL_SEPARATOR")
        self.units = [(size, gettext(template).replace(" ", "\xa0")) for size, template in self.UNITS]

    def __call__(self, value: int) -> str:
        if value < 1 << 10 or settings.USE_THOUSAND_SEPARATOR:
            return filesizeformat(value)
        for size, template in self.units:
            if value >= size:
                return template % f"{round(value / size, 1):.1f}".replace(".", self.separator)
        raise AssertionError("unreachable: sizes from 1 KB up match a unit")


TABLE_COLUMNS = (*(key for key, _label, _css in SERIES), "removable_bytes")


@dataclass
class Point:
    x: float
    y: float
    day: date
    value: int


@dataclass
class Series:
    key: str
    label: str
    css: str
    points: list[Point] = field(default_factory=list)

    @property
    def circles(self) -> SafeString:
        """One marker per day, built here: a template loop over 400 days x 3 series is slow."""
        return mark_safe("".join(  # noqa: S308 (numbers and ISO dates only)
            f'<circle cx="{p.x:.1f}" cy="{p.y:.1f}" r="3.5" data-day="{p.day.isoformat()}"/>' for p in self.points))

    @property
    def polyline(self) -> str:
        # Strings, not numbers: a template would localize a float's decimal point.
        return " ".join(f"{p.x:.1f},{p.y:.1f}" for p in self.points)


@dataclass
class Chart:
    days: list[DailySize]
    series: list[Series]
    top: int
    width: int = WIDTH
    height: int = HEIGHT

    # Coordinates as strings: a template would localize a number's decimal point.
    @property
    def baseline(self) -> str:
        return str(HEIGHT - BOTTOM)

    @property
    def ceiling(self) -> str:
        return str(TOP)

    @property
    def middle(self) -> str:
        return str((TOP + HEIGHT - BOTTOM) // 2)

    @property
    def view_box(self) -> str:
        return f"0 0 {WIDTH} {HEIGHT}"

    @property
    def half(self) -> int:
        return self.top // 2

    def table_rows(self) -> SafeString:
        """The figures table's body, in the viewer's locale (built here for speed, like the markers)."""
        size, day = SizeFormat(), formats.get_format("SHORT_DATE_FORMAT")
        rows = []
        for d in self.days:
            cells = "".join(f"<td>{escape(size(getattr(d, key)))}</td>" for key in TABLE_COLUMNS)
            rows.append(f'<tr><th scope="row">{escape(format_date(d.day, day))}</th>{cells}</tr>')
        return mark_safe("".join(rows))  # noqa: S308 (every value escaped above)


def build(days: list[DailySize]) -> Chart:
    """One point per measured day and series; x is the date (a gap of days without a
    measurement is as wide as those days), y runs from 0 to the peak."""
    top = max((getattr(d, key) for d in days for key, _label, _css in SERIES), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = (days[-1].day - days[0].day).days if days else 0
    series = []
    for key, label, css in SERIES:
        s = Series(key, str(label), css)
        for d in days:
            x = LEFT + (plot_w / 2 if not span else plot_w * (d.day - days[0].day).days / span)
            value = getattr(d, key)
            s.points.append(Point(x, TOP + plot_h * (1 - value / top), d.day, value))
        series.append(s)
    return Chart(days, series, top)
