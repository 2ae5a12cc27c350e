"""A trained policy as the facade keeps it between ``train()`` calls: its model (CPU), its own
settings, counters and the file of its Adam state; and how several trained policies' configs
are derived from the run's (each may override any field but ``GRAPH_FIELDS``)."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

import torch

from .config import GRAPH_FIELDS, MUTABLE_HPARAMS, Config, ConfigError, with_defaults
from .distributions import make_distribution
from .learner import make_optimizer
from .models import PolicySpec, build_checked
from .runner import Job, TrainedPolicy
from .spaces import EnvSpec


@dataclasses.dataclass
class Trainee:
    """One trained policy. ``fields``: where its config differs from the run's (its own
    settings and what they imply, its lanes); ``own``: its own MUTABLE_HPARAMS values or
    schedules (else the model's attributes apply)."""
    policy_id: str
    spec: PolicySpec
    model: torch.nn.Module
    fields: dict
    own: dict
    optimizer_path: str = ""
    version: int = 0          # weight updates published by its learner
    num_timesteps: int = 0    # agent steps trained on, over all train() calls
    min_version: int = 0      # samples of older versions come from replaced weights
    optimizer_epoch: int = 0  # moves when the user replaced its Adam state

    def config(self, run_cfg: Config, hparams: Optional[dict] = None) -> Config:
        """Its config: the run's with its own fields (and ``hparams``, current values)."""
        if not self.fields and not hparams:
            return run_cfg
        return run_cfg.replace(**{**self.fields, **(hparams or {})})

    def optimizer_state(self, cfg: Config) -> dict:
        if os.path.exists(self.optimizer_path):
            return torch.load(self.optimizer_path, map_location="cpu")
        return make_optimizer(self.model, cfg).state_dict()  # not trained yet: fresh

    def trained_policy(self, cfg: Config) -> TrainedPolicy:
        return TrainedPolicy(self.policy_id, cfg, self.spec, self.model, self.optimizer_path)

    def job(self, steps: int, hparams: Callable[[float], dict]) -> Job:
        return Job(self.model, self.version, self.num_timesteps, self.num_timesteps + steps,
                   hparams, self.min_version, self.optimizer_epoch)

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


def build_trainee(pid: str, env_spec: EnvSpec, overrides: dict, run_kwargs: dict, run_cfg: Config,
                  lanes: int, policy: Any, policy_kwargs: Optional[dict],
                  defaults: Callable[[dict, bool], dict]) -> Trainee:
    """A trained policy beside others: its config from the run's keywords, the defaults its
    own action space implies (a continuous policy beside a discrete one: CONTINUOUS_DEFAULTS),
    its own values and its lanes (``defaults(kwargs, continuous)``: the run's
    ``with_defaults``), the run's GRAPH_FIELDS kept; checked. Hyper-parameters its action
    space implies (and the user did not set for the run) become its own."""
    policy, policy_kwargs, own = own_settings(pid, overrides, policy, policy_kwargs)
    values = {k: (v(1.0) if k in MUTABLE_HPARAMS and callable(v) else v) for k, v in own.items()}
    continuous = not make_distribution(env_spec.action_space).discrete
    graph = {f: getattr(run_cfg, f) for f in GRAPH_FIELDS}
    try:
        cfg = Config.from_kwargs(defaults({**run_kwargs, **values, "lanes_per_env": lanes, **graph},
                                          continuous))
    except ConfigError as e:
        raise ConfigError(f"policies[{pid!r}]: {e}") from e
    fields = {k: v for k, v in cfg.__dict__.items() if run_cfg.__dict__[k] != v}
    spec = PolicySpec(env_spec, policy, dict(policy_kwargs or {}))
    own_hparams = {k: v for k, v in own.items() if k in MUTABLE_HPARAMS}
    own_hparams.update({k: fields[k] for k in MUTABLE_HPARAMS
                        if k in fields and k not in own and k not in run_kwargs})
    return Trainee(pid, spec, build_checked(spec, cfg), fields, own_hparams)


def run_defaults(family: Optional[str], cpu_only: bool,
                 multi_agent: bool) -> Callable[[dict, bool], dict]:
    """kwargs, continuous -> the keywords over the run's implied defaults (config.with_defaults)."""
    return lambda kwargs, continuous: with_defaults(kwargs, family=family, cpu_only=cpu_only,
                                                    continuous=continuous, multi_agent=multi_agent)

