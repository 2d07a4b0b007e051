from django import template

from icrlhf.insights.charts import percent as _percent

register = template.Library()


@register.filter
def percent(value: float) -> str:
    """0.423 → "42%"."""
    return _percent(value)


@register.filter
def signed_points(value: float) -> str:
    """A difference of two rates in percentage points: 0.12 → "+12 pts"."""
    return f"{value * 100:+.0f} pts"
