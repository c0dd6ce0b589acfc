"""The fixed-budget benchmark's table (scripts/benchmark_fixed_budget.py), fast: no benchmark run."""

from __future__ import annotations

import os
import sys

from helpers import REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))


def test_the_fixed_budget_table_tells_a_run_that_never_solved_from_one_that_never_checked():
    """scripts/benchmark_fixed_budget.py: a run with the early stop off and agent.solved_target_update_* null never
    looks for its solve (summary.json's solve_checked false): its row says so, not "never"."""
    import benchmark_fixed_budget

    def row(seed, solved, checked, final):
        return {"seed": seed, "solved_env_steps": solved, "solve_checked": checked, "best": 250.0, "final": final,
                "holds": final >= 200, "target": 200.0}

    lines = benchmark_fixed_budget.table([row(1, 31000, True, 227.7), row(2, None, True, 165.0),
                                          row(3, None, False, 191.6)])
    assert [line.split(" | ")[1] for line in lines[2:5]] == ["31,000", "never", "not checked"]
    assert lines[-1].endswith("1/3 seeds' final policies solve (≥ 200).")
