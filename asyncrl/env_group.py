"""What a rollout worker holds: a view of each trained policy's slot pool (``SlotPool``), and per
env group its envs, its episodes' bookkeeping and one slot of every pool (``EnvGroup``)."""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from .buffers import RNN_STATE, WAITING, TrajectoryBuffers
from .config import Config
from .distributions import make_distribution, mask_sizes
from .spaces import GLOBAL_STATE, OBS_PREFIX, EnvSpec, ObsWriter


class SlotPool:
    """A rollout worker's view of one trained policy's slot pool: its config, spec, shared
    arrays (mapped in the worker process by ``map``) and queues."""

    def __init__(self, k: int, cfg: Config, env_spec: EnvSpec, buffers: TrajectoryBuffers, queues,
                 worker_idx: int):
        self.k, self.cfg, self.env_spec, self.buffers = k, cfg, env_spec, buffers
        self.lanes = cfg.lanes_per_env  # columns per env
        self.policy_idx = worker_idx % cfg.num_policy_workers  # the policy worker it asks
        self.request_queue = queues.policy_request[self.policy_idx]
        self.free_slot_queue, self.full_slot_queue = queues.free_slot, queues.full_slot

    def map(self) -> None:
        b = self.buffers
        arrays = b.numpy()
        self.observed = {name: arrays[name] for name in b.obs_names()}  # [S, T+1, E, ...]
        self.float_obs = [name for name, a in self.observed.items()
                          if a.dtype.kind == "f" and name.startswith(OBS_PREFIX)]
        self.state_np = arrays.get(RNN_STATE)  # a recurrent model's: zeroed where episodes start
        self.actions_np, self.rewards_np = arrays["actions"], arrays["rewards"]
        self.dones_np, self.truncated_np = arrays["dones"], arrays["truncated"]
        self.versions_np = arrays["policy_versions"]
        self.waiting_np = arrays.get(WAITING)  # a turn-based game's (see turns)
        # the entry a centralised critic reads, written by the worker (None: none)
        self.global_state = OBS_PREFIX + GLOBAL_STATE if OBS_PREFIX + GLOBAL_STATE in arrays else None
        self.slot_owner_np, self.claiming_np = b.slot_owner.numpy(), b.claiming.numpy()
        self.policy_incarnation_np = b.policy_incarnation.numpy()
        self.policy_incarnation = int(self.policy_incarnation_np[self.policy_idx])
        self.write_obs = ObsWriter(self.env_spec)
        self.dist = make_distribution(self.env_spec.action_space)
        source = self.env_spec.mask_source
        self.mask_source = source if source != "obs" else None  # written by the worker
        self.mask_sizes = mask_sizes(self.dist) if source else []

    def row(self, slot: int, t: int) -> tuple:
        """Views of row t of a slot: observations of t + 1, rewards, dones, truncated."""
        return ({name: a[slot, t + 1] for name, a in self.observed.items()}, self.rewards_np[slot, t],
                self.dones_np[slot, t], self.truncated_np[slot, t])


class GroupSlot:
    """One group's slot of one trained policy's pool, and its lanes (see multiagent)."""

    def __init__(self, pool: SlotPool, num_envs: int):
        self.slot_idx: Optional[int] = None  # None: waiting for a free slot
        # row T of the last slot (observations and mask), the next slot's row 0
        self.last_obs = {name: np.zeros((num_envs * pool.lanes, *a.shape[3:]), a.dtype)
                         for name, a in pool.observed.items()}
        # each env's lanes: agent -> lane, lane -> agent (None: idle)
        self.lane_of: List[dict] = [{} for _ in range(num_envs)]
        self.lane_agent: List[list] = [[None] * pool.lanes for _ in range(num_envs)]


class EnvGroup:
    """Half of a worker's envs and the trajectory slots they are writing, one per trained
    policy (``slots``), all at row ``t``."""

    def __init__(self, envs: list, pools: List[SlotPool]):
        self.envs = envs
        self.slots = [GroupSlot(pool, len(envs)) for pool in pools]
        self.t = 0
        self.has_slots = False  # a slot of every pool (kept by the worker as it claims and hands)
        self.waiting = 0  # bit k: trained policy k has not written its actions for row t yet
        self.ep_return = [0.0] * len(envs)
        self.ep_length = [0] * len(envs)
        self.failures = [0] * len(envs)  # restarts since the env last completed a step
        # the step at which each env's first episode is truncated (0: none; see
        # Config.spread_first_episodes)
        self.first_cut = [0] * len(envs)
        # a multi-agent env's episode: the policy of each agent, its last observation (for a
        # rule-based policy), return and length so far, and the episode's index (the mapping's)
        self.policy_of: List[dict] = [{} for _ in envs]
        self.agent_obs: List[dict] = [{} for _ in envs]
        self.agent_return: List[dict] = [{} for _ in envs]
        self.agent_length: List[dict] = [{} for _ in envs]
        self.episode_idx = [0] * len(envs)
