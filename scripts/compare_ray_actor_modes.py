"""How a role runs inside a Ray actor: in the actor's own process, or as the actor's child process (what
`--topology ray` does, `distributed/ray_role.py`). Measured on the collector, interleaved, REPEATS times each:

* start-up: the actor created -> the first window it inserted into a replay server;
* restart: its actor's worker SIGKILLed -> windows inserted again (Ray restarts the actor and retries `run`; in
  child mode the role's own process dies with it); in child mode also the role's own process SIGKILLed -> windows
  inserted again (its actor, alive, forks it again from its warm start-up process, as `--topology ray` does);
* RSS: the actor's process plus its children (in child mode the warm start-up process too), once collecting;
* the graceful stop: SIGTERM to the role (child: from its actor; in-process: to the actor's worker process, the
  only way to reach a handler there: the actor answers no call while its role runs) -> how it ended (the
  collector's exit status, or the worker's death).

Usage: python scripts/compare_ray_actor_modes.py [--repeats 3]   (wrap it in `flock /tmp/dqn-heavy.lock`)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SETS = ["replay.backend=reverb", "distributed.replay=server", "distributed.samples_per_insert=null"]


class InProcess:
    """The collector in the actor's process: `collect()` called from the actor's method."""

    def __init__(self, config_path: str, address: str, run_dir: str):
        self.args = (config_path, address, run_dir)

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> int:
        os.environ.update(TF_CPP_MIN_LOG_LEVEL="3", SDL_AUDIODRIVER="dummy")
        from dqn_cartpole.config import load_config
        from dqn_cartpole.console.imports import heavy_imports

        with heavy_imports():
            from dqn_cartpole.distributed.collector import collect
        config_path, address, run_dir = self.args
        return collect(load_config(config_path, SETS), address, 0, run_dir)


def role_host(ray, config_path: str, address: str, run_dir: str):
    """The collector as the child of a `RoleHost` actor, as `--topology ray` runs it."""
    from dqn_cartpole.distributed.policy import COLLECTOR, Role, role_argv
    from dqn_cartpole.distributed.ray_role import RoleHost

    argv = role_argv(Role(COLLECTOR, 0), config_path, address, run_dir, False, True)
    for item in SETS:
        argv += ["--set", item]
    actor = ray.remote(RoleHost).options(max_restarts=-1, max_task_retries=-1, num_cpus=0).remote("collector 0", "x")
    return actor, argv, os.path.join(run_dir, "collector.log")


def inserts(client) -> int:
    return int(client.server_info(timeout=5)["uniform_table"].rate_limiter_info.insert_stats.completed)


def wait_inserting(client, timeout_s: float = 180.0) -> float:
    start = inserts(client)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if inserts(client) > start:
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError("no insert")


def rss_mb(pid: int) -> float:
    import psutil

    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2 ** 20


def worker_pid(ray, actor, mode: str) -> int:
    """The actor's process. An in-process role holds its actor's only thread: the actor answers no call while the
    role runs, so its process is found by its title."""
    if mode == "child":
        return ray.get(actor.where.remote())["worker_pid"]
    import psutil

    found = [p.pid for p in psutil.process_iter(["cmdline"]) if "ray::InProcess" in " ".join(p.info["cmdline"] or [])]
    assert len(found) == 1, found
    return found[0]


def one(ray, mode: str, config_path: str, address: str, client) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"dqn-actor-{mode}-")
    began = time.monotonic()
    if mode == "in-process":
        actor = ray.remote(InProcess).options(max_restarts=-1, max_task_retries=-1, num_cpus=0).remote(
            config_path, address, run_dir)
        actor.run.remote()
    else:
        actor, argv, log = role_host(ray, config_path, address, run_dir)
        running = actor.run.remote(argv, log)
    first = wait_inserting(client)
    pid = worker_pid(ray, actor, mode)
    time.sleep(2)
    result = {"startup_s": first - began, "rss_mb": rss_mb(pid)}
    if mode == "child":  # the role's own process killed: its actor starts it again (as the topology's driver asks)
        os.kill(ray.get(actor.where.remote())["pid"], signal.SIGKILL)
        killed = time.monotonic()
        ray.get(running, timeout=30)
        actor.run.remote(argv, log)
        time.sleep(0.3)
        result["process_restart_s"] = wait_inserting(client) - killed
        time.sleep(2)
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    time.sleep(0.3)
    result["restart_s"] = wait_inserting(client) - killed  # Ray retried `run` on the restarted actor
    result["stop"] = graceful_stop(ray, actor, mode)
    ray.kill(actor, no_restart=True)
    return result


def graceful_stop(ray, actor, mode: str) -> str:
    """SIGTERM to the role; how it ended."""
    if mode == "child":
        started = time.monotonic()
        status = ray.get(actor.stop.remote(int(signal.SIGTERM), 12.0))
        return f"exit status {status} in {time.monotonic() - started:.1f} s"
    pid = worker_pid(ray, actor, mode)
    os.kill(pid, signal.SIGTERM)
    started = time.monotonic()
    while time.monotonic() - started < 15:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"the actor's worker died in {time.monotonic() - started:.1f} s (Ray restarts the actor)"
        time.sleep(0.1)
    return "still running after 15 s"


def main(argv: list) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import ray
    import reverb

    from dqn_cartpole.distributed.launcher import free_port
    from dqn_cartpole.distributed.policy import replay_answers

    config_path = os.path.join(REPO, "configs", "default.yaml")
    port = free_port()
    address = f"localhost:{port}"
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
    server_args = [sys.executable, "-m", "dqn_cartpole", "replay-server", "--config", config_path,
                   "--replay-address", address, "--run-dir", tempfile.mkdtemp(prefix="dqn-actor-server-")]
    for item in SETS:
        server_args += ["--set", item]
    with contextlib.ExitStack() as stack:
        server = subprocess.Popen(server_args, env=env, stderr=subprocess.DEVNULL)
        stack.callback(server.wait)
        stack.callback(server.terminate)
        while not replay_answers(address):
            time.sleep(0.2)
        push_weights(config_path, address, env)
        began = time.monotonic()
        ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 * 2 ** 20, log_to_driver=False,
                 configure_logging=False)
        stack.callback(ray.shutdown)
        print(f"ray.init: {time.monotonic() - began:.1f} s", flush=True)
        client = reverb.Client(address)
        results: dict = {"in-process": [], "child": []}
        for _ in range(args.repeats):
            for mode in results:
                results[mode].append(one(ray, mode, config_path, address, client))
                print(mode, json.dumps(results[mode][-1]), flush=True)
        for mode, runs in results.items():
            process = (f", its role's process killed: back in median "
                       f"{statistics.median(r['process_restart_s'] for r in runs):.1f} s" if mode == "child" else "")
            worker = statistics.median(r['restart_s'] for r in runs)
            print(f"{mode}: start-up median {statistics.median(r['startup_s'] for r in runs):.1f} s, its actor's "
                  f"worker killed: back in median {worker:.1f} s{process}, RSS "
                  f"median {statistics.median(r['rss_mb'] for r in runs):.0f} MB; stop: {runs[-1]['stop']}")
        print(f"load average {'/'.join(f'{v:.1f}' for v in os.getloadavg())} at the end", flush=True)
    return 0


def push_weights(config_path: str, address: str, env: dict) -> None:
    """Pushes a fresh agent's weights once, so collectors start."""
    code = (f"import contextlib, sys; sys.path.insert(0, {REPO!r})\n"
            "from dqn_cartpole.config import load_config\n"
            "from dqn_cartpole.distributed import parts\n"
            "from dqn_cartpole.distributed.variables import WeightSync\n"
            f"config = load_config({config_path!r}, {SETS!r})\n"
            "with contextlib.ExitStack() as stack:\n"
            "    _, _, agent = parts.agent_with_envs(config, 1, 0, stack)\n"
            f"    WeightSync({address!r}, agent).push()\n")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
