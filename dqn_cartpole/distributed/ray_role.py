"""The Ray actor of `--topology ray`: one role, run as its own command in a child process of the actor.

A role keeps its code: the actor starts `python -m dqn_cartpole ROLE ...` and waits for it; the role's signals,
its watchdog, its exit statuses and its log are those of `--topology local`. The role's process is a fork of the
run's warm start-up process on its node (`processes.warm_start`, on the node's socket `warm_socket`), which outlives
the actors: neither a role's start nor its restart, in a new actor process too, imports TensorFlow (how, and what a
fault of the warm process costs: docs/distributed.md, "A warm start"). A role's SIGTERM (the stop order) goes
through `stop`.

A role that must not need the run folder's file system (a collector) runs in a folder of its node
(`node_local`): the actor writes the run's config.yaml there, substitutes the folder for NODE_LOCAL in the
command, and hands the files the role writes there to the driver (`files`, see `mirror`). Its folder is
removed when the actor is closed, and an earlier process's folder whose actor is gone when the next
starts.

The methods are coroutines (an async actor): `run` waits for the role while `where`, `send`, `stop` and
`files` answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import os
import shutil
import signal
import tempfile
import time
import uuid
from typing import Optional

from dqn_cartpole.console import exit_status
from dqn_cartpole.distributed import mirror
from dqn_cartpole.processes.ray_node import this_node
from dqn_cartpole.processes.supervisor import Child
from dqn_cartpole.processes.warm_process import pid_exists
from dqn_cartpole.processes.warm_start import WARM_MODULES, WarmChild, WarmStarter, remove_stale

NODE_LOCAL = "{node-local}"  # in a command: the role's folder on its node
# What a node's warm start-up process imports besides the libraries: the command line and the roles' modules (about
# 1 s more), so that a fork imports nothing.
ROLE_MODULES = ("dqn_cartpole.distributed.server", "dqn_cartpole.distributed.learner",
                "dqn_cartpole.distributed.evaluator", "dqn_cartpole.distributed.collector")
WHERE_WAIT_S = 30.0  # `where` waits this long for `run` to start the role (then says pid None: ask again)
POLL_S = 0.1


class RoleHost:
    """One role in a Ray actor; see the module docstring."""

    def __init__(self, role_name: str, run_name: str, config_text: Optional[str] = None):
        self.role_name, self.token = role_name, uuid.uuid4().hex  # `token`: this process, for the mirror
        self.child: Optional[Child] = None
        self.run_id: Optional[int] = None  # the driver's id of the current `run`
        self.starter = WarmStarter(signal.SIGKILL, (*WARM_MODULES, "dqn_cartpole.cli.main", *ROLE_MODULES),
                                   socket_path=warm_socket(run_name), lifeline=os.getppid())
        with contextlib.suppress(OSError):  # `run` says it if it still cannot start its role
            self.starter.ensure()  # its imports overlap the driver's call (a restarted actor: Ray's own restart)
        self.root: Optional[str] = None
        if config_text is not None:
            self.root = node_local_folder(run_name, role_name)
            with open(os.path.join(self.root, "config.yaml"), "w", encoding="utf-8") as handle:
                handle.write(config_text)

    def command(self, argv: list) -> list:
        """The role's `python -m dqn_cartpole` arguments, NODE_LOCAL replaced by its folder."""
        return [arg.replace(NODE_LOCAL, self.root) if self.root else arg for arg in argv]

    async def run(self, argv: list, log_path: str, run_id: Optional[int] = None) -> dict:
        """Runs the role to its end: {"status": its exit status, "why": its last error line}. A role started
        again in this actor: its earlier process is killed first if it still runs (the driver gave up on it).
        `run_id`: what `where(run_id)` waits for (Ray may start a later call's coroutine first)."""
        previous, self.child, self.run_id = self.child, None, run_id  # `where` waits for this start
        if self.root is not None:
            log_path = log_path.replace(NODE_LOCAL, self.root)
        if previous is not None and previous.returncode is None:
            previous.process.kill()
            await asyncio.to_thread(previous.process.wait)
        child = WarmChild(self.role_name, self.command(argv), log_path, starter=self.starter)
        try:  # the first one waits for the warm process's imports; a new warm process's if that one died
            await asyncio.to_thread(child.start)
        except OSError as exc:  # the warm process could not start it: this start fails, as a role's crash would
            return {"status": exit_status.EXIT_CRASHED, "why": f"its process could not be started: {exc}"}
        self.child = child
        while child.returncode is None:
            await asyncio.sleep(POLL_S)
        return {"status": child.returncode, "why": child.last_error()}

    async def ready(self) -> str:
        """This actor process's token, once it is up (a restarted actor's first answer)."""
        return self.token

    async def where(self, run_id: Optional[int] = None) -> dict:
        """Where the role runs: its node (IP, id), its pid and its actor's (once `run`, the one of `run_id` if
        given, started it)."""

        def started() -> bool:
            return self.child is not None and (run_id is None or self.run_id == run_id)

        deadline = time.monotonic() + WHERE_WAIT_S
        while not started() and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        return {**this_node(), "pid": self.child.process.pid if started() else None, "worker_pid": os.getpid(),
                "token": self.token}

    async def send(self, signum: int) -> None:
        if self.child is not None:
            self.child.send(signum)

    async def stop(self, signum: int, grace_s: float) -> Optional[int]:
        """`signum` once, SIGKILL after `grace_s`; the role's exit status."""
        if self.child is None or self.child.process is None:
            return None
        self.child.send(signum)
        deadline = time.monotonic() + grace_s
        while self.child.returncode is None and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S / 2)
        if self.child.returncode is None:
            self.child.process.kill()
            self.child.process.wait()
        return self.child.returncode

    async def files(self, taken: dict) -> tuple:
        """(this process's token, what is new in its node-local folder past what the driver has `taken` of it:
        {token: {path: offset}}; see `mirror`)."""
        return self.token, (mirror.read_new(self.root, taken.get(self.token, {})) if self.root else [])

    async def close(self) -> None:
        """Ends the warm start-up process and removes the node-local folder (the role has ended)."""
        self.starter.close()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def warm_socket(run_name: str) -> str:
    """Where the run's warm start-up process on this node listens: one per run (its Ray job: a resumed run's
    actors import the code afresh) and node, shared by the roles the node runs, and found again by a role's actor
    when Ray restarts it in a new process on the same node."""
    import ray  # pylint: disable=import-outside-toplevel  # in the actor's process

    context = ray.get_runtime_context()
    key = f"{context.get_job_id()}/{context.get_node_id()}/{run_name}"
    remove_stale(os.path.join(tempfile.gettempdir(), "dqn_cartpole-warm-*.sock"))  # left by SIGKILLed ones
    return os.path.join(tempfile.gettempdir(), f"dqn_cartpole-warm-{hashlib.sha1(key.encode()).hexdigest()[:16]}.sock")


def node_local_folder(run_name: str, role_name: str) -> str:
    """A fresh folder for a role on this node, laid out like a run folder; the folders an earlier process of the
    same role left behind (its actor was killed) are removed first."""
    prefix = os.path.join(tempfile.gettempdir(), f"dqn_cartpole-{run_name}-{role_name.replace(' ', '-')}-")
    for stale in glob.glob(prefix + "*"):
        owner = stale[len(prefix):].split("-")[0]
        if owner.isdigit() and not pid_exists(int(owner)):
            shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
