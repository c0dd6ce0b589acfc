"""The population benchmark (scripts/benchmark_population.py): its tables from made-up summaries (fast, no benchmark
run), its refusals of bad input, and the bound on every command it runs (benchmark_common.run_timed's timeout)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))

SEEDS = list(range(8))


def summary(steps, rss=600.0, final=None, wall=None):
    return {"solved_env_steps": steps, "env_steps": steps or 30000, "peak_rss_mb": rss, "solved_wall_s": wall,
            "final_policy_return": final, "solve_return_target": 475.0, "evaluator_peak_rss_mb": 300.0,
            "renderer_peak_rss_mb": 200.0}


def found(population_steps, single_steps, finals=None):
    """What `measure_all` returns, for seeds 0-7: single runs of seeds 0-2 taking 10, 11, 12 s and 600 MB, a
    population of 30 s and 900 MB, its sweep 35 s, the sweep of ordinary runs 120 s."""
    def result(wall, runs, load=(1.0, 2.0)):
        return {"wall_s": wall, "runs": runs, "load": load}

    single = {s: summary(v) for s, v in zip(SEEDS, single_steps)}
    out = {"reference_before": {"rate": 150.0, "load": (1.0, 1.5)}, "reference_after": {"rate": 140.0, "load": (2, 3)},
           "single": [result(10.0 + s, {s: single[s]}) for s in range(3)],
           "population": result(30.0, {s: summary(v, rss=900.0, wall=5.0) for s, v in zip(SEEDS, population_steps)}),
           "sweep_population": result(35.0, {s: summary(v) for s, v in zip(SEEDS, population_steps)}),
           "sweep": result(120.0, single)}
    if finals is not None:
        out["fixed"] = result(60.0, {s: summary(1000, final=f) for s, f in zip(SEEDS, finals)})
    return out


ARGS = SimpleNamespace(iterations=6000, fixed_iterations=20000)


def met(lines, start):
    """The `met?` cell of the targets row that starts with `start`."""
    row = next(line for line in lines if line.startswith(f"| {start}"))
    return row.rstrip(" |").rsplit("| ", 1)[1]


def test_the_targets_from_the_measurements():
    """Ratios of the whole commands, the Mann-Whitney verdict, the solved counts, the memory, the held policies."""
    import benchmark_population as bench

    steps = [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000]
    lines = bench.tables(found(steps, list(reversed(steps)), finals=[500.0] * 7 + [300.0]), SEEDS, ARGS)
    assert "×2.73 (30.0 s against a median of 11.0 s)" in lines[2] and met(lines, "8 seeds as one") == "yes"
    assert "×4.00 (120.0 s against 30.0 s)" in lines[3] and met(lines, "`sweep --jobs 2`") == "yes"
    assert "p = 1.000" in lines[4] and met(lines, "the same learning") == "yes"
    assert "×1.50 (900 MB against a median of 600 MB" in lines[6] and met(lines, "peak RSS") == "yes"
    assert "| 7/8 |" in lines[7] and met(lines, "the held final policy") == "yes"
    assert "| 7 | 8,000 | 8,000 | 1,000 | - | 5.0 s | 300.0 (**< target**) |" in lines


def test_learning_that_differs_or_never_solves_misses_its_targets():
    """Population steps all above the single runs' are told apart (p < 0.05); a seed that never solved counts as
    unsolved and ranks last, not as a missing value."""
    import benchmark_population as bench

    population = [9000 + 100 * s for s in SEEDS[:-1]] + [None]
    lines = bench.tables(found(population, [1000 + 100 * s for s in SEEDS]), SEEDS, ARGS)
    assert met(lines, "the same learning") == "**no**"
    assert "population 7/8, single runs 8/8" in lines[5] and met(lines, "8/8 seeds solve") == "**no**"
    assert any(line.startswith("Env steps to the first confirmed solve") and line.count("never") == 1
               for line in lines)
    assert not any(line.startswith("| the held final policy") for line in lines)  # no --fixed-budget


@pytest.mark.parametrize("args, needle", [
    (("--seeds", "0,2,4"), "--seeds 0,2,4: a population needs at least 2 consecutive seeds"),
    (("--single-seeds", "4-1"), "--single-seeds 4-1: the range 4-1 is empty"),
    (("--reference", "/nonexistent/loop.py"), "--reference /nonexistent/loop.py: no such file"),
])
def test_bad_input_is_one_line_and_exit_status_2_before_anything_runs(args, needle):
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "benchmark.py"), "--population", *args],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {needle}"), result.stderr


def test_a_command_still_running_at_its_timeout_is_stopped():
    """benchmark_common.run_timed(timeout=...), which bounds every command the benchmark runs: past it, the process
    is stopped (Ctrl-C's signal) and waited for, and the benchmark ends with one line."""
    from benchmark_common import run_timed

    started = time.monotonic()
    with pytest.raises(SystemExit, match="still running after 1 s; stopped"):
        run_timed([sys.executable, "-c", "import time, os; print(os.getpid(), flush=True); time.sleep(60)"], 1)
    assert time.monotonic() - started < 30
    assert not [p for p in psutil.process_iter(["cmdline"]) if "time.sleep(60)" in " ".join(p.info["cmdline"] or [])]
