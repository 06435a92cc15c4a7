"""Size over time as coordinates for a server-rendered SVG line chart (no script)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date

from django.utils.translation import gettext_lazy as _

from insight.models import DailySize

WIDTH, HEIGHT = 640, 260
LEFT, RIGHT, TOP, BOTTOM = 8, 8, 12, 12

SERIES = (
    ("database_bytes", _("Database file"), "db"),
    ("engine_bytes", _("Engine folder"), "engine"),
    ("payload_bytes", _("Tool details"), "payload"),
)


@dataclass
class Point:
    x: float
    y: float
    day: date
    value: int

    @property
    def cx(self) -> str:
        return f"{self.x:.1f}"

    @property
    def cy(self) -> str:
        return f"{self.y:.1f}"


@dataclass
class Series:
    key: str
    label: str
    css: str
    points: list[Point] = field(default_factory=list)

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


def build(days: list[DailySize]) -> Chart:
    """One point per day and series; x spreads the days evenly, y runs from 0 to the peak."""
    top = max((getattr(d, key) for d in days for key, _label, _css in SERIES), default=0) or 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    series = []
    for key, label, css in SERIES:
        s = Series(key, str(label), css)
        for i, d in enumerate(days):
            x = LEFT + (plot_w / 2 if len(days) == 1 else plot_w * i / (len(days) - 1))
            value = getattr(d, key)
            s.points.append(Point(x, TOP + plot_h * (1 - value / top), d.day, value))
        series.append(s)
    return Chart(days, series, top)
