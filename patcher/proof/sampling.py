"""The statistics behind the ``sampling`` check: are two servers' sampled tokens one distribution?

Issue 17: at temperature 1.0 with top-p / top-k truncation, the tokens a dynspec server samples must
be indistinguishable from a plain server's. Each server's draws are counted per token id, and the two
counts are put to a G-test of homogeneity (the likelihood-ratio form of the chi-square test on the
2 x k table); the check passes where p > ``ALPHA``. A negative control (a server sampling at another
temperature) must fail the same test, or it has no power at the sample size used.

Standard library only: the chi-square tail comes from the regularized upper incomplete gamma
function (series / Lentz continued fraction, as in Numerical Recipes' ``gammq``), so the proof runs
where neither scipy nor numpy is installed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ALPHA = 0.01  # the threshold: distinguishable at p <= 0.01
MIN_EXPECTED = 5.0  # the usual rule for the chi-square approximation to hold in every cell

_EPS = 1e-15  # stop when the last series term / fraction step changes the result by less than this
_TINY = 1e-300  # keeps Lentz's denominators off zero
_MAX_ITERATIONS = 100_000  # series and fraction both need O(sqrt(a)) terms; this is far beyond


def _gamma_prefactor(a: float, x: float) -> float:
    """x^a e^-x / Gamma(a), in logs so that large a and x neither overflow nor underflow early."""
    return math.exp(a * math.log(x) - x - math.lgamma(a))


def _lower_series(a: float, x: float) -> float:
    """Regularized lower gamma P(a, x) by its power series; converges quickly for x < a + 1."""
    term = 1.0 / a
    total = term
    n = a
    for _ in range(_MAX_ITERATIONS):
        n += 1.0
        term *= x / n
        total += term
        if abs(term) < abs(total) * _EPS:
            return total * _gamma_prefactor(a, x)
    raise ArithmeticError(f"gamma series did not converge (a={a}, x={x})")


def _upper_fraction(a: float, x: float) -> float:
    """Regularized upper gamma Q(a, x) by its continued fraction (modified Lentz), for x >= a + 1.

    Computing Q directly there, rather than 1 - P, keeps small tail probabilities accurate.
    """
    b = x + 1.0 - a
    c = 1.0 / _TINY
    d = 1.0 / b
    h = d
    for i in range(1, _MAX_ITERATIONS):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < _TINY:
            d = _TINY
        c = b + an / c
        if abs(c) < _TINY:
            c = _TINY
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            return h * _gamma_prefactor(a, x)
    raise ArithmeticError(f"gamma continued fraction did not converge (a={a}, x={x})")


def chi2_sf(x: float, dof: int) -> float:
    """P(X >= x) for X chi-square with ``dof`` degrees of freedom: Q(dof / 2, x / 2)."""
    if dof < 1:
        raise ValueError(f"a chi-square distribution needs at least 1 degree of freedom, not {dof}")
    if math.isnan(x):
        raise ValueError("chi-square statistic is NaN")
    if x <= 0.0:
        return 1.0
    if math.isinf(x):
        return 0.0
    a, half = dof / 2.0, x / 2.0
    if half < a + 1.0:
        # Here Q is not small (x is below about the mean), so 1 - P loses nothing that matters.
        return max(0.0, 1.0 - _lower_series(a, half))
    return _upper_fraction(a, half)


@dataclass(frozen=True)
class Homogeneity:
    """A G-test of homogeneity of two samples of categorical outcomes (token id -> count)."""

    statistic: float  # G = 2 sum O ln(O / E) over the 2 x k table
    dof: int  # k - 1; 0 where there was nothing to distinguish
    p_value: float
    samples: tuple[int, int]  # the two sample sizes
    categories: int  # k, after pooling
    pooled: int  # rare categories pooled into one "other" cell

    def entry(self) -> dict[str, Any]:
        """The report's form of the result (JSON-ready, rounded for reading)."""
        return {
            "test": "G",
            "statistic": round(self.statistic, 3),
            "dof": self.dof,
            "p_value": float(f"{self.p_value:.6g}"),
            "samples": list(self.samples),
            "categories": self.categories,
            "pooled": self.pooled,
        }


def _size(counts: Mapping[int, int], name: str) -> int:
    for token, count in counts.items():
        if count < 0:
            raise ValueError(f"{name}: token {token} has a negative count ({count})")
    total = sum(counts.values())
    if total == 0:
        raise ValueError(f"{name} is empty: no draws to compare")
    return total


def homogeneity(a: Mapping[int, int], b: Mapping[int, int], min_expected: float = MIN_EXPECTED) -> Homogeneity:
    """G-test that samples ``a`` and ``b`` (token id -> count) come from one distribution.

    Categories expected fewer than ``min_expected`` times in either sample are pooled into one
    "other" cell, where the chi-square approximation to G would not hold; if that cell is itself
    still below ``min_expected``, it joins the smallest remaining category.
    """
    n_a = _size(a, "sample a (the first)")
    n_b = _size(b, "sample b (the second)")
    n = n_a + n_b
    smaller = min(n_a, n_b)  # a category's expected count is lowest in the smaller sample

    # Sorted so that a result never depends on the mappings' order.
    cells = sorted(
        (token, a.get(token, 0), b.get(token, 0)) for token in set(a) | set(b) if a.get(token, 0) + b.get(token, 0) > 0
    )
    kept: list[tuple[int, int]] = []
    other_a = other_b = pooled = 0
    for _, count_a, count_b in cells:
        if (count_a + count_b) * smaller / n < min_expected:
            other_a += count_a
            other_b += count_b
            pooled += 1
        else:
            kept.append((count_a, count_b))
    if pooled:
        if (other_a + other_b) * smaller / n >= min_expected or not kept:
            kept.append((other_a, other_b))
        else:
            # Still too rare to stand alone: fold it into the smallest category (first one on ties).
            i = min(range(len(kept)), key=lambda j: kept[j][0] + kept[j][1])
            kept[i] = (kept[i][0] + other_a, kept[i][1] + other_b)

    k = len(kept)
    if k < 2:  # one cell: both samples put everything in it, nothing to distinguish
        return Homogeneity(0.0, 0, 1.0, (n_a, n_b), k, pooled)

    terms: list[float] = []
    for count_a, count_b in kept:
        total = count_a + count_b
        for observed, size in ((count_a, n_a), (count_b, n_b)):
            if observed:  # O ln(O / E) -> 0 as O -> 0
                terms.append(observed * math.log(observed * n / (size * total)))
    g = max(0.0, 2.0 * math.fsum(terms))  # identical proportions can round to -1e-15
    dof = k - 1
    return Homogeneity(g, dof, chi2_sf(g, dof), (n_a, n_b), k, pooled)


def indistinguishable(result: Homogeneity, alpha: float = ALPHA) -> bool:
    """Whether the test could not tell the two samples apart at level ``alpha`` (p > alpha)."""
    return result.p_value > alpha
