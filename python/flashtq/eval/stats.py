"""Confidence intervals across windows (Student's t; the windows are few)."""
from __future__ import annotations

import math

# Two-sided 95 % quantiles of Student's t by degrees of freedom (1..30); 1.96 beyond.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


def relative_change_ci(deltas: list[float]) -> tuple[float, float, float]:
    """Perplexity ratio - 1 from per-window differences of mean NLL (config - exact): the point estimate
    exp(mean) - 1 and a 95 % interval exp(mean -+ t * se) - 1 (NaN bounds with one window)."""
    n = len(deltas)
    mean = sum(deltas) / n
    if n < 2:
        return math.exp(mean) - 1, float("nan"), float("nan")
    sd = math.sqrt(sum((d - mean) ** 2 for d in deltas) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return math.exp(mean) - 1, math.exp(mean - half) - 1, math.exp(mean + half) - 1
