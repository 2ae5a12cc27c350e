"""Turning the user's ``env`` argument into a picklable factory, and checking it early."""
from __future__ import annotations

import difflib
import pickle
from typing import Callable, Tuple, Union

import gymnasium as gym
import numpy as np

from .config import ConfigError

OBS_DTYPES = (np.uint8, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64)


class GymIdFactory:
    """Picklable zero-argument factory for a registered Gymnasium id."""

    def __init__(self, env_id: str, env_kwargs: dict):
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs)

    def __call__(self) -> gym.Env:
        from asyncrl.envs import make_env
        return make_env(self.env_id, **self.env_kwargs)

    def __repr__(self):
        return f"GymIdFactory({self.env_id!r})"


def make_env_factory(env: Union[str, Callable[[], gym.Env]], env_kwargs: dict = None) -> Callable:
    """Check ``env`` in the main process and return a factory every worker can unpickle."""
    if isinstance(env, str):
        from asyncrl.envs import env_ids
        ids = env_ids()
        if env not in ids:
            close = difflib.get_close_matches(env, ids, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigError(f"env {env!r} is not a registered Gymnasium id.{hint} Pass a "
                              "registered id or a picklable zero-argument function returning an env.")
        return GymIdFactory(env, env_kwargs or {})
    if isinstance(env, gym.Env):
        raise ConfigError(
            "env must be a Gymnasium id or a picklable zero-argument factory, not an env instance: "
            "each worker process builds its own envs. Pass its id, a module-level function, or "
            "functools.partial(gym.make, 'CartPole-v1').")
    if not callable(env):
        raise ConfigError(f"env={env!r}: expected a Gymnasium id (str) or a zero-argument factory")
    if env_kwargs:
        raise ConfigError("env_kwargs only applies to a Gymnasium id; bind arguments into the factory")
    try:
        pickle.dumps(env)
    except Exception as e:
        raise ConfigError(
            f"env factory {env!r} cannot be pickled ({type(e).__name__}: {e}); worker processes are "
            "started with spawn and must receive it. Define it at module level (not a lambda or a "
            "nested function), or use functools.partial.") from e
    return env


def eval_env_factory(factory: Callable) -> Callable:
    """The factory of an env for evaluation: Atari ids without episodic life, so an episode is a
    whole game; any other factory as it is."""
    if isinstance(factory, GymIdFactory) and factory.env_kwargs.get("episodic_life"):
        return GymIdFactory(factory.env_id, {**factory.env_kwargs, "episodic_life": False})
    return factory


def probe_env(factory: Callable) -> Tuple[gym.spaces.Box, gym.spaces.Discrete]:
    """Build one env in the main process, check its spaces and first observation, close it."""
    try:
        env = factory()
    except Exception as e:
        raise ConfigError(f"the env factory {factory!r} failed in the main process: "
                          f"{type(e).__name__}: {e}") from e
    if not isinstance(env, gym.Env):
        raise ConfigError(f"the env factory returned {type(env).__name__}, not a gymnasium.Env "
                          "(a missing `return`?)")
    try:
        obs_space, act_space = env.observation_space, env.action_space
        check_spaces(obs_space, act_space)
        obs, _ = env.reset(seed=0)
        if not obs_space.contains(np.asarray(obs, dtype=obs_space.dtype)) or \
                np.shape(obs) != obs_space.shape:
            raise ConfigError(
                f"the env's first observation (shape {np.shape(obs)}) does not lie in its declared "
                f"observation_space {obs_space}; fix the env's observation_space or its reset()")
        return obs_space, act_space
    finally:
        env.close()


def check_spaces(obs_space, act_space) -> None:
    if not isinstance(act_space, gym.spaces.Discrete):
        raise ConfigError(f"action space {act_space} is not supported yet: asyncrl supports "
                          "Discrete actions")
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"observation space {obs_space} is not supported yet: asyncrl supports "
                          "Box observations (vectors, or uint8 images as [C, H, W])")
    if len(obs_space.shape) == 3 and obs_space.dtype == np.uint8:
        c, h, w = obs_space.shape
        if obs_space.shape[-1] in (1, 3, 4) and c > 4:
            raise ConfigError(
                f"image observations of shape {obs_space.shape} look channel-last [H, W, C]; asyncrl "
                "expects [C, H, W]: wrap the env to transpose them (np.transpose(obs, (2, 0, 1)) and "
                "a matching Box)")
        if h < 36 or w < 36:
            raise ConfigError(f"image observations of shape {obs_space.shape} are smaller than the "
                              "Nature CNN's 36 x 36 minimum; resize them (Atari uses 84 x 84)")
    if obs_space.dtype.type not in OBS_DTYPES:
        raise ConfigError(f"observation dtype {obs_space.dtype} is not supported: use one of "
                          f"{[np.dtype(d).name for d in OBS_DTYPES]}")


def storage_dtype(obs_space: gym.spaces.Box) -> np.dtype:
    """uint8 stays uint8 (images); everything else is stored as float32."""
    return np.dtype(np.uint8) if obs_space.dtype == np.uint8 else np.dtype(np.float32)
