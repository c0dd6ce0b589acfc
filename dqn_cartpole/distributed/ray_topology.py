"""`train --topology ray --collectors N`: a run's roles as Ray actors, on a cluster or a local Ray instance.

The command (the driver) stays light (no TensorFlow): the CLI checks the input, joins the cluster that
`--address` or RAY_ADDRESS names, or starts a Ray instance on this machine for the run
(`processes.ray_cluster`), and only then creates and locks the run folder. Here it writes the run's
config.yaml, stages a resumed run's table, places the roles (`ray_placement`) and runs them under the
topology's rules (`policy.RAY`, applied by `supervision`): every single failure (a collector's or the
evaluator's process, a whole worker node, the learner, the server) is survived without a manual resume;
a role that dies 5 times within 120 s stops the run with one line and the resume command. A local Ray
instance is shut down at the end of the command.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from typing import Any, Iterator, Optional

from dqn_cartpole.config import Config, dump_yaml
from dqn_cartpole.console import signals
from dqn_cartpole.distributed import launcher, policy
from dqn_cartpole.distributed.ray_placement import RayPlacement
from dqn_cartpole.distributed.supervision import Supervision
from dqn_cartpole.processes import ray_private
from dqn_cartpole.processes.ray_node import this_node
from dqn_cartpole.run_folder import checkpointing
from dqn_cartpole.run_folder.layout import RunLayout
from dqn_cartpole.run_folder.placement import PlacementRecord
from dqn_cartpole.run_folder.record import write_summary

RAY_ERRORS_LOG = "ray-errors.log"  # what Ray's own processes report to the driver (a worker died, ...)


def run(config: Config, run_dir: str, collectors: int, plan: Optional[checkpointing.ResumePlan], quiet: bool,
        session: Any, started_s: float) -> int:
    """Runs the Ray topology in `session` (a `ray_cluster.Session`, joined or started `started_s` seconds ago);
    the caller holds the run folder's lock."""
    import ray  # pylint: disable=import-outside-toplevel  # the extra, present: the session is up

    from dqn_cartpole.replay.reverb_tables import check_port_free

    node = this_node()  # the driver's: it holds the run folder
    port = config.replay.reverb_port or launcher.free_port()
    check_port_free(port)
    layout = launcher.prepare_folder(config, run_dir, plan)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    cpus = sum(n.get("Resources", {}).get("CPU", 0) for n in nodes)
    print(f"Ray: {session.how} in {started_s:.1f} s ({len(nodes)} node(s), {cpus:g} CPUs)", flush=True)
    print(f"Ray topology: a replay server on {node['node_ip']} port {port}, a learner and an evaluator beside it, "
          f"{collectors} collector(s) spread over the cluster -> {run_dir} (logs in {layout.roles})", flush=True)
    placement = RayPlacement(ray, run_dir, dump_yaml(config), port, node, plan is not None, quiet)
    supervision = Supervision(placement, policy.make_roles(collectors), policy.RAY, run_dir, f"localhost:{port}",
                              policy.topology_args("ray", collectors), PlacementRecord(run_dir, "ray"))
    try:
        with signals.StopRequest() as stop:
            status = supervision.run(stop)
    finally:
        placement.close()
    return status


def command_time_line(run_dir: str, how: str, ray_start_s: float, command_s: float) -> None:
    """After the learner's summary (whose "Done in" is the learner's own time, over every command of the run): this
    command's whole time and Ray's start-up in it, on the console and in summary.json (`command_wall_s`,
    `ray_start_s`)."""
    path = RunLayout(run_dir).summary
    try:
        with open(path, encoding="utf-8") as handle:
            summary = json.load(handle)
    except (OSError, ValueError):
        return  # the learner never finished: nothing to add to
    summary.update(command_wall_s=round(command_s, 2), ray_start_s=round(ray_start_s, 2))
    with contextlib.suppress(OSError):
        write_summary(path, summary)
    print(f"The whole command took {command_s:.1f} s: Ray's start-up {ray_start_s:.1f} s ({how}), then the roles' "
          f"start and the run (\"Done in\" above is the learner's own time).", flush=True)


@contextlib.contextmanager
def quiet_ray(roles_dir: str) -> Iterator[None]:
    """Ray's own messages off the terminal, for a `ray.init` inside the block: its Python loggers' warnings (a note
    on token authentication at a local instance's start) and the errors its processes send the driver (a worker
    died: `supervision` says each role's end in one line) go to `roles_dir`/ray-errors.log once that folder
    exists (Ray has no switch for the latter: `processes.ray_private.cluster_errors_to`)."""
    ray_logger = logging.getLogger("ray")  # Ray's documented logger, the parent of its modules' own
    level = ray_logger.level
    ray_logger.setLevel(logging.ERROR)
    try:
        with ray_private.cluster_errors_to(functools.partial(_error_to_log, roles_dir=roles_dir)):
            yield
    finally:
        ray_logger.setLevel(level)


def _error_to_log(message: str, roles_dir: str) -> None:
    """One error the cluster published, appended to `roles_dir`/ray-errors.log (once the run's folder exists)."""
    if os.path.isdir(roles_dir):
        with open(os.path.join(roles_dir, RAY_ERRORS_LOG), "a", encoding="utf-8") as log:
            log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message.rstrip()}\n")
