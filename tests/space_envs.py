"""Module-level envs, factories and networks for tests/test_spaces.py: picklable, so spawned workers
can build them (``functools.partial`` of a class here, or one of the functions)."""
from __future__ import annotations

import copy
import functools
import string
from typing import Any, Optional

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

MASK_KEY = "action_mask"

# Every action any env of this module received, per process (serial mode and predict/evaluate
# run the envs in the test process): the tests read it, and clear it first.
SEEN_ACTIONS: list = []


class IllegalAction(AssertionError):
    """An env received an action outside its action space (or a masked one)."""


def legal(space: gym.Space, action: Any) -> bool:
    """Whether ``action`` is exactly what an env with action space ``space`` may receive: in the
    space, of its shape; a Discrete action an integer in [start, start + n)."""
    if isinstance(space, Box):
        try:
            arr = np.asarray(action, dtype=space.dtype)
        except (TypeError, ValueError):
            return False
        return arr.shape == space.shape and bool(np.all(np.isfinite(arr))) and space.contains(arr)
    if isinstance(space, Discrete):
        if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer, np.ndarray)):
            return False
        arr = np.asarray(action)
        if arr.shape != () or not np.issubdtype(arr.dtype, np.integer):
            return False
        return int(space.start) <= int(arr) < int(space.start) + int(space.n)
    if isinstance(space, MultiDiscrete):
        arr = np.asarray(action)
        return (arr.shape == space.shape and np.issubdtype(arr.dtype, np.integer)
                and bool(np.all(arr >= space.start)) and bool(np.all(arr < space.start + space.nvec)))
    if isinstance(space, MultiBinary):
        arr = np.asarray(action)
        return (arr.shape == space.shape and np.issubdtype(arr.dtype, np.integer)
                and bool(np.all((arr == 0) | (arr == 1))))
    if isinstance(space, Tuple):
        return (isinstance(action, tuple) and len(action) == len(space.spaces)
                and all(legal(s, a) for s, a in zip(space.spaces, action)))
    if isinstance(space, Dict):
        return (isinstance(action, dict) and set(action) == set(space.spaces)
                and all(legal(s, action[k]) for k, s in space.spaces.items()))
    raise TypeError(f"no legality check for {space}")


class SpaceEnv(gym.Env):
    """Observations sampled from ``obs_space`` (seeded by reset), random rewards, episodes of
    ``ep_len`` steps; step() raises IllegalAction on anything ``act_space`` does not hold."""

    def __init__(self, obs_space: gym.Space, act_space: gym.Space, ep_len: int = 5, record: bool = False):
        # copies: in serial mode the spaces would otherwise be the test's (and share its RNG)
        self.observation_space, self.action_space = copy.deepcopy(obs_space), copy.deepcopy(act_space)
        self.ep_len, self.record = ep_len, record
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        if not legal(self.action_space, action):
            raise IllegalAction(f"illegal action {action!r} ({type(action).__name__}) for {self.action_space}")
        if self.record:
            SEEN_ACTIONS.append(action)
        self.t += 1
        return (self.observation_space.sample(), float(self.np_random.normal()), False,
                self.t >= self.ep_len, {})


def space_env(obs_space, act_space, ep_len: int = 5, record: bool = False):
    return functools.partial(SpaceEnv, obs_space, act_space, ep_len, record)


# --- action masks, the three conventions -------------------------------------------------------
def mask_size(space: gym.Space) -> int:
    return int(space.n) if isinstance(space, Discrete) else int(np.sum(space.nvec))


def random_mask(rng: np.random.Generator, space: gym.Space) -> np.ndarray:
    """A random mask: per categorical dimension at least one legal and (for n > 1) at least one
    illegal action."""
    sizes = [int(space.n)] if isinstance(space, Discrete) else [int(n) for n in space.nvec]
    parts = []
    for n in sizes:
        m = np.zeros(n, bool)
        k = rng.integers(1, n) if n > 1 else 1
        m[rng.choice(n, size=k, replace=False)] = True
        parts.append(m)
    return np.concatenate(parts)


def masked_ok(space: gym.Space, mask: np.ndarray, action: Any) -> bool:
    """Whether ``action`` (env format) is legal under ``mask``."""
    if isinstance(space, Discrete):
        return bool(mask[int(action) - int(space.start)])
    offset = 0
    for n, start, a in zip(space.nvec, space.start, np.asarray(action).reshape(-1)):
        if not mask[offset + int(a) - int(start)]:
            return False
        offset += int(n)
    return True


class MaskedEnv(gym.Env):
    """New legal actions every step, announced by ``convention``: "method" (``action_masks()``,
    MaskablePPO), "info" (``info["action_mask"]``, Taxi) or "obs" (a Dict observation with an
    "action_mask" key, PettingZoo classic). Raises IllegalAction on a masked action. Reward 1 for
    the legal action the observation points at (``obs`` = one-hot of the first legal action),
    so a policy can learn something."""

    def __init__(self, convention: str, act_space: gym.Space, ep_len: int = 8,
                 bad_mask: Optional[str] = None):
        self.convention, self.action_space, self.ep_len = convention, act_space, ep_len
        self.bad_mask = bad_mask  # "size" or "dtype": a broken env
        self.n = mask_size(act_space)
        self.mask = np.ones(self.n, bool)
        self.t = 0
        vec = Box(0.0, 1.0, (self.n,), np.float32)
        if convention == "obs":  # a broken mask is declared as it comes (the obs lies in its space)
            m = self._mask_out()
            mask_space = Box(0, 1, m.shape, np.int8 if m.dtype == bool else m.dtype)
            self.observation_space = Dict({"obs": vec, MASK_KEY: mask_space})
        else:
            self.observation_space = vec

    def _mask_out(self):
        m = self.mask
        if self.bad_mask == "size":
            m = m[:-1]
        elif self.bad_mask == "dtype":
            m = m.astype(np.float32)
        return m

    def _observe(self):
        self.mask = random_mask(self.np_random, self.action_space)
        vec = np.zeros(self.n, np.float32)
        vec[int(np.flatnonzero(self.mask)[0])] = 1.0
        info = {MASK_KEY: self._mask_out()} if self.convention == "info" else {}
        if self.convention == "obs":
            m = self._mask_out()
            return {"obs": vec, MASK_KEY: m.astype(np.int8) if m.dtype == bool else m}, info
        return vec, info

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe()

    def step(self, action):
        if not legal(self.action_space, action):
            raise IllegalAction(f"illegal action {action!r} for {self.action_space}")
        if not masked_ok(self.action_space, self.mask, action):
            raise IllegalAction(f"masked action {action!r} under mask {self.mask.astype(int)}")
        first = int(np.flatnonzero(self.mask)[0])
        reward = float(int(action) - int(self.action_space.start) == first) \
            if isinstance(self.action_space, Discrete) else 0.0
        self.t += 1
        obs, info = self._observe()
        return obs, reward, False, self.t >= self.ep_len, info


class MethodMaskedEnv(MaskedEnv):
    """The "method" convention: sb3-contrib's ``action_masks()``."""

    def action_masks(self):
        return self._mask_out()


def masked_env(convention: str, act_space, ep_len: int = 8, bad_mask: Optional[str] = None):
    cls = MethodMaskedEnv if convention == "method" else MaskedEnv
    return functools.partial(cls, convention, act_space, ep_len, bad_mask)


class ContinuousMaskedEnv(gym.Env):
    """A Box action space with an ``action_masks()`` method: nothing to mask."""

    observation_space = Box(-1.0, 1.0, (2,), np.float32)
    action_space = Box(-1.0, 1.0, (2,), np.float32)

    def action_masks(self):
        return np.ones(2, bool)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, True, False, {}


# --- learning checks ---------------------------------------------------------------------------
class TargetEnv(gym.Env):
    """One-step episodes: obs = a target in [-1, 1], reward = -|action - target|."""

    observation_space = Box(-1.0, 1.0, (1,), np.float32)
    action_space = Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1, 1, (1,)).astype(np.float32)
        return self.target.copy(), {}

    def step(self, action):
        if not legal(self.action_space, action):
            raise IllegalAction(f"illegal action {action!r}")
        reward = -float(np.abs(np.asarray(action, np.float32) - self.target).sum())
        return self.target.copy(), reward, True, False, {}


def target_env():
    return TargetEnv()


class CueEnv(gym.Env):
    """Dict observation: "cue" (Discrete(4)) says which action pays 1; "noise" is a distractor.
    Episodes of 8 steps."""

    observation_space = Dict({"cue": Discrete(4), "noise": Box(-1.0, 1.0, (3,), np.float32)})
    action_space = Discrete(4)

    def _obs(self):
        self.cue = int(self.np_random.integers(4))
        return {"cue": self.cue, "noise": self.np_random.uniform(-1, 1, 3).astype(np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not legal(self.action_space, action):
            raise IllegalAction(f"illegal action {action!r}")
        reward = float(int(action) == self.cue)
        self.t += 1
        return self._obs(), reward, False, self.t >= 8, {}


def cue_env():
    return CueEnv()


class CopyEnv(gym.Env):
    """MultiDiscrete observation and action of the same nvec: the reward is the number of
    dimensions where the action copies the observation. Episodes of 8 steps."""

    NVEC = (3, 4, 2)
    observation_space = MultiDiscrete(NVEC)
    action_space = MultiDiscrete(NVEC)

    def _obs(self):
        self.obs = self.observation_space.sample()
        return self.obs.copy()

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        if not legal(self.action_space, action):
            raise IllegalAction(f"illegal action {action!r}")
        reward = float(np.sum(np.asarray(action) == self.obs))
        self.t += 1
        return self._obs(), reward, False, self.t >= 8, {}


def copy_env():
    return CopyEnv()


# --- networks in SB3's and in asyncrl's custom-policy contracts ---------------------------------
try:
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
except ImportError:  # the SB3 tests skip
    BaseFeaturesExtractor = nn.Module


class SmallExtractor(BaseFeaturesExtractor):
    """A user's SB3 extractor of a flat Box observation."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 16, width: Optional[int] = None):
        super().__init__(observation_space, features_dim)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(observation_space.shape)),
                                                          width or features_dim), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class CustomPolicy(nn.Module):
    """A whole custom network over a Dict observation with keys "img" (uint8 [7, 7, 3] image),
    "cue" (Discrete(3)) and "pos" (Box (2,)). It checks the preprocessing it was promised: floats,
    the image channel-first in [0, 1], the Discrete one-hot."""

    def __init__(self, observation_space, action_space, param_size, hidden: int = 32):
        super().__init__()
        assert isinstance(observation_space, Dict), observation_space
        self.img = nn.Sequential(nn.Flatten(), nn.Linear(3 * 7 * 7, hidden))
        self.body = nn.Sequential(nn.Linear(hidden + 3 + 2, hidden), nn.Tanh())
        self.pi, self.vf = nn.Linear(hidden, param_size), nn.Linear(hidden, 1)
        self.calls = 0

    def forward(self, obs):
        img, cue, pos = obs["img"], obs["cue"], obs["pos"]
        n = img.shape[0]
        assert img.dtype == torch.float32 and tuple(img.shape) == (n, 3, 7, 7), img.shape
        assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0
        assert cue.dtype == torch.float32 and tuple(cue.shape) == (n, 3), cue.shape
        assert torch.all(cue.sum(-1) == 1) and torch.all((cue == 0) | (cue == 1))
        assert tuple(pos.shape) == (n, 2), pos.shape
        self.calls += 1
        h = self.body(torch.cat([self.img(img), cue, pos], -1))
        return self.pi(h), self.vf(h).squeeze(-1)


class TextCueEnv(CueEnv):
    """CueEnv whose cue is text: "mission" (a Text space) names the colour whose action pays 1,
    in one of three phrasings (the colour the 4th or 5th word, words after it or none)."""

    COLOURS = ("red", "green", "blue", "grey")
    PHRASES = ("go to the {}", "you must reach the {} door", "now pick up the {} key, then stop")
    observation_space = Dict({"mission": gym.spaces.Text(48, charset=string.ascii_lowercase + " ,"),
                              "noise": Box(-1.0, 1.0, (3,), np.float32)})

    def _obs(self):
        obs = super()._obs()
        phrase = self.PHRASES[int(self.np_random.integers(len(self.PHRASES)))]
        return {"mission": phrase.format(self.COLOURS[obs.pop("cue")]), **obs}


def text_cue_env():
    return TextCueEnv()
