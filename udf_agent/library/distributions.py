"""Student's t distribution, for the p-values of the library's tests (``ttest``).

Written here rather than taken from scipy: importing scipy makes numba import
``scipy.linalg`` when it first loads compiled code (it looks for BLAS), which
put ~0.15 s on every task's start-up, and scipy is ~110 MB installed.
"""

from __future__ import annotations

import math

# The continued fraction converges in a few dozen terms for the arguments a t-test
# gives; this bound only stops a runaway.
_MAX_TERMS = 10_000
_EPSILON = 1e-16
_TINY = 1e-300
# From here on, Stirling's series (three terms) is exact to double precision.
_STIRLING_FROM = 100.0


def t_two_sided_pvalue(t: float, dof: float) -> float:
    """P(|T| >= |t|) for Student's t with ``dof`` (any real > 0) degrees of freedom.

    It is the regularized incomplete beta function I_x(dof/2, 1/2) at x = dof / (dof + t²).
    """
    if not dof > 0:
        raise ValueError(f"degrees of freedom must be positive, got {dof}")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    # Both x and 1 - x from t directly: with a small t and many degrees of freedom, x is
    # within 1e-9 of 1 and 1 - x computed from it would keep only a few digits.
    square = t * t
    return regularized_beta(dof / (dof + square), dof / 2, 0.5, square / (dof + square))


def regularized_beta(x: float, a: float, b: float, complement: float | None = None) -> float:
    """I_x(a, b), by its continued fraction (Lentz's method), on the side of x where it
    converges fast; small results keep their relative precision. ``complement``: 1 - x,
    when the caller knows it more precisely than 1 - x gives it."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    y = 1.0 - x if complement is None else complement
    log_x = math.log(x) if complement is None else math.log1p(-y)  # a precise y: x near 1 stays precise
    front = math.exp(_log_gamma_ratio(a, b) - math.lgamma(b) + a * log_x + b * math.log(y))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(x, a, b) / a
    return 1.0 - front * _beta_fraction(y, b, a) / b


def _log_gamma_ratio(a: float, b: float) -> float:
    """log(Γ(a + b) / Γ(a)). For large a the two log-gammas are huge and nearly equal
    (their difference lost ~1e-9 of the p-value at a million degrees of freedom), so
    their Stirling series are subtracted term by term instead."""
    if a < _STIRLING_FROM:
        return math.lgamma(a + b) - math.lgamma(a)
    s = a + b
    return (a - 0.5) * math.log1p(b / a) + b * math.log(s) - b - b / (12 * a * s) + (1 / a**3 - 1 / s**3) / 360


def _beta_fraction(x: float, a: float, b: float) -> float:
    def nonzero(value: float) -> float:
        return value if abs(value) > _TINY else _TINY

    c = 1.0
    d = 1.0 / nonzero(1.0 - (a + b) * x / (a + 1.0))
    result = d
    for m in range(1, _MAX_TERMS):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 / nonzero(1.0 + numerator * d)
            c = nonzero(1.0 + numerator / c)
            result *= d * c
        if abs(d * c - 1.0) < _EPSILON:
            return result
    raise ArithmeticError(f"the incomplete beta function did not converge for x={x}, a={a}, b={b}")
