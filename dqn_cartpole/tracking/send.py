"""`send_run`: a run folder sent where its config's `tracking` section says, once its run ended. A failure of any
kind (a server that does not answer, a full disk in the store) is one warning line: the run, its folder and its exit
status are never touched by it. `check_installed` refuses a tracker whose extra is missing before any run starts."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import sys
from typing import Callable, Iterator, Optional

from dqn_cartpole.config import Config
from dqn_cartpole.errors import UserError

EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}  # backend -> the module its extra installs
SQLALCHEMY_PREAMBLE = "(raised as a result of"  # a line before the error itself (a full SQLite store's, say)


def install_hint(backend: str) -> str:
    # Not `pip install "dqn_cartpole[mlflow]"` alone: beside TF-Agents' typing-extensions pin, pip cannot resolve the
    # tracking extras (they need pydantic 2); the lock overrides that pin (docs/install.md).
    return f"it is the {backend} extra, which make install puts in .venv with every other extra (docs/install.md)"


def check_installed(backend: Optional[str], named: Optional[str] = None) -> None:
    """A one-line UserError when `backend`'s library is not installed (looked up, not imported: no cost), so a
    tracked run is refused before it trains instead of being trained and then not sent. `named`: how the user
    asked for it (default `--track NAME`)."""
    if backend is not None and importlib.util.find_spec(EXTRAS[backend]) is None:
        raise UserError(f"{named or '--track ' + backend}: {EXTRAS[backend]} is not installed: "
                        f"{install_hint(backend)}")


def one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    lines = [line for line in str(exc).strip().splitlines() if not line.startswith(SQLALCHEMY_PREAMBLE)]
    problem = (lines or [""])[0]
    problem = problem if len(problem) <= 300 else problem[:300] + "..."
    return f"{type(exc).__name__}: {problem}" if problem else type(exc).__name__


def send_run(config: Config, run_dir: str, say: Callable[[str], None] = None) -> Optional[str]:
    """Sends `run_dir` to `config.tracking.backend` (nothing without one: no import); returns the tracked run's
    id, or None after one warning line (`say`, default stderr) when it could not be sent."""
    backend = config.tracking.backend
    if backend is None:
        return None
    say = say or (lambda line: print(line, file=sys.stderr))
    try:
        importlib.import_module(EXTRAS[backend])  # checked before the run (`check_installed`); uninstalled since?
    except ImportError:
        say(f"warning: --track {backend}: {EXTRAS[backend]} is not installed ({install_hint(backend)}); the run is "
            f"not tracked")
        return None
    try:
        with quiet_libraries():
            return _send(backend, config, run_dir, say)
    except Exception as exc:  # pylint: disable=broad-except  # tracking never fails the run
        say(f"warning: --track {backend}: the run was not sent ({one_line(exc)}); it is saved in {run_dir}")
        return None


def _send(backend: str, config: Config, run_dir: str, say: Callable[[str], None]) -> str:
    from dqn_cartpole.tracking.sent import what_is_sent

    sent = what_is_sent(run_dir, dataclasses.asdict(config.tracking))
    if backend == "mlflow":
        from dqn_cartpole.tracking import mlflow_run

        return mlflow_run.send(sent, config.output.root)
    from dqn_cartpole.tracking import wandb_run

    return wandb_run.send(sent, config.output.root, config.tracking.online, say)


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """MLflow's and W&B's own log lines (retries, banners, migrations) kept off the console while a run is sent:
    the one warning line says what went wrong."""
    levels = {name: logging.getLogger(name).level for name in ("mlflow", "wandb", "urllib3", "alembic", "git")}
    for name in levels:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
