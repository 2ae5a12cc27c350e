"""The one configuration object: a documented, validated, frozen dataclass.

Every process receives the same pickled ``Config``. Keyword arguments of ``APPO(...)`` override
these fields; an unknown keyword or a bad value raises ``ConfigError`` in the main process, with
every problem listed at once and what to change.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Tuple, TypedDict, Union

ALGOS = ("appo", "impala", "ppo")
CNNS = ("nature", "doom", "doom_relu", "tiny")
SMALL_IMAGES = ("flat", "conv")
CNN_PRECISIONS = ("auto", "float32", "bfloat16")
# Fields a running learner picks up between (and during) train() calls, without a restart; on
# APPO they are plain attributes (a number, or a schedule: progress_remaining -> number).
MUTABLE_HPARAMS = ("learning_rate", "gamma", "ent_coef", "clip_coef", "vf_coef", "max_grad_norm",
                   "vtrace_lambda")
ENGINE_SET = ("lanes_per_env",)  # fields the engine derives from the env: no command-line flag
# Fields of the whole process graph: with several trained policies, one policy's overrides
# (``policies={id: {...}}``) may set any field but these, which the rollout workers share.
GRAPH_FIELDS = ("num_workers", "num_envs_per_worker", "rollout", "sampler_nice", "device",
                "serial_mode", "seed", "verbose", "log_interval", "tensorboard_log", "stats_window",
                "worker_timeout", "on_env_error", "max_env_restarts", "max_worker_restarts")
# The largest global state (floats) a centralised critic reads by default (an MLP's input;
# spaces.EnvSpec.critic_state, SEVERAL_AGENTS_CRITIC_DEFAULTS). Ahead or level on states of 14-384
# floats (simple_spread with three, six and eight agents, simple_reference, speaker-listener),
# behind on the two larger ones measured, both of eight agents: collect_treasure (684: the
# training return's last fifth -0.7 to 0.6 against 1.6 independent, 3 seeds of 3, at 0.54-0.59 of
# the rate) and pursuit (768: the target in 47-90 s against 78-161 s, the training return's middle
# fifths behind in 3 seeds of 3); as MAPPO found of states that concatenate many agents'
# observations (docs/benchmarks/learning-suite.md, "The centralised critic with eight agents").
CRITIC_STATE_MAX = 512
DEVICES_HINT = '"cpu", "cuda", "cuda:N" or "auto"'


class ConfigError(ValueError):
    """A configuration value (or combination of values) that asyncrl cannot run with."""


def _f(default, doc: str, **kw):
    return field(default=default, metadata={"doc": doc}, **kw)


# The smallest factor kl_adaptive_lr may put on learning_rate (the learner's floor; the largest
# is Config.kl_adaptive_lr_max, which may not go below it).
KL_ADAPTIVE_LR_MIN = 0.01


@dataclass(frozen=True)
class Config:
    # --- processes and sampling -------------------------------------------------------------
    num_workers: int = _f(2, "Rollout worker processes.")
    num_envs_per_worker: int = _f(
        8, "Envs per rollout worker, split into two groups stepped in turn (must be even).")
    num_policy_workers: int = _f(1, "Policy (inference) worker processes.")
    rollout: int = _f(32, "Rollout length T: env steps per trajectory slot.")
    batch_size: int = _f(
        1024, "Samples (T x trajectories) per learner update; a multiple of rollout x envs per group.")
    learner_threads: int = _f(
        1, "Torch intra-op threads of the learner process (the other processes use one each).")
    sampler_nice: int = _f(
        0, "Niceness added to the rollout and policy worker processes (0-19). Where the learner "
        "shares the CPU with sampling and is the bottleneck (a CNN learning asynchronously on a "
        "CPU), a positive value lets its threads run first and sampling fill the rest "
        "(measured: the Atari guide).")
    batches_to_accumulate: int = _f(
        2, "Batches the sampling may collect ahead of the learner before it waits for free "
        "trajectory slots (Sample Factory's num_batches_to_accumulate): where the learner is the "
        "bottleneck, it trains on samples up to about this many policy versions old. The "
        "shared buffer holds this many batches of slots plus one per env group (synchronous "
        "PPO: one batch).")
    spread_first_episodes: bool = _f(
        False, "Truncate each env's first episode at a point spread over the env's time limit "
        "(env k of N at (k + 1) / N of it; bootstrapped like any time limit, not logged as an "
        "episode), so that envs whose episodes all run to the limit do not stay in step (every "
        "batch would otherwise hold the same stretch of each env's episode). Single-agent envs "
        "with a time limit (`spec.max_episode_steps` or a TimeLimit wrapper); others unchanged. "
        "Off by default: measured over 1M env steps it lifts Swimmer (greedy median 54 against "
        "42, 3 seeds) and leaves Walker2d as it was, but stalls HalfCheetah more often (3 seeds "
        "of 8 under 2,000 against 1; median 3,018 against 4,046) at the initial std of then; at "
        "today's (2026-12-06) HalfCheetah no longer stalls with it (0 of 7; median 6,100 against "
        "6,151) and Pusher and Swimmer gained nothing (the learning suite's page).")
    device: str = _f("auto", f"Torch device of the learner and policy workers: {DEVICES_HINT}.")
    algo: str = _f(
        "appo", "appo: V-trace + PPO clipping (default); impala: V-trace, no clipping, one epoch; "
        "ppo: synchronous collection (every sample from the latest policy; the default for ALE "
        "ids, and for continuous actions of more than four dimensions learnt on a CPU, but in "
        "turn-based games).")
    serial_mode: bool = _f(False, "Run every component in the main process, in turn (debugging).")
    seed: Optional[int] = _f(None, "Seed of weights, envs and action sampling (None: random).")
    lanes_per_env: int = _f(
        1, "Set by the engine from the env, not by hand: trajectory columns (lanes) per env, one "
        "per agent of a multi-agent env that may play the trained policy; 1 for a single-agent "
        "env. Batch sizes count agent steps.")

    # --- optimisation -----------------------------------------------------------------------
    learning_rate: float = _f(5e-4, "Adam learning rate (0 freezes the policy; a schedule may end "
                               "at 0).")
    adam_eps: float = _f(1e-5, "Adam epsilon.")
    num_epochs: int = _f(4, "Passes over each batch (IMPALA: 1).")
    minibatch_size: int = _f(
        128, "Samples per gradient step; must divide batch_size (the default: 8 steps per batch "
        "and epoch).")
    gamma: float = _f(0.99, "Discount factor.")
    vtrace_lambda: float = _f(
        0.95, "Trace-cutting lambda of V-trace (1.0: the IMPALA paper's; 0.95: GAE's lambda in "
        "SB3's, CleanRL's and Sample Factory's PPO).")
    vtrace_rho_clip: float = _f(1.0, "V-trace rho-bar: clip of importance weights in the targets.")
    vtrace_c_clip: float = _f(1.0, "V-trace c-bar: clip of the trace coefficients.")
    vtrace_pg_rho_clip: float = _f(1.0, "Clip of importance weights in the policy-gradient advantages.")
    clip_coef: float = _f(0.15, "PPO ratio clipping epsilon.")
    decoupled_clip: bool = _f(
        False, "Take PPO's ratio against the learner's policy at the start of each update, with "
        "V-trace's clipped importance weight pi/mu in the advantage correcting for the policy "
        "lag (decoupled PPO, Hilton et al. 2021; IMPACT, Luo et al. 2020): lagged samples keep "
        "their gradient. False: against the policy that sampled (Sample Factory's APPO), which "
        "clips away samples whose policy has drifted by more than clip_coef.")
    dual_clip: Optional[float] = _f(
        None, "Dual-clip PPO (Ye et al. 2020): a sample with a negative advantage adds at most "
        "dual_clip x |advantage| to the policy loss, however far its ratio has grown (the "
        "clipped surrogate bounds only the other side). None: off; else a number > 1.")
    vf_clip_coef: Optional[float] = _f(
        None, "Clip of the value change per update (None: unclipped value loss).")
    target_kl: Optional[float] = _f(
        0.02, "End an update early, before the first minibatch that finds the policy moved by "
        "more than 1.5 x this KL from where the update started (SB3's target_kl): a converged, "
        "nearly deterministic policy otherwise takes jumps that can collapse it. None: every "
        "minibatch of every epoch steps.")
    kl_adaptive_lr: Optional[float] = _f(
        None, "Adapt the learning rate to this KL (rl_games' and Sample Factory's adaptive "
        "schedule, e.g. 0.008): before each minibatch step that finds the policy moved from the "
        "update's start by more than 2 x this KL, a factor on learning_rate (or its schedule) "
        f"falls 1.5x; by less than half of it, the factor rises 1.5x; within [{KL_ADAPTIVE_LR_MIN}, "
        "kl_adaptive_lr_max], from 1 in each learner process. None: off (continuous actions "
        "imply 0.02 with kl_adaptive_lr_max 1, a brake: docs/benchmarks/learning-suite.md).")
    kl_adaptive_lr_max: float = _f(
        30.0, "The largest factor kl_adaptive_lr may put on learning_rate (1: it only slows "
        "the rate where the policy moves too far, never raises it above learning_rate).")
    ent_coef: float = _f(0.005, "Entropy bonus coefficient.")
    vf_coef: float = _f(0.5, "Value loss coefficient.")
    max_grad_norm: float = _f(0.5, "Gradient-norm clip.")
    normalize_advantages: bool = _f(True, "Normalise advantages per minibatch.")
    advantage_std_floor: float = _f(
        0.01, "Divide a minibatch's advantages by their std, but by no less than this fraction "
        "of the value targets' running std (the normalize_returns statistics; of 1 without "
        "them). Once a task is solved the advantages are the value head's noise (std ~1e-4 "
        "where they were ~0.1), which their own std would scale back to unit-sized steps that "
        "drive a near-deterministic policy until it collapses (MiniGrid LavaGapS5, "
        "docs/benchmarks/learning-suite.md). 0: by the std alone (SB3's, CleanRL's); the Atari "
        "and VizDoom presets keep 0 (not measured there).")
    reward_clip: Optional[float] = _f(
        None, "Clip rewards to [-reward_clip, reward_clip] in the learner (Atari: 1.0); logged "
        "episode returns stay raw. None: no clipping.")
    bootstrap_truncation: bool = _f(
        True, "At a time-limit truncation, add gamma x V(last observation before the limit) to "
        "the reward instead of treating the state as terminal (the final observation itself is "
        "not stored; its predecessor's value stands in for it).")
    max_policy_lag: int = _f(
        50, "Samples made by a policy more than this many versions older than the learner's are "
        "masked out of the loss.")

    # --- model ------------------------------------------------------------------------------
    hidden_sizes: Tuple[int, ...] = _f((64, 64), "Hidden layer widths of the MLP (vector obs).")
    activation: str = _f("tanh", 'MLP activation: "tanh" or "relu".')
    cnn: str = _f("nature", 'Encoder of uint8 image obs: "nature" (Mnih et al. 2015: 3 convolutions '
                  '+ 512 units, ReLU), "doom" (Sample Factory\'s convnet_simple: 32 8x8/4, 64 4x4/2, '
                  '128 3x3/2 + 512 units, ELU), "doom_relu" (the same with ReLU: the Doom default, '
                  'faster and quicker to learn: docs/guides/vizdoom.md); images under 36 x 36 get '
                  'small_images\' encoder, boards of 0/1 planes (PettingZoo\'s classic games) two '
                  '3 x 3 convolutions + 128 units. Or "tiny" '
                  '(every 8th pixel + 32 units: for throughput tests, where inference and learning '
                  'cost next to nothing).')
    small_images: str = _f(
        "flat", 'Encoder of uint8 images under 36 x 36 (MiniGrid\'s 7 x 7 views, more often a grid '
        'of ids than a camera frame), each channel normalised by running statistics (not divided '
        'by 255): "flat": the cells flattened into the MLP, as SB3\'s MLP sees such a grid; "conv": '
        'two 3 x 3 convolutions + 128 units, ~4x the learner\'s work per env step (MiniGrid, '
        'docs/benchmarks/learning-suite.md: about the same env steps to the target, 2.1x the env '
        'steps/s with "flat").')
    cnn_precision: str = _f(
        "auto", 'Arithmetic of the "nature", "doom" and "doom_relu" encoders (their convolutions '
        'and 512-unit layer, the bulk of an image model\'s work) and, on a CPU, of a GRU core '
        'behind them: '
        '"bfloat16" runs the encoders under torch.autocast and the GRU\'s matrix products in '
        'bfloat16 (weights, the recurrent state and Adam stay float32; an LSTM and the heads '
        'compute in float32): a learner minibatch 1.4-1.9x faster on a CPU with '
        'AVX512-BF16 (docs/benchmarks/measured.md); "float32"; "auto": bfloat16 where the device '
        'computes it natively (a CPU with AVX512-BF16 or AMX-BF16, an Ampere or later GPU), '
        'else float32. Where it is not native, "bfloat16" is emulated and slower than float32. '
        'An exported policy computes in float32.')
    policy_head_gain: float = _f(
        0.01, "Orthogonal gain of the policy head's initial weights. 0.01 (SB3's and CleanRL's) "
        "starts from a nearly uniform policy, but while the head is that small little of the "
        "policy gradient reaches a trunk shared with the value head, so the policy learns only "
        "once many gradient steps have grown it; Sample Factory starts every layer at 1 (the Doom "
        "default: with one gradient step a batch VizdoomBasic-v1 learns at 1, not at 0.01; "
        "docs/guides/vizdoom.md).")
    use_rnn: bool = _f(
        False, "A recurrent core (rnn_type, rnn_size) between the encoders and the heads: memory "
        "for partially observed envs. Hidden states live in the trajectory buffers; the learner "
        "re-runs the core over whole trajectories from the state stored with their first step, "
        "resetting it where an episode starts, so minibatch_size must be a multiple of rollout.")
    centralized_critic: bool = _f(
        False, "Multi-agent envs: the value head sees the global state (the env's state() where "
        "it declares a state_space, else every agent's observation side by side, absent agents "
        "zeroed) beside the agent's own features (whose value it is: agents sharing a policy may "
        "be rewarded apart) through its own MLP, while the actor sees only its agent's "
        "observation (MAPPO's centralised critic; predict needs nothing more). Per trained "
        "policy, as an override. Implied (SEVERAL_AGENTS_CRITIC_DEFAULTS) for a trained policy "
        "with discrete actions among several agents acting at once (a ParallelEnv) whose state is "
        f"a vector of at most {CRITIC_STATE_MAX:,} floats, with no image observations, no use_rnn "
        "and the built-in network.")
    rnn_type: str = _f("gru", 'The recurrent core: "gru" or "lstm" (stores 2 x rnn_size per env).')
    rnn_size: int = _f(128, "Hidden units of the recurrent core.")
    # On for every env (it was for continuous actions only), measured in the learning suite
    # (docs/benchmarks/learning-suite.md, 2026-11-27): MountainCar reaches -110 in 3 of 3 seeds
    # (none without: its velocity spans +-0.07), NASim medium 170 at 73k env steps (never in 2M
    # without), NASim small and tiny-hard in a quarter and 0.6 of the env steps, CartPole in 0.82;
    # Acrobot needs 1.24x the env steps.
    normalize_obs: bool = _f(
        True, "Normalise vector observations (Box leaves other than images and boards) by running "
        "mean and std (clipped to +-10), inside the model: the statistics are buffers that travel "
        "with the weights.")
    normalize_returns: bool = _f(
        True, "Learn values in units of the running std of the value targets, centred on their "
        "mean where it is positive; where it is negative the value head's untrained output "
        "(what a rarely visited state keeps) is a value one std above the mean, never above "
        "0. The value loss has one scale whatever the rewards' (NASim's episodes pay ~200, "
        "CartPole's 1 a step).")

    # --- logging ----------------------------------------------------------------------------
    verbose: int = _f(1, "0: silent; 1: console summary every log_interval seconds.")
    log_interval: float = _f(5.0, "Seconds between console summaries.")
    tensorboard_log: Optional[str] = _f(None, "Directory for TensorBoard scalars (None: off).")
    stats_window: int = _f(100, "Episodes averaged in rollout/ep_rew_mean.")

    # --- robustness -------------------------------------------------------------------------
    worker_timeout: float = _f(
        60.0, "Seconds any component may wait on another before the run fails as stuck.")
    on_env_error: str = _f(
        "restart", 'An env raising in step or reset: "restart" recreates it, drops the samples '
        'of its broken episode in the current slot, counts it (rollout/env_restarts) and goes '
        'on; "abort" ends the run with the env\'s traceback.')
    max_env_restarts: int = _f(
        3, "Restarts of one env in a row, each failing before it completed a step (a crash "
        "loop), before the run ends with the env's last traceback.")
    max_worker_restarts: int = _f(
        10, "Component processes (rollout workers, policy workers, the learner) that die without "
        "an error of their own (killed by a signal, the OOM killer, a segfault in an env) are "
        "replaced: a rollout worker's slots are taken back, a policy worker's unanswered "
        "requests sent again, a learner goes on from the last published weights and Adam's "
        "state; after this many replacements in one run of the process graph the run fails. "
        "0: fail at the first death.")
    max_nonfinite_updates: int = _f(
        10, "A minibatch step with a non-finite loss or gradient is skipped (and counted); this "
        "many in a row end the run. Non-finite weights are never published nor saved.")

    # ---------------------------------------------------------------------------------------
    @property
    def envs_per_group(self) -> int:
        return self.num_envs_per_worker // 2

    @property
    def num_groups(self) -> int:
        return self.num_workers * 2

    @property
    def columns_per_group(self) -> int:
        """Trajectory columns of one env group's slot: its envs x lanes per env."""
        return self.envs_per_group * self.lanes_per_env

    @property
    def slot_size(self) -> int:
        """Samples in one trajectory slot: rollout x columns per group."""
        return self.rollout * self.columns_per_group

    @property
    def slots_per_batch(self) -> int:
        return self.batch_size // self.slot_size

    @property
    def num_slots(self) -> int:
        """Slots in the shared buffer. Synchronous PPO has exactly one batch of them, so no
        sample is collected before the learner has published the policy that trains on it."""
        if self.algo == "ppo":
            return self.slots_per_batch
        return self.num_groups + self.batches_to_accumulate * self.slots_per_batch

    def replace(self, **overrides) -> "Config":
        return Config.from_kwargs(dataclasses.asdict(self) | overrides)

    @classmethod
    def from_kwargs(cls, kwargs: dict) -> "Config":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in kwargs if k not in names]
        if unknown:
            msgs = []
            for k in unknown:
                close = difflib.get_close_matches(k, names, n=1)
                msgs.append(f"unknown argument {k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ConfigError("; ".join(msgs) + ". See asyncrl.Config for the documented fields.")
        if isinstance(kwargs.get("hidden_sizes"), list):
            kwargs = dict(kwargs, hidden_sizes=tuple(kwargs["hidden_sizes"]))
        cfg = cls(**kwargs)
        errors = cfg.validation_errors()
        if errors:
            raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(errors))
        return cfg

    def validation_errors(self) -> list:
        errs = []

        def check(ok, name, allowed):
            if not ok:
                errs.append(f"{name}={getattr(self, name)!r}: {allowed}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v

        for name in ("num_workers", "num_policy_workers", "learner_threads", "batches_to_accumulate",
                     "rollout", "batch_size", "num_epochs",
                     "minibatch_size", "stats_window", "max_nonfinite_updates",
                     "max_env_restarts", "lanes_per_env"):
            check(is_int(getattr(self, name)) and getattr(self, name) >= 1, name,
                  "must be an integer >= 1")
        check(is_int(self.num_envs_per_worker) and valid_envs_per_worker(self.num_envs_per_worker),
              "num_envs_per_worker",
              "must be an even integer >= 2 (envs are split into two groups stepped in turn)")
        check(is_int(self.sampler_nice) and 0 <= self.sampler_nice <= 19, "sampler_nice",
              "must be an integer in [0, 19]")
        for name in ("max_policy_lag", "max_worker_restarts"):
            check(is_int(getattr(self, name)) and getattr(self, name) >= 0, name,
                  "must be an integer >= 0")
        check(self.algo in ALGOS, "algo", f"must be one of {ALGOS}")
        check(isinstance(self.device, str) and valid_device(self.device), "device",
              f"must be {DEVICES_HINT}")
        check(self.seed is None or is_int(self.seed), "seed", "must be an integer or None")
        check(is_int(self.verbose) and self.verbose in (0, 1, 2), "verbose", "must be 0, 1 or 2")
        for name in ("adam_eps", "vtrace_rho_clip", "vtrace_c_clip",
                     "vtrace_pg_rho_clip", "max_grad_norm", "log_interval",
                     "worker_timeout"):
            check(is_num(getattr(self, name)) and getattr(self, name) > 0, name,
                  "must be a number > 0")
        # learning_rate and clip_coef may be 0: a schedule falling linearly to 0 (SB3's and RL
        # Zoo's lin_) is 0 at the end of the run, and a learning rate of 0 freezes a policy.
        for name in ("learning_rate", "clip_coef", "ent_coef", "vf_coef", "advantage_std_floor"):
            check(is_num(getattr(self, name)) and getattr(self, name) >= 0, name,
                  "must be a number >= 0")
        for name in ("gamma", "vtrace_lambda"):
            check(is_num(getattr(self, name)) and 0 <= getattr(self, name) <= 1, name,
                  "must be a number in [0, 1]")
        check(self.reward_clip is None or (is_num(self.reward_clip) and self.reward_clip > 0),
              "reward_clip", "must be None or a number > 0")
        check(self.target_kl is None or (is_num(self.target_kl) and self.target_kl > 0),
              "target_kl", "must be None or a number > 0")
        check(self.kl_adaptive_lr is None or (is_num(self.kl_adaptive_lr) and self.kl_adaptive_lr > 0),
              "kl_adaptive_lr", "must be None or a number > 0")
        check(is_num(self.kl_adaptive_lr_max) and self.kl_adaptive_lr_max >= KL_ADAPTIVE_LR_MIN,
              "kl_adaptive_lr_max", f"must be a number >= {KL_ADAPTIVE_LR_MIN} (the smallest factor)")
        check(self.dual_clip is None or (is_num(self.dual_clip) and self.dual_clip > 1),
              "dual_clip", "must be None or a number > 1")
        check(self.vf_clip_coef is None or (is_num(self.vf_clip_coef) and self.vf_clip_coef > 0),
              "vf_clip_coef", "must be None or a number > 0")
        check(isinstance(self.hidden_sizes, tuple) and len(self.hidden_sizes) >= 1
              and all(is_int(h) and h >= 1 for h in self.hidden_sizes), "hidden_sizes",
              "must be a non-empty tuple of positive integers, e.g. (64, 64)")
        for f in dataclasses.fields(self):  # every switch, read off its annotation
            if f.type in ("bool", bool):
                check(isinstance(getattr(self, f.name), bool), f.name, "must be True or False")
        check(self.activation in ("tanh", "relu"), "activation", 'must be "tanh" or "relu"')
        check(self.rnn_type in ("gru", "lstm"), "rnn_type", 'must be "gru" or "lstm"')
        check(is_int(self.rnn_size) and self.rnn_size >= 1, "rnn_size", "must be an integer >= 1")
        check(self.cnn in CNNS, "cnn", f"must be one of {CNNS}")
        check(self.small_images in SMALL_IMAGES, "small_images", f"must be one of {SMALL_IMAGES}")
        check(self.cnn_precision in CNN_PRECISIONS, "cnn_precision", f"must be one of {CNN_PRECISIONS}")
        check(is_num(self.policy_head_gain) and 0 < self.policy_head_gain < math.inf,
              "policy_head_gain", "must be a number > 0")
        check(self.on_env_error in ("restart", "abort"), "on_env_error", 'must be "restart" or "abort"')
        check(self.tensorboard_log is None or isinstance(self.tensorboard_log, str),
              "tensorboard_log", "must be a directory path or None")
        if errs:  # the cross-field checks below assume well-typed fields
            return errs
        if self.batch_size % self.slot_size:
            errs.append(
                f"batch_size={self.batch_size} must be a multiple of rollout x envs per group"
                + (" x agent lanes per env" if self.lanes_per_env > 1 else "") + " = "
                f"{self.rollout} x {self.envs_per_group}"
                + (f" x {self.lanes_per_env}" if self.lanes_per_env > 1 else "") +
                f" = {self.slot_size} (rollout={self.rollout}, "
                f"num_envs_per_worker={self.num_envs_per_worker}"
                + (f", lanes_per_env={self.lanes_per_env}" if self.lanes_per_env > 1 else "") + "); try "
                f"batch_size={max(1, round(self.batch_size / self.slot_size)) * self.slot_size}")
        if self.batch_size % self.minibatch_size:
            errs.append(f"minibatch_size={self.minibatch_size} must divide "
                        f"batch_size={self.batch_size}")
        if self.use_rnn and self.minibatch_size % self.rollout:
            fit = max(1, round(self.minibatch_size / self.rollout)) * self.rollout
            errs.append(
                f"minibatch_size={self.minibatch_size}: with use_rnn every minibatch holds whole "
                f"trajectories of rollout={self.rollout} steps, so it must be a multiple of "
                f"rollout; try minibatch_size={fit}" + ("" if self.batch_size % fit == 0 else
                                                        " with a batch_size that it divides"))
        if self.algo == "impala" and self.dual_clip is not None:
            errs.append(f"dual_clip={self.dual_clip}: algo='impala' has no clipped surrogate to "
                        "bound (its policy gradient is -A log pi); leave dual_clip=None or use "
                        "algo='appo'")
        if self.algo == "impala" and self.num_epochs != 1:
            errs.append(f"num_epochs={self.num_epochs}: algo='impala' trains one epoch per batch; "
                        "use num_epochs=1 or algo='appo'")
        if self.algo == "ppo":
            per_round = self.num_groups * self.slot_size
            if self.batch_size != per_round:
                per_env_a_worker = self.num_workers * self.rollout * self.lanes_per_env
                envs = self.batch_size // per_env_a_worker
                fit = (f" (num_envs_per_worker={envs})" if self.batch_size % per_env_a_worker == 0
                       and valid_envs_per_worker(envs) else "")
                errs.append(
                    f"batch_size={self.batch_size}: algo='ppo' (synchronous) collects one rollout "
                    f"of every env per update, so batch_size must be num_workers x "
                    f"num_envs_per_worker x rollout"
                    + (" x agent lanes per env" if self.lanes_per_env > 1 else "")
                    + f" = {per_round}; set those counts to make {self.batch_size}{fit} and leave "
                    f"batch_size out, or pass algo='appo' to sample asynchronously")
        return errs

    def describe(self) -> str:
        """A markdown table of every field, its default and its documentation."""
        rows = ["| field | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(self):
            rows.append(f"| `{f.name}` | `{f.default!r}` | {f.metadata['doc']} |")
        return "\n".join(rows)


Schedule = Callable[[float], float]  # progress_remaining (1 at a train() call's start, 0 at its end) -> value


class ConfigKwargs(TypedDict, total=False):
    """``APPO(...)``'s keyword arguments, for type checkers and IDEs (``**kwargs:
    Unpack[ConfigKwargs]``): every field of :class:`Config` but those the engine sets
    (``ENGINE_SET``), with its type; the fields of ``MUTABLE_HPARAMS`` may be schedules.
    ``tests/test_config.py`` checks the keys and types against ``Config``."""
    num_workers: int
    num_envs_per_worker: int
    num_policy_workers: int
    rollout: int
    batch_size: int
    learner_threads: int
    sampler_nice: int
    batches_to_accumulate: int
    spread_first_episodes: bool
    device: str
    algo: str
    serial_mode: bool
    seed: Optional[int]
    learning_rate: Union[float, Schedule]
    adam_eps: float
    num_epochs: int
    minibatch_size: int
    gamma: Union[float, Schedule]
    vtrace_lambda: Union[float, Schedule]
    vtrace_rho_clip: float
    vtrace_c_clip: float
    vtrace_pg_rho_clip: float
    clip_coef: Union[float, Schedule]
    decoupled_clip: bool
    dual_clip: Optional[float]
    vf_clip_coef: Optional[float]
    target_kl: Optional[float]
    kl_adaptive_lr: Optional[float]
    kl_adaptive_lr_max: float
    ent_coef: Union[float, Schedule]
    vf_coef: Union[float, Schedule]
    max_grad_norm: Union[float, Schedule]
    normalize_advantages: bool
    advantage_std_floor: float
    reward_clip: Optional[float]
    bootstrap_truncation: bool
    max_policy_lag: int
    hidden_sizes: Tuple[int, ...]
    activation: str
    cnn: str
    small_images: str
    cnn_precision: str
    policy_head_gain: float
    use_rnn: bool
    centralized_critic: bool
    rnn_type: str
    rnn_size: int
    normalize_obs: bool
    normalize_returns: bool
    verbose: int
    log_interval: float
    tensorboard_log: Optional[str]
    stats_window: int
    worker_timeout: float
    on_env_error: str
    max_env_restarts: int
    max_worker_restarts: int
    max_nonfinite_updates: int


def valid_envs_per_worker(n: int) -> bool:
    """Whether a rollout worker can hold n envs: two groups stepped in turn, at least one each."""
    return n >= 2 and n % 2 == 0


def valid_device(device: str) -> bool:
    if device in ("cpu", "cuda", "auto"):
        return True
    prefix, _, idx = device.partition(":")
    return prefix == "cuda" and idx.isdigit()


# Atari (ALE ids): CleanRL's ppo_atari / Sample Factory's Atari settings, adapted to V-trace.
# Applied automatically for ALE ids; every field stays overridable by a keyword argument. Rewards
# clipped to +-1 keep returns near unit scale: return normalisation stays off, as when Pong's
# +18 was measured (docs/guides/atari.md).
ATARI_DEFAULTS = dict(rollout=128, learning_rate=2.5e-4, gamma=0.99, vtrace_lambda=0.95,
                      clip_coef=0.1, ent_coef=0.01, minibatch_size=256, num_epochs=4,
                      reward_clip=1.0, learner_threads=2, normalize_returns=False, target_kl=None,
                      advantage_std_floor=0.0)
ATARI_BATCH_SIZE = 1024  # rounded to a multiple of the slot size
# ... and unless the caller asks for another algo, on any device: synchronous (as Sample Factory's
# Atari preset, async_rl=False), one rollout of 64 steps from ATARI_ENVS envs = CleanRL's batch of
# 1024. On a CPU the CNN's backward pass is the bottleneck, and it runs fastest with the cores to
# itself: sampling and learning in turn beat sampling beside learning, and the policy lag is 0
# (Pong, 2 cores: +18 within 10M frames in seeds 0-2, at 8.3M-9.8M). On a GPU the same batch
# learns Pong as on the CPU per frame where the asynchronous preset (rollout 128 over the GPU
# layout, 28 envs) does not: on a lent H200 (16 cores, 8 x 2, seed 0) +18 at 8.8M frames in 481 s,
# ~4,550 env steps/s; the asynchronous preset at ~8,460 env steps/s had +2.4 at 10M frames (303 s,
# a lent H100) and was behind from ~250 s on (docs/guides/atari.md, "On a GPU"). A caller who
# sets batch_size but no algo samples asynchronously with it, as CONTINUOUS_CPU_DEFAULTS do.
ATARI_SYNC_DEFAULTS = dict(algo="ppo", rollout=64)
ATARI_ENVS = 16


def atari_layout(cores: int, num_workers: Optional[int] = None,
                 num_envs_per_worker: Optional[int] = None) -> dict:
    """The synchronous Atari preset's ATARI_ENVS envs over rollout workers: a worker per core but
    two (the policy worker's and the learner's), as many as divide the envs into at least 2 a
    worker (the two groups): one of 16 on up to 3 cores, 2 x 8 on 4, 4 x 4 on 6, 8 x 2 from 10.
    With two cores the rollout worker and the policy worker then sample on one core each, where
    two rollout workers and the policy worker preempt one another (Pong, 2 cores, side by side:
    docs/guides/atari.md). A count the caller gave is kept; the other keeps the 16 envs."""
    if num_workers:
        envs = num_envs_per_worker or max(2, ATARI_ENVS // num_workers // 2 * 2)
        return dict(num_workers=num_workers, num_envs_per_worker=envs)
    if num_envs_per_worker:
        return dict(num_workers=max(1, ATARI_ENVS // num_envs_per_worker),
                    num_envs_per_worker=num_envs_per_worker)
    workers = 1
    while workers * 2 <= min(cores - 2, ATARI_ENVS // 2):
        workers *= 2
    return dict(num_workers=workers, num_envs_per_worker=ATARI_ENVS // workers)


# VizDoom (Vizdoom ids, envs/doom.py): the model and sampling of Sample Factory's VizDoom example
# (its CNN, convnet_simple, with ReLU for its ELU since 2026-12-04: Sample Factory's 1M-frame return
# in 0.11-0.29 of its time where ELU took 0.14-0.51 and missed it in 1M frames once, 9 seeds over
# Basic, HealthGatheringSupreme and DefendCenter; and a GRU of 512; rollout 32, batches of 1024, 2
# workers x 8 envs; clip 0.1, gradient norm 4, Adam eps 1e-6, normalised game variables and returns;
# its exploration loss, symmetric KL at 0.001, becomes an entropy bonus of 0.001; its GAE lambda,
# V-trace's) and its initial gain of 1 for the policy head. Its optimisation (one epoch of one
# minibatch at lr 1e-4) did not learn VizdoomBasic-v1 in 1M frames with the head at gain 0.01
# (return -150, as random play; Sample Factory +80): so small a head passes little policy gradient
# to the shared CNN and GRU. At gain 1 it does (+64 at 1M frames). Atari's minibatches of 256 at lr
# 2.5e-4, in 2 epochs (Atari's 4 reached +80 at 242k and 524k frames in two runs at gain 1). The
# learner is the bottleneck, the rollout and policy workers take about half a core of two: the
# learner's second thread (as Atari's) trained Basic ~1.2x as many frames a second (seeds 0-2); 2
# epochs trained ~1.5x as many as 4 (HealthGatheringSupreme, side by side) and reached Sample
# Factory's 1M-frame return on Basic in 0.80 and 0.62 of 4 epochs' time (seeds 0, 1, one run after
# the other), 1 epoch (2 x 16 envs) in 1.03 (seed 0); docs/guides/vizdoom.md. One thread
# (2026-11-29, after the niceness below) trained HealthGatheringSupreme 1.23x as many frames a
# second, but the sampling then runs a batch ahead of the learner (policy lag 1.5 versions of 8
# gradient steps against 0.25), and in 6 seeds of 8 of Basic and HealthGatheringSupreme it took
# longer to Sample Factory's return (decoupled_clip did not mend it in the one run tried): two
# threads stay.
DOOM_DEFAULTS = dict(rollout=32, batch_size=1024, minibatch_size=256, num_epochs=2,
                     learning_rate=2.5e-4, adam_eps=1e-6, gamma=0.99, vtrace_lambda=0.95,
                     clip_coef=0.1, ent_coef=0.001, vf_coef=0.5, max_grad_norm=4.0,
                     cnn="doom_relu", use_rnn=True, rnn_type="gru", rnn_size=512,
                     normalize_returns=True, target_kl=None, policy_head_gain=1.0,
                     learner_threads=2, advantage_std_floor=0.0)
# ... and with no GPU to learn on, sampling yields to the learner (niceness 19 for the rollout and
# policy workers and the games they start). The learner's two threads are the bottleneck; at equal
# priority the sampling processes preempt one of them while the other waits for it, so the
# learner burnt 1.40 cores for less work than 1.19 do at niceness 19 (HealthGatheringSupreme, 2
# cores, medians of 2 alternated repeats: 487 -> 614 env steps/s, 1.02 -> 1.28 of Sample
# Factory's example beside them; niceness 10: 591; then 1.27x in 3 repeats), and VizDoom Basic
# reached Sample Factory's 1M-frame return in 0.21-0.32 of its time. docs/guides/vizdoom.md.
DOOM_CPU_DEFAULTS = dict(sampler_nice=19)
FAMILY_DEFAULTS = {"atari": ATARI_DEFAULTS, "doom": DOOM_DEFAULTS}


# Continuous actions (a Box, alone or in a Tuple/Dict): after CleanRL's ppo_continuous_action and
# Sample Factory's MuJoCo preset: lr 3e-4, clip 0.2, no entropy bonus, 10 epochs (their gamma
# 0.99, lambda 0.95, return and observation normalisation are every env's defaults now).
# Asynchronous (APPO, V-trace) up to four dimensions: on two cores it takes 1.2-1.6x as many env
# steps a second as the same learner synchronous (the learning suite's runs; more than four
# dimensions: CONTINUOUS_CPU_DEFAULTS below). Minibatches of 256: 40 gradient steps per
# 1,024-sample batch (SB3's and CleanRL's defaults take 320 per 2,048). Measured on 2026-11-28
# against 512 (20 steps: HalfCheetah stalled near 1,700), 128 (80 steps: Hopper below SB3) and 64
# (collapsed on Hopper): 256 ended higher than 128 on Hopper, Walker2d and LunarLanderContinuous,
# reached every training target sooner, and ended lower on HalfCheetah (bimodal outcomes either
# way); figures per seed in docs/benchmarks/learning-suite.md, "Continuous control". No
# target_kl (0.02 stalled HalfCheetah in 2 seeds of 3) but a brake on each update's move:
# kl_adaptive_lr 0.02 with kl_adaptive_lr_max 1, so within an update the rate falls 1.5x a
# minibatch once the policy has moved from the update's start by more than 0.04 (KL) and climbs
# back, never above learning_rate, on minibatches that find less than 0.01. Late in training, as
# the Gaussian's std shrinks, the same steps move the policy further: InvertedDoublePendulum's
# and Reacher's returns fell back from their best. With the brake, seeds 0-2, greedy medians
# (without it): IDP 9,340 (7,501; SB3 9,357), Reacher -5.23 (-5.60; SB3 -5.22), Walker2d 3,700
# (3,582), HalfCheetah 4,180 (4,363, and no seed stalled below 2,000), LunarLanderContinuous 198
# (204), Pendulum -128 (-123); Hopper in docs/benchmarks/learning-suite.md, "a brake on each
# update's move". (It makes the KL per minibatch, so a recurrent model's first epoch no longer
# gives the targets: Learner.targets_in_first_epoch.) The Gaussian's initial std (0.61 of each
# dimension's half range, 0.37 above four dimensions; SB3's 1) is the distribution's:
# distributions.default_log_std.
CONTINUOUS_DEFAULTS = dict(rollout=64, learning_rate=3e-4, clip_coef=0.2, ent_coef=0.0,
                           vf_coef=0.5, max_grad_norm=0.5, num_epochs=10, minibatch_size=256,
                           target_kl=None, kl_adaptive_lr=0.02, kl_adaptive_lr_max=1.0)
# ... and with more than four continuous dimensions over all Box parts ("continuous_many": the
# number of the Gaussian's initial-std cut, distributions.MANY_ACTUATORS, which counts each Box
# by itself), learning on a CPU: synchronous PPO
# (algo="ppo"), every sample drawn by the policy that trains on it, the same 2 x 8 envs, batch,
# learner and brake. Against asynchronous sampling, 1M env steps, greedy medians (training return
# at 1M): HalfCheetah 6,462 over 7 seeds (5,741) against 6,151 (4,576), Walker2d 4,715 (3,771)
# against 3,204 (3,237), the held-out Pusher -29.4 over 5 seeds (-31.4; SB3 -28.4 (-31.6))
# against -34.0 (-36.2), their targets in as few env steps or fewer; Ant level, 3,782 (2,568)
# against 3,851 (2,575), its target later (464k env steps against 377k); at 1.2-1.6x the wall
# time per env step (sampling waits while the learner trains). How the lag it removes held
# Pusher back was not pinned down (keeping the lagged samples' gradient, decoupled_clip, did
# worse). With one to four dimensions it did not pay over all: ahead on
# MountainCarContinuous (its goal in 15 seeds of 20 against 8 of 20) and Reacher, level on
# Hopper, InvertedDoublePendulum, InvertedPendulum, Pendulum and Swimmer, behind on BipedalWalker
# (308 against 315) and LunarLanderContinuous (156 over 5 seeds, one at 49, against 200; SB3 179).
# Held out afterwards, Humanoid (17 dimensions) ended behind asynchronous sampling within the
# seeds' spread: greedy median 1,280 against 1,535 over 7 seeds (rank-sum p = 0.32), both far
# above SB3's 454; the rule was kept (three envs ahead, Ant level, Humanoid behind).
# Several agents (a PettingZoo ParallelEnv) too, the batch then one rollout of every agent's
# lane: held out, simple_spread with MPE2's continuous actions (three agents, five dimensions
# each), 1M agent steps: greedy median -23.2 over 7 seeds (-25.2 to -20.9; the target, -20, in 2)
# against asynchronous sampling's -42.6 / -44.5 / -34.5 (seeds 0-2), worse than random play
# (-26.9); the discrete form's defaults: -19.7 over 7 seeds. There each env's three lanes put three
# times the samples in flight, so the asynchronous batch (768, a slot's multiple) trained at a
# policy lag of ~3.4 updates (HalfCheetah's: ~1.8); asynchronous with the synchronous batch of
# 3,072 scored -24.2 (one seed, with the Gaussian's mean started mid-range, which alone changed
# nothing: -41.7 / -57.8). With four dimensions an agent (multiwalker: three walkers) the lanes'
# lag (2.3-2.5 updates) did not hurt: asynchronous reached its target sooner (26-39 s against
# 50-161 s) and ended level (greedy median 1.6 against -1.2, seeds 0-2), so the cut stays at
# more than four. Turn-based games keep asynchronous sampling (not measured). With a
# GPU to learn on, asynchronous as before (not measured there: the GPU layout would make the
# synchronous batch 14 x 4 x 64 = 3,584 on 16 cores). A caller who sets batch_size keeps it,
# sampled asynchronously: synchronous PPO's batch is the layout's one rollout of every env
# (docs/benchmarks/learning-suite.md, "Synchronous sampling for more than four actuators").
CONTINUOUS_CPU_DEFAULTS = dict(algo="ppo")
# ... and for several agents sampled so, minibatches of 128 (24 gradient steps an epoch of the
# 3,072-sample batch where 256 take 12). simple_spread with MPE2's continuous forces, 1M agent
# steps, seeds 0-6: greedy median -20.8 (-22.1 to -19.3), the target (-20) in 6 seeds of 7 at
# 132k-519k agent steps (23-94 s), against 256's -23.2 (-25.2 to -20.9; the target in 2 of 7;
# rank-sum p = 0.03; SB3 -21.4 over 3), at 1.2-1.3x the wall time a run; 64 (seed 0): -20.0 at
# 1.5x. On one agent's many actuators (seeds 0-2) 128 was ahead on Pusher (-28.3 against -29.4),
# level on HalfCheetah (greedy 6,280 against 6,852, training return 5,190 against 5,933) and
# behind on Walker2d (seeds 0-1), so one agent keeps 256 (docs/benchmarks/learning-suite.md,
# "Minibatches of 128 for several agents").
SEVERAL_AGENTS_CPU_DEFAULTS = dict(minibatch_size=128)

# Factored discrete actions (several choices made together: MultiDiscrete, MultiBinary, a Tuple
# or Dict of Discretes): ten times the entropy bonus. Some combinations of the parts are often
# free and do nothing (NASim's exploits whose service and OS match no vulnerability): a policy
# learns to idle on them before it finds the chain of paid actions that pays off, and keeps its
# entropy in the parts that no longer matter. NASim small with MultiDiscrete actions, 1M env
# steps, seeds 0-2: greedy 92.5 x 3 (one host of two) at 0.005, solved at 0.05 (184-185, the
# target in 194k-231k env steps); NASim tiny-hard's form learns either way (191 x 3; target in
# 84k-88k env steps at 0.05, 74k-82k at 0.005); popgym MineSweeper reaches its target at 0.05
# too, in 1.6x the time (docs/benchmarks/learning-suite.md, "Factored actions").
FACTORED_DEFAULTS = dict(ent_coef=0.05)
# The presets an action space implies (ActionDistribution.kind); "categorical" (one Discrete)
# takes Config's own defaults.
ACTION_DEFAULTS = {"categorical": {}, "continuous": CONTINUOUS_DEFAULTS,
                   "continuous_many": CONTINUOUS_DEFAULTS, "factored": FACTORED_DEFAULTS}

# Turn-based games (a PettingZoo AECEnv, asyncrl.turns), over the action space's preset: twenty
# times the entropy bonus. In self-play the opponent is the policy itself: as its entropy falls,
# both seats settle into the same few lines of play, the positions it learns from narrow, and
# what it learns there does not carry to other positions. Connect four by self-play at 0.005:
# the entropy fell from 1.0 to 0.46 (of ln 7 = 1.95) within 600k agent steps, and the greedy
# policy made fewer of the fours that 400 fixed positions offered at 400k agent steps than at
# 100k (26% against 40%). At 2M agent steps, seeds 0-2, against a one-move lookahead (wins,
# else blocks): 0.05 won 54.5 / 51.5 / 58.5%, 0.1 68.5 / 71.5 / 65.5%, making 60-73% of those
# fours (docs/guides/multi-agent.md, "Turn-based games").
TURN_BASED_DEFAULTS = dict(ent_coef=0.1)

# Several agents acting at once whose global state is a vector (spaces.EnvSpec.critic_state), a
# policy with discrete actions: MAPPO's centralised critic, reading the state beside the agent's own
# features. 1M agent steps, greedy medians against independent critics: MPE2 simple_spread (one
# shared policy, seeds 0-6) -18.1 against -19.7 (rank-sum p = 0.05; the target -20 in 7 of 7 at
# 28-43 s against 23-103 s), simple_reference (seeds 0-2) -18.1 against -19.5 (at 5M, seeds 0-1:
# -13.6 and -14.8, they talk, against -17.5), six agents (2M) -33.9 against -33.4; speaker-listener
# (two policies) -13.2 / -8.6 / -8.6 against -12.1 / -16.1 / -14.0; at 0.85-0.95 of the agent steps
# a second (six agents: 0.6-0.8). Continuous actions keep independent critics: on multiwalker (four
# dimensions an agent) the critic's training return passed 0 in 1 seed of 3 (independent: 3 of 3, in
# 26-39 s) and one seed collapsed (greedy -79.0); on continuous simple_spread it was level. Eight
# agents (simple_spread, a 384-float state, 2M): -39.1 against -40.9, the training return ahead in
# 3 seeds of 3, at 0.82-0.98 of the rate; larger states keep independent critics (CRITIC_STATE_MAX).
# Not measured: factored actions, turn-based games, recurrent cores
# (docs/benchmarks/learning-suite.md, "The centralised critic for several agents with discrete
# actions" and "The centralised critic with eight agents").
SEVERAL_AGENTS_CRITIC_DEFAULTS = dict(centralized_critic=True)
CRITIC_ACTIONS = ("categorical",)  # ActionDistribution.kind of the policies it is implied for


# With a GPU to learn on, the CPU cores are left to sampling: one rollout worker per core but two
# (the policy worker's and the learner's processes drive the GPU), and envs per worker (at most
# the default 8, at least 2, the two groups) so that no more than GPU_BATCHES_IN_FLIGHT batches
# are sampled at once (fewer workers where even 2 envs each would sample more). Envs beyond what
# the learner consumes buy policy lag, not frames (Pong on a 16-core H200, docs/guides/atari.md:
# 14 x 16 envs, 28 batches in flight, ~9,500 env steps/s at lag ~25; 14 x 4, 7 batches, ~10,700
# at lag 6).
GPU_BATCHES_IN_FLIGHT = 4


def gpu_layout(cores: int, rollout: int, batch_size: int, lanes: int = 1,
               num_workers: Optional[int] = None,
               num_envs_per_worker: Optional[int] = None) -> dict:
    """num_workers and num_envs_per_worker on a machine with ``cores`` CPU cores whose GPU learns
    (see GPU_BATCHES_IN_FLIGHT); on two cores the Config defaults. Either count, when given (the
    caller's), is kept and the other follows from it."""
    per_env = rollout * lanes
    budget = GPU_BATCHES_IN_FLIGHT * batch_size  # agent steps sampled at once
    workers = num_workers or max(Config.num_workers,
                                 min(cores - 2, budget // ((num_envs_per_worker or 2) * per_env)))
    envs = num_envs_per_worker
    if not envs:  # the most, from the default down, that keeps the budget
        envs = Config.num_envs_per_worker
        while envs > 2 and workers * envs * per_env > budget:
            envs -= 2
    return dict(num_workers=workers, num_envs_per_worker=envs)


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which containers and taskset
    narrow; os.cpu_count() counts the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _positive_ints(values: list) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values)


def with_defaults(kwargs: dict, family: Optional[str] = None, cpu_only: bool = False,
                  cores: Optional[int] = None, actions: str = "categorical",
                  multi_agent: bool = False, turn_based: bool = False,
                  critic_state: bool = False) -> dict:
    """The caller's keywords, over the values that the env ``family`` (``envs.env_family``) and the
    algorithm variant imply: a family gets FAMILY_DEFAULTS[family], "doom" DOOM_DEFAULTS; Atari
    gets ATARI_DEFAULTS, and unless the caller chose another ``algo`` (or set ``batch_size``
    and no ``algo``), on any device, ATARI_SYNC_DEFAULTS with ``atari_layout`` for the
    ``cores`` (default: available_cores()); Doom DOOM_CPU_DEFAULTS when ``cpu_only``; with a
    GPU (not ``cpu_only``), ``gpu_layout`` for the cores sets whichever of the two counts is not
    set;
    without a family, the kind of ``actions`` (``ActionDistribution.kind``) gets its
    ACTION_DEFAULTS, and a ``turn_based`` game TURN_BASED_DEFAULTS over them; "continuous_many"
    CONTINUOUS_CPU_DEFAULTS when ``cpu_only``, not ``turn_based``, and the caller set no batch_size
    (``multi_agent``: with SEVERAL_AGENTS_CPU_DEFAULTS); a ``critic_state`` (several agents whose
    global state a centralised critic reads: spaces.EnvSpec.critic_state) with actions of a kind
    in CRITIC_ACTIONS and no use_rnn SEVERAL_AGENTS_CRITIC_DEFAULTS;
    IMPALA trains one epoch per batch; synchronous PPO's batch is one rollout of every env; a
    ``multi_agent`` env's batch (or any with ``lanes_per_env`` > 1) is rounded to a multiple of
    its slot. What the caller sets always wins."""
    atari = family == "atari"
    cores = available_cores() if cores is None else cores
    if actions not in ACTION_DEFAULTS:
        raise ValueError(f"actions={actions!r}: one of {list(ACTION_DEFAULTS)}")
    preset = dict(FAMILY_DEFAULTS.get(family) or
                  {**ACTION_DEFAULTS[actions], **(TURN_BASED_DEFAULTS if turn_based else {})})
    if family == "doom" and cpu_only:
        preset.update(DOOM_CPU_DEFAULTS)
    if (not family and actions == "continuous_many" and cpu_only and not turn_based
            and "batch_size" not in kwargs):
        preset.update(CONTINUOUS_CPU_DEFAULTS)
        if multi_agent:
            preset.update(SEVERAL_AGENTS_CPU_DEFAULTS)
    if not family and critic_state and actions in CRITIC_ACTIONS and not kwargs.get("use_rnn"):
        preset.update(SEVERAL_AGENTS_CRITIC_DEFAULTS)
    # a synchronous batch is one rollout of every env: a caller's batch_size without an algo
    # samples asynchronously instead, as with CONTINUOUS_CPU_DEFAULTS above
    sync_atari = atari and kwargs.get("algo", "appo" if "batch_size" in kwargs else "ppo") == "ppo"
    if sync_atari:
        preset.update(ATARI_SYNC_DEFAULTS)
    merged = {**preset, **kwargs}
    algo = merged.get("algo", "appo")
    defaults = {f.name: f.default for f in dataclasses.fields(Config)}
    get = lambda name: merged.get(name, defaults[name])  # noqa: E731
    layout_names = ("num_workers", "num_envs_per_worker")
    if (sync_atari or not cpu_only) and not all(n in merged for n in layout_names):
        counts = [get(n) for n in ("rollout", "batch_size", "lanes_per_env")]
        given = {n: merged[n] for n in layout_names if n in merged}
        if _positive_ints(counts + list(given.values())):  # else: left to validation
            layout = atari_layout(cores, **given) if sync_atari else gpu_layout(cores, *counts, **given)
            preset.update({k: v for k, v in layout.items() if v != defaults[k] and k not in given})
            merged = {**preset, **kwargs}
    counts = [get(n) for n in ("num_workers", "num_envs_per_worker", "rollout", "minibatch_size",
                               "lanes_per_env")]
    counts_ok = _positive_ints(counts)
    implied = {}
    slot = counts[2] * max(1, counts[1] // 2) * counts[4] if counts_ok else 0
    if (atari or multi_agent or counts[4] != 1) and counts_ok:  # bad counts: left to validation
        target = ATARI_BATCH_SIZE if atari else get("batch_size")
        implied["batch_size"] = max(1, round(target / slot)) * slot
    if algo == "impala":
        implied["num_epochs"] = 1
    elif algo == "ppo" and counts_ok:
        implied["batch_size"] = counts[0] * counts[1] * counts[2] * counts[4]
    batch = implied.get("batch_size", get("batch_size"))
    if "batch_size" in implied and "minibatch_size" not in kwargs and batch % get("minibatch_size"):
        # the fewest minibatches at most the default's size that divide the batch in whole
        # rollouts; the whole batch if none does
        n = max(1, round(batch / get("minibatch_size")))
        while n < batch and (batch % n or (batch // n) % counts[2]):
            n += 1
        implied["minibatch_size"] = batch // n if n < batch else batch
    return {**preset, **implied, **kwargs}


# The fields whose defaults with_defaults derives from the machine: the CPU-learner presets (Doom's,
# many actuators'), the layout's counts (the GPU's, Atari's), and the batch and minibatch implied
# from the layout. A saved model's values of these that its caller did not set are derived again
# where it is loaded.
MACHINE_FIELDS = frozenset({*DOOM_CPU_DEFAULTS, *CONTINUOUS_CPU_DEFAULTS, "num_workers",
                            "num_envs_per_worker", "batch_size", "minibatch_size"})


def portable(config: dict, set_by_caller: Optional[Iterable[str]]) -> dict:
    """A saved ``config`` as keywords for a machine of its own: the MACHINE_FIELDS that are not
    in ``set_by_caller`` left out, for with_defaults to derive there (a model saved on a CPU
    loads with a GPU's layout and algorithm, and one saved with a GPU's 14 workers loads with
    two cores' two). ``set_by_caller`` None (a file saved before it was recorded): all kept."""
    if set_by_caller is None:
        return dict(config)
    keep = set(set_by_caller)
    return {k: v for k, v in config.items() if k not in MACHINE_FIELDS or k in keep}


def schedule_value(name: str, value: Any, progress_remaining: float) -> Any:
    """A hyper-parameter's value now: ``value`` itself, or ``value(progress_remaining)``."""
    if not callable(value):
        return value
    try:
        return value(progress_remaining)
    except Exception as e:
        raise ConfigError(f"{name}: the schedule {value!r} failed at progress_remaining="
                          f"{progress_remaining:.3f} ({type(e).__name__}: {e})") from e


class Settings:
    """A model's config, its ``MUTABLE_HPARAMS`` as set (numbers, or schedules of SB3's
    ``progress_remaining``) and the names of the fields its caller set (``set_by_caller``; the
    rest the env and the machine implied): their one home. ``config`` is always current: a value
    set is checked into it at once (a schedule's at progress 1; a bad one raises ConfigError and
    is not kept), and while training it holds the schedules' values at the run's progress."""

    def __init__(self, config: Config, schedules: dict, set_by_caller: Iterable[str] = ()):
        self.config = config
        self.hparams = {n: schedules.get(n, getattr(config, n)) for n in MUTABLE_HPARAMS}
        self.set_by_caller = frozenset(set_by_caller)

    def set(self, name: str, value: Any) -> None:
        self.config = self.config.replace(**{name: schedule_value(name, value, 1.0)})
        self.hparams[name] = value
        self.set_by_caller |= {name}

    def replace_config(self, config: Config) -> None:
        """A whole new config: the hyper-parameters it changes become numbers, the fields it
        changes the caller's."""
        changed = {f.name for f in dataclasses.fields(Config)
                   if getattr(config, f.name) != getattr(self.config, f.name)}
        self.hparams.update({n: getattr(config, n) for n in MUTABLE_HPARAMS if n in changed})
        self.set_by_caller |= changed
        self.config = config

    def at(self, progress_remaining: float) -> dict:
        """The hyper-parameters' values at ``progress_remaining``, checked into ``config``."""
        values = {n: schedule_value(n, v, progress_remaining) for n, v in self.hparams.items()}
        if any(getattr(self.config, n) != v for n, v in values.items()):
            self.config = self.config.replace(**values)  # raises ConfigError naming the field
        return values
