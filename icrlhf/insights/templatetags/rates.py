import math

from django import template

from icrlhf.insights.charts import percent as _percent

register = template.Library()


@register.filter
def percent(value: float) -> str:
    """0.423 → "42%"."""
    return _percent(value)


@register.filter
def percent_exact(value: float | None) -> str:
    """A lower bound to one decimal, rounded down (0.94996 → "94.9%"): compared with a target,
    it is never rounded up to it. "–" where there is none (a curve kept before bounds were)."""
    if not isinstance(value, int | float):
        return "–"
    return f"{math.floor(value * 1000 + 1e-9) / 10:.1f}%"


@register.filter
def percent_ceil(value: float | None) -> str:
    """An upper bound to one decimal, rounded up (0.8131 → "81.4%")."""
    if not isinstance(value, int | float):
        return "–"
    return f"{math.ceil(value * 1000 - 1e-9) / 10:.1f}%"


@register.filter
def signed_points(value: float) -> str:
    """A difference of two rates in percentage points: 0.12 → "+12 pts"."""
    return f"{value * 100:+.0f} pts"
