"""The command line's shortcuts for the keys changed most (`--env`, `--seed`, `-n`), as `--set` overrides: `train`,
`config`, `specs`, `sweep` and `tune` add them with `add_shortcut_args`; the Python API's `load_config(env=, seed=,
iterations=)` reads `SHORTCUTS` too."""

from __future__ import annotations

import json
from typing import Any

from dqn_cartpole.config import Flagged

# argparse dest -> (config key, the flag's name in errors).
SHORTCUTS = {"env_id": ("env.id", "--env"), "seed": ("training.seed", "--seed"),
             "iterations": ("training.num_iterations", "-n"), "track": ("tracking.backend", "--track")}


def add_shortcut_args(parser: Any, seed: bool = True) -> None:
    """Adds the shortcuts to an argparse parser: `--env ID`, `--seed N` (unless the command has a --seed of its
    own) and `-n/--iterations N`; `shortcut_overrides` reads them back."""
    parser.add_argument("--env", metavar="ID", dest="env_id", help="shortcut for --set env.id=ID")
    if seed:
        parser.add_argument("--seed", metavar="N", type=int, help="shortcut for --set training.seed=N")
    parser.add_argument("-n", "--iterations", metavar="N", type=int,
                        help="shortcut for --set training.num_iterations=N")


def add_track_arg(parser: Any) -> None:
    """`--track mlflow | wandb` (train, sweep, tune): a shortcut for --set tracking.backend=NAME."""
    from dqn_cartpole.config.schema import TRACKERS

    parser.add_argument("--track", choices=TRACKERS,
                        help="track the run (each run) in MLflow (a local SQLite store under outputs/ unless "
                             "MLFLOW_TRACKING_URI; metrics sent as it trains) or W&B (offline unless tracking.online); "
                             "needs its extra, which make install puts in .venv (docs/tracking.md)")


def shortcut_overrides(args: Any, seed: bool = True, flagged: bool = False) -> list:
    """`section.key=value` overrides for the shortcuts given on a command line (`--env`, `--seed`, `-n`); with
    `seed=False`, the command's own --seed (tune's sampler seed) is not one of them. `flagged`: as `Flagged`
    overrides, so an error about one names the flag the user typed (`--env Pendulum-v1`)."""
    found = []
    for dest, (key, flag) in SHORTCUTS.items():
        if dest == "seed" and not seed:
            continue
        value = getattr(args, dest, None)
        if value is not None:
            item = f"{key}={json.dumps(value)}"  # JSON is YAML: an env id stays a string
            found.append(Flagged(item, f"{flag} {value}") if flagged else item)
    return found
