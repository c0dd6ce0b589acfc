"""A saved policy's files, without TensorFlow: one writer at a time, finishing an interrupted swap, reading
`policy_info.json`.

Every export of a policy folder (`export.save_policy`) and every `recover_policy` hold an exclusive `flock`
on a lock file next to it (`policy/.final.lock` for `policy/final`), so a reader that finishes a swap
(`evaluate RUN`, `record RUN`) never moves the temporary folder of a live export away, and two roles
exporting the same policy (the learner's finish and the evaluator's solve) take turns.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from typing import Iterator, Optional

from dqn_cartpole.errors import UserError
from dqn_cartpole.run_folder.atomic import recover_dir

INFO_FILE = "policy_info.json"
LOCK_WAIT_S = 120.0  # an export takes well under a second; a writer stopped (SIGSTOP) longer is reported
POLL_S = 0.05


def lock_path(path: str) -> str:
    """`policy/.final.lock` for `policy/final`: hidden, and not one of `recover_dir`'s leftovers."""
    folder, base = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{base}.lock")


@contextlib.contextmanager
def writing(path: str, wait_s: float = LOCK_WAIT_S) -> Iterator[bool]:
    """Holds the policy's lock (waiting up to `wait_s` for another writer); yields False without it where the
    lock file cannot be made (a read-only folder: then nothing can write there either)."""
    try:
        handle = open(lock_path(path), "a", encoding="utf-8")  # pylint: disable=consider-using-with
    except OSError:
        yield False
        return
    with handle:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise UserError(f"{path}: another process has been writing this policy for over {wait_s:g} s; "
                                    f"try again once it is done") from None
                time.sleep(POLL_S)
        yield True


def recover_policy(path: str, remove_leftovers: bool = False) -> None:
    """Completes a swap that a crash interrupted (see `export.save_policy`), under the policy's lock, so never
    one that a live export is making; `remove_leftovers` when no process writes the policy (see
    `atomic.recover_dir`). Creates nothing where the policy's folder does not exist."""
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        return
    if os.path.exists(path) and not remove_leftovers:
        return  # a swap is finished only where the policy is missing: nothing to do, no lock file made
    with writing(path) as locked:
        if locked:
            recover_dir(path, remove_leftovers)


def read_info(path: str) -> Optional[dict]:
    """The `policy_info.json` of a saved policy, or None."""
    try:
        with open(os.path.join(path, INFO_FILE), encoding="utf-8") as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_solved(info: Optional[dict]) -> bool:
    """The policy passed the solve check (`policy_info.json` says `"solved": true`)."""
    return bool(info and info.get("solved"))


POLICY_MEANINGS = {
    "final": "the weights at the last step (or those that passed the solve check, in a run that stopped on it)",
    "best": "the weights of the best periodic evaluation",
}


def describe_policy(path: str, name: str) -> Optional[dict]:
    """summary.json's record of one saved policy (`name`: final or best): what it is, where in the run its weights
    come from, and its score (average return over how many greedy episodes); None when it was not saved."""
    info = read_info(path)
    if info is None:
        return None
    solved = is_solved(info)
    what = POLICY_MEANINGS[name]
    if name == "final":
        held = info.get("held_since")
        what = ("the weights that passed the solve check (the run stopped on it)" if solved else
                "the weights at the last step" if held is None else
                f"the weights at the last step: the live ones, held since iteration {held:,} (agent.solved_learning_rate"
                f" 0; those that passed the solve check were no longer kept)" if info.get("held_weights") == "live" else
                f"the weights at the last step: those that passed the solve check at iteration {held:,}, held since "
                f"(agent.solved_learning_rate 0)")
    return {"what": what, "iteration": info.get("iteration"), "env_steps": info.get("env_steps"),
            "average_return": info.get("average_return"), "episodes": info.get("episodes"), "solved": solved}
