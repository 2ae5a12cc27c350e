"""Environments shipped with asyncrl, importable as ``asyncrl.envs`` (installed from the top-level
``envs/`` folder). ``make_env`` is what every rollout worker calls to build an env from an id."""
from __future__ import annotations

import gymnasium as gym

DEFAULT_ENV = "CartPole-v1"


def make_env(env_id: str, **kwargs) -> gym.Env:
    """Build a Gymnasium env by id, registering optional env families first."""
    return gym.make(env_id, **kwargs)


def env_ids() -> list:
    """Ids this process can make (for error messages)."""
    return sorted(gym.registry.keys())
