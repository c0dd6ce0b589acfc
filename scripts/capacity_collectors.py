"""The capacity benchmark's synthetic collectors (scripts/benchmark_capacity.py starts them).

A synthetic collector is what a cluster's collector is to the replay server, minus its env and its policy: a
separate process that writes (n_step + 1)-step windows of the run's data spec through the collectors' own writers
(`replay.reverb_writers.StreamWriters`), as fast as the server takes them, with a collector's traffic around
them: a weight pull (the `variables` item) and a flush every `distributed.weight_refresh_steps` windows, each
window tagged with the pulled train step. Its steps are made beforehand (`synthetic_steps`: random values within
the specs, whole episodes, so the writers pad each episode's end as they do a real one's) and cycled.

The benchmark starts them all once: one host process imports what they need (TensorFlow, Reverb: a few CPU
seconds) and forks them, so 16 collectors cost one import, and they share one scheduling group (the host's session)
unless told to take one each. It tells them through a small file (`Control`) which of them write, into which
server; each answers every change of its state, with its pid, so a measurement starts only once exactly the wanted
ones write, and their CPU is read process by process.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import time
from typing import Any, Callable

CONTROL_POLL_S = 0.1
SETUP_FILE, STEPS_FILE = "collectors.json", "synthetic.pkl"


def random_values(spec: Any, count: int, rng: Any) -> Any:
    """`count` values of one leaf spec: floats standard normal, integers uniform, both within the spec's bounds (a
    sane scale: huge values would make the learner's loss overflow, which its divergence check would act on)."""
    import numpy as np

    dtype = spec.dtype.as_numpy_dtype
    shape = (count,) + tuple(spec.shape)
    low, high = getattr(spec, "minimum", None), getattr(spec, "maximum", None)
    if np.issubdtype(dtype, np.floating):
        values = rng.standard_normal(shape)
        return np.clip(values, low, high).astype(dtype) if low is not None else values.astype(dtype)
    if low is None:
        return np.zeros(shape, dtype)
    return rng.integers(np.asarray(low), np.asarray(high), size=shape, endpoint=True).astype(dtype)


def synthetic_steps(data_spec: Any, count: int, seed: int = 0, lengths: tuple = (10, 200)) -> list:
    """At least `count` steps of `data_spec` as a collector's driver hands them to its writers: each step its fields
    in `tf.nest.flatten` order, numpy arrays [1 env, ...] (`random_values`). A Trajectory stream is made of whole
    episodes of `lengths` transitions (FIRST, MID..., discount 0 into the last state, then the LAST boundary step),
    so the writers pad each episode's end as they do a real one's, and the steps can be cycled."""
    import numpy as np
    import tensorflow as tf
    from tf_agents.specs import tensor_spec
    from tf_agents.trajectories import time_step as ts, trajectory as trajectory_lib

    rng = np.random.default_rng(seed)
    episodes = isinstance(data_spec, trajectory_lib.Trajectory)
    sizes: list = []
    while episodes and sum(sizes) < count:
        sizes.append(int(rng.integers(*lengths)) + 1)  # + 1: the boundary step
    total = sum(sizes) if episodes else count
    batch = tf.nest.map_structure(lambda spec: random_values(spec, total, rng), tensor_spec.from_spec(data_spec))
    if episodes:
        step_type = np.full(total, ts.StepType.MID, batch.step_type.dtype)
        next_type = np.full(total, ts.StepType.MID, batch.next_step_type.dtype)
        discount, reward = np.ones_like(batch.discount), batch.reward.copy()
        start = 0
        for size in sizes:
            last = start + size - 1
            step_type[start], step_type[last], next_type[last] = ts.StepType.FIRST, ts.StepType.LAST, ts.StepType.FIRST
            next_type[last - 1], discount[last - 1], reward[last] = ts.StepType.LAST, 0, 0
            start += size
        batch = batch._replace(step_type=step_type, next_step_type=next_type, discount=discount, reward=reward)
    flat = tf.nest.flatten(batch)
    return [[a[i:i + 1] for a in flat] for i in range(total)]


class SyntheticCollector:
    """A collector without env or policy: `steps` (see `synthetic_steps`) written in a loop through the collectors'
    writers into the server at `address`, with a collector's traffic: a weight pull and a flush every
    `distributed.weight_refresh_steps` windows. A write held back by the server is given up on once `stopped()`."""

    def __init__(self, config: Any, data_spec: Any, address: str, steps: list,
                 stopped: Callable[[], bool] = lambda: False):
        import reverb

        from dqn_cartpole.core import build

        self.stack = contextlib.ExitStack()
        self.writers = build.make_stream_writers(config, data_spec, address, self.stack)
        self.writers.give_up_waiting_when(stopped)
        self.client = reverb.Client(address)
        self.steps, self.next, self.written = steps, 0, 0
        self.refresh = config.distributed.weight_refresh_steps

    def pull(self) -> int:
        """What a collector's weight pull asks of the server (the variables item); returns its train step."""
        from dqn_cartpole.distributed.variables import VARIABLES_TABLE
        from dqn_cartpole.replay import deadlines

        sample = deadlines.sample_one(self.client, VARIABLES_TABLE, "pull the weights", num_samples=1,
                                      emit_timesteps=False)
        return int(sample.data[-1].reshape(-1)[0])  # the flattened {policy_variables, train_step}: last

    def write(self, windows: int, pull: bool = True) -> None:
        """`windows` steps (one window each), tagged with the pulled train step, then a flush."""
        if pull:
            self.writers.tag_items(self.pull())
        for _ in range(windows):
            self.writers.add_flat(*self.steps[self.next])
            self.next = (self.next + 1) % len(self.steps)
        self.writers.flush()
        self.written += windows

    def block(self) -> None:
        """One weight refresh's worth: a pull, `weight_refresh_steps` windows, a flush."""
        self.write(self.refresh)

    def close(self) -> None:
        self.stack.close()


class Control:
    """The orchestrator's orders to its collectors (one small JSON file, replaced atomically), and their answers
    (one file each)."""

    def __init__(self, folder: str):
        self.folder, self.path = folder, os.path.join(folder, "control.json")
        self._cached: dict = {}
        self._read_at = float("-inf")

    def write(self, **order: Any) -> None:
        temporary = f"{self.path}.tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(order, handle)
        os.replace(temporary, self.path)

    def read(self) -> dict:
        """The newest order, read at most every CONTROL_POLL_S."""
        if time.monotonic() - self._read_at >= CONTROL_POLL_S:
            self._read_at = time.monotonic()
            with contextlib.suppress(OSError, ValueError):
                with open(self.path, encoding="utf-8") as handle:
                    self._cached = json.load(handle)
        return self._cached

    def answer(self, index: int, phase: Any, active: bool) -> None:
        """Collector `index`'s state: the phase of the newest order it saw and whether it writes, with its pid."""
        path = os.path.join(self.folder, f"ack-{index}.json")
        with open(f"{path}.tmp", "w", encoding="utf-8") as handle:
            json.dump({"phase": phase, "active": active, "pid": os.getpid()}, handle)
        os.replace(f"{path}.tmp", path)

    def answers(self, count: int) -> list:
        found = []
        for index in range(count):
            with contextlib.suppress(OSError, ValueError):
                with open(os.path.join(self.folder, f"ack-{index}.json"), encoding="utf-8") as handle:
                    found.append(json.load(handle))
                continue
            found.append(None)
        return found


def collector_host(count: int, workdir: str, own_sessions: bool) -> int:
    """The synthetic collectors' parent: imports what they need once, then forks `count` collector processes
    (copies that share those pages: one TensorFlow import instead of `count`) and waits for them. They are in this
    process's session, i.e. one scheduling group, unless `own_sessions` gives each its own. Returns the exit status:
    1 if a collector failed (its traceback is in this process's log)."""
    import signal

    from dqn_cartpole.console.imports import heavy_imports

    with heavy_imports():  # no TensorFlow op runs and no gRPC channel opens before the fork
        from dqn_cartpole.config import load_config  # noqa: F401  (imported for the children)
        from dqn_cartpole.core import build  # noqa: F401
        from dqn_cartpole.replay.reverb_writers import WriterInterrupted  # noqa: F401
    with open(os.path.join(workdir, STEPS_FILE), "rb") as handle:
        data_spec, steps = pickle.load(handle)
    children = []
    for index in range(count):
        pid = os.fork()
        if pid == 0:
            _run_child(index, workdir, data_spec, steps, own_sessions)
        children.append(pid)
    signal.signal(signal.SIGTERM, lambda signum, frame: [_kill(pid) for pid in children])
    failed = 0
    for _ in children:
        _, status = os.wait()
        failed += os.waitstatus_to_exitcode(status) not in (0, -signal.SIGTERM)
    return 1 if failed else 0


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, 15)


def _run_child(index: int, workdir: str, data_spec: Any, steps: list, own_session: bool) -> None:
    """A forked collector: never returns into the parent's code."""
    import traceback

    from dqn_cartpole.processes.supervisor import die_with_parent

    status = 0
    try:
        if own_session:
            os.setsid()
        die_with_parent()
        collector_loop(index, workdir, data_spec, steps)
    except BaseException:  # pylint: disable=broad-except  # reported, then the child ends
        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)  # pylint: disable=protected-access


def collector_loop(index: int, workdir: str, data_spec: Any, steps: list) -> None:
    """Collector `index`: writes while the orders say it is active, idles otherwise; answers each change of its
    state; returns on the `exit` order."""
    from dqn_cartpole.config import load_config
    from dqn_cartpole.replay.reverb_writers import WriterInterrupted

    control = Control(workdir)
    with open(os.path.join(workdir, SETUP_FILE), encoding="utf-8") as handle:
        config_path = json.load(handle)["config"]
    collector, phase, answered = None, None, None

    def wanted(order: dict) -> bool:
        return order.get("phase") == phase and order.get("active", 0) > index

    while not control.read().get("exit"):
        order = control.read()
        if collector is not None and not wanted(order):
            collector.close()
            collector = None
        if collector is None and order.get("active", 0) > index:
            phase = order["phase"]
            collector = SyntheticCollector(load_config(config_path, order["overrides"]), data_spec, order["address"],
                                           steps, stopped=lambda: not wanted(control.read()))
        state = (order.get("phase"), collector is not None)
        if state != answered:
            control.answer(index, *state)
            answered = state
        if collector is None:
            time.sleep(CONTROL_POLL_S / 2)
            continue
        try:
            collector.block()
        except WriterInterrupted:  # told to stop while the server held a write back
            pass
    if collector is not None:
        collector.close()
