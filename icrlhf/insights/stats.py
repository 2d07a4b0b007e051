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
    """Two-sided p-value that two rates differ: the pooled z-test, or Fisher's exact test
    when a cell of the 2×2 table is expected to hold fewer than 5 (where z is unreliable)."""
    if n_a == 0 or n_b == 0:
        return 1.0
    pooled = (a + b) / (n_a + n_b)
    expected = (n * share for n in (n_a, n_b) for share in (pooled, 1 - pooled))
    if min(expected) < 5:
        return fisher_exact_p(a, n_a, b, n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = abs(a / n_a - b / n_b) / se  # se > 0: both kinds of outcome are expected above
    return math.erfc(z / math.sqrt(2))


def fisher_exact_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided Fisher's exact test of a successes in n_a against b in n_b: the chance,
    with the margins fixed, of a table at most as likely as the one observed."""
    successes, total = a + b, n_a + n_b

    def chance(k: int) -> float:
        return math.comb(n_a, k) * math.comb(n_b, successes - k) / math.comb(total, successes)

    observed = chance(a)
    possible = range(max(0, successes - n_b), min(n_a, successes) + 1)
    return min(1.0, sum(p for k in possible if (p := chance(k)) <= observed * (1 + 1e-9)))
