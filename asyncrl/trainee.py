"""A trained policy as the facade keeps it between ``train()`` calls: everything about it (its
model, its settings over the run's, its scratch files, its counters); and how several trained
policies' settings are derived from the run's (each may override any field but
``GRAPH_FIELDS``)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Optional

import torch

from .config import (GRAPH_FIELDS, MUTABLE_HPARAMS, Config, ConfigError, Settings, schedule_value,
                     with_defaults)
from .distributions import make_distribution
from .fileio import PolicyFiles
from .learner import make_optimizer
from .models import PolicySpec, build_checked
from .runner import Job, TrainedPolicy
from .spaces import EnvSpec


@dataclasses.dataclass
class Trainee:
    """One trained policy: its id, model spec and model (CPU, the latest weights between calls),
    its settings, its scratch files (``files``: Adam's state and its learner's RNG) and its
    counters. Its settings are the run's (``run``, the model's: its attributes and ``config``)
    except ``fields``, where its config differs from the run's (its own settings and what they
    imply, its lanes), and ``own``, its own MUTABLE_HPARAMS (numbers or schedules). A model of
    one trained policy has neither: its settings are the run's."""
    policy_id: str
    spec: PolicySpec
    model: torch.nn.Module
    run: Settings
    files: PolicyFiles
    fields: dict = dataclasses.field(default_factory=dict)
    own: dict = dataclasses.field(default_factory=dict)
    version: int = 0          # weight updates published by its learner
    num_timesteps: int = 0    # agent steps trained on, over all train() calls
    min_version: int = 0      # samples of older versions come from replaced weights
    optimizer_epoch: int = 0  # moves when the user replaced its Adam state

    def __post_init__(self):
        self.own_now = {n: schedule_value(n, v, 1.0) for n, v in self.own.items()}

    @property
    def config(self) -> Config:
        """Its config now: the run's, with its own fields and hyper-parameters' values."""
        if not self.fields and not self.own:
            return self.run.config
        return self.run.config.replace(**{**self.fields, **self.own_now})

    def hparams_at(self, progress_remaining: float) -> dict:
        """Its MUTABLE_HPARAMS values at ``progress_remaining`` (its own, else the run's),
        checked into its config (a bad value raises ConfigError naming the field)."""
        values = self.run.at(progress_remaining)
        if self.own:
            own_now = {n: schedule_value(n, v, progress_remaining) for n, v in self.own.items()}
            self.run.config.replace(**{**self.fields, **own_now})
            self.own_now = own_now
            values = {**values, **own_now}
        return values

    def optimizer_state(self) -> dict:
        if os.path.exists(self.files.optimizer):
            return torch.load(self.files.optimizer, map_location="cpu")
        return make_optimizer(self.model, self.config).state_dict()  # not trained yet: fresh

    def trained_policy(self) -> TrainedPolicy:
        return TrainedPolicy(self.policy_id, self.config, self.spec, self.model, self.files)

    def job(self, steps: int) -> Job:
        return Job(self.model, self.version, self.num_timesteps, self.num_timesteps + steps,
                   self.hparams_at, self.min_version, self.optimizer_epoch)

    def replaced(self) -> None:
        """New weights were set: samples made before are from another policy."""
        self.version += 1
        self.min_version = self.version


def own_settings(pid: str, overrides: dict, policy: Any, policy_kwargs: Optional[dict]) -> tuple:
    """Split one trained policy's overrides (several trained policies) into (its model class,
    its policy_kwargs, its config values); graph fields raise."""
    own = dict(overrides)
    shared = sorted(set(own) & set(GRAPH_FIELDS))
    if shared:
        raise ConfigError(f"policies[{pid!r}] sets {shared}: these are shared by every policy of the "
                          "run (the rollout workers step all agents together); pass them to "
                          "APPO(...) itself")
    return own.pop("policy", policy), own.pop("policy_kwargs", policy_kwargs), own


def build_trainee(pid: str, env_spec: EnvSpec, overrides: dict, run_kwargs: dict, run: Settings,
                  lanes: int, policy: Any, policy_kwargs: Optional[dict],
                  defaults: Callable[[dict, EnvSpec], dict], files: PolicyFiles) -> Trainee:
    """A trained policy beside others: its config from the run's keywords, the defaults its
    own spaces imply (a continuous policy beside a discrete one: CONTINUOUS_DEFAULTS),
    its own values and its lanes (``defaults(kwargs, env_spec)``: the run's
    ``with_defaults``), the run's GRAPH_FIELDS kept; checked. Hyper-parameters its spaces
    imply (and the user did not set for the run) become its own."""
    policy, policy_kwargs, own = own_settings(pid, overrides, policy, policy_kwargs)
    values = {k: (schedule_value(k, v, 1.0) if k in MUTABLE_HPARAMS else v) for k, v in own.items()}
    run_cfg = run.config
    graph = {f: getattr(run_cfg, f) for f in GRAPH_FIELDS}
    try:
        cfg = Config.from_kwargs(defaults({**run_kwargs, **values, "lanes_per_env": lanes, **graph},
                                          env_spec))
    except ConfigError as e:
        raise ConfigError(f"policies[{pid!r}]: {e}") from e
    fields = {k: v for k, v in cfg.__dict__.items() if run_cfg.__dict__[k] != v}
    spec = PolicySpec(env_spec, policy, dict(policy_kwargs or {}))
    own_hparams = {k: v for k, v in own.items() if k in MUTABLE_HPARAMS}
    own_hparams.update({k: fields[k] for k in MUTABLE_HPARAMS
                        if k in fields and k not in own and k not in run_kwargs})
    return Trainee(pid, spec, build_checked(spec, cfg), run, files, fields, own_hparams)


def build_policies(trained: dict, frozen: dict, run: Settings, files: Dict[str, PolicyFiles],
                   lanes: Dict[str, int], policy: Any, policy_kwargs: Optional[dict], run_kwargs: dict,
                   defaults: Callable[[dict, EnvSpec], dict]) -> tuple:
    """The model's policies, from ``trained`` and ``frozen`` ({id: (env spec, overrides)}):
    ({id: Trainee}, {frozen id: PolicySpec}, {frozen id: model}). One trained policy's settings
    are the run's; several each have theirs over the run's (``build_trainee``). A frozen policy
    has the first trained one's policy and policy_kwargs unless it names its own, and is built
    with the run's config, as the rollout workers build it."""
    if len(trained) == 1:
        ((pid, (env_spec, _)),) = trained.items()
        spec = PolicySpec(env_spec, policy, dict(policy_kwargs or {}))
        trainees = {pid: Trainee(pid, spec, build_checked(spec, run.config), run, files[pid])}
    else:
        trainees = {pid: build_trainee(pid, env_spec, own, run_kwargs, run, lanes[pid], policy,
                                       policy_kwargs, defaults, files[pid])
                    for pid, (env_spec, own) in trained.items()}
    first = next(iter(trainees.values())).spec
    frozen_specs = {pid: PolicySpec(env_spec, own.get("policy", first.policy),
                                    dict(own.get("policy_kwargs", first.policy_kwargs) or {}))
                    for pid, (env_spec, own) in frozen.items()}
    return trainees, frozen_specs, {pid: build_checked(spec, run.config) for pid, spec in frozen_specs.items()}


def run_defaults(family: Optional[str], cpu_only: bool, multi_agent: bool,
                 custom: bool) -> Callable[[dict, EnvSpec], dict]:
    """kwargs, a trained policy's env spec -> the keywords over the run's implied defaults
    (config.with_defaults: its action space's kind, a turn-based game, a global state a
    centralised critic can read, unless ``custom``: a policy= network in the run)."""
    return lambda kwargs, spec: with_defaults(
        kwargs, family=family, cpu_only=cpu_only, actions=make_distribution(spec.action_space).kind,
        multi_agent=multi_agent, turn_based=spec.turn_based,
        critic_state=spec.critic_state and not custom)

