"""How a rollout worker steps multi-agent envs (see multiagent): a column of the trained
policy's slot per agent lane, idle lanes masked; rule-based and frozen agents act in the worker.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Dict, List, Optional

import numpy as np
import torch

from .buffers import SharedWeights
from .config import Config
from .models import ActorCritic, PolicySpec
from .spaces import MASK_KEY, read_mask, stack_observations


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
    the worker's buffers, ``agents`` layout, ``lanes`` per env, ``frozen`` policies and its env
    restarts). An agent that plays the trained policy holds a lane of its env from its first
    step in an episode to its last (``group.lane_of``/``lane_agent``)."""

    def _lane_agent(self, group_idx: int, col: int):
        """The agent in column ``col`` of a group's slot (None: an idle lane)."""
        return self.groups[group_idx].lane_agent[col // self.lanes][col % self.lanes]

    def _other_actions(self, group) -> List[dict]:
        """Per env of the group, {agent: action} of the agents that do not play the trained
        policy: rule-based ones from their functions, frozen ones from one forward pass per
        frozen policy for the whole group. (User code: its errors are not the env's.)"""
        layout, out = self.agents, [{} for _ in group.envs]
        batches = defaultdict(list)  # frozen policy id -> [(env, agent)]
        for i, env in enumerate(group.envs):
            policy_of, observations = group.policy_of[i], group.agent_obs[i]
            for a in env.agents:
                pid = policy_of[a]
                if pid in self.frozen:
                    batches[pid].append((i, a))
                elif pid != layout.policy_id:
                    out[i][a] = layout.act_rule_based(pid, a, observations[a])
        for pid, who in batches.items():
            acts = self.frozen[pid].act([group.agent_obs[i][a] for i, a in who],
                                        [(group.episode_idx[i], a) for i, a in who])
            for (i, a), action in zip(who, acts):
                out[i][a] = action
        return out

    def _step_agents(self, group, i: int, env, actions: list, others: dict,
                     obs_out: dict, slot: int, t: int) -> None:
        """Step one ParallelEnv: its trained agents act from their lanes' actions, the others
        as ``others`` says; row t of its lanes is written (idle lanes: masked, done), and the
        observations of t + 1."""
        lane_of, col0 = group.lane_of[i], i * self.lanes
        acting = {a: (actions[col0 + lane_of[a]] if a in lane_of else others[a]) for a in env.agents}
        rewards_out, dones_out = self.rewards_np[slot, t], self.dones_np[slot, t]
        truncated_out, versions_out = self.truncated_np[slot, t], self.versions_np[slot, t]
        try:
            observations, rewards, terms, truncs, infos = env.step(acting)
            group.failures[i] = 0
        except Exception:
            if self.cfg.on_env_error == "abort":
                raise
            self._started(obs_out, group, i, *self._restart_env(group, i, slot, t)[:2])
            cols = slice(col0, col0 + self.lanes)
            rewards_out[cols], dones_out[cols], truncated_out[cols] = 0.0, True, False
            return
        for k, a in enumerate(group.lane_agent[i]):
            col = col0 + k
            if a is not None and a in acting:
                term, trunc = bool(terms.get(a, False)), bool(truncs.get(a, False))
                rewards_out[col] = rewards.get(a, 0.0)
                dones_out[col] = term or trunc or a not in env.agents
                truncated_out[col] = trunc and not term
            else:  # idle: no agent of the trained policy holds it
                rewards_out[col], dones_out[col], truncated_out[col] = 0.0, True, False
                versions_out[col] = -1
        self._count_agent_episodes(group, i, env, acting, rewards, terms, truncs)
        if not env.agents:
            try:
                observations, infos = env.reset()
            except Exception:
                if self.cfg.on_env_error == "abort":
                    raise
                observations, infos = self._restart_env(group, i, slot, t)[:2]
            self._started(obs_out, group, i, observations, infos)
        else:
            self._write_agents(obs_out, group, i, observations, infos)

    def _take_lane(self, group, i: int, agent: str) -> None:
        lane_agent = group.lane_agent[i]
        if None not in lane_agent:
            raise ValueError(
                f"{self.name}: agent {agent!r} plays the trained policy {self.agents.policy_id!r} "
                f"in episode {group.episode_idx[i]} while {lane_agent} do: more than the "
                f"{self.lanes} lane(s) an env has. A fixed mapping, fn(agent_id), must always give "
                "the same answer (take the episode as a second argument if it varies); with a "
                "per-episode mapping, raise the policy's 'agents_per_env'")
        k = lane_agent.index(None)
        lane_agent[k], group.lane_of[i][agent] = agent, k

    def _count_agent_episodes(self, group, i: int, env, acting: dict, rewards: dict,
                              terms: dict, truncs: dict) -> None:
        returns, lengths = group.agent_return[i], group.agent_length[i]
        for a in acting:
            returns[a] = returns.get(a, 0.0) + float(rewards.get(a, 0.0))
            lengths[a] = lengths.get(a, 0) + 1
            if terms.get(a) or truncs.get(a) or a not in env.agents:
                pid = group.policy_of[i][a]
                done = (self.episodes if pid == self.agents.policy_id else self.other_episodes[pid])
                done.append((returns.pop(a), lengths.pop(a)))
                if a in group.lane_of[i]:  # its lane is free for an agent that comes later
                    group.lane_agent[i][group.lane_of[i].pop(a)] = None

    def _write_agents(self, views: Dict[str, np.ndarray], group, i: int,
                      observations: dict, infos: dict) -> None:
        """Map agents new to this episode (one of the trained policy takes a free lane), then
        write the observations of the trained policy's agents into their lanes (an idle lane's
        mask allows everything: it is never checked)."""
        layout, policy_of, lane_agent = self.agents, group.policy_of[i], group.lane_agent[i]
        for a in observations:
            if a not in policy_of:
                pid = policy_of[a] = layout.policy_of(a, group.episode_idx[i])
                if pid == layout.policy_id:
                    self._take_lane(group, i, a)
        group.agent_obs[i] = observations
        col0 = i * self.lanes
        for k, a in enumerate(lane_agent):
            if a is not None and a in observations:
                self.write_obs(views, col0 + k, observations[a])
                if self.mask_source == "info":
                    views[MASK_KEY][col0 + k] = np.asarray(
                        read_mask(None, "info", None, infos.get(a, {})), bool).reshape(-1)
            elif MASK_KEY in views:
                views[MASK_KEY][col0 + k] = True
