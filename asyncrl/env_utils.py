"""Turning the user's ``env`` argument into a picklable factory, and checking it early."""
from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Union

import gymnasium as gym
import numpy as np

from . import pickling
from .config import ConfigError
from .distributions import make_distribution
from .multiagent import (DEFAULT_POLICY, AgentLayout, agents_of, build_layout, global_state_space,
                         is_parallel_env, policies_by_space)
from .spaces import MASK_KEY, EnvSpec, check_mask, detect_mask_source, read_mask
from .turns import TurnBased, TurnBasedEnv, is_aec_env, movers

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
        module, _, env_id = env.rpartition(":")  # Gymnasium's "module:EnvId": import, then make
        if module:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise ConfigError(f"env {env!r}: module {module!r} (imported to register the id) "
                                  f"could not be imported ({e}); pip install it") from e
        ids = env_ids()
        if env_id not in ids:
            close = difflib.get_close_matches(env_id, ids, n=3)
            hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ConfigError(f"env {env_id!r} is not a registered Gymnasium id.{hint} Pass a "
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
    pickling.dumps(env, "env factory")  # fails here, naming it, not in the workers
    return env


def time_limit(env) -> Optional[int]:
    """The env's time limit in steps: its spec's ``max_episode_steps`` or the outermost
    gymnasium TimeLimit wrapper's (None: none known)."""
    spec = getattr(env, "spec", None)
    if spec is not None and spec.max_episode_steps:
        return int(spec.max_episode_steps)
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return int(env._max_episode_steps)
        env = env.env
    return None


def eval_env_factory(factory: Callable) -> Callable:
    """The factory of an env for evaluation: Atari ids without episodic life, so an episode is a
    whole game; any other factory as it is."""
    if isinstance(factory, GymIdFactory) and factory.env_kwargs.get("episodic_life"):
        return GymIdFactory(factory.env_id, {**factory.env_kwargs, "episodic_life": False})
    return factory


class Probed(NamedTuple):
    """What ``probe_env`` found: {trained policy id: (spec of its agents, its overrides
    (``policies[id]`` as a dict))}, in order (a single-agent env: the env's spec under
    ``"policy"``), and for a multi-agent env the agent layout and {frozen policy id: (spec,
    overrides)}; ``factory``: the one to build envs with (a turn-based game's wraps the user's,
    see turns); ``policies`` and ``policy_mapping``: the caller's, or those derived from the
    agents' spaces where the caller gave neither (``multiagent.policies_by_space``)."""
    trained: Dict[str, Tuple[EnvSpec, dict]]
    factory: Callable
    agents: Optional[AgentLayout] = None
    frozen: Dict[str, Tuple[EnvSpec, dict]] = {}
    policies: Optional[dict] = None
    policy_mapping: Optional[Callable] = None


def probe_env(factory: Callable, policies: Optional[dict] = None,
              policy_mapping: Optional[Callable] = None) -> Probed:
    """Build one env in the main process, check its spaces, first observation and action mask
    (per policy of a multi-agent env: a PettingZoo ParallelEnv, or an AECEnv, whose games are
    stepped turn by turn), close it."""
    try:
        env = factory()
    except Exception as e:
        raise ConfigError(f"the env factory {factory!r} failed in the main process: "
                          f"{type(e).__name__}: {e}") from e
    if is_aec_env(env):
        env, factory = TurnBasedEnv(env), TurnBased(factory)
    multi = is_parallel_env(env)
    if not multi and not isinstance(env, gym.Env):
        raise ConfigError(f"the env factory returned {type(env).__name__}, not a gymnasium.Env "
                          "nor a PettingZoo ParallelEnv or AECEnv (a missing `return`?)")
    if not multi and (policies is not None or policy_mapping is not None):
        env.close()
        raise ConfigError("policies and policy_mapping apply to multi-agent envs (a PettingZoo "
                          "ParallelEnv); this env is a single-agent gymnasium.Env")
    try:
        if not multi:
            obs, info = env.reset(seed=0)
            source = detect_mask_source(env, obs, info)
            return Probed({DEFAULT_POLICY: (_checked_spec(env, env.observation_space,
                                                          env.action_space, source, obs, info), {})},
                          factory)
        if policies is None and policy_mapping is None:
            policies, policy_mapping = policies_by_space(env)
        layout, spaces = build_layout(env, policies, policy_mapping)
        observations, infos = env.reset(seed=0)
        specs = {}
        for pid, (obs_space, act_space, overrides) in spaces.items():
            players = [a for a in observations if a in agents_of(layout, pid)]
            if not players:
                raise ConfigError(f"after reset the env's observations hold none of the agents "
                                  f"that play policy {pid!r}")
            # in a turn-based game only the agent to move has legal actions
            agent = next((a for a in players if a in movers(env)), players[0])
            obs, info = observations[agent], infos.get(agent, {})
            spec = _checked_spec(env, obs_space, act_space, _mask_source(obs_space, obs, info),
                                 obs, info, moves=agent in movers(env))
            specs[pid] = (spec, overrides)
        return Probed({pid: specs[pid] for pid in layout.trained}, factory, layout,
                      {pid: specs[pid] for pid in layout.frozen}, policies, policy_mapping)
    finally:
        env.close()


def _checked_spec(env, obs_space: gym.Space, act_space: gym.Space, source: Optional[str], obs,
                  info, moves: bool = True) -> EnvSpec:
    """The spec of one pair of spaces, checked against a first observation and its mask (that
    of an agent to move: ``moves``)."""
    dist = make_distribution(act_space)  # unsupported action spaces raise here
    if source is not None and not dist.mask_size:
        raise ConfigError(f"the env provides action masks ({source}) but its action space "
                          f"{act_space} has no discrete part to mask")
    spec = EnvSpec(obs_space, act_space, source, dist.mask_size if source else 0,
                   turn_based=isinstance(env, TurnBasedEnv), global_state_size=_global_state_size(env))
    if not _contains(obs_space, obs):
        raise ConfigError(
            f"the env's first observation ({_describe(obs)}) does not lie in its declared "
            f"observation_space {obs_space}; fix the env's observation_space or its reset()")
    if source == "obs":  # the declared size, whether or not this agent moves now
        declared = getattr(obs_space.spaces[MASK_KEY], "shape", None)
        if declared is None or int(np.prod(declared)) != spec.mask_size:
            raise ConfigError(f'the observation space\'s "{MASK_KEY}" is '
                              f"{obs_space.spaces[MASK_KEY]}, but the action space {act_space} "
                              f"needs {spec.mask_size} entries; fix the env's observation_space "
                              "(one entry per action)")
    if source is not None and moves:
        check_mask(read_mask(env, source, obs, info), spec.mask_size, source, act_space)
    return spec


def _global_state_size(env) -> int:
    """Floats of a multi-agent env's global state (a centralised critic's input); 0 for a
    single-agent env, or where the state or an agent's observation space does not flatten to a
    vector (a rule-based agent may see anything; text): a critic asked for then says so."""
    if isinstance(env, gym.Env):
        return 0
    try:
        return int(global_state_space(env).shape[0])
    except (ValueError, TypeError, NotImplementedError):  # gymnasium: a space that does not flatten
        return 0


def _mask_source(obs_space: gym.Space, obs: Any, info: dict) -> Optional[str]:
    """An agent's mask convention: PettingZoo's "action_mask" observation key, or its info's."""
    if isinstance(obs_space, gym.spaces.Dict) and MASK_KEY in obs_space.spaces:
        return "obs"
    return "info" if isinstance(info, dict) and MASK_KEY in info else None


def _contains(space: gym.Space, obs) -> bool:
    if isinstance(space, gym.spaces.Box):
        arr = np.asarray(obs)
        return arr.shape == space.shape and space.contains(arr.astype(space.dtype, copy=False))
    try:
        return bool(space.contains(obs))
    except Exception:
        return False


def _describe(obs) -> str:
    if isinstance(obs, dict):
        return "keys " + ", ".join(map(repr, obs))
    return f"shape {np.shape(obs)}"
