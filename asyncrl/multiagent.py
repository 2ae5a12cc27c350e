"""Multi-agent envs (PettingZoo's ``ParallelEnv``): which policy each agent plays, and the lanes
of a trajectory slot.

Each trained policy has its own pool of slots, and an env group holds one slot of every pool.
Each env has, per trained policy, ``lanes[pid]`` *lanes* (columns of that policy's slot): an
agent that plays the policy takes a free lane when it appears in an episode and frees it when
its episode ends; a lane without such an agent is masked (policy version -1, ``done``: nothing
bootstraps across), so agents that join, leave, or play another policy for an episode need no
special case in the policy workers or the learners. Rule-based policies are plain functions run
in the rollout worker: no slot, no inference. Frozen policies (weights set by the user, not
trained: opponents, past snapshots in self-play) run in the rollout worker too, one forward
pass per group step (see agent_lanes, where the rollout worker steps these envs).

``policy_mapping(agent_id)`` or ``policy_mapping(agent_id, episode_idx)`` is called when an
agent first appears in an episode; with one argument it is taken to be fixed, and an env has as
many lanes of a trained policy as agents it maps there; with two, as many as it has agents,
unless the policy's ``agents_per_env`` says fewer play it at once (self-play: 1).

With neither ``policies`` nor a mapping, agents of the same spaces share one trained policy, and
agents whose spaces differ (a speaker and a listener, adversaries and the agents they chase)
train one policy per pair of spaces (``policies_by_space``).
"""
from __future__ import annotations

import inspect
import re
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import gymnasium as gym
import numpy as np

from . import pickling
from .config import ConfigError
from .messages import MAX_TRAINED_POLICIES
from .spaces import is_text
from .turns import movers

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


def global_state_space(env: Any) -> gym.spaces.Box:
    """The global state a centralised critic sees (flattened, float32): the env's ``state()``
    where it declares a ``state_space``, else every possible agent's observation (flattened:
    Discrete parts one-hot) side by side in ``possible_agents`` order. Raises ValueError where
    such a state holds text (gymnasium flattens a text into its characters' indices)."""
    parts = ([env.state_space] if _has_state(env)
             else [env.observation_space(a) for a in env.possible_agents])
    if any(_holds_text(space) for space in parts):
        raise ValueError("a text leaf does not flatten into a critic's state")
    return gym.spaces.Box(-np.inf, np.inf, (sum(gym.spaces.flatdim(p) for p in parts),),
                          np.float32)


def _holds_text(space: gym.Space) -> bool:
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return any(_holds_text(s) for s in (space.spaces.values()
                                           if isinstance(space, gym.spaces.Dict) else space.spaces))
    return is_text(space)


def global_state(env: Any, observations: Dict[str, Any]) -> np.ndarray:
    """The global state now (see global_state_space); an agent absent from ``observations``
    (not in the episode, or gone) is zeros."""
    if _has_state(env):
        return gym.spaces.flatten(env.state_space, env.state()).astype(np.float32, copy=False)
    parts = []
    for a in env.possible_agents:
        space = env.observation_space(a)
        parts.append(gym.spaces.flatten(space, observations[a]).astype(np.float32, copy=False)
                     if a in observations else np.zeros(gym.spaces.flatdim(space), np.float32))
    return np.concatenate(parts)


def _has_state(env: Any) -> bool:
    return callable(getattr(env, "state", None)) and isinstance(getattr(env, "state_space", None),
                                                                gym.Space)


class AgentLayout:
    """What the engine knows of a multi-agent env's agents, checked in the main process and
    pickled to every rollout worker: the trained policies' ids (``trained``, in the order of
    their slot pools) and their lanes per env, the frozen policies' ids, the rule-based
    policies, and the mapping (both cloudpickled; None: every agent plays the one trained
    policy, ``shared``)."""

    def __init__(self, possible_agents: List[str], trained: List[str],
                 rule_based: Dict[str, Callable], mapping: Optional[Callable],
                 frozen: Optional[List[str]] = None):
        self.possible_agents, self.trained = list(possible_agents), list(trained)
        self.trained_index = {pid: k for k, pid in enumerate(self.trained)}
        self.shared = self.trained[0] if mapping is None else None
        self.lanes = {pid: 1 for pid in self.trained}  # set by build_layout
        self.frozen = list(frozen or [])
        self.policy_ids = [*self.trained, *self.frozen, *rule_based]
        self._rule_based = {pid: pickling.dumps(fn, f"rule-based policy {pid!r}")
                            for pid, fn in rule_based.items()}
        self._mapping = None if mapping is None else pickling.dumps(mapping, "policy_mapping")
        self.arity = 1 if mapping is None else _arity(mapping)
        self.unpickle()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in ("rule_based", "mapping")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.unpickle()

    def unpickle(self) -> None:
        self.rule_based = {pid: pickling.loads(b) for pid, b in self._rule_based.items()}
        self.mapping = None if self._mapping is None else pickling.loads(self._mapping)

    def policy_of(self, agent: str, episode_idx: int) -> str:
        """The policy ``agent`` plays in episode ``episode_idx``; a failing mapping or an
        unknown id raises, naming the agent."""
        if self.mapping is None:
            return self.shared  # one policy, shared by every agent
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


def agents_of(layout: AgentLayout, pid: str) -> List[str]:
    """The agents that may play ``pid``: with a fixed mapping those it maps there, else all."""
    if layout.arity == 1:
        return [a for a in layout.possible_agents if layout.policy_of(a, 0) == pid]
    return list(layout.possible_agents)


class SpaceGroups:
    """The mapping ``policies_by_space`` derives: each agent plays the policy of its pair of
    spaces (fixed; a plain class, so that a saved model's mapping loads anywhere)."""

    def __init__(self, policy_of: Dict[str, str]):
        self.policy_of = dict(policy_of)

    def __call__(self, agent: str) -> str:
        return self.policy_of[agent]

    def __repr__(self) -> str:
        return f"SpaceGroups({self.policy_of!r})"


def policies_by_space(env: Any) -> Tuple[Optional[dict], Optional[SpaceGroups]]:
    """The policies of a multi-agent env given none: ``(None, None)`` (one shared policy) where
    every possible agent has the same observation and action spaces, else one trained policy
    per pair of spaces, in the order of ``possible_agents``, named by its agents' common name
    before a trailing ``_<n>`` (PettingZoo's ``speaker_0``, ``adversary_2``), and the mapping
    that sends each agent to it."""
    groups: List[Tuple[gym.Space, gym.Space, List[str]]] = []
    for a in env.possible_agents:
        obs_space, act_space = env.observation_space(a), env.action_space(a)
        for g_obs, g_act, members in groups:
            if _same_space(g_obs, obs_space) and _same_space(g_act, act_space):
                members.append(a)
                break
        else:
            groups.append((obs_space, act_space, [a]))
    if len(groups) < 2:
        return None, None
    if len(groups) > MAX_TRAINED_POLICIES:
        raise ConfigError(f"the env's agents have {len(groups)} different pairs of spaces, a trained "
                          f"policy each by default, and at most {MAX_TRAINED_POLICIES} can be trained "
                          "in one run: pass policies= and policy_mapping= (agents that play one "
                          "policy must share its spaces)")

    def common(names: List[str]) -> str:  # '' where they differ
        found = {re.sub(r"[./]", "_", str(n)) for n in names}
        return found.pop() if len(found) == 1 else ""

    ids = [common([re.sub(r"_\d+$", "", str(a)) for a in members]) for _, _, members in groups]
    if len(set(ids)) < len(ids):  # stems shared across groups: the agents' own names
        ids = [common(members) for _, _, members in groups]
    ids = [pid if pid and ids.count(pid) == 1 else f"policy_{k}" for k, pid in enumerate(ids)]
    if len(set(ids)) < len(ids):  # a name that was itself "policy_<k>"
        ids = [f"policy_{k}" for k in range(len(ids))]
    return ({pid: None for pid in ids},
            SpaceGroups({a: pid for pid, (_, _, members) in zip(ids, groups) for a in members}))


def build_layout(env: Any, policies: Optional[dict], policy_mapping: Optional[Callable]):
    """Check a probed ParallelEnv with the user's ``policies`` and ``policy_mapping``. Returns
    (layout, {policy id: (observation space, action space, overrides)} of the trained policies,
    in their order, then the frozen ones)."""
    agents = list(env.possible_agents)
    if not agents:
        raise ConfigError("the multi-agent env has no possible_agents")
    policies = {DEFAULT_POLICY: None} if policies is None else dict(policies)
    if not policies or not all(isinstance(k, str) for k in policies):
        raise ConfigError(f"policies={policies!r}: expected a dict {{policy id (str): None, a dict "
                          "of overrides, or a function obs -> action}}")
    frozen = [pid for pid, v in policies.items() if isinstance(v, dict) and v.get("frozen")]
    trained = [pid for pid, v in policies.items()
               if v is None or (isinstance(v, dict) and not v.get("frozen"))]
    rule_based = {pid: v for pid, v in policies.items() if callable(v) and not isinstance(v, dict)}
    odd = [pid for pid in policies if pid not in trained + frozen and pid not in rule_based]
    if odd:
        raise ConfigError(f"policies[{odd[0]!r}]={policies[odd[0]]!r}: expected None (trained, the "
                          "defaults), a dict of overrides (trained), {'frozen': True} (weights you "
                          "set, not trained) or a function obs -> action (rule-based)")
    for pid in frozen:
        extra = set(policies[pid]) - {"frozen", "policy_kwargs", "policy"}
        if extra:
            raise ConfigError(f"policies[{pid!r}]: a frozen policy takes only 'policy_kwargs' and "
                              f"'policy' besides 'frozen' (it is not trained), not {sorted(extra)}")
    if not trained:
        raise ConfigError(f"policies: none of {list(policies)} is trained; give at least one "
                          "policy None or a dict of overrides (frozen and rule-based ones only "
                          "play: use model.evaluate() on a model that trains one)")
    if len(trained) > MAX_TRAINED_POLICIES:
        raise ConfigError(f"policies: {len(trained)} trained policies; at most "
                          f"{MAX_TRAINED_POLICIES} can be trained in one run (map agents to fewer, "
                          "or make some frozen)")
    bad = [pid for pid in trained if "." in pid or "/" in pid]
    if bad:
        raise ConfigError(f"policies: the trained policy id {bad[0]!r} contains '.' or '/', which "
                          "parameter keys ('<id>.optimizer') and log names ('train/<id>/...') "
                          "use as separators; pick another id")
    if policy_mapping is None and len(policies) > 1:
        raise ConfigError(f"policies has {len(policies)} entries but no policy_mapping says which "
                          "agent plays which: pass policy_mapping=fn(agent_id) -> policy id")
    if policy_mapping is not None and not callable(policy_mapping):
        raise ConfigError(f"policy_mapping={policy_mapping!r}: expected fn(agent_id) or "
                          "fn(agent_id, episode_idx) returning a policy id")
    layout = AgentLayout(agents, trained, rule_based, policy_mapping, frozen)
    for a in agents:  # a mapping that fails, fails here
        try:
            layout.policy_of(a, 0)
        except (RuntimeError, ValueError) as e:
            raise ConfigError(str(e).split("\n")[0]) from e
    spaces = {}
    for pid in (*trained, *frozen):
        players = agents_of(layout, pid)
        if not players:
            raise ConfigError(f"policy_mapping maps none of the agents {agents} to the "
                              f"{'trained' if pid in trained else 'frozen'} policy {pid!r}")
        obs_space, act_space = env.observation_space(players[0]), env.action_space(players[0])
        for a in players[1:]:
            for kind, mine, first in (("observation", env.observation_space(a), obs_space),
                                      ("action", env.action_space(a), act_space)):
                if not _same_space(mine, first):
                    raise ConfigError(
                        f"agents {players[0]!r} and {a!r} both may play policy {pid!r} but their "
                        f"{kind} spaces differ ({first} and {mine}); one policy has one pair of "
                        "spaces: map them to different policies (policies= and policy_mapping=)")
        overrides = {k: v for k, v in (policies[pid] or {}).items() if k != "frozen"}
        spaces[pid] = (obs_space, act_space, overrides)
        if pid not in trained:
            continue
        # lanes per env: the agents that may play it, or fewer at once (agents_per_env)
        at_once = overrides.pop("agents_per_env", None)
        if at_once is not None and not (isinstance(at_once, int) and 1 <= at_once <= len(players)):
            raise ConfigError(f"policies[{pid!r}]['agents_per_env']={at_once!r}: expected an "
                              f"integer from 1 to {len(players)} (the agents that may play it)")
        layout.lanes[pid] = at_once or len(players)
    return layout, spaces


def play_parallel_episode(layout: AgentLayout, env: Any, act: Callable, seed: Optional[int],
                          episode_idx: int) -> Dict[str, float]:
    """Play one episode of a ParallelEnv (or a turn-based game's view) in this process: the
    agents to move of the trained and frozen policies through ``act(policy id, obs, info,
    episode_start, state) -> (action, state)`` (a state per agent), the rule-based ones through
    their functions. Returns {policy id: its agents' mean return}."""
    observations, infos = env.reset(seed=seed)
    policy_of: Dict[str, str] = {}
    returns: Dict[str, float] = {}
    states: Dict[str, Any] = {}
    while env.agents:
        actions = {}
        for a in env.agents:  # mapped when it appears, whether it moves or not
            if a not in policy_of:
                policy_of[a] = layout.policy_of(a, episode_idx)
        for a in movers(env):
            pid = policy_of[a]
            if pid in layout.rule_based:
                actions[a] = layout.act_rule_based(pid, a, observations[a])
            else:
                actions[a], states[a] = act(pid, observations[a], infos.get(a, {}), a not in states,
                                            states.get(a))
        observations, rewards, _, _, infos = env.step(actions)
        for a, r in rewards.items():
            returns[a] = returns.get(a, 0.0) + float(r)
    by_policy: Dict[str, list] = {}
    for a, r in returns.items():
        by_policy.setdefault(policy_of[a], []).append(r)
    return {pid: float(np.mean(rs)) for pid, rs in by_policy.items()}


class SelfPlay:
    """Self-play with a pool of past snapshots: in each episode the trained policy plays one
    seat (drawn per episode) and a snapshot drawn from the pool plays every other seat.

        self_play = SelfPlay(["player_0", "player_1"], pool_size=4)
        model = APPO(make_duel, policies=self_play.policies, policy_mapping=self_play.policy_mapping)
        self_play.fill(model)          # every snapshot starts as the initial weights
        for _ in range(rounds):
            model.train(100_000)
            self_play.snapshot(model)  # the oldest snapshot becomes the current weights

    The snapshots are frozen policies (``"<trained>_past_<k>"``), run in the rollout workers.
    """

    def __init__(self, seats: List[str], trained: str = "hero", pool_size: int = 4):
        """``seats``: the agents of the game (the trained policy plays one per episode)."""
        if len(seats) < 2 or pool_size < 1:
            raise ConfigError(f"SelfPlay: needs at least two seats (got {seats}) and a pool of at "
                              f"least one snapshot (got {pool_size})")
        self.seats, self.trained = list(seats), trained
        self.pool = [f"{trained}_past_{k}" for k in range(pool_size)]
        self.policies: Dict[str, Any] = {trained: {"agents_per_env": 1},  # one seat an episode
                                         **{p: {"frozen": True} for p in self.pool}}
        self.replaced = 0  # snapshots taken so far (the next one replaces the oldest)

    def policy_mapping(self, agent: str, episode_idx: int) -> str:
        draw = np.random.default_rng(episode_idx).integers(len(self.seats) * len(self.pool))
        seat, opponent = divmod(int(draw), len(self.pool))
        return self.trained if agent == self.seats[seat] else self.pool[opponent]

    def fill(self, model) -> None:
        """Every snapshot in the pool becomes the trained policy's current weights."""
        weights = model.get_parameters()[self.trained]
        model.set_parameters({p: weights for p in self.pool})

    def snapshot(self, model) -> str:
        """The oldest snapshot becomes the trained policy's current weights; returns its id."""
        pid = self.pool[self.replaced % len(self.pool)]
        model.set_parameters({pid: model.get_parameters()[self.trained]})
        self.replaced += 1
        return pid


class AgentView(gym.Env):
    """One agent's view of a multi-agent env, for single-agent tools (Stable-Baselines3's
    ``evaluate_policy``): in each episode the first agent that plays ``policy_id`` is stepped
    from outside; every other agent plays the policy the mapping gives it, through
    ``act(policy id, obs, info, episode_start, state) -> (action, state)`` or its rule-based
    function. The view's episode ends when its agent's does; in a turn-based game a step of
    the view is its agent's move and the others' until its next turn (their rewards to it
    summed)."""

    def __init__(self, env: Any, layout: AgentLayout, policy_id: str, act: Callable):
        self.env, self.layout, self.policy_id, self.act = env, layout, policy_id, act
        player = agents_of(layout, policy_id)[0]  # the spaces of the agents that play it
        self.observation_space = env.observation_space(player)
        self.action_space = env.action_space(player)
        self.episodes = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.obs, self.infos = self.env.reset(seed=seed, options=options)
        self.policy_of: Dict[str, str] = {}
        self.states: Dict[str, Any] = {}
        self.episode_idx, self.episodes = self.episodes, self.episodes + 1
        self._map()
        self.agent = next((a for a in self.obs if self.policy_of[a] == self.policy_id), None)
        if self.agent is None:
            raise RuntimeError(f"no agent plays policy {self.policy_id!r} at the start of episode "
                               f"{self.episode_idx}")
        self.last = self.obs[self.agent]
        while self.env.agents and self.agent not in movers(self.env):
            self._step_env(None)  # a turn-based game: the others move until its turn
        return self.obs[self.agent], self.infos.get(self.agent, {})

    def _map(self) -> None:
        for a in self.obs:
            if a not in self.policy_of:
                self.policy_of[a] = self.layout.policy_of(a, self.episode_idx)

    def step(self, action):
        reward, terminated, truncated = self._step_env(action)
        while not (terminated or truncated) and self.agent not in movers(self.env):
            r, terminated, truncated = self._step_env(None)  # a turn-based game: the others move
            reward += r
        return (self.obs.get(self.agent, self.last), reward, terminated, truncated,
                self.infos.get(self.agent, {}))

    def _step_env(self, action) -> tuple:
        """One step of the env, ``action`` for the view's agent if it is to move; returns its
        (reward, terminated, truncated)."""
        actions = {}
        for a in movers(self.env):
            pid = self.policy_of[a]
            if a == self.agent:
                actions[a] = action
            elif pid in self.layout.rule_based:
                actions[a] = self.layout.act_rule_based(pid, a, self.obs[a])
            else:
                actions[a], self.states[a] = self.act(pid, self.obs[a], self.infos.get(a, {}),
                                                      a not in self.states, self.states.get(a))
        self.last = self.obs.get(self.agent, self.last)
        self.obs, rewards, terms, truncs, self.infos = self.env.step(actions)
        self._map()
        a = self.agent
        terminated = bool(terms.get(a, False)) or (a not in self.env.agents and not truncs.get(a))
        return float(rewards.get(a, 0.0)), terminated, bool(truncs.get(a, False))

    def close(self):
        self.env.close()
