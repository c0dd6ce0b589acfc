"""Across-seed statistics through rliable (Agarwal et al., NeurIPS 2021): point estimates with 95% stratified
bootstrap confidence intervals, performance profiles and the probability of improvement.

Scores are rliable's `(runs x tasks)` matrices with one task (the env). IQM is the interquartile mean (the mean of
the middle 50%, `metrics.aggregate_iqm`), which rliable recommends for few seeds: less noisy than the median, less
outlier-prone than the mean. Intervals are percentile bootstraps, which stay defined for the 2-5 seeds a sweep
has; every bootstrap starts from the same seed, so a table is the same every time it is drawn. rliable (and arch
under it) is imported on first use: it takes a second or two.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

CONFIDENCE = 0.95
# Bootstrap resamples of each estimate. A few seeds have few distinct resamples (5 seeds: 126), so the percentiles
# settle early: on the default and Rainbow sweeps' 5 seeds, 1,000 gave the 5,000's intervals to 0.001 (the
# probability of improvement) and exactly (the IQM) at a fifth of the CPU (docs/experiments.md).
REPS = 1000
SEED = 0
AGGREGATES = {"iqm": "aggregate_iqm", "mean": "aggregate_mean"}  # rliable.metrics'


@functools.lru_cache(maxsize=None)
def rliable() -> tuple:
    """(rliable.library, rliable.metrics), imported once, without the deprecation noise of their imports."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from rliable import library, metrics  # pylint: disable=import-outside-toplevel
    return library, metrics


def aggregate(name: str) -> Callable[[np.ndarray], float]:
    """rliable's aggregate `name` (iqm, mean) of a (runs x tasks) score matrix; median: the median of the runs'
    scores (rliable's aggregate_median is the median over tasks of each task's mean: with one task, the mean)."""
    return np.median if name == "median" else getattr(rliable()[1], AGGREGATES[name])


def per_point(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The aggregate `name` of each point of (runs x 1 x points) curves, as a vector: what `aggregate(name)` gives
    for each point's (runs x 1) column, in one numpy call (a resample costs microseconds, not a loop of calls)."""
    def iqm(curves: np.ndarray) -> np.ndarray:  # rliable's aggregate_iqm is trim_mean(.., 0.25, axis=None)
        return scipy_stats.trim_mean(curves[:, 0, :], proportiontocut=0.25, axis=0)

    return {"iqm": iqm, "mean": lambda curves: np.mean(curves[:, 0, :], axis=0),
            "median": lambda curves: np.median(curves[:, 0, :], axis=0)}[name]


@dataclass(frozen=True)
class Estimate:
    """A statistic over `n` values with its confidence interval (NaN when there are no values)."""

    value: float
    low: float
    high: float
    n: int

    @property
    def empty(self) -> bool:
        return self.n == 0 or math.isnan(self.value)

    def format(self, digits: int = 0) -> str:
        """`498.8 [480.1, 500.0]`, thousands separated; one value has no interval; no values: `-`."""
        if self.empty:
            return "-"
        text = f"{self.value:,.{digits}f}"
        return text if self.n < 2 else f"{text} [{self.low:,.{digits}f}, {self.high:,.{digits}f}]"


def _interval(scores: object, func: Callable, reps: int = REPS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(point, low, high) of `func` over `scores` (an array, or a list of arrays for a paired statistic) through
    rliable's stratified bootstrap, seeded.

    rliable 1.2's bootstraps draw their resamples from NumPy's global generator (`np.random.choice` in
    `update_indices`), whatever `random_state` says, so the global one is seeded here and put back after."""
    library, _ = rliable()
    saved = np.random.get_state()
    np.random.seed(SEED)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # arch warns about degenerate (constant) resamples
            points, intervals = library.get_interval_estimates({"x": scores}, func, reps=reps,
                                                               confidence_interval_size=CONFIDENCE)
    finally:
        np.random.set_state(saved)
    return np.asarray(points["x"], dtype=float), intervals["x"][0], intervals["x"][1]


def estimate(values: Sequence[float], statistic: str = "iqm") -> Estimate:
    """`statistic` (iqm, mean, median) of `values` with its 95% bootstrap interval; one value, or values that are
    all the same, has none."""
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    func = aggregate(statistic)
    if data.size < 2 or np.all(data == data[0]):
        value = float(func(data[:, None]))
        return Estimate(value, value, value, int(data.size))
    point, low, high = _interval(data[:, None], lambda scores: np.array([func(scores)]))
    return Estimate(float(point), float(low[0]), float(high[0]), int(data.size))


def band(curves: np.ndarray, statistic: str = "iqm") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of `curves` (runs x points): (the statistic, the low and the high end of its 95% bootstrap
    interval) across runs. One run has a zero-width band."""
    func = per_point(statistic)
    if curves.shape[0] < 2:
        line = func(curves[:, None, :])
        return line, line, line
    return _interval(curves[:, None, :], func)


def improvement(x: Sequence[float], y: Sequence[float]) -> Estimate:
    """The probability that a run of `x` scores higher than a run of `y` (ties count half: 0.5 is no
    difference), rliable's `probability_of_improvement`, with its 95% interval (each side resampled on its own).
    Scores may be +-inf (a run that never solved, on a measure of how soon)."""
    a, b = np.asarray(list(x), dtype=float), np.asarray(list(y), dtype=float)
    if a.size == 0 or b.size == 0:
        return Estimate(math.nan, math.nan, math.nan, 0)
    func = rliable()[1].probability_of_improvement
    point, low, high = _interval([a[:, None], b[:, None]], func)
    return Estimate(float(point), float(low), float(high), int(min(a.size, b.size)))


def score_distribution(scores: np.ndarray, taus: np.ndarray) -> np.ndarray:
    """The fraction of (runs x tasks) `scores` above each tau: rliable's `score_distributions` (the profile
    create_performance_profile bootstraps) in one numpy call instead of one call per tau."""
    return np.mean(scores[..., None] > np.asarray(taus), axis=(0, 1))


def profiles(scores: dict[str, Sequence[float]], taus: np.ndarray) -> dict[str, tuple]:
    """Performance profiles: per label, (the fraction of its runs scoring above each tau, low, high) with 95%
    stratified bootstrap intervals, as rliable's `create_performance_profile` (which takes no seed) computes them."""
    found = {}
    for label, values in scores.items():
        data = np.asarray(list(values), dtype=float)[:, None]
        if data.size:
            found[label] = _interval(data, lambda s: score_distribution(s, taus))
    return found
