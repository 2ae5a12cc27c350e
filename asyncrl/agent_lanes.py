"""How a rollout worker steps multi-agent envs (see multiagent): a column of a trained
policy's slot per agent lane, idle lanes masked; rule-based and frozen agents act in the worker.
In a turn-based game (see turns) a lane whose agent did not move in a step has its row marked
``waiting``, and any action is legal there (its mask is all True: nothing samples from it).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np
import torch

from .buffers import SharedWeights
from .config import Config
from .models import ActorCritic, PolicySpec
from .multiagent import global_state
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
    """The rollout worker's steps of PettingZoo ParallelEnvs (a mixin of RolloutWorker: it uses
    the worker's slot ``pools``, ``agents`` layout, ``frozen`` policies and its env restarts).
    An agent that plays trained policy k holds a lane of its env in the group's slot of pool k
    from its first step in an episode to its last (``group.slots[k].lane_of``/``lane_agent``)."""

    def _lane_agent(self, group_idx: int, k: int, col: int):
        """The agent in column ``col`` of a group's slot of pool k (None: an idle lane)."""
        lanes = self.pools[k].lanes
        return self.groups[group_idx].slots[k].lane_agent[col // lanes][col % lanes]

    def _other_actions(self, group) -> List[dict]:
        """Per env of the group, {agent: action} of the agents to move that play no trained
        policy: rule-based ones from their functions, frozen ones from one forward pass per
        frozen policy for the whole group. (User code: its errors are not the env's.)"""
        layout, out = self.agents, [{} for _ in group.envs]
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

    def _step_agents(self, group, i: int, env, actions: list, others: dict, rows: list,
                     views: list, t: int) -> None:
        """Step one ParallelEnv: its trained agents to move act from their lanes' actions
        (``actions``: per pool), the others as ``others`` says; row t of its lanes in every pool
        is written (idle lanes: masked, done; ``rows``: per pool, see SlotPool.row), and the
        observations of t + 1 (``views``: each row's observations)."""
        stepped, acting = list(env.agents), {}
        for a in movers(env):
            k = self.agents.trained_index.get(group.policy_of[i][a])
            acting[a] = (others[a] if k is None else
                         actions[k][i * self.pools[k].lanes + group.slots[k].lane_of[i][a]])
        try:
            observations, rewards, terms, truncs, infos = env.step(acting)
            group.failures[i] = 0
        except Exception:
            if self.cfg.on_env_error == "abort":
                raise
            self._started(views, group, i, *self._restart_env(group, i, t)[:2])
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
                observations, infos = self._restart_env(group, i, t)[:2]
            self._started(views, group, i, observations, infos)
        else:
            self._write_agents(views, group, i, observations, infos)

    def _take_lane(self, group, i: int, agent: str, k: int) -> None:
        lane_agent, lanes = group.slots[k].lane_agent[i], self.pools[k].lanes
        if None not in lane_agent:
            raise ValueError(
                f"{self.name}: agent {agent!r} plays the trained policy {self.agents.trained[k]!r} "
                f"in episode {group.episode_idx[i]} while {lane_agent} do: more than the "
                f"{lanes} lane(s) an env has. A fixed mapping, fn(agent_id), must always give "
                "the same answer (take the episode as a second argument if it varies); with a "
                "per-episode mapping, raise the policy's 'agents_per_env'")
        lane = lane_agent.index(None)
        lane_agent[lane], group.slots[k].lane_of[i][agent] = agent, lane

    def _count_agent_episodes(self, group, i: int, env, stepped: list, rewards: dict,
                              terms: dict, truncs: dict) -> None:
        returns, lengths, layout = group.agent_return[i], group.agent_length[i], self.agents
        for a in stepped:
            returns[a] = returns.get(a, 0.0) + float(rewards.get(a, 0.0))
            lengths[a] = lengths.get(a, 0) + 1
            if terms.get(a) or truncs.get(a) or a not in env.agents:
                pid = group.policy_of[i][a]
                done = self.episodes if pid == layout.policy_id else self.other_episodes[pid]
                done.append((returns.pop(a), lengths.pop(a)))
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
        layout, policy_of = self.agents, group.policy_of[i]
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
