"""Rates measured on samples: their 95% intervals, and whether two of them differ."""

import math


def wilson(successes: int, total: int, z: float = 1.96) -> tuple[float, float]:
    if total == 0:
        return (0.0, 0.0)
    p = successes / total
    centre = (p + z * z / (2 * total)) / (1 + z * z / total)
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / (1 + z * z / total)
    return (max(0.0, centre - half), min(1.0, centre + half))


def two_proportion_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided p-value that two rates differ (pooled z-test)."""
    if n_a == 0 or n_b == 0:
        return 1.0
    pooled = (a + b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return 1.0 if a / n_a == b / n_b else 0.0
    z = abs(a / n_a - b / n_b) / se
    return math.erfc(z / math.sqrt(2))
