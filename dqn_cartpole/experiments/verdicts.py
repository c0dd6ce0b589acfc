"""`compare`'s verdicts: whether each group is better than the first, on which measure, with what probability.

The probability of improvement (rliable; Agarwal et al., NeurIPS 2021) is the chance that a run of one group does
better than a run of the other, ties counting half, with its 95% bootstrap CI. A group is better when the whole CI
lies above 0.5 (the other when it lies below); a CI that holds 0.5 cannot tell the groups apart with these seeds.
Two measures, in this order:
- the final policy's score over fresh greedy episodes (higher is better), the strongest evidence of what a run ends
  with (`compare_table.final_score`);
- the env steps to a confirmed solve (fewer is better), a run that checked and never solved counting as never.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from dqn_cartpole.experiments import stats
from dqn_cartpole.experiments.compare_table import final_scores


@dataclass(frozen=True)
class Measure:
    """A measure the verdicts compare groups on: its name, each run's value (higher is better), its sense."""

    name: str
    values: Callable[[object], list]  # a Group -> the values of its runs that have one, higher is better
    better: str  # what a better run does, in words


def _final_policy(group) -> list:
    return [s.score for s in final_scores(group.runs)]


def _env_steps(group) -> list:
    """Minus the env steps to the solve of each run that checked for one (-inf: it never solved), so higher is
    better, as the probability of improvement counts it; only the order counts there."""
    return [-float(r.get("solved_env_steps")) if r.solved and r.get("solved_env_steps") is not None else -math.inf
            for r in group.runs if r.solve_checked]


MEASURES = (Measure("final policy score", _final_policy, "scores higher"),
            Measure("env steps to solve", _env_steps, "solves in fewer env steps"))


@dataclass(frozen=True)
class Verdict:
    """`group` against `base` (the first group) on one measure: P(a run of group does better than one of base)."""

    group: str
    base: str
    measure: Measure
    probability: stats.Estimate
    seeds: tuple  # (runs of group, runs of base) with a value of the measure
    tie: bool  # every run of both has the same value: nothing to tell apart

    @property
    def winner(self) -> Optional[str]:
        """The better group's label, or None when the CI holds 0.5."""
        p = self.probability
        if p.empty or self.tie:
            return None
        return self.group if p.low > 0.5 else self.base if p.high < 0.5 else None

    def words(self) -> str:
        """`rainbow-5 scores higher: P = 0.84 [0.60, 1.00]`, or `cannot tell with 5 seeds each (P = ...)`."""
        p = self.probability
        if p.empty:
            return f"{self.measure.name}: no runs to compare"
        if self.tie:
            return f"{self.measure.name}: no difference (every run of both has the same value)"
        if self.winner is None:
            each = f"{self.seeds[0]} seeds each" if self.seeds[0] == self.seeds[1] else \
                f"{self.seeds[0]} and {self.seeds[1]} seeds"
            shown = _p(p.value, p.low, p.high)
            return f"{self.measure.name}: cannot tell with {each} (P({self.group} better) = {shown})"
        flip = self.winner == self.base  # say the winner's own probability of improvement
        shown = _p(1 - p.value, 1 - p.high, 1 - p.low) if flip else _p(p.value, p.low, p.high)
        return f"{self.measure.name}: {self.winner} is better (P = {shown} that its run {self.measure.better})"


def _p(value: float, low: float, high: float) -> str:
    return f"{value:.2f} [{low:.2f}, {high:.2f}]"


@dataclass(frozen=True)
class PairVerdict:
    """Every measure's verdict for one group against the first: printed as one line."""

    group: str
    base: str
    measures: tuple

    def line(self) -> str:
        return f"{self.group} vs {self.base}: " + "; ".join(v.words() for v in self.measures)


def verdict(group, base, measure: Measure) -> Verdict:
    x, y = measure.values(group), measure.values(base)
    tie = bool(x) and bool(y) and len(set(x) | set(y)) == 1
    probability = stats.Estimate(0.5, 0.5, 0.5, min(len(x), len(y))) if tie else stats.improvement(x, y)
    return Verdict(group.label, base.label, measure, probability, (len(x), len(y)), tie)


def against_first(groups: Sequence) -> list[PairVerdict]:
    """Each group after the first against the first, on every measure."""
    return [PairVerdict(g.label, groups[0].label, tuple(verdict(g, groups[0], m) for m in MEASURES))
            for g in groups[1:]]

