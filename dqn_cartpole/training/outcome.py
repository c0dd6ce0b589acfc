"""How a run ends, whichever way it ran (one process, or the learner of the roles): the errors it can end in,
then summary.json, report.html, the summary lines and how to continue it.

    with RunEnd(run_dir, created, progress, resume_hint) as end:
        end.summary = train(...)
    return end.finish()
"""

from __future__ import annotations

import resource
import shutil
import sys
from typing import Optional

from dqn_cartpole.console.exit_status import EXIT_FAILED
from dqn_cartpole.console.progress import Progress
from dqn_cartpole.errors import UserError
from dqn_cartpole.report.facts import final_much_worse_line
from dqn_cartpole.report.run_page import write_run_report
from dqn_cartpole.run_folder import write_summary
from dqn_cartpole.run_folder.checkpointing import CheckpointError, DiskFullError
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.provenance import provenance


class RunEnd:
    """A context manager around a run's training: bad input removes a folder the run created (and goes on to
    the CLI's one line); a full disk is one line with the resume command (exit status 1); an unreadable
    checkpoint is bad input. `resume_hint` continues the run (None: the caller prints how), and `change_hint`
    continues it with a lower learning rate (default: `resume_hint --set agent.learning_rate=...`).

    Why a run failed (exit status 1: a full disk, a diverged loss) is kept in `failure`, one line; with
    `print_failure=False` it is not printed either (the Python API raises it instead)."""

    def __init__(self, run_dir: str, created: bool, progress: Progress, resume_hint: Optional[str],
                 change_hint: Optional[str] = None, print_failure: bool = True) -> None:
        self.run_dir, self.created, self.progress, self.resume_hint = run_dir, created, progress, resume_hint
        self.change_hint = change_hint or (f"{resume_hint} --set agent.learning_rate=..." if resume_hint else None)
        self.print_failure = print_failure
        self.summary: Optional[dict] = None
        self.failure: Optional[str] = None

    def __enter__(self) -> "RunEnd":
        return self

    def __exit__(self, kind, exc, _traceback) -> bool:
        self.progress.close()
        if kind is not None and issubclass(kind, UserError) and self.created:
            shutil.rmtree(self.run_dir, ignore_errors=True)  # bad input leaves no run folder behind
        if kind is not None and issubclass(kind, DiskFullError):
            self.failure = f"{exc}. Free some space" + (f", then resume with: {self.resume_hint}"
                                                        if self.resume_hint else "")
            if self.print_failure:
                print(f"error: {self.failure}", file=sys.stderr)
            return True
        if kind is not None and issubclass(kind, CheckpointError):
            raise UserError(str(exc)) from None
        return False

    def finish(self) -> int:
        """summary.json and report.html, the summary on the console; returns the run's exit status."""
        if self.summary is None:  # the disk was full
            return EXIT_FAILED
        summary, run = self.summary, RunLayout(self.run_dir)
        summary["artifacts"]["report"] = run.report
        write_run_summary(summary, run.summary)
        write_run_report(self.run_dir)  # after the summary, which it shows
        print("\n".join(summary_lines(summary)))
        if summary["stopped_by"]:
            print(f"Stopped by {summary['stopped_by']} at iteration {summary['iterations']}; the checkpoint, plots "
                  f"and policy are saved." + (f" Resume with:\n  {self.resume_hint}" if self.resume_hint else ""))
        elif summary["diverged_at_iteration"] is not None:
            self.failure = diverged_line(summary, self.change_hint, " ")
            if self.print_failure:
                print(diverged_line(summary, self.change_hint), file=sys.stderr)
        return summary["exit_status"]


def diverged_line(summary: dict, change_hint: Optional[str], before_hint: str = "\n  ") -> str:
    """A diverged run: what to change, and how to continue (the hint on a line of its own, or after `before_hint`)."""
    return (f"Training diverged (the loss became NaN or Inf at iteration {summary['diverged_at_iteration']}) and "
            f"stopped. Lower agent.learning_rate or set agent.gradient_clipping" +
            (f", then continue with:{before_hint}{change_hint}" if change_hint else "."))


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
    policies = summary.get("policies") or {}
    for name in ("final", "best"):
        entry = policies.get(name)
        if entry and entry.get("average_return") is not None:
            lines.append(f"  {'policy/' + name:<21} {entry['average_return']:.1f} over {entry.get('episodes')} "
                         f"episodes, iteration {entry.get('iteration')}: {entry['what']}")
    worse = final_much_worse_line(policies, summary.get("solve_return_target"))
    if worse:
        lines.append(f"  {worse}")
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
