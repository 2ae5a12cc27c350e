"""Multi-agent envs (PettingZoo's ``ParallelEnv``): which policy each agent plays, and the lanes
of a trajectory slot.

A slot belongs to the trained policy. Each env of a group has one *lane* (a column of the slot)
per agent that may map to that policy; a lane holds its agent's trajectory while the agent acts
for the trained policy and is masked otherwise (policy version -1, ``done``: nothing bootstraps
across), so agents that join, leave, or play another policy for an episode need no special case
in the policy worker or the learner. Rule-based policies are plain functions run in the rollout
worker: no slot, no inference.

``policy_mapping(agent_id)`` or ``policy_mapping(agent_id, episode_idx)`` is called when an
agent first appears in an episode; with one argument it is taken to be fixed, and only the
agents it maps to the trained policy get lanes.
"""
from __future__ import annotations

import inspect
import traceback
from typing import Any, Callable, Dict, List, Optional

import cloudpickle
import gymnasium as gym
import numpy as np

from .config import ConfigError

DEFAULT_POLICY = "policy"  # the one policy of a single-agent env, or one shared by every agent


def is_parallel_env(env: Any) -> bool:
    """PettingZoo's ParallelEnv API, by duck typing (pettingzoo stays optional)."""
    return (not isinstance(env, gym.Env) and hasattr(env, "possible_agents")
            and callable(getattr(env, "observation_space", None))
            and callable(getattr(env, "action_space", None)) and hasattr(env, "step"))


def _arity(fn: Callable) -> int:
    """1 for ``fn(agent_id)``, 2 for ``fn(agent_id, episode_idx)``."""
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        return 1
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(params) >= 2:
        return 2
    if len(params) == 1:
        return 1
    raise ConfigError(f"policy_mapping {fn!r} takes no argument: expected fn(agent_id) or "
                      "fn(agent_id, episode_idx)")


def _pickled(fn: Callable, what: str) -> bytes:
    try:
        return cloudpickle.dumps(fn)
    except Exception as e:
        raise ConfigError(f"{what} {fn!r} cannot be pickled with cloudpickle ({type(e).__name__}: "
                          f"{e}); worker processes must receive it: avoid capturing open files, "
                          "locks or envs in it") from e


class AgentLayout:
    """What the engine knows of a multi-agent env's agents, checked in the main process and
    pickled to every rollout worker: the trained policy's id and the agents that have lanes,
    the rule-based policies, and the mapping."""

    def __init__(self, possible_agents: List[str], policy_id: str, lanes: List[str],
                 rule_based: Dict[str, Callable], mapping: Optional[Callable]):
        self.possible_agents, self.policy_id, self.lanes = list(possible_agents), policy_id, lanes
        self.policy_ids = [policy_id, *rule_based]
        self._rule_based = {pid: _pickled(fn, f"rule-based policy {pid!r}")
                            for pid, fn in rule_based.items()}
        self._mapping = None if mapping is None else _pickled(mapping, "policy_mapping")
        self.arity = 1 if mapping is None else _arity(mapping)
        self.unpickle()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("rule_based", "mapping")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.unpickle()

    def unpickle(self) -> None:
        self.rule_based = {pid: cloudpickle.loads(b) for pid, b in self._rule_based.items()}
        self.mapping = None if self._mapping is None else cloudpickle.loads(self._mapping)

    def policy_of(self, agent: str, episode_idx: int) -> str:
        """The policy ``agent`` plays in episode ``episode_idx``; a failing mapping or an
        unknown id raises, naming the agent."""
        if self.mapping is None:
            return self.policy_id
        try:
            pid = self.mapping(agent, episode_idx) if self.arity == 2 else self.mapping(agent)
        except Exception as e:
            raise RuntimeError(f"policy_mapping failed for agent {agent!r} (episode {episode_idx}): "
                               f"{type(e).__name__}: {e}\n{traceback.format_exc()}") from e
        if pid not in self.policy_ids:
            raise ValueError(f"policy_mapping({agent!r}) returned {pid!r}, which is not among the "
                             f"policies {self.policy_ids}")
        return pid

    def act_rule_based(self, pid: str, agent: str, obs: Any) -> Any:
        try:
            return self.rule_based[pid](obs)
        except Exception as e:
            raise RuntimeError(f"rule-based policy {pid!r} failed on agent {agent!r}'s observation: "
                               f"{type(e).__name__}: {e}\n{traceback.format_exc()}") from e


def _same_space(a: gym.Space, b: gym.Space) -> bool:
    try:
        return a == b
    except Exception:
        return False


def build_layout(env: Any, policies: Optional[dict], policy_mapping: Optional[Callable]):
    """Check a probed ParallelEnv with the user's ``policies`` and ``policy_mapping``. Returns
    (layout, the trained policy's observation space, its action space, its overrides)."""
    agents = list(env.possible_agents)
    if not agents:
        raise ConfigError("the multi-agent env has no possible_agents")
    policies = {DEFAULT_POLICY: None} if policies is None else dict(policies)
    if not policies or not all(isinstance(k, str) for k in policies):
        raise ConfigError(f"policies={policies!r}: expected a dict {{policy id (str): None, a dict "
                          "of overrides, or a function obs -> action}}")
    trained = [pid for pid, v in policies.items() if v is None or isinstance(v, dict)]
    rule_based = {pid: v for pid, v in policies.items() if callable(v) and not isinstance(v, dict)}
    odd = [pid for pid in policies if pid not in trained and pid not in rule_based]
    if odd:
        raise ConfigError(f"policies[{odd[0]!r}]={policies[odd[0]]!r}: expected None (trained, the "
                          "defaults), a dict of overrides (trained) or a function obs -> action "
                          "(rule-based)")
    if len(trained) != 1:
        raise ConfigError(f"policies: {len(trained)} trained policies ({trained}); this version "
                          "trains exactly one policy per run, beside any number of rule-based ones "
                          "(several trained and frozen policies are not supported yet)")
    policy_id = trained[0]
    if policy_mapping is None and len(policies) > 1:
        raise ConfigError(f"policies has {len(policies)} entries but no policy_mapping says which "
                          "agent plays which: pass policy_mapping=fn(agent_id) -> policy id")
    if policy_mapping is not None and not callable(policy_mapping):
        raise ConfigError(f"policy_mapping={policy_mapping!r}: expected fn(agent_id) or "
                          "fn(agent_id, episode_idx) returning a policy id")
    layout = AgentLayout(agents, policy_id, [], rule_based, policy_mapping)
    if layout.arity == 1:  # fixed: only the agents it maps to the trained policy get lanes
        layout.lanes = [a for a in agents if layout.policy_of(a, 0) == policy_id]
    else:
        layout.lanes = agents
        for a in agents:
            layout.policy_of(a, 0)  # a mapping that fails, fails here
    if not layout.lanes:
        raise ConfigError(f"policy_mapping maps none of the agents {agents} to the trained policy "
                          f"{policy_id!r}")
    obs_space, act_space = env.observation_space(layout.lanes[0]), env.action_space(layout.lanes[0])
    for a in layout.lanes[1:]:
        for kind, mine, first in (("observation", env.observation_space(a), obs_space),
                                  ("action", env.action_space(a), act_space)):
            if not _same_space(mine, first):
                raise ConfigError(
                    f"agents {layout.lanes[0]!r} and {a!r} both play policy {policy_id!r} but their "
                    f"{kind} spaces differ ({first} and {mine}); one policy has one pair of "
                    "spaces: map them to different policies (policies= and policy_mapping=)")
    return layout, obs_space, act_space, dict(policies[policy_id] or {})


def play_parallel_episode(layout: AgentLayout, env: Any, act: Callable, seed: Optional[int],
                          episode_idx: int) -> Dict[str, float]:
    """Play one episode of a ParallelEnv in this process: the trained policy's agents through
    ``act(obs, info, episode_start, state) -> (action, state)`` (a state per agent), the
    rule-based ones through their functions. Returns {policy id: its agents' mean return}."""
    observations, infos = env.reset(seed=seed)
    policy_of: Dict[str, str] = {}
    returns: Dict[str, float] = {}
    states: Dict[str, Any] = {}
    while env.agents:
        actions = {}
        for a in env.agents:
            if a not in policy_of:
                policy_of[a] = layout.policy_of(a, episode_idx)
            pid = policy_of[a]
            if pid == layout.policy_id:
                actions[a], states[a] = act(observations[a], infos.get(a, {}), a not in states,
                                            states.get(a))
            else:
                actions[a] = layout.act_rule_based(pid, a, observations[a])
        observations, rewards, _, _, infos = env.step(actions)
        for a, r in rewards.items():
            returns[a] = returns.get(a, 0.0) + float(r)
    by_policy: Dict[str, list] = {}
    for a, r in returns.items():
        by_policy.setdefault(policy_of[a], []).append(r)
    return {pid: float(np.mean(rs)) for pid, rs in by_policy.items()}
