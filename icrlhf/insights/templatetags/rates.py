from django import template

from icrlhf.insights.charts import percent as _percent

register = template.Library()


@register.filter
def percent(value: float) -> str:
    """0.423 → "42%"."""
    return _percent(value)


@register.filter
def percent_exact(value: float | None) -> str:
    """0.9464 → "94.6%": a bound compared with a target, never rounded up to it. "–" where
    there is none (a curve fitted before bounds were kept)."""
    return f"{value * 100:.1f}%" if isinstance(value, int | float) else "–"


@register.filter
def signed_points(value: float) -> str:
    """A difference of two rates in percentage points: 0.12 → "+12 pts"."""
    return f"{value * 100:+.0f} pts"
