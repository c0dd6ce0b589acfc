"""The config's schema: one frozen dataclass per section, each field typed and declared with everything about it
(`declare.key`: its description, its choices or the constraint on its value, when it applies), its default
configs/default.yaml's (`declare.section_defaults`). A new key is one field here and its default in that file."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Optional

from dqn_cartpole.config import files
from dqn_cartpole.config.coerce import suggest
from dqn_cartpole.config.declare import (Check, When, at_least, between, default_values, key as _f, positive,
                                         section_defaults as _section_defaults)
from dqn_cartpole.errors import ConfigError


MAX_SEED = 2**31 - 1  # NumPy takes seeds below 2^32, and the seed offsets are added to it
REVERB, DATASET, VIDEO = When("backend", ("reverb",)), When("sampling", ("dataset",)), When("enabled", (True,))
PRIORITIZED = When("prioritized", (True,))


@dataclass(frozen=True)
@_section_defaults("env")
class EnvConfig:
    """The gymnasium environment."""

    id: str = _f("gymnasium env id; needs a Box observation and a Discrete action space")
    num_envs: int = _f("copies of the env stepped together for collection (1 = the tutorial)", check=positive())
    max_episode_steps: Optional[int] = _f("override the env's time limit (null = the env's own)", check=positive())


@dataclass(frozen=True)
@_section_defaults("network")
class NetworkConfig:
    """The Q-network."""

    fc_layer_params: tuple = _f("units of each hidden Dense layer (ReLU, VarianceScaling init)",
                                check=Check(lambda sizes: bool(sizes) and min(sizes) > 0,
                                            "a non-empty list of positive sizes"))
    noisy: bool = _f("factorised Gaussian noisy layers (Fortunato et al., 2018) instead of Dense: they explore, so "
                     "the collect policy's epsilon is 0 (agent.epsilon_* are ignored); the greedy policy, the "
                     "evaluation and the exported policy act on the mean weights")
    noisy_sigma0: float = _f("sigma0 of the noisy layers: each starts with sigma = sigma0 / sqrt(inputs)",
                             check=positive(), when=When("noisy", (True,)))
    dueling: bool = _f("dueling head (Wang et al., 2016): Q = V + A - mean(A) from a value and an advantage stream "
                       "on the last hidden layer; for c51 per atom, Rainbow's distributional dueling head")


AGENT_KINDS = ("dqn", "double_dqn", "c51")
C51_DEFAULTS = {"num_atoms": 51, "min_q_value": -10.0, "max_q_value": 10.0}  # what null means for kind c51


@dataclass(frozen=True)
@_section_defaults("agent")
class AgentConfig:
    """The value-based agent."""

    kind: str = _f("the agent: dqn (TF-Agents' DqnAgent), double_dqn (DdqnAgent: the target network evaluates the "
                   "online network's greedy action) or c51 (CategoricalDqnAgent: a distribution over num_atoms "
                   "values per action)", choices=AGENT_KINDS)
    double_dqn: Optional[bool] = _f("deprecated: write kind: double_dqn (true) or kind: dqn (false); loading it "
                                    "prints a note and sets kind (null = not given)")
    learning_rate: float = _f("Adam learning rate", check=positive())
    td_loss: str = _f("TD loss: huber is linear beyond an error of 1, so large errors move the weights less (C51's "
                      "loss is the cross-entropy of the projected target distribution)", choices=("squared", "huber"),
                      kinds=("dqn", "double_dqn"))
    gamma: float = _f("discount factor, in [0, 1]", check=between(0, 1))
    epsilon_start: float = _f("epsilon of the epsilon-greedy collect policy at train step 0", check=between(0, 1))
    epsilon_end: float = _f("epsilon after epsilon_decay_steps train steps", check=between(0, 1))
    epsilon_decay_steps: int = _f("train steps over which epsilon falls linearly from start to end", check=positive())
    target_update_period: int = _f("train steps between target-network updates", check=positive())
    target_update_tau: float = _f("target update factor, in (0, 1]; 1 copies the weights",
                                  check=between(0, 1, low_open=True))
    solved_target_update_period: Optional[int] = _f(
        "target_update_period from the run's first confirmed solve on, for a run that trains on after it "
        "(evaluation.stop_when_solved false; null = unchanged)", check=positive())
    solved_target_update_tau: Optional[float] = _f(
        "target_update_tau from the run's first confirmed solve on, for a run that trains on after it (null = "
        "unchanged)", check=between(0, 1, low_open=True))
    solved_learning_rate: Optional[float] = _f(
        "learning_rate from the run's first confirmed solve on, for a run that trains on after it: the weights that "
        "passed the solve check come back, then train at this rate, so 0 holds them to the last step (null = "
        "unchanged: the live weights train on)", check=at_least(0))
    gradient_clipping: Optional[float] = _f("clip gradients to this global norm (null = off)", check=positive())
    n_step: int = _f("n-step TD update; replay holds sequences of n_step + 1 steps", check=positive())
    num_atoms: Optional[int] = _f(f"C51: atoms of each action's return distribution, at least 2 (null = "
                                  f"{C51_DEFAULTS['num_atoms']})", check=at_least(2), kinds=("c51",))
    min_q_value: Optional[float] = _f(f"C51: the lowest atom, the smallest return the distribution can hold (null = "
                                      f"{C51_DEFAULTS['min_q_value']:g}, the paper's, for rewards clipped to [-1, 1])",
                                      kinds=("c51",))
    max_q_value: Optional[float] = _f(f"C51: the highest atom, above min_q_value (null = "
                                      f"{C51_DEFAULTS['max_q_value']:g})", kinds=("c51",))
    double_q: bool = _f("C51: the online network picks the next state's action and the target network's "
                        "distribution there is bootstrapped (double Q, as in Rainbow); false: the target network "
                        "picks it (TF-Agents' C51)", kinds=("c51",))


@dataclass(frozen=True)
@_section_defaults("replay")
class ReplayConfig:
    """The replay buffer."""

    backend: str = _f("replay buffer: reverb (an embedded server, opens a port), tf_uniform or py_uniform (one env "
                      "only)", choices=("reverb", "tf_uniform", "py_uniform"))
    capacity: int = _f("maximum transitions kept; the oldest are evicted first", check=positive())
    sampling: str = _f("dataset (tf.data, parallel + prefetch), direct (in program order, reproducible; uniform "
                       "buffers only) or auto (direct for the uniform buffers, dataset for Reverb)",
                       choices=("auto", "dataset", "direct"))
    num_parallel_calls: int = _f("parallel sampling calls in the tf.data pipeline", check=positive(), when=DATASET)
    prefetch: int = _f("batches the tf.data pipeline prepares ahead", check=positive(), when=DATASET)
    reverb_port: Optional[int] = _f("port of the embedded Reverb server (null = a free port)", when=REVERB,
                                    check=Check(lambda port: 0 < port < 65536, "a port in 1..65535"))
    reverb_max_cycle_length: int = _f("Reverb streams read in parallel, each yielding whole batches (Acme's "
                                      "make_reverb_dataset; 4 was the fastest of 1-8 on 2 cores)",
                                      check=positive(), when=REVERB)
    reverb_dataset_buffer_size: Optional[int] = _f("samples in flight per Reverb stream (null = 2 x the batch)",
                                                   check=positive(), when=REVERB)
    reverb_num_workers_per_iterator: int = _f("threads sampling for each Reverb stream (-1 = Reverb picks)",
                                              check=Check(lambda threads: threads == -1 or threads > 0,
                                                          "-1 (Reverb picks) or positive"), when=REVERB)
    prioritized: bool = _f("prioritized replay (Schaul et al., 2016): sample each item with probability p^alpha / "
                           "sum p^alpha of its priority p, and scale its loss by its importance weight (reverb or "
                           "py_uniform; false = uniform)")
    priority_exponent: float = _f("alpha: how much the priorities count (0 = uniform sampling, 1 = in proportion)",
                                  check=between(0, 1), when=PRIORITIZED)
    importance_exponent: float = _f("beta at train step 0: the importance weights (N P(i))^-beta, divided by the "
                                    "batch's largest, undo that much of the sampling's bias",
                                    check=between(0, 1), when=PRIORITIZED)
    importance_anneal_steps: int = _f("train steps over which beta rises linearly to 1", check=positive(),
                                      when=PRIORITIZED)
    priority_epsilon: float = _f("added to every written priority (|n-step TD error| for dqn and double_dqn, the "
                                 "item's cross-entropy for c51), so no item is never sampled again",
                                 check=positive(), when=PRIORITIZED)


@dataclass(frozen=True)
@_section_defaults("training")
class TrainingConfig:
    """The training loop."""

    seed: int = _f("seeds Python, NumPy, TensorFlow and the environments", check=between(0, MAX_SEED))
    num_iterations: int = _f("iterations; each collects, then trains", check=positive())
    initial_collect_steps: int = _f("env steps of a random policy that fill the buffer first")
    collect_steps_per_iteration: int = _f("env steps collected per iteration, summed over envs", check=positive())
    train_steps_per_iteration: int = _f("gradient steps per iteration", check=positive())
    batch_size: int = _f("transitions per gradient step", check=positive())
    log_interval: int = _f("iterations between rows of train_metrics.csv (loss: mean and max over the interval)",
                          check=positive())
    checkpoint_interval: int = _f("iterations between checkpoints (resume with: train --resume RUN_DIR)",
                                 check=positive())
    keep_checkpoints: int = _f("newest complete checkpoints kept in RUN_DIR/checkpoints; older ones are deleted",
                              check=positive())
    jit_compile: bool = _f("compile each gradient step with XLA (slower inside the compiled loop on CPU: off by "
                           "default)")


@dataclass(frozen=True)
@_section_defaults("collection")
class CollectionConfig:
    """How the collect policy steps the envs."""

    driver: str = _f("compiled (a TF driver inside the compiled loop, fastest) or py (the tutorial's PyDriver + "
                     "PyTFEagerPolicy in Python, then a compiled train step)", choices=("compiled", "py"))
    graph_env: bool = _f("CartPole-v0/v1 under the compiled driver: step the env in TensorFlow ops inside the "
                         "compiled loop (the same episodes as gymnasium's, bit for bit, from the same seed; "
                         "faster) instead of gymnasium through a Python callback; other envs always use gymnasium",
                         when=When("driver", ("compiled",)))


@dataclass(frozen=True)
@_section_defaults("distributed")
class DistributedConfig:
    """Roles as separate processes (train --topology local, replay-server, collect, learn); a single-process run
    ignores this section."""

    replay: str = _f("where the replay lives: 'learner' keeps it in the learner's own in-graph buffer (fast), fed "
                     "through a queue on the server; 'server' keeps one shared replay table on the server "
                     "(checkpointed there, for several learners), which the learner samples over the network",
                     choices=("learner", "server"))
    weight_refresh_steps: int = _f("env steps a collector takes between pulls of the learner's weights (about 1 ms "
                                   "each)", check=positive())
    weight_push_interval: int = _f("learner train steps between pushes of its weights to the variables table (a "
                                   "background thread pushes them while the learner trains)", check=positive())
    server_checkpoint_s: Optional[float] = _f("seconds between the replay server's own table checkpoints (null = "
                                              "only when it stops and with each learner checkpoint; a timer races "
                                              "a learner's checkpoint, which moves the newest)", check=positive())
    connect_timeout_s: float = _f("seconds a role waits for the replay server at start-up before it gives up",
                                  check=positive())
    rate_limiter_timeout_ms: int = _f("a learner's sample waits this long for data, then fails (no freeze)",
                                      check=positive())
    final_evaluation_timeout_s: float = _f("seconds a learner that trained all its iterations waits for the "
                                           "evaluate-live role's evaluation of its final weights", check=positive())
    samples_per_insert: Optional[float] = _f("sampled items per inserted item (a batch of 64 counts 64). replay "
                                             "learner: the learner reads exactly this (null = as one process: "
                                             "batch_size x train_steps / collect_steps per iteration); server: "
                                             "Reverb's SampleToInsertRatio (null = no ratio, MinSize(1))",
                                             check=positive("positive or null"))
    samples_per_insert_tolerance: float = _f("how far (in sampled items) the ratio may drift before one side waits; "
                                             "learner: the queue holds tolerance / samples_per_insert items; "
                                             "server: prefetched samples count too")


@dataclass(frozen=True)
@_section_defaults("evaluation")
class EvaluationConfig:
    """Periodic greedy evaluation."""

    eval_interval: int = _f("iterations between evaluations", check=positive())
    num_eval_episodes: int = _f("greedy episodes per evaluation", check=positive())
    stop_when_solved: bool = _f("stop early once the greedy policy reaches solve_return")
    solve_return: Optional[float] = _f("average return that counts as solved (null = the env's registered reward "
                                       "threshold; an env without one needs it)")
    solve_episodes: int = _f("fresh greedy episodes of the solve check, which an evaluation reaching solve_return "
                             "starts: their average must reach it too to confirm a solve (which stops the run, or "
                             "with stop_when_solved false only marks it)", check=positive())
    solve_margin: float = _f("standard errors of the check's average that must lie above solve_return (0: the "
                             "average alone, gymnasium's definition of solved)", check=at_least(0, "0 or more"))
    final_episodes: int = _f("fresh greedy episodes that score policy/final, the weights at the last step, when a "
                             "run ends without stopping on a solve (the fixed-budget protocol's score)",
                             check=positive())
    overlap: str = _f("where the evaluations and the solve check run: process (a child process on the other core, "
                      "on a copy of the weights, while the training goes on; the result is taken in one eval_interval "
                      "later, so a solve stops the run there and policy/final is the copy that passed), thread (the "
                      "same in a thread, which shares the trainer's GIL) or inline (training waits for each); a "
                      "population (train --population) takes each outcome in 50 iterations later instead",
                      choices=("process", "thread", "inline"))


@dataclass(frozen=True)
@_section_defaults("video")
class VideoConfig:
    """The mp4s of the trained and the random agent."""

    enabled: bool = _f("record videos at the end of training")
    num_episodes: int = _f("episodes of the trained (greedy) agent in its video", check=positive(), when=VIDEO)
    random_episodes: int = _f("episodes of the random agent in its video", check=positive(), when=VIDEO)
    fps: int = _f("frames per second of the mp4", check=positive(), when=VIDEO)


@dataclass(frozen=True)
@_section_defaults("output")
class OutputConfig:
    """Where the run's files go."""

    root: str = _f("folder that holds one folder per run (relative to the working directory)")
    run_name: Optional[str] = _f("run folder name (null = <env>__s<seed>__<time>)",
                                 check=Check(lambda name: bool(name) and "/" not in name, "a plain folder name", repr))
    tensorboard: bool = _f("write TensorBoard event files")


TRACKERS = ("mlflow", "wandb")
TRACKING = When("backend", TRACKERS)


@dataclass(frozen=True)
@_section_defaults("tracking")
class TrackingConfig:
    """Where the run is tracked (train/sweep/tune --track, docs/tracking.md): MLflow to a local SQLite store under
    output.root unless MLFLOW_TRACKING_URI names another, its metrics as the run trains; W&B offline unless online
    is asked for, once the run ended."""

    backend: Optional[str] = _f("the tracking service: mlflow or wandb (null = none: nothing is imported or sent; "
                                "--track NAME sets it)", choices=TRACKERS)
    project: Optional[str] = _f("MLflow experiment or W&B project (null = dqn_cartpole)", when=TRACKING,
                                check=Check(bool, "a non-empty name", repr))
    run_name: Optional[str] = _f("the tracked run's name (null = the run folder's name)", when=TRACKING,
                                 check=Check(bool, "a non-empty name", repr))
    group: Optional[str] = _f("runs that belong together: a W&B group, an MLflow tag (a sweep or a study sets its "
                              "name; null = none)", when=TRACKING, check=Check(bool, "a non-empty name", repr))
    tags: tuple[str, ...] = _f("extra tags, each NAME or NAME=VALUE", when=TRACKING,
                     check=Check(lambda tags: all(tag.split("=", 1)[0].strip() for tag in tags),
                                 "a list of NAME or NAME=VALUE strings"))
    online: bool = _f("W&B: send as the run goes (needs `wandb login`); false = offline, synced later with `wandb "
                      "sync`", when=When("backend", ("wandb",)))


@dataclass(frozen=True)
class Config:
    """The whole configuration of a run."""

    env: EnvConfig = field(default_factory=EnvConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    collection: CollectionConfig = field(default_factory=CollectionConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    video: VideoConfig = field(default_factory=VideoConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)


SECTIONS: dict[str, type] = typing.get_type_hints(Config)
ROLES_ONLY_SECTIONS = ("distributed",)  # read only when the roles run as processes
_UNKNOWN_DEFAULT_SECTIONS = sorted(set(default_values()) - set(SECTIONS))
if _UNKNOWN_DEFAULT_SECTIONS:  # the sections' own keys are checked as each section takes its defaults
    raise ConfigError(f"{files.default_config_path()}: unknown section '{_UNKNOWN_DEFAULT_SECTIONS[0]}'"
                      f"{suggest(_UNKNOWN_DEFAULT_SECTIONS[0], SECTIONS)}")



def fields(section: str) -> dict[str, dataclasses.Field]:
    """The fields of one section, by key."""
    return {f.name: f for f in dataclasses.fields(SECTIONS[section])}


NEVER_READ = ("agent.double_dqn",)  # deprecated: loading folds it into agent.kind; a resolved config holds null
# Keys a run reads only when a key of another section has one of some values (a field's own `when` reads its own
# section): noisy layers explore, so the epsilon schedule is not read; the solved_* keys act from a solve on, in a
# run that trains on past it.
ACROSS_SECTIONS = {**{f"agent.epsilon_{name}": ("network", When("noisy", (False,)))
                      for name in ("start", "end", "decay_steps")},
                   **{f"agent.solved_{name}": ("evaluation", When("stop_when_solved", (False,)))
                      for name in ("target_update_period", "target_update_tau", "learning_rate")}}


def applies(config: dict, dotted: str, distributed: bool = False) -> bool:
    """Whether `section.key` acts in a run with this resolved config (as plain data, e.g. a run's config.yaml):
    the run's agent, network, replay and loop read it. `distributed`: the run's roles are separate processes. The
    run report's config table and `compare`'s differing keys both ask this."""
    section, key = dotted.split(".", 1)
    if section in ROLES_ONLY_SECTIONS:
        return distributed
    if dotted in NEVER_READ:
        return False
    if dotted in ACROSS_SECTIONS:
        where, condition = ACROSS_SECTIONS[dotted]
        values = config.get(where, {})  # a run folder from before that key holds its default
        if not condition.holds({condition.key: values.get(condition.key, fields(where)[condition.key].default)}):
            return False
    spec = fields(section).get(key)
    condition = spec.metadata["condition"] if spec is not None else None
    return condition is None or condition.holds(config.get(section, {}))
