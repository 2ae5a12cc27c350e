"""Environments shipped with asyncrl, importable as ``asyncrl.envs`` (installed from the top-level
``envs/`` folder). ``make_env`` is what every rollout worker calls to build an env from an id."""
from __future__ import annotations

import gymnasium as gym

from .atari import is_atari_id, make_atari, register as register_atari

__all__ = ["DEFAULT_ENV", "env_ids", "is_atari_id", "make_atari", "make_env", "register_atari"]

DEFAULT_ENV = "CartPole-v1"


def make_env(env_id: str, **kwargs) -> gym.Env:
    """Build a Gymnasium env by id; ALE ids get the DeepMind preprocessing (see envs/atari.py)."""
    if is_atari_id(env_id):
        return make_atari(env_id, **kwargs)
    return gym.make(env_id, **kwargs)


def env_ids() -> list:
    """Ids this process can make (for error messages), ALE ones included when ale-py is installed."""
    register_atari()
    return sorted(gym.registry.keys())
