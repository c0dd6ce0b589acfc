"""Regenerates docs/report.png: a real default run's report.html, photographed in headless Chromium at 1280 px.

    python scripts/report_screenshot.py [--run-dir outputs/docs/report-seed0] [--seed 0] [--reuse]

Trains `python -m dqn_cartpole train --seed SEED --output-dir RUN_DIR` (configs/default.yaml; --reuse keeps an
existing run and only redraws its report), then screenshots its report.html with the Chromium flags the tests use
(tests/browser.py) and prints the run's figures, so the docs that show the picture can name the run they come from.
Needs Debian's chromium (`apt-get install -y chromium`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))  # the Chromium helpers the report tests use

from browser import find_chromium, screenshot  # noqa: E402

OUT = os.path.join(REPO, "docs", "report.png")
WINDOW = "1280,1500"  # the outcome, the returns plot, the other plots and the videos


def dqn(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "dqn_cartpole", *args], cwd=REPO, check=True,
                   env=dict(os.environ, SDL_AUDIODRIVER="dummy"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", default=os.path.join("outputs", "docs", "report-seed0"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="keep an existing run; only redraw its report")
    args = parser.parse_args()
    browser = find_chromium()
    if browser is None:
        sys.exit("no chromium or chromium-browser on the PATH (apt-get install -y chromium)")
    run_dir = os.path.join(REPO, args.run_dir)
    if args.reuse and os.path.isfile(os.path.join(run_dir, "summary.json")):
        dqn("report", run_dir)
    else:
        dqn("train", "--quiet", "--seed", str(args.seed), "--output-dir", run_dir, "--overwrite")
    with tempfile.TemporaryDirectory() as profile:
        screenshot(browser, os.path.join(run_dir, "report.html"), OUT, profile, size=WINDOW)
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    print(f"wrote {OUT} from {args.run_dir}: solved at iteration {summary['solved_at_iteration']} "
          f"({summary['solved_env_steps']} env steps, {summary['solved_wall_s']:.1f} s), best return "
          f"{summary['best_return']:.1f}, wall {summary['wall_s']:.1f} s, commit {summary['provenance']['git_commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
