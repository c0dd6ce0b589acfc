"""What a sweep costs: the same 4 smoke runs with --jobs 1 and --jobs 2, and the start-up cost of one run process.

    python scripts/sweep_cost.py [--repeats 1]

Start-up is read from the run folders: wall times in the metrics count from process start, so the first
evaluation's wall_s (at train step 0, before any training) is imports + building the pipeline + the
initial collect + tracing + one evaluation. The machine's load average is printed with each result,
because on a shared machine it moves the numbers more than anything else.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dqn_cartpole.run_folder import read_run  # noqa: E402
from dqn_cartpole.run_folder.record import find_runs  # noqa: E402


def run_sweep(root: str, name: str, jobs: int) -> float:
    argv = [sys.executable, "-m", "dqn_cartpole", "sweep", "--config", os.path.join(REPO, "configs", "smoke.yaml"),
            "--seeds", "0-1", "--grid", "agent.learning_rate=[1e-3,2e-3]", "--jobs", str(jobs), "--name", name,
            "--set", f"output.root={root}", "--quiet"]
    start = time.time()
    subprocess.run(argv, check=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.DEVNULL)
    return time.time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        walls: dict[int, list] = {1: [], 2: []}
        for repeat in range(args.repeats):
            for jobs in ((2, 1) if repeat % 2 else (1, 2)):  # alternate the order: load drifts
                walls[jobs].append(run_sweep(root, f"j{jobs}-{repeat}", jobs))
                print(f"--jobs {jobs}: {walls[jobs][-1]:.1f} s (load average {os.getloadavg()[0]:.1f})")
        runs = [read_run(path) for path in find_runs(os.path.join(root, "sweeps"))]
        startup = [float(r.eval_rows[0]["wall_s"]) for r in runs if r.eval_rows and r.eval_rows[0]["train_step"] == "0"]
        total = [r.get("wall_s") for r in runs]
    for jobs, values in walls.items():
        print(f"4 smoke runs, --jobs {jobs}: median {statistics.median(values):.1f} s over {len(values)}")
    print(f"per run process: start-up to the first evaluation median {statistics.median(startup):.1f} s "
          f"(of a median {statistics.median(total):.1f} s run), over {len(startup)} runs")


if __name__ == "__main__":
    main()
