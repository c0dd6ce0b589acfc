"""What `train` prints and writes at the end: the summary lines and summary.json."""

from __future__ import annotations

import resource
from typing import Optional

from dqn_cartpole.run_folder import write_summary
from dqn_cartpole.run_folder.provenance import provenance


def write_run_summary(summary: dict, path: str) -> None:
    """summary.json, with this process's peak memory and what produced the run (code, libraries, machine), for
    scripts and tools that read a finished run."""
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    write_summary(path, {**summary, "peak_rss_mb": peak_rss_mb, "provenance": provenance()})


def summary_lines(summary: dict) -> list[str]:
    def fmt(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.1f}"

    rate = summary.get("iterations_per_s")
    lines = [
        f"Done in {summary['wall_s']:.1f} s: {summary['iterations']} iterations, {summary['train_steps']} train "
        f"steps, {summary['env_steps']} env steps"
        + (f" ({rate:.0f} it/s in the loop, {summary['eval_s']:.1f} s evaluating)." if rate else "."),
        f"  best average return   {fmt(summary['best_return'])}",
        f"  final average return  {fmt(summary['final_return'])}",
    ]
    if summary["solved_at_iteration"] is not None:
        lines.append(f"  solved                at iteration {summary['solved_at_iteration']}, "
                     f"policy saved after {summary['solved_wall_s']:.1f} s")
    if summary["resumed_from"]:
        lines.append(f"  resumed from          {summary['resumed_from']}")
    if summary["checkpoint_bytes"] is not None:
        lines.append(f"  last checkpoint       {summary['checkpoint_bytes'] / 1e6:.2f} MB, written in "
                     f"{summary['checkpoint_write_s']:.2f} s")
    artifacts = summary["artifacts"]
    lines.append(f"Artifacts in {summary['run_dir']}:")
    width = max(len(k) for k in artifacts)
    lines += [f"  {name:<{width}}  {path}" for name, path in artifacts.items()]
    return lines
