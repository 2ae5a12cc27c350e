"""Action distributions, one per action space, and the conversion of stored actions for env.step.

Every distribution maps the policy head's ``params [N, param_size]`` to samples, log-probs and
entropies. Actions are stored flat, ``[N, action_size]`` (int64 when every part is discrete,
else float32), and masks flat, ``[N, mask_size]`` bool (MaskablePPO's layout: one entry per
action of each categorical dimension, concatenated). A masked action is never sampled, and the
learner evaluates the same masked distribution the policy worker sampled from.

- ``Categorical``: ``Discrete`` (any ``start``); ``MultiCategorical``: ``MultiDiscrete`` and
  ``MultiBinary`` (two choices per bit); ``DiagGaussian``: ``Box``, with a state-independent
  learned log-std (CleanRL's ``ppo_continuous_action``): the unclipped sample is stored and
  trained on, the env gets it clipped to its bounds; ``Composite``: ``Tuple``/``Dict`` of these.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from .config import ConfigError

TORCH_FLOATS = {np.dtype(np.float16): torch.float16, np.dtype(np.float32): torch.float32,
                np.dtype(np.float64): torch.float64}
MASKED_LOGIT = -1e8  # not -inf: 0 * -inf is NaN in the entropy
LOG_2PI = math.log(2 * math.pi)
# The Gaussian's initial log std where policy_kwargs give no log_std_init, in units of each
# bounded dimension's half range: LOG_STD_INIT, -0.5, for a Box of up to MANY_ACTUATORS
# dimensions (std 0.61 for MuJoCo's and Box2D's [-1, 1], 1.21 for Pendulum's [-2, 2]; SB3's and
# CleanRL's 0 is std 1 in the env's units, whatever its range), LOG_STD_INIT_MANY, -1.0, for more
# (std 0.37 for [-1, 1]). With std 1, HalfCheetah's runs split between a running gait and a stall
# near 1,500-1,950; at 0.61 3 of 7 seeds still stalled, on the cheetah's back (greedy median
# 4,091); at 0.37 none of 7 did (median 6,151; SB3 under RL Zoo's tuned entry 6,245). Walker2d,
# Ant and the held-out Pusher (seven dimensions) stayed within their seeds' spread (greedy medians
# 3,204 against 3,705, 3,851 against 3,919, -34.0 against -31.8; no worst seed lower by more than
# 70 or 0.4); HalfCheetah, Walker2d and Ant reached their targets in fewer env steps, Pusher in 3
# of 5 seeds either way. With one to four dimensions less noise did not pay:
# MountainCarContinuous's goal, found by the noise, went from 3 of 7 seeds to 0, Hopper's median
# from 2,771 to 2,557 with 1,000 reached later, BipedalWalker reached 250 later. Pendulum needed
# the range: std 0.61 left it below -200 at 200k env steps in 3 of 3 seeds, std 1.21 reached it
# in 139k-155k. The cut between four and six is read off these envs (none has five)
# (docs/benchmarks/learning-suite.md, "Continuous control: initial action noise" and "Less
# initial noise for more than four actuators").
LOG_STD_INIT = -0.5
LOG_STD_INIT_MANY = -1.0
MANY_ACTUATORS = 4


def default_log_std(action_size: int) -> float:
    """The initial log std, in units of each dimension's half range, of a ``Box`` of
    ``action_size`` dimensions where policy_kwargs give none."""
    return LOG_STD_INIT if action_size <= MANY_ACTUATORS else LOG_STD_INIT_MANY


# A bound this far from 0 stands in for none (Box(-np.finfo(np.float32).max, ...)): such a
# dimension starts at default_log_std itself, not at a std of ~1e38.
UNBOUNDED = 1e10


def _gumbel_argmax(logits: torch.Tensor) -> torch.Tensor:
    noise = torch.empty_like(logits).exponential_().log_()  # log(Exp(1)) = -Gumbel
    return (logits - noise).argmax(dim=-1)


class ActionDistribution(nn.Module):
    param_size: int = 0
    action_size: int = 0
    mask_size: int = 0      # 0: no part of it can be masked
    discrete: bool = True   # every part discrete: actions stored as int64
    continuous_size: int = 0  # dimensions of its Box parts, in all

    @property
    def kind(self) -> str:
        """What the defaults follow (config.ACTION_DEFAULTS): "continuous" (a Box part, at most
        MANY_ACTUATORS continuous dimensions in all), "continuous_many" (more: HalfCheetah's 6),
        "factored" (several discrete choices made together: MultiDiscrete, MultiBinary, a Tuple
        or Dict of Discretes) or "categorical" (one Discrete)."""
        if not self.discrete:
            return "continuous_many" if self.continuous_size > MANY_ACTUATORS else "continuous"
        return "factored" if self.action_size > 1 else "categorical"

    def sample(self, params: torch.Tensor, mask: Optional[torch.Tensor],
               deterministic: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
        """(actions [N, action_size], log_probs [N])."""
        raise NotImplementedError

    def log_prob_entropy(self, params: torch.Tensor, actions: torch.Tensor,
                         mask: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(log_probs [N], entropy [N]) of stored ``actions``, with grad."""
        raise NotImplementedError

    def to_env(self, actions: np.ndarray) -> list:
        """Stored actions of several envs [E, action_size] -> what each env.step takes."""
        raise NotImplementedError

    def mode_env(self, params: torch.Tensor, mask: Optional[torch.Tensor]) -> List[torch.Tensor]:
        """The deterministic actions of ``params`` [N, P] in the env's format, in torch alone
        (what an exported policy computes): one [N, *shape] tensor per action leaf, the dtype
        ``to_env`` gives; the same actions as ``sample(deterministic=True)`` then ``to_env``."""
        raise NotImplementedError


class Categorical(ActionDistribution):
    def __init__(self, n: int, start: int = 0):
        super().__init__()
        self.n, self.start = int(n), int(start)
        self.param_size = self.mask_size = self.n
        self.action_size = 1

    def _log_probs(self, logits: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        if mask is not None:
            logits = logits.masked_fill(~mask, MASKED_LOGIT)
        return F.log_softmax(logits, dim=-1)

    def sample(self, params, mask, deterministic=False):
        log_p = self._log_probs(params, mask)
        actions = log_p.argmax(dim=-1) if deterministic else _gumbel_argmax(log_p)
        return actions.unsqueeze(-1), log_p.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def log_prob_entropy(self, params, actions, mask):
        log_p = self._log_probs(params, mask)
        entropy = -(log_p.exp() * log_p).sum(-1)
        return log_p.gather(-1, actions.long().view(-1, 1)).squeeze(-1), entropy

    def to_env(self, actions):
        return (actions[:, 0] + self.start).tolist() if self.start else actions[:, 0].tolist()

    def mode_env(self, params, mask):
        return [self._log_probs(params, mask).argmax(dim=-1) + self.start]


class MultiCategorical(ActionDistribution):
    """Independent categoricals over ``nvec`` (MultiDiscrete), or two-way ones (MultiBinary)."""

    def __init__(self, nvec, start=None, binary_shape: Optional[tuple] = None):
        super().__init__()
        self.nvec_shape = np.shape(nvec)
        self.parts = [Categorical(n) for n in np.asarray(nvec).reshape(-1)]
        self.start = None if start is None or not np.any(start) else np.asarray(start).reshape(-1)
        self.binary_shape = binary_shape
        self.param_size = self.mask_size = sum(p.n for p in self.parts)
        self.action_size = len(self.parts)
        self.sizes = [p.n for p in self.parts]

    def _split(self, params, mask):
        ps = params.split(self.sizes, dim=-1)
        ms = mask.split(self.sizes, dim=-1) if mask is not None else [None] * len(ps)
        return zip(self.parts, ps, ms)

    def sample(self, params, mask, deterministic=False):
        outs = [p.sample(x, m, deterministic) for p, x, m in self._split(params, mask)]
        return torch.cat([a for a, _ in outs], -1), torch.stack([lp for _, lp in outs]).sum(0)

    def log_prob_entropy(self, params, actions, mask):
        outs = [p.log_prob_entropy(x, actions[:, i], m)
                for i, (p, x, m) in enumerate(self._split(params, mask))]
        return torch.stack([lp for lp, _ in outs]).sum(0), torch.stack([e for _, e in outs]).sum(0)

    def to_env(self, actions):
        if self.binary_shape is not None:
            return list(actions.astype(np.int8).reshape(len(actions), *self.binary_shape))
        a = actions if self.start is None else actions + self.start
        return list(a.reshape(len(actions), *self.nvec_shape))

    def mode_env(self, params, mask):
        a = torch.stack([p.mode_env(x, m)[0] for p, x, m in self._split(params, mask)], -1)
        if self.binary_shape is not None:
            return [a.to(torch.int8).reshape(-1, *self.binary_shape)]
        if self.start is not None:
            a = a + torch.as_tensor(self.start)
        return [a.reshape(-1, *self.nvec_shape)]


class DiagGaussian(ActionDistribution):
    def __init__(self, space: gym.spaces.Box, log_std_init: Optional[float] = None):
        """``log_std_init``: the initial log std of every dimension, in the env's units (SB3's
        meaning); None: default_log_std (by the number of dimensions) in units of each
        dimension's half range where both bounds are finite and within UNBOUNDED of 0 (the
        value itself where they are not)."""
        super().__init__()
        self.shape, self.dtype = space.shape, space.dtype
        self.param_size = self.action_size = self.continuous_size = int(np.prod(space.shape))
        self.discrete = False
        bounded = np.isfinite(space.low).any() or np.isfinite(space.high).any()
        self.low = space.low.reshape(-1).astype(np.float32) if bounded else None  # +-inf: no clip
        self.high = space.high.reshape(-1).astype(np.float32) if bounded else None
        if log_std_init is not None:
            init = np.full(self.action_size, float(log_std_init))
        else:  # a share of each dimension's range, where it has one
            init = np.full(self.action_size, default_log_std(self.action_size))
            low, high = (b.reshape(-1).astype(np.float64) for b in (space.low, space.high))
            ranged = (high > low) & (np.abs(low) < UNBOUNDED) & (np.abs(high) < UNBOUNDED)
            init[ranged] += np.log((high[ranged] - low[ranged]) / 2)
        self.log_std = nn.Parameter(torch.as_tensor(init, dtype=torch.float32))

    def sample(self, params, mask, deterministic=False):
        if deterministic:
            actions = params
        else:
            actions = params + self.log_std.exp() * torch.randn_like(params)
        return actions, self._log_prob(params, actions)

    def _log_prob(self, mean, actions):
        log_std = self.log_std.expand_as(mean)
        z = (actions - mean) * torch.exp(-log_std)
        return (-0.5 * z * z - log_std - 0.5 * LOG_2PI).sum(-1)

    def log_prob_entropy(self, params, actions, mask):
        entropy = (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(params.shape[0])
        return self._log_prob(params, actions), entropy

    def to_env(self, actions):
        if self.low is not None:
            actions = np.clip(actions, self.low, self.high)
        return list(actions.astype(self.dtype, copy=False).reshape(len(actions), *self.shape))

    def mode_env(self, params, mask):
        a = params
        if self.low is not None:  # (an infinite bound of a half-bounded Box clips nothing)
            a = torch.minimum(torch.maximum(a, torch.as_tensor(self.low)), torch.as_tensor(self.high))
        return [a.to(TORCH_FLOATS[np.dtype(self.dtype)]).reshape(-1, *self.shape)]


class Composite(ActionDistribution):
    """A ``Tuple`` or ``Dict`` of distributions (hybrid actions): parameters, actions and masks are
    the parts' concatenated; log-probs and entropies add up."""

    def __init__(self, parts: List[ActionDistribution], keys: Optional[List[str]] = None):
        super().__init__()
        self.parts, self.keys = nn.ModuleList(parts), keys
        self.param_size = sum(p.param_size for p in parts)
        self.action_size = sum(p.action_size for p in parts)
        self.mask_size = sum(p.mask_size for p in parts)
        self.continuous_size = sum(p.continuous_size for p in parts)
        self.discrete = all(p.discrete for p in parts)

    def _split(self, params, actions, mask):
        ps = params.split([p.param_size for p in self.parts], -1)
        acts = actions.split([p.action_size for p in self.parts], -1) if actions is not None \
            else [None] * len(ps)
        if mask is None:
            ms = [None] * len(ps)
        else:
            ms = [m if p.mask_size else None
                  for p, m in zip(self.parts, mask.split([p.mask_size for p in self.parts], -1))]
        return zip(self.parts, ps, acts, ms)

    def sample(self, params, mask, deterministic=False):
        outs = [p.sample(x, m, deterministic) for p, x, _, m in self._split(params, None, mask)]
        dtype = torch.int64 if self.discrete else torch.float32
        return (torch.cat([a.to(dtype) for a, _ in outs], -1),
                torch.stack([lp for _, lp in outs]).sum(0))

    def log_prob_entropy(self, params, actions, mask):
        outs = [p.log_prob_entropy(x, a, m) for p, x, a, m in self._split(params, actions, mask)]
        return torch.stack([lp for lp, _ in outs]).sum(0), torch.stack([e for _, e in outs]).sum(0)

    def to_env(self, actions):
        cols = np.cumsum([0] + [p.action_size for p in self.parts])
        per_part = []
        for p, lo, hi in zip(self.parts, cols[:-1], cols[1:]):
            part = actions[:, lo:hi]
            per_part.append(p.to_env(part.astype(np.int64) if p.discrete else part))
        if self.keys is None:
            return [tuple(a) for a in zip(*per_part)]
        return [dict(zip(self.keys, a)) for a in zip(*per_part)]

    def mode_env(self, params, mask):
        return [a for p, x, _, m in self._split(params, None, mask) for a in p.mode_env(x, m)]

    def leaf_names(self) -> List[str]:
        """The parts' names: the Dict's keys, or the Tuple's indices."""
        return list(self.keys) if self.keys is not None else [str(i) for i in range(len(self.parts))]


def mask_sizes(dist: ActionDistribution) -> List[int]:
    """The sizes of the categorical segments of a mask, in its order (each needs a legal action)."""
    if isinstance(dist, Categorical):
        return [dist.n]
    if isinstance(dist, MultiCategorical):
        return list(dist.sizes)
    if isinstance(dist, Composite):
        return [n for p in dist.parts for n in mask_sizes(p)]
    return []


def make_distribution(space: gym.Space, log_std_init: Optional[float] = None,
                      _key: str = "action") -> ActionDistribution:
    """The distribution of an action space; unsupported spaces raise, naming what to use."""
    if isinstance(space, gym.spaces.Discrete):
        return Categorical(space.n, space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical(space.nvec, space.start)
    if isinstance(space, gym.spaces.MultiBinary):
        shape = tuple(np.atleast_1d(space.n))
        return MultiCategorical(np.full(shape, 2), binary_shape=shape)
    if isinstance(space, gym.spaces.Box):
        if not np.issubdtype(space.dtype, np.floating):
            raise ConfigError(f"{_key}: a Box action space of dtype {space.dtype} is not supported; "
                              "use a float Box (continuous) or MultiDiscrete (integer vectors)")
        return DiagGaussian(space, log_std_init)
    if isinstance(space, (gym.spaces.Tuple, gym.spaces.Dict)):
        items = list(space.spaces.items()) if isinstance(space, gym.spaces.Dict) \
            else list(enumerate(space.spaces))
        if not items:
            raise ConfigError(f"{_key}: an empty {type(space).__name__} action space")
        for k, sub in items:
            if not isinstance(sub, (gym.spaces.Discrete, gym.spaces.Box)):
                raise ConfigError(
                    f"{_key}.{k}: {sub} inside a {type(space).__name__} action space is not "
                    "supported; hybrid actions may combine Discrete and Box parts")
        parts = [make_distribution(sub, log_std_init, f"{_key}.{k}") for k, sub in items]
        return Composite(parts, [k for k, _ in items] if isinstance(space, gym.spaces.Dict) else None)
    raise ConfigError(f"action space {space} is not supported; use Discrete, MultiDiscrete, "
                      "MultiBinary, Box, or a Tuple/Dict of Discrete and Box")
