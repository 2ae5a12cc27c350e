"""How a rollout worker steps multi-agent envs (see multiagent): a column of a trained
policy's slot per agent lane, idle lanes masked; rule-based and frozen agents act in the worker.
In a turn-based game (see turns) a lane whose agent did not move in a step has its row marked
``waiting``, and any action is legal there (its mask is all True: nothing samples from it).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from .buffers import SharedWeights
from .config import Config
from .models import ActorCritic, PolicySpec
from .multiagent import AgentLayout, global_state
from .spaces import MASK_KEY, read_mask, stack_observations
from .turns import movers


class FrozenPolicy:
    """A policy whose weights the user sets and no learner trains (an opponent, a past snapshot
    in self-play): run in the rollout worker, one forward pass per group step for all the agents
    that play it, reloading its shared weights when their version moved (between train()
    calls). A recurrent one keeps a state per (episode, agent)."""

    def __init__(self, spec: PolicySpec, cfg: Config, weights: SharedWeights):
        self.spec, self.cfg, self.weights = spec, cfg, weights
        self.model: Optional[ActorCritic] = None
        self.version = -1
        self.states: Dict[tuple, torch.Tensor] = {}

    def reload(self) -> None:
        if self.model is None:
            self.model = ActorCritic(self.spec, self.cfg)
            self.model.eval()
        self.version = self.weights.load_if_newer(self.model, self.version)

    @torch.no_grad()
    def act(self, observations: list, keys: list) -> list:
        """Env actions for ``observations`` (one per agent), sampled; ``keys``: (episode, agent)
        of each, for a recurrent state."""
        env = self.spec.env
        arrays, _, _ = env.batch_obs(stack_observations(env.observation_space, observations))
        obs = {k: torch.as_tensor(v) for k, v in arrays.items()}
        mask = None
        if env.mask_source == "obs":
            mask = torch.as_tensor(np.stack([np.asarray(o[MASK_KEY], bool).reshape(-1)
                                             for o in observations]))
        state = None
        if self.model.core is not None:
            zeros = torch.zeros(self.model.state_size)
            state = torch.stack([self.states.get(k, zeros) for k in keys])
        actions, _, _, next_state = self.model.act(obs, mask, state=state)
        if next_state is not None:
            self.states.update(zip(keys, next_state))
        return self.model.dist.to_env(actions.numpy())

    def forget(self, episode_idx: int) -> None:
        """An episode ended: drop its agents' recurrent states."""
        for key in [k for k in self.states if k[0] == episode_idx]:
            del self.states[key]


class AgentLanes:
    """How a rollout worker steps PettingZoo ParallelEnvs, given the worker's ``layout`` of
    agents, its slot ``pools``, its ``frozen`` policies and ``restart_env(group, i, t) -> (obs,
    info, ...)``, the worker's replacement of an env that raised. An agent that plays trained
    policy k holds a lane of its env in the group's slot of pool k from its first step in an
    episode to its last (``group.slots[k].lane_of``/``lane_agent``). Episodes numbered
    ``worker_idx + num_workers * n`` are unique over the run's workers; finished ones collect in
    ``finished`` ({policy id: [(return, length)]}) until the worker reports them."""

    def __init__(self, layout: AgentLayout, pools: list, frozen: Dict[str, FrozenPolicy], cfg: Config,
                 name: str, worker_idx: int, restart_env: Callable[..., tuple]):
        self.layout, self.pools, self.frozen, self.cfg, self.name = layout, pools, frozen, cfg, name
        self.worker_idx, self.restart_env = worker_idx, restart_env
        self.episodes_started = 0
        self.finished: Dict[str, list] = defaultdict(list)

    def take_finished(self) -> Dict[str, list]:
        """The episodes finished since the last call, per policy id."""
        finished, self.finished = self.finished, defaultdict(list)
        return finished

    def lane_agent(self, group, k: int, col: int):
        """The agent in column ``col`` of a group's slot of pool k (None: an idle lane)."""
        lanes = self.pools[k].lanes
        return group.slots[k].lane_agent[col // lanes][col % lanes]

    def other_actions(self, group) -> List[dict]:
        """Per env of the group, {agent: action} of the agents to move that play no trained
        policy: rule-based ones from their functions, frozen ones from one forward pass per
        frozen policy for the whole group. (User code: its errors are not the env's.)"""
        layout, out = self.layout, [{} for _ in group.envs]
        batches = defaultdict(list)  # frozen policy id -> [(env, agent)]
        for i, env in enumerate(group.envs):
            policy_of, observations = group.policy_of[i], group.agent_obs[i]
            for a in movers(env):
                pid = policy_of[a]
                if pid in self.frozen:
                    batches[pid].append((i, a))
                elif pid in layout.rule_based:
                    out[i][a] = layout.act_rule_based(pid, a, observations[a])
        for pid, who in batches.items():
            acts = self.frozen[pid].act([group.agent_obs[i][a] for i, a in who],
                                        [(group.episode_idx[i], a) for i, a in who])
            for (i, a), action in zip(who, acts):
                out[i][a] = action
        return out

    def step(self, group, i: int, env, actions: list, others: dict, rows: list, views: list,
             t: int) -> None:
        """Step one ParallelEnv: its trained agents to move act from their lanes' actions
        (``actions``: per pool), the others as ``others`` says; row t of its lanes in every pool
        is written (idle lanes: masked, done; ``rows``: per pool, see SlotPool.row), and the
        observations of t + 1 (``views``: each row's observations)."""
        stepped, acting = list(env.agents), {}
        for a in movers(env):
            k = self.layout.trained_index.get(group.policy_of[i][a])
            acting[a] = (others[a] if k is None else
                         actions[k][i * self.pools[k].lanes + group.slots[k].lane_of[i][a]])
        try:
            observations, rewards, terms, truncs, infos = env.step(acting)
            group.failures[i] = 0
        except Exception:
            if self.cfg.on_env_error == "abort":
                raise
            self.begin_episode(views, group, i, *self.restart_env(group, i, t)[:2])
            for pool, (_, rewards_out, dones_out, truncated_out) in zip(self.pools, rows):
                cols = slice(i * pool.lanes, (i + 1) * pool.lanes)
                rewards_out[cols], dones_out[cols], truncated_out[cols] = 0.0, True, False
            return
        for pool, s, (_, rewards_out, dones_out, truncated_out) in zip(self.pools, group.slots, rows):
            versions_out = pool.versions_np[s.slot_idx, t]
            waiting_out = None if pool.waiting_np is None else pool.waiting_np[s.slot_idx, t]
            for lane, a in enumerate(s.lane_agent[i]):
                col = i * pool.lanes + lane
                live = a is not None and a in stepped
                if live:
                    term, trunc = bool(terms.get(a, False)), bool(truncs.get(a, False))
                    rewards_out[col] = rewards.get(a, 0.0)
                    dones_out[col] = term or trunc or a not in env.agents
                    truncated_out[col] = trunc and not term
                else:  # idle: no agent of this trained policy holds it
                    rewards_out[col], dones_out[col], truncated_out[col] = 0.0, True, False
                    versions_out[col] = -1
                if waiting_out is not None:
                    waiting_out[col] = live and a not in acting
        self._count_agent_episodes(group, i, env, stepped, rewards, terms, truncs)
        if not env.agents:
            try:
                observations, infos = env.reset()
            except Exception:
                if self.cfg.on_env_error == "abort":
                    raise
                observations, infos = self.restart_env(group, i, t)[:2]
            self.begin_episode(views, group, i, observations, infos)
        else:
            self._write_agents(views, group, i, observations, infos)

    def begin_episode(self, views: List[dict], group, i: int, observations: dict, infos: dict) -> None:
        """Env ``i`` was (re)built or reset: a new episode, whose agents are mapped to policies
        as they appear; its first observations are written into ``views`` (one dict per pool)."""
        for policy in self.frozen.values():
            policy.forget(group.episode_idx[i])
        self.episodes_started += 1
        group.episode_idx[i] = self.episodes_started * self.cfg.num_workers + self.worker_idx
        group.policy_of[i], group.agent_return[i], group.agent_length[i] = {}, {}, {}
        for pool, s in zip(self.pools, group.slots):
            s.lane_of[i], s.lane_agent[i] = {}, [None] * pool.lanes
        self._write_agents(views, group, i, observations, infos)

    def _take_lane(self, group, i: int, agent: str, k: int) -> None:
        lane_agent, lanes = group.slots[k].lane_agent[i], self.pools[k].lanes
        if None not in lane_agent:
            raise ValueError(
                f"{self.name}: agent {agent!r} plays the trained policy {self.layout.trained[k]!r} "
                f"in episode {group.episode_idx[i]} while {lane_agent} do: more than the "
                f"{lanes} lane(s) an env has. A fixed mapping, fn(agent_id), must always give "
                "the same answer (take the episode as a second argument if it varies); with a "
                "per-episode mapping, raise the policy's 'agents_per_env'")
        lane = lane_agent.index(None)
        lane_agent[lane], group.slots[k].lane_of[i][agent] = agent, lane

    def _count_agent_episodes(self, group, i: int, env, stepped: list, rewards: dict,
                              terms: dict, truncs: dict) -> None:
        returns, lengths, layout = group.agent_return[i], group.agent_length[i], self.layout
        for a in stepped:
            returns[a] = returns.get(a, 0.0) + float(rewards.get(a, 0.0))
            lengths[a] = lengths.get(a, 0) + 1
            if terms.get(a) or truncs.get(a) or a not in env.agents:
                pid = group.policy_of[i][a]
                self.finished[pid].append((returns.pop(a), lengths.pop(a)))
                k = layout.trained_index.get(pid)
                if k is not None:  # its lane is free for an agent that comes later
                    s = group.slots[k]
                    s.lane_agent[i][s.lane_of[i].pop(a)] = None

    def _write_agents(self, views: List[dict], group, i: int, observations: dict,
                      infos: dict) -> None:
        """Map agents new to this episode (one of a trained policy takes a free lane of its
        pool), then write the observations of the trained policies' agents into their lanes
        (``views``: per pool; the mask of an idle lane, or of an agent not to move, allows
        everything: it is never checked), and the env's global state into every lane of the
        pools whose critic reads it."""
        layout, policy_of = self.layout, group.policy_of[i]
        to_move = movers(group.envs[i])
        for a in observations:
            if a not in policy_of:
                pid = policy_of[a] = layout.policy_of(a, group.episode_idx[i])
                k = layout.trained_index.get(pid)
                if k is not None:
                    self._take_lane(group, i, a, k)
        group.agent_obs[i] = observations
        state = None
        for pool, s, v in zip(self.pools, group.slots, views):
            col0 = i * pool.lanes
            if pool.global_state is not None:
                if state is None:
                    state = global_state(group.envs[i], observations)
                v[pool.global_state][col0:col0 + pool.lanes] = state
            for lane, a in enumerate(s.lane_agent[i]):
                if a is not None and a in observations:
                    pool.write_obs(v, col0 + lane, observations[a])
                    if MASK_KEY in v and a not in to_move:
                        v[MASK_KEY][col0 + lane] = True
                    elif pool.mask_source == "info":
                        v[MASK_KEY][col0 + lane] = np.asarray(
                            read_mask(None, "info", None, infos.get(a, {})), bool).reshape(-1)
                elif MASK_KEY in v:
                    v[MASK_KEY][col0 + lane] = True
