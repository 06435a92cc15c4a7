from __future__ import annotations

from django import template

from lifecycle.engine_health import EngineProblem, fleet_health
from lifecycle.enginefs import EngineHome

register = template.Library()


@register.simple_tag
def engine_fleet_health() -> list[EngineProblem]:
    """`{% engine_fleet_health as problems %}`: the fleet files that cannot be read."""
    return fleet_health(EngineHome())
