"""`Run`: a run folder from Python: what it says (summary, config, metrics) and what its trained agent does.

It reads any run folder (`train` wrote it, in this process or another, finished, stopped or still running) through
`run_folder.read_run`, each time anew, so a Run always says what the folder holds now. `policy`, `evaluate` and
`record` import TensorFlow; the rest never does. The commands' rules apply (the same checks, the same one-line
`UserError`s): `evaluate` and `record` are `python -m dqn_cartpole evaluate` / `record` on this folder.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from dqn_cartpole.config import Config
from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder import RunRecord, read_run
from dqn_cartpole.run_folder.metrics import EVAL_COLUMNS, TRAIN_COLUMNS


@dataclass(frozen=True)
class Evaluation:
    """Greedy episodes of a saved policy: their returns and lengths, and what ran them."""

    policy_dir: str
    env_id: str
    returns: np.ndarray
    lengths: np.ndarray

    @property
    def mean(self) -> float:
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        return float(np.std(self.returns))

    def __str__(self) -> str:
        r = self.returns
        return (f"{self.policy_dir} on {self.env_id}, {len(r)} greedy episodes: mean {np.mean(r):.1f}, "
                f"std {np.std(r):.1f}, min {np.min(r):.1f}, max {np.max(r):.1f}")


class RunFailed(RuntimeError):
    """Runs that ended in failure: a diverged loss (policy/final then holds the last good checkpoint's weights), a
    full disk, a sweep's member that crashed. The message is one line; `runs` are their folders, which keep what the
    runs saved (`run`: the first)."""

    def __init__(self, message: str, runs: Sequence["Run"]) -> None:
        super().__init__(message)
        self.runs = list(runs)

    @property
    def run(self) -> Optional["Run"]:
        return self.runs[0] if self.runs else None

    def _render_traceback_(self) -> list[str]:
        """What IPython (a Jupyter notebook) shows instead of a traceback: the one line."""
        return [f"{type(self).__name__}: {self}"]


def columns(rows: Sequence[dict], names: Sequence[str]) -> dict[str, np.ndarray]:
    """A metrics CSV's rows as columns: name -> float64 array, NaN for an empty cell (every cell is a number)."""
    found = list(rows[0]) if rows else list(names)
    return {name: np.array([np.nan if row.get(name) in (None, "") else float(row[name]) for row in rows],
                           dtype=np.float64) for name in found}


def cli_args(*argv: str) -> Any:
    """The CLI's parsed arguments for `argv`, so a method runs a command's own checks with its defaults."""
    from dqn_cartpole.cli.main import build_parser

    return build_parser().parse_args(list(argv))


class Run:
    """A run folder. `Run.open(path)` checks it; `dqn_cartpole.train` returns one.

    In Jupyter it shows the outcome, the returns plot and the trained agent's video (`_repr_html_`).
    """

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def open(cls, path: "str | os.PathLike[str]") -> "Run":
        """The run in `path`; raises UserError (one line) when it is not a readable run folder."""
        path = os.fspath(path)
        read_run(path)
        return cls(path)

    def __repr__(self) -> str:
        return f"Run({self.path!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and os.path.realpath(self.path) == os.path.realpath(other.path)

    def __hash__(self) -> int:
        return hash(os.path.realpath(self.path))

    # -- what the folder says (read anew each time; no TensorFlow)
    def read(self) -> RunRecord:
        """Everything the folder holds now: summary.json, config.yaml and the metrics' rows (`RunRecord`)."""
        return read_run(self.path)

    @property
    def summary(self) -> dict:
        """summary.json (empty while the run has none: still running, or stopped before its end)."""
        return dict(self.read().summary)

    @property
    def config(self) -> Config:
        """The run's config.yaml as a checked, frozen `Config`."""
        from dqn_cartpole.api.configs import load_config

        return load_config(self.read().layout.config)

    @property
    def finished(self) -> bool:
        """The run wrote its summary (it may have stopped early on Ctrl-C: see `stopped`)."""
        return self.read().finished

    @property
    def solved(self) -> bool:
        return self.read().solved

    @property
    def stopped(self) -> bool:
        """Stopped early by Ctrl-C (KeyboardInterrupt) or SIGTERM: `train(resume=run)` continues it."""
        return bool(self.read().get("stopped_by"))

    @property
    def train_metrics(self) -> dict[str, np.ndarray]:
        """train_metrics.csv as columns: `train_step`, `env_steps`, `loss`, `epsilon`, ... -> float arrays."""
        return columns(self.read().train_rows, TRAIN_COLUMNS)

    @property
    def eval_metrics(self) -> dict[str, np.ndarray]:
        """eval_metrics.csv as columns: `train_step`, `env_steps`, `average_return`, ... -> float arrays."""
        return columns(self.read().eval_rows, EVAL_COLUMNS)

    # -- the trained agent (TensorFlow)
    def policy(self, final: bool = False) -> Any:
        """The saved greedy policy (a TF-Agents SavedModel: `policy.action(time_step)`): policy/best, or
        policy/final with `final`."""
        from dqn_cartpole.cli.single_process import load_policy_or_fail
        from dqn_cartpole.console.imports import import_tensorflow
        from dqn_cartpole.run_folder.resolve import resolve_policy

        policy_dir, _ = resolve_policy(self.path, final)
        import_tensorflow()
        return load_policy_or_fail(policy_dir)

    def evaluate(self, episodes: int = 10, *, final: bool = False, env: Optional[str] = None,
                 seed: int = 0) -> Evaluation:
        """`episodes` greedy episodes of the saved policy (policy/best, or policy/final with `final`) on the run's
        env (or `env`), seeded with `seed`: `python -m dqn_cartpole evaluate`'s episodes, returned."""
        from dqn_cartpole.cli.single_process import evaluate_policy
        from dqn_cartpole.console.imports import import_tensorflow

        argv = ["evaluate", self.path, "--episodes", str(int_arg("episodes", episodes)), "--seed",
                str(int_arg("seed", seed))]
        args = cli_args(*argv, *(["--final"] if final else []), *(["--env", env] if env else []))
        import_tensorflow()  # before the command's `heavy_imports`, which would freeze this process's heap
        policy_dir, env_id, result = evaluate_policy(args)
        return Evaluation(policy_dir, env_id, np.asarray(result.returns), np.asarray(result.lengths))

    def record(self, output: "str | os.PathLike[str] | None" = None, *, episodes: int = 1,
               fps: Optional[int] = None, final: bool = False, random: bool = False, env: Optional[str] = None,
               seed: int = 0, overwrite: bool = False) -> str:
        """Records `episodes` episodes of the saved policy (or, with `random`, of the random one on the run's env)
        to an mp4, as `python -m dqn_cartpole record` does, which prints what it wrote; returns the mp4's path
        (default: a new file in the run's videos/; with `overwrite`, videos/trained-agent.mp4 itself). An existing
        `output` is refused without `overwrite`, and in a run folder only its videos/ takes one (UserError). `fps`
        defaults to the run's video.fps, as its own videos."""
        from dqn_cartpole.cli.single_process import cmd_record, record_fps, record_output
        from dqn_cartpole.run_folder.resolve import check_recording_path
        from dqn_cartpole.console.imports import import_tensorflow

        fps = record_fps(self.path) if fps is None else int_arg("fps", fps)  # `random` too: the run's own rate
        argv = ["record", "--episodes", str(int_arg("episodes", episodes)), "--fps", str(fps),
                "--seed", str(int_arg("seed", seed))]
        if random:
            argv += ["--random", "--env", env or self.read().config_value("env.id") or "CartPole-v1"]
        else:
            argv += [self.path] + (["--env", env] if env else [])
        argv += (["--final"] if final else []) + (["--overwrite"] if overwrite else [])
        args = cli_args(*argv, *(["--output", os.fspath(output)] if output else []))
        args.output = record_output(args, self.path)  # the command's own choice, made here to return it
        check_recording_path(args.output, overwrite, "output", "overwrite=True")  # API words; cmd_record checks again
        import_tensorflow()
        cmd_record(args)
        return args.output

    # -- the report (no TensorFlow)
    def report(self) -> str:
        """Redraws the plots and writes report.html (as `python -m dqn_cartpole report`); returns its path."""
        from dqn_cartpole.report.command import redraw_run

        with contextlib.redirect_stderr(io.StringIO()):  # matplotlib's font-cache notice, on a first run
            return redraw_run(self.path)[-1]

    def _repr_html_(self) -> str:
        from dqn_cartpole.api.display import run_html

        try:
            return run_html(self.read())
        except UserError as exc:  # the folder went away or was damaged since: say so, in place of the run
            return f"<p>{exc}</p>"


def int_arg(name: str, value: Any) -> int:
    """An integer argument, else a UserError naming it (as the CLI's parser would)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise UserError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    return int(value)
