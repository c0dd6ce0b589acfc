"""Across-seed statistics with 95% bootstrap confidence intervals (scipy.stats.bootstrap).

IQM is the interquartile mean (the mean of the middle 50%, `scipy.stats.trim_mean(x, 0.25)`),
which rliable recommends for few seeds: less noisy than the median, less outlier-prone than the
mean. Intervals are percentile bootstraps, which stay defined for the 2-5 seeds a sweep has.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
N_RESAMPLES = 2000
SEED = 0  # fixed, so a table is the same every time it is drawn


def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Interquartile mean along `axis`."""
    return stats.trim_mean(values, 0.25, axis=axis)


mean, median = np.mean, np.median  # each statistic is called as f(values) or f(values, axis=...)
STATISTICS: dict[str, Callable] = {"iqm": iqm, "mean": mean, "median": median}


@dataclass(frozen=True)
class Estimate:
    """A statistic over `n` values with its confidence interval (NaN when there are no values)."""

    value: float
    low: float
    high: float
    n: int

    def format(self, digits: int = 0) -> str:
        if self.n == 0 or math.isnan(self.value):
            return "-"
        text = f"{self.value:.{digits}f}"
        return text if self.n < 2 else f"{text} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def estimate(values: Sequence[float], statistic: Callable = iqm) -> Estimate:
    """`statistic` of `values` with a 95% percentile-bootstrap interval; one value has no interval."""
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    value = float(statistic(data))
    if data.size < 2 or np.all(data == data[0]):
        return Estimate(value, value, value, int(data.size))
    low, high = band(data[:, None], statistic)
    return Estimate(value, float(low[0]), float(high[0]), int(data.size))


def band(curves: np.ndarray, statistic: Callable = iqm) -> tuple[np.ndarray, np.ndarray]:
    """Per column of `curves` (seeds x points): the 95% bootstrap interval of `statistic` across seeds.

    Columns where every seed has the same value have a zero-width interval.
    """
    if curves.shape[0] < 2:
        point = statistic(curves, axis=0)
        return point, point
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate (constant) columns: handled below
        result = stats.bootstrap((curves,), statistic, axis=0, confidence_level=CONFIDENCE,
                                 n_resamples=N_RESAMPLES, method="percentile", random_state=SEED, vectorized=True)
    point = statistic(curves, axis=0)
    low = np.where(np.isnan(result.confidence_interval.low), point, result.confidence_interval.low)
    high = np.where(np.isnan(result.confidence_interval.high), point, result.confidence_interval.high)
    return low, high
