"""Environments shipped with asyncrl, importable as ``asyncrl.envs`` (installed from the top-level
``envs/`` folder). ``make_env`` is what every rollout worker calls to build an env from an id."""
from __future__ import annotations

from typing import Optional

import gymnasium as gym

from .atari import is_atari_id, make_atari, register as register_atari
from .doom import is_doom_id, make_doom, register as register_doom

__all__ = ["DEFAULT_ENV", "env_family", "env_ids", "is_atari_id", "is_doom_id", "make_atari",
           "make_doom", "make_env", "register_atari", "register_doom"]

DEFAULT_ENV = "CartPole-v1"

# Env families with their own preprocessing and defaults (config.FAMILY_DEFAULTS): name, test
# of an id, maker (its ids' preprocessing), registration of their ids in this process.
FAMILIES = {"atari": (is_atari_id, make_atari, register_atari),
            "doom": (is_doom_id, make_doom, register_doom)}


def env_family(env_id) -> Optional[str]:
    """"atari", "doom", or None for an id (or factory) of no family."""
    if isinstance(env_id, str):
        for name, (is_member, _, _) in FAMILIES.items():
            if is_member(env_id):
                return name
    return None


def make_env(env_id: str, **kwargs) -> gym.Env:
    """Build a Gymnasium env by id; ALE ids get the DeepMind preprocessing (envs/atari.py),
    Vizdoom ids Sample Factory's (envs/doom.py)."""
    family = env_family(env_id)
    if family is not None:
        return FAMILIES[family][1](env_id, **kwargs)
    return gym.make(env_id, **kwargs)


def env_ids() -> list:
    """Ids this process can make (for error messages), ALE and Vizdoom ones included when their
    packages are installed."""
    for _, _, register in FAMILIES.values():
        register()
    return sorted(gym.registry.keys())
