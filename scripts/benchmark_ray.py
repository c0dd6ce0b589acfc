"""`train --topology ray` in the scale-out benchmark (`scripts/benchmark.py --scale-out 2 --ray [--ray-failures]`).

* `ray_solve_run`: one `--topology ray` run (a local Ray instance that the command starts and stops), timed like
  the others; besides, Ray's start-up seconds (the command's own line) and the peak RSS, sampled every 0.5 s, of
  Ray's processes (its GCS, raylet, agents and the role actors' workers) and, apart, of the roles' processes;
* `failure_table`: one run per failure of one role, each SIGKILLed (or, for a node, removed from a three-node
  `ray.cluster_utils.Cluster` whose health checks see a lost node within about 3 s, `HEALTH_CHECKS`) once the
  learner has checkpointed: how long until the role works again (a
  collector: its replacement's first write; the learner: its first train row after the restart; the server: the
  learner's next train row; the evaluator: its next evaluation), the run's exit status, and what the failure cost
  (train steps trained again, evaluations missed, the collector's own env-step count carried on or not).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

from benchmark_common import DEFAULT_REFERENCE, REPO, load_averages, reference_rate
from dqn_cartpole.run_folder.csv_files import read_csv  # (light: no TensorFlow)
from dqn_cartpole.processes.commands import set_flags
from dqn_cartpole.run_folder.placement import read_placement
FAILURES = ("collector process", "collector worker", "evaluator", "learner", "replay server", "worker node")
FAILURE_SETS = ["training.checkpoint_interval=1000", "training.log_interval=100", "evaluation.stop_when_solved=false",
                "training.num_iterations=10000", "video.enabled=false", "evaluation.eval_interval=250"]
KILL_AT = 2200  # train step: after the checkpoint at 2,000


def command(collectors: int, out: str, overrides: list) -> list:
    return [sys.executable, "-m", "dqn_cartpole", "train", "--topology", "ray", "--collectors", str(collectors),
            "--quiet", "--output-dir", out, *set_flags(overrides)]


# ---------------------------------------------------------------------------- time to solve, start-up, memory


class RssSampler:
    """Peak RSS of a `--topology ray` driver's Ray processes and, apart, of its roles' processes (the roles and their
    warm start-up processes, whose forks they are); and the peak of the roles' PSS (their shared pages counted once:
    a fork shares the warm process's imported libraries)."""

    def __init__(self, driver_pid: int):
        self.driver_pid, self.ray_peak, self.roles_peak, self.roles_pss_peak = driver_pid, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            ray_rss, roles_rss, roles_pss = self.sample()
            self.ray_peak, self.roles_peak = max(self.ray_peak, ray_rss), max(self.roles_peak, roles_rss)
            self.roles_pss_peak = max(self.roles_pss_peak, roles_pss)

    def sample(self) -> tuple[int, int, int]:
        import psutil

        sessions = glob.glob(f"/tmp/ray/session_*_{self.driver_pid}")
        if not sessions:
            return 0, 0, 0
        name = os.path.basename(sessions[0])
        ray_procs, roles = set(), set()
        for process in psutil.process_iter(["cmdline"]):
            if any(name in part for part in process.info["cmdline"] or []):
                ray_procs.add(process)
        for process in list(ray_procs):
            try:
                for child in process.children(recursive=True):
                    cmdline = " ".join(child.cmdline())
                    (roles if "-m dqn_cartpole" in cmdline else ray_procs).add(child)
            except psutil.Error:
                continue
        return _memory(ray_procs, "rss"), _memory(roles, "rss"), _memory(roles, "pss")

    def stop(self) -> tuple[float, float, float]:
        self._stop.set()
        self._thread.join()
        return self.ray_peak / 2 ** 20, self.roles_peak / 2 ** 20, self.roles_pss_peak / 2 ** 20


def _memory(processes: set, field: str) -> int:
    """The sum of the processes' `rss` (memory_info) or `pss` (memory_full_info; a process gone meanwhile counts 0)."""
    import psutil

    total = 0
    for process in processes:
        try:
            info = process.memory_info() if field == "rss" else process.memory_full_info()
            total += getattr(info, field)
        except (psutil.Error, AttributeError):
            continue
    return total


def ray_solve_run(collectors: int, out: str, overrides: list) -> tuple[dict, float, dict]:
    """(summary.json, the launch's Unix time, {ray_startup_s, ray_rss_mb, roles_rss_mb, roles_pss_mb}) of one run on
    a local Ray instance."""
    started = time.time()
    with open(out + ".log", "w") as log:
        process = subprocess.Popen(command(collectors, out, overrides), cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        sampler = RssSampler(process.pid)
        status = process.wait()
    ray_rss, roles_rss, roles_pss = sampler.stop()
    text = open(out + ".log").read()
    if status != 0:
        raise SystemExit(f"train --topology ray failed ({status}):\n{text[-2000:]}")
    match = re.search(r"Ray: started a local Ray instance in ([\d.]+) s", text)
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    return summary, started, {"ray_startup_s": float(match.group(1)) if match else float("nan"),
                              "ray_rss_mb": ray_rss, "roles_rss_mb": roles_rss, "roles_pss_mb": roles_pss}


# ---------------------------------------------------------------------------- one failure of one role


def placement(run_dir: str) -> dict:
    """The roles of the run's roles/placement.json ({} before it is written)."""
    found = read_placement(run_dir)
    return found["roles"] if found else {}


def train_step(run_dir: str) -> int:
    found = read_csv(os.path.join(run_dir, "train_metrics.csv"))
    return int(found[-1]["train_step"]) if found else 0


def wait(condition, timeout_s: float, process: subprocess.Popen, poll_s: float = 0.1) -> Optional[float]:
    """time.time() when `condition()` held (None: the run ended or `timeout_s` passed first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        if condition():
            return time.time()
        time.sleep(poll_s)
    return None


def failure_run(kind: str, workdir: str, address: Optional[str] = None, cluster=None) -> dict:
    """One run with one failure of `kind` (see FAILURES); what it cost."""
    out = os.path.join(workdir, "failure-" + kind.replace(" ", "-"))
    env = dict(os.environ, **({"RAY_ADDRESS": address} if address else {}))
    with open(out + ".log", "w") as log:
        process = subprocess.Popen(command(2, out, FAILURE_SETS + ["training.seed=1"]), cwd=REPO, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        wait(lambda: train_step(out) >= KILL_AT, 600, process)
        roles, killed_step = placement(out), train_step(out)
        killed = time.time()
        result = kill(kind, roles, cluster)
        result.update(recovery(kind, out, process, killed, killed_step, result.pop("role")))
        result["status"] = process.wait(900)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    result["lost"] = cost(kind, out, killed_step, result)
    return result


def kill(kind: str, roles: dict, cluster) -> dict:
    """SIGKILLs the process of `kind` (or removes a worker node holding a collector); {"role": its name}."""
    if kind == "worker node":
        by_node = {entry["node_id"]: name for name, entry in roles.items() if name.startswith("collector")}
        node = next(n for n in cluster.worker_nodes if n.node_id in by_node)
        cluster.remove_node(node, allow_graceful=False)
        return {"role": by_node[node.node_id]}
    name = {"collector process": "collector 0", "collector worker": "collector 1", "evaluator": "evaluator",
            "learner": "learner", "replay server": "replay server"}[kind]
    os.kill(roles[name]["worker_pid" if kind.endswith("worker") else "pid"], signal.SIGKILL)
    return {"role": name}


def recovery(kind: str, out: str, process, killed: float, killed_step: int, role: str) -> dict:
    """How long until the role works again, measured from the kill."""
    if role.startswith("collector"):
        path = os.path.join(out, "roles", f"collector-{role.split()[-1]}.csv")

        def wrote_again() -> bool:
            return any(float(r["unix_s"]) > killed for r in read_csv(path))

        watch = NoticeWatch(out + ".log", role, out)
        wait(lambda: watch() and wrote_again(), 180, process, poll_s=0.05)
        first = next((r for r in read_csv(path) if float(r["unix_s"]) > killed), None)
        # Its first row comes 5 s after it began collecting; its first window, within milliseconds of that start.
        back = float(first["unix_s"]) - float(first["wall_s"]) if first else None
        return {"role": role, "back_s": None if back is None else back - killed,
                "phases": restart_phases(out, role, killed, watch)}
    if kind == "evaluator":
        path = os.path.join(out, "eval_metrics.csv")
        before = len(read_csv(path))
        back = wait(lambda: len(read_csv(path)) > before, 180, process)
        return {"role": role, "back_s": None if back is None else back - killed}
    if kind == "replay server":  # it answers again; then the learner trains on (it may have read ahead)
        port = int(re.search(r"port (\d+), a learner", open(out + ".log").read()).group(1))
        from dqn_cartpole.distributed.policy import replay_answers

        answers = wait(lambda: replay_answers(f"localhost:{port}"), 180, process)
        step = train_step(out)
        back = wait(lambda: train_step(out) > step, 180, process) if answers else None
        return {"role": role, "back_s": None if back is None else back - killed,
                "answers_s": None if answers is None else answers - killed}
    back = wait(lambda: train_step(out) > killed_step and (kind != "learner" or resumed(out)), 180, process)
    return {"role": role, "back_s": None if back is None else back - killed}


class NoticeWatch:
    """Polled while a collector comes back: when the driver's log first said that `role` ended (its `warning: ROLE
    ...; restarting it` line), and when the processes of its new placement started (its actor's Ray worker, the
    warm start-up process, the role's own: read while they live)."""

    def __init__(self, log_path: str, role: str, run_dir: str):
        self.log_path, self.role, self.run_dir, self.seen = log_path, role, run_dir, None
        self.offset = os.path.getsize(log_path)
        self.before = placement(run_dir).get(role, {}).get("pid")
        self.started: dict = {}

    def __call__(self) -> bool:
        if self.seen is None:
            with open(self.log_path, errors="replace") as log:
                log.seek(self.offset)
                if f"warning: {self.role} " in log.read():
                    self.seen = time.time()
        if not self.started:
            entry = placement(self.run_dir).get(self.role, {})
            if entry.get("pid") not in (None, self.before):
                self.started = started_times(entry)
        return True


def started_times(entry: dict) -> dict:
    """When the processes of a placement started (Unix time): its actor's worker, the role's parent (the warm
    start-up process), the role's own."""
    import psutil

    found = {}
    try:
        role = psutil.Process(entry["pid"])
        found["role"], found["warm"] = role.create_time(), psutil.Process(role.ppid()).create_time()
        found["worker"] = psutil.Process(entry["worker_pid"]).create_time()
    except (KeyError, TypeError, psutil.Error):
        pass
    return found


def restart_phases(out: str, role: str, killed: float, watch: NoticeWatch) -> list:
    """Where a collector's restart seconds went, as (phase, seconds), one after the other from the kill: the driver's
    notice, a new actor process (Ray's worker; none if the actor kept its process), its warm start-up process (none
    if it kept it), the role's own process (a fork of the warm one), then the role's own phases (its log's
    `StartClock` line: config, envs and agent, ..., its first windows written)."""
    log = open(os.path.join(out, "roles", f"collector-{role.split()[-1]}.log"), errors="replace").read()
    found = [m for m in re.finditer(r"writing [\d.]+ s after its process started at unix ([\d.]+) \((.*)\)", log)
             if float(m.group(1)) > killed]
    started = watch.started
    points = [("the driver heard of it", watch.seen),
              ("a new actor process (Ray worker) started", started.get("worker")),
              ("its warm start-up process started", started.get("warm")),
              ("the role's process forked (Python and TensorFlow imported)",
               float(found[0].group(1)) if found else started.get("role"))]
    phases, at = [], killed
    for name, when in points:
        if when is not None and when >= at:
            phases.append((name, when - at))
            at = when
    for part in found[0].group(2).split(", ") if found else []:
        match = re.fullmatch(r"(.+) ([\d.]+) s", part)
        if match:
            phases.append((match.group(1), float(match.group(2))))
    return phases


def resumed(out: str) -> Optional[int]:
    text = open(os.path.join(out, "roles", "learner.log")).read()
    match = re.search(r"Resumed from ckpt-\d+: iteration \d+ of \d+, train step (\d+)", text)
    return int(match.group(1)) if match else None


def cost(kind: str, out: str, killed_step: int, result: dict) -> str:
    """What the failure cost the run, from its files."""
    train = [int(r["train_step"]) for r in read_csv(os.path.join(out, "train_metrics.csv"))]
    gaps = max((b - a for a, b in zip(train, train[1:])), default=0)
    evals = [int(r["train_step"]) // 250 for r in read_csv(os.path.join(out, "eval_metrics.csv"))]  # eval_interval
    missed = sum(b - a - 1 for a, b in zip(evals, evals[1:]) if b - a > 1)
    parts = []
    resumed_at = resumed(out)
    if resumed_at is not None and resumed_at <= killed_step:
        parts.append(f"the learner resumed from its checkpoint at train step {resumed_at:,} (logged {killed_step:,} "
                     f"at the kill): {killed_step - resumed_at:,} train steps trained again")
    elif resumed_at is not None:
        parts.append(f"the learner checkpointed its buffer at train step {resumed_at:,} when stopped, and resumed "
                     f"there: no train step lost")
    if kind == "replay server":
        if result.get("answers_s") is not None:
            parts.append(f"the server answered again after {result['answers_s']:.1f} s; the queue's windows (at "
                         f"most 25) lost")
    if kind == "evaluator":
        parts.append(f"{missed} evaluation interval(s) without a row" if missed else "no evaluation interval missed")
    if result["role"].startswith("collector"):
        path = os.path.join(out, "roles", f"collector-{result['role'].split()[-1]}.csv")
        steps = [int(r["env_steps"]) for r in read_csv(path)]
        parts.append("its env-step count carried on" if steps == sorted(steps) else "its env-step count restarted")
    parts.append(f"train rows continuous (largest gap {gaps} steps)" if train == sorted(set(train))
                 else "train rows repeated")
    return "; ".join(parts)


def failure_table(workdir: str, kinds: tuple = FAILURES) -> None:
    """Each failure in its own run; a worker node on a three-node cluster on this machine."""
    print("\n| `--topology ray`, 2 collectors, one failure (SIGKILL at train step 2,200) | works again after | exit "
          "status | what it cost |\n| --- | --- | --- | --- |", flush=True)
    phases = []
    for kind in kinds:
        if kind == "worker node":
            try:
                result = node_failure(workdir)
            except Exception as exc:  # pylint: disable=broad-except  # Ray's start-up raises a bare Exception
                print(f"| {kind} | not measured: the three-node cluster did not start ({exc}) | - | - |", flush=True)
                continue
        else:
            result = failure_run(kind, workdir)
        back = "never" if result["back_s"] is None else f"{result['back_s']:.1f} s"
        print(f"| {kind} ({result['role']}) | {back} | {result['status']} | {result['lost']} |", flush=True)
        if result.get("phases"):
            phases.append((kind, result["phases"]))
    for kind, found in phases:  # where a collector's restart seconds went
        print(f"\n{kind}: " + "; ".join(f"{name} +{seconds:.2f} s" for name, seconds in found)
              + f" (sum {sum(s for _, s in found):.2f} s)", flush=True)


# How soon Ray's GCS declares a silent node dead: a health check every second, 3 missed ones (Ray's defaults, 3 s
# and 5 after a first 5 s, take 15 s and more). On a real cluster, set on the head node before `ray start --head`:
# RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=3 (see docs/scale-out.md).
HEALTH_CHECKS = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


def node_failure(workdir: str) -> dict:
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "object_store_memory": 100 * 2 ** 20,
                                                            "_system_config": HEALTH_CHECKS})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=100 * 2 ** 20)
        cluster.wait_for_nodes()
        return failure_run("worker node", workdir, cluster.address, cluster)
    finally:
        cluster.shutdown()


def main(argv: list) -> None:
    """The failure runs alone, between two runs of the reference loop, with the load average before and after."""
    import argparse

    parser = argparse.ArgumentParser(description="one --topology ray run per failure (scripts/benchmark_ray.py)")
    parser.add_argument("--failures", default=",".join(FAILURES), help=f"among: {', '.join(FAILURES)}")
    parser.add_argument("--reference", default=DEFAULT_REFERENCE, metavar="PATH")
    parser.add_argument("--iterations", type=int, default=3000, help="the reference loop's iterations")
    parser.add_argument("--run-iterations", type=int, default=10000,
                        help=f"each failure run's iterations (at least {KILL_AT + 1000}: the kill is at {KILL_AT})")
    args = parser.parse_args(argv)
    FAILURE_SETS[FAILURE_SETS.index("training.num_iterations=10000")] = \
        f"training.num_iterations={max(args.run_iterations, KILL_AT + 1000)}"
    kinds = tuple(kind.strip() for kind in args.failures.split(","))
    unknown = [kind for kind in kinds if kind not in FAILURES]
    if unknown:
        parser.error(f"--failures: unknown {', '.join(unknown)} (known: {', '.join(FAILURES)})")
    started, loads = time.time(), [load_averages()]
    before = reference_rate(args.reference, args.iterations)
    failure_table(tempfile.mkdtemp(prefix="dqn-bench-ray-"), kinds)
    after = reference_rate(args.reference, args.iterations)
    loads.append(load_averages())
    print(f"\nreference loop (the tutorial's own): {before:.0f} it/s at the start, {after:.0f} at the end; load "
          f"average (1/5/15 min) {loads[0]} at the start, {loads[1]} at the end; {time.time() - started:.0f} s")


if __name__ == "__main__":  # the failure runs alone: python scripts/benchmark_ray.py [--failures ...]
    main(sys.argv[1:])
