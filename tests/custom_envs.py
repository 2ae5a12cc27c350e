"""Module-level env factories for the tests: picklable, so spawned workers can build them."""
from __future__ import annotations

import gymnasium as gym
import numpy as np

FAIL_AFTER_STEPS = 150
FAIL_MESSAGE = "custom env exploded on purpose"


def cartpole():
    """A plain factory (not a registered id): what a user passes for their own env."""
    return gym.make("CartPole-v1")


class FailingEnv(gym.Env):
    """CartPole-like spaces; step() raises after FAIL_AFTER_STEPS steps of this env."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.num_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.num_steps += 1
        if self.num_steps > FAIL_AFTER_STEPS:
            raise RuntimeError(f"{FAIL_MESSAGE} at step {self.num_steps}")
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, 1.0, self.num_steps % 20 == 0, False, {}


def failing_env():
    return FailingEnv()


class BoxActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}


def box_action_env():
    return BoxActionEnv()


class DictObsEnv(gym.Env):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"pos": np.zeros(2, np.float32)}, 0.0, True, False, {}


def dict_obs_env():
    return DictObsEnv()


class OutOfSpaceEnv(gym.Env):
    """Declares observations in [0, 1] but reset() returns 5.0 everywhere."""

    observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(4, 5.0, np.float32), {}

    def step(self, action):
        return np.full(4, 0.5, np.float32), 0.0, True, False, {}


def out_of_space_env():
    return OutOfSpaceEnv()
