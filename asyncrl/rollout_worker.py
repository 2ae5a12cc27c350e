"""Rollout worker: steps its envs in two groups, writing straight into shared trajectory slots.

While the policy workers compute actions for one group, the worker steps the other
(double-buffered sampling). Per group step the only messages are one ``PolicyRequest`` out per
trained policy and one code back from each (see messages.ready_code). A group holds one
slot of every trained policy's pool (``SlotPool``; a single-agent env has one) and steps when
all of them have their actions.
"""
from __future__ import annotations

import pickle
import queue
import time
import traceback
from typing import Callable, Dict, List, Optional

import numpy as np

from .buffers import Ctl, SharedControl, SlotState, Worker
from .config import Config
from .env_group import EnvGroup, SlotPool
from .env_utils import time_limit
from .ipc import SLOTS_FREED
from .messages import PolicyRequest, Report, ReportKind, parse_ready
from .agent_lanes import AgentLanes, FrozenPolicy
from .multiagent import AgentLayout
from .spaces import MASK_KEY, read_mask
from .timing import StageTimer

REPORT_INTERVAL = 1.0  # seconds between episode/timing reports


class RolloutWorker:
    def __init__(self, cfg: Config, worker_idx: int, env_factory: bytes, pools: List[tuple],
                 ctl: SharedControl, queues, serial: bool = False,
                 agents: Optional[AgentLayout] = None, frozen: Optional[dict] = None):
        """``pools``: (config, env spec, buffers, queues) of each trained policy's slot pool
        (see runner.PolicyPart.pool); ``ctl``: the graph's control matrix."""
        self.cfg, self.worker_idx, self.env_factory = cfg, worker_idx, env_factory
        self.pools = [SlotPool(k, *pool, worker_idx) for k, pool in enumerate(pools)]
        self.all_pools = (1 << len(self.pools)) - 1  # EnvGroup.waiting for every pool
        self.agents = agents
        # frozen policies (a multi-agent env): id -> FrozenPolicy, built in init
        self.frozen = {pid: FrozenPolicy(spec, cfg, weights)
                       for pid, (spec, weights) in (frozen or {}).items()}
        self.ctl, self.serial = ctl, serial
        self.name = f"rollout-{worker_idx}"
        # a multi-agent env's steps: its agents' lanes in the pools
        self.lanes = None if agents is None else AgentLanes(agents, self.pools, self.frozen, cfg, self.name,
                                                            worker_idx, self._restart_env)
        self.action_ready_queue = queues.action_ready[worker_idx]
        self.report_queue = queues.report
        self.timer = StageTimer()
        self.groups: List[EnvGroup] = []
        self.envs: list = []  # every env built so far, closed even if init fails half-way
        self.episodes: list = []  # (return, length) of a single-agent env's episodes
        self.steps_since_report = 0
        self.env_restarts = 0
        self.trained_seen: list = []  # the learners' trained-env-steps counters, last seen

    # --- set-up ---------------------------------------------------------------------------
    def init(self) -> None:
        cfg = self.cfg
        try:  # pickled separately so that a factory that cannot be imported here is named
            self.make_env: Callable = pickle.loads(self.env_factory)
        except Exception as e:
            raise RuntimeError(f"{self.name} could not unpickle the env factory ({type(e).__name__}: "
                               f"{e}); define it in a module the worker processes can import") from e
        for pool in self.pools:
            pool.map()
        for policy in self.frozen.values():
            policy.reload()
        # A replacement for a killed worker: new env seeds, and no stale "actions ready" message
        # (the main process moved the incarnation first, so policy workers send no more).
        self.incarnation = int(self.ctl.workers[self.worker_idx, Worker.INCARNATION])
        # this process's name in slot_owner (see SlotState)
        self.worker_serial = SlotState.serial(self.worker_idx, self.incarnation, cfg.num_workers)
        self.action_ready_queue.drain()
        E = cfg.envs_per_group
        for g in range(2):
            group = EnvGroup([None] * E, self.pools)
            views = [s.last_obs for s in group.slots]
            for i in range(E):
                seed = (cfg.seed + self.worker_idx * cfg.num_envs_per_worker + g * E + i
                        + 7_919 * cfg.num_envs_per_worker * self.incarnation) % 2 ** 31
                self._started(views, group, i, *self._start_env(group, i, seed))
                group.first_cut[i] = self._first_cut(group.envs[i], g * E + i)
            self.groups.append(group)
            self._check_masks(views, g)
        self.last_report = time.perf_counter()
        self.last_progress = time.perf_counter()
        self._claim_slots()

    def _first_cut(self, env, i: int) -> int:
        """The step at which env ``i`` of this worker ends its first episode by truncation
        (0: none), spread over the env's time limit (``Config.spread_first_episodes``)."""
        cfg = self.cfg
        limit = time_limit(env)
        if not cfg.spread_first_episodes or self.lanes is not None or not limit:
            return 0
        k = self.worker_idx * cfg.num_envs_per_worker + i
        cut = -(-limit * (k + 1) // (cfg.num_workers * cfg.num_envs_per_worker))
        return cut if cut < limit else 0

    def close(self) -> None:
        try:
            if len(self.groups) == 2:
                self.report()  # the last episodes and timings
        finally:
            for env in self.envs:
                try:
                    env.close()
                except Exception:  # a broken env must not keep the others open
                    pass

    def pause(self, run: int) -> None:
        """Between train() calls: envs keep their episodes, the slots their partial data. The
        last report goes out first, so the main process can wait for it (see Runner._pause)."""
        self.report()
        self.ctl.workers[self.worker_idx, Worker.PAUSED_RUN] = run

    def resume(self) -> None:
        self.last_progress = max(self.last_progress, time.perf_counter())
        for policy in self.frozen.values():  # weights the user set between train() calls
            policy.reload()

    # --- the loop body --------------------------------------------------------------------
    def step(self, timeout: float) -> bool:
        """Step every group whose actions are ready; returns whether any work was done."""
        if not all(g.has_slots for g in self.groups):  # woken by SLOTS_FREED (see ipc)
            self._claim_slots()
        # With no slots in either group nothing can be asked for: the wait is for a learner.
        waiting_for = "wait_actions" if any(g.has_slots for g in self.groups) else "wait_slot"
        # Read before the answers: a replaced policy worker's answers all precede the move.
        incarnations = [int(p.policy_incarnation_np[p.policy_idx]) for p in self.pools]
        t0 = time.perf_counter()
        try:
            ready = self.action_ready_queue.get_many(block=timeout > 0, timeout=timeout)
        except queue.Empty:
            ready = None
        self.timer.add(waiting_for, time.perf_counter() - t0)
        for code in ready or ():
            if code == SLOTS_FREED:
                continue
            k, group_idx = parse_ready(code)
            group = self.groups[group_idx]
            if group.waiting >> k & 1:
                group.waiting &= ~(1 << k)
                if not group.waiting:  # every trained policy's actions are written
                    self._step_group(group, group_idx)
        for pool, incarnation in zip(self.pools, incarnations):
            if incarnation != pool.policy_incarnation:
                self._ask_again(pool, incarnation)
        if ready is None:
            self._check_stuck()
            return False
        self.last_progress = time.perf_counter()
        if self.last_progress - self.last_report > REPORT_INTERVAL:
            self.report()
        return True

    def _step_group(self, group: EnvGroup, group_idx: int) -> None:
        t = group.t
        rows = [pool.row(s.slot_idx, t) for pool, s in zip(self.pools, group.slots)]
        views = [obs for obs, *_ in rows]
        with self.timer("env_step"):
            actions = [pool.dist.to_env(pool.actions_np[s.slot_idx, t])
                       for pool, s in zip(self.pools, group.slots)]
            if self.lanes is not None:
                others = self.lanes.other_actions(group)
                for i, env in enumerate(group.envs):
                    self.lanes.step(group, i, env, actions, others[i], rows, views, t)
            else:  # a single-agent env fills one pool
                (env_actions,), (row,) = actions, rows
                self._step_envs(group, env_actions, *row, t)
        for pool, s, (obs_out, rewards_out, dones_out, _) in zip(self.pools, group.slots, rows):
            if pool.state_np is not None and dones_out.any():  # also after an env restart
                pool.state_np[s.slot_idx, t + 1][dones_out] = 0
            self._check_finite(pool, rewards_out, obs_out, group_idx)
            self.steps_since_report += len(dones_out)
        self._check_masks(views, group_idx)
        group.t = t + 1
        if group.t < self.cfg.rollout:
            self._request(group_idx)
            return
        # The slots are full: keep their last obs (the next slots' first), hand them to the
        # learners (marked first: were this worker killed before the put, they still get them).
        for pool, s in zip(self.pools, group.slots):
            for name, a in pool.observed.items():
                s.last_obs[name][:] = a[s.slot_idx, group.t]
            pool.slot_owner_np[s.slot_idx] = SlotState.handing(self.worker_serial)
            pool.full_slot_queue.put(s.slot_idx)
            s.slot_idx = None
        group.has_slots = False
        self._claim_slots()

    def _step_envs(self, group: EnvGroup, actions: list, obs_out: dict, rewards_out: np.ndarray,
                   dones_out: np.ndarray, truncated_out: np.ndarray, t: int) -> None:
        """Step a group of single-agent envs, writing row t (and the observations of t + 1)."""
        ep_return, ep_length, failures = group.ep_return, group.ep_length, group.failures
        first_cut = group.first_cut
        (pool,) = self.pools
        for i, env in enumerate(group.envs):
            try:
                obs, reward, terminated, truncated, info = env.step(actions[i])
                if failures[i]:  # it works again: not a crash loop
                    failures[i] = 0
                ep_return[i] += reward
                ep_length[i] += 1
                cut = (first_cut[i] and ep_length[i] >= first_cut[i]
                       and not (terminated or truncated))
                truncated = truncated or cut
                done = terminated or truncated
                if done:
                    first_cut[i] = 0
                    # An env may end learning episodes inside one game (Atari's episodic
                    # life): the logged return is the whole game's, until info["game_over"]. A
                    # first episode cut short is not logged (a part of one).
                    if cut:
                        ep_return[i], ep_length[i] = 0.0, 0
                    elif info.get("game_over", True):
                        self.episodes.append((ep_return[i], ep_length[i]))
                        ep_return[i], ep_length[i] = 0.0, 0
                    obs, info = env.reset()
            except Exception:
                if self.cfg.on_env_error == "abort":
                    raise
                obs, info, reward, done, terminated, truncated = self._restart_env(group, i, t)
            self._write(pool, obs_out, i, group.envs[i], obs, info)
            rewards_out[i] = reward
            dones_out[i] = done
            truncated_out[i] = truncated and not terminated

    def _restart_env(self, group: EnvGroup, i: int, t: int) -> tuple:
        """The env raised in step or reset: replace it with a new one and drop the samples it
        wrote into this group's slots (policy version -1: the learners mask them), so the
        broken episode is not mixed with the new one. Returns what the step writes: the new
        first obs and info, reward 0, done (nothing bootstraps across), terminated, not
        truncated."""
        self._count_failure(group, i, traceback.format_exc())
        obs, info = self._start_env(group, i, seed=int(np.random.randint(2 ** 31)))
        for pool, s in zip(self.pools, group.slots):
            pool.versions_np[s.slot_idx, :t + 1, i * pool.lanes:(i + 1) * pool.lanes] = -1
        group.ep_return[i], group.ep_length[i], group.first_cut[i] = 0.0, 0, 0
        return obs, info, 0.0, True, True, False

    def _started(self, views: List[dict], group: EnvGroup, i: int, obs, info) -> None:
        """Env ``i`` was (re)built and reset: write its first observation into ``views`` (one
        dict per pool); a multi-agent env's episode begins: its agents are mapped to policies."""
        if self.lanes is not None:
            self.lanes.begin_episode(views, group, i, obs, info)
            return
        (pool,), (view,) = self.pools, views  # one pool
        self._write(pool, view, i, group.envs[i], obs, info)

    @staticmethod
    def _write(pool: SlotPool, views: Dict[str, np.ndarray], i: int, env, obs, info) -> None:
        """Env ``i``'s observation (and the mask of its legal actions) into ``views``."""
        pool.write_obs(views, i, obs)
        if pool.mask_source is not None:
            views[MASK_KEY][i] = np.asarray(read_mask(env, pool.mask_source, obs, info),
                                            bool).reshape(-1)

    def _check_masks(self, views: List[dict], group_idx: int) -> None:
        """A mask that leaves some action dimension with no legal action: fail naming the env."""
        for pool, v in zip(self.pools, views):
            if not pool.mask_sizes:
                continue
            starts = np.cumsum([0] + pool.mask_sizes[:-1])
            ok = np.add.reduceat(v[MASK_KEY], starts, axis=1) > 0
            if ok.all():
                continue
            col = int(np.flatnonzero(~ok.all(axis=1))[0])
            what = self._column(pool, group_idx, col)
            raise ValueError(f"{what}: its action mask allows no action in dimension "
                             f"{int(np.flatnonzero(~ok[col])[0])}; every observation needs at "
                             "least one legal action per dimension")

    def _column(self, pool: SlotPool, group_idx: int, col: int) -> str:
        """The env (and agent) of a column of a group's slot, for an error message."""
        i = col // pool.lanes
        env_idx = (self.worker_idx * self.cfg.num_envs_per_worker
                   + group_idx * self.cfg.envs_per_group + i)
        agent = ("" if self.lanes is None
                 else f", agent {self.lanes.lane_agent(self.groups[group_idx], pool.k, col)!r}")
        return f"env {env_idx} ({self.name}, group {group_idx}, env {i}{agent})"

    def _start_env(self, group: EnvGroup, i: int, seed: int) -> tuple:
        """Put a new env in place ``i`` of the group (closing the one there) and reset it; returns
        its first observation and info. With on_env_error="restart" a new env that fails to build or
        reset (at start-up too) is replaced again, each failure counting towards the crash
        loop limit; with "abort" the first error ends the run."""
        while True:
            old = group.envs[i]
            if old is not None and old in self.envs:
                self.envs.remove(old)
                try:
                    old.close()
                except Exception:  # it is broken already
                    pass
            group.envs[i] = None
            try:
                env = self.make_env()
                self.envs.append(env)
                group.envs[i] = env
                if self.agents is None:  # a ParallelEnv's action_space is a method
                    env.action_space.seed(seed)
                return env.reset(seed=seed)
            except Exception:
                if self.cfg.on_env_error == "abort":
                    raise
                self._count_failure(group, i, traceback.format_exc())
                seed = int(np.random.randint(2 ** 31))

    def _count_failure(self, group: EnvGroup, i: int, error: str) -> None:
        group.failures[i] += 1
        self.env_restarts += 1
        if group.failures[i] > self.cfg.max_env_restarts:
            raise RuntimeError(f"{self.name}: an env failed {group.failures[i]} times in a row "
                               f"before completing a step (max_env_restarts="
                               f"{self.cfg.max_env_restarts}): a crash loop; its last "
                               f"error:\n{error}")

    def _check_finite(self, pool: SlotPool, rewards: np.ndarray, obs: Dict[str, np.ndarray],
                      group_idx: int) -> None:
        """A NaN or Inf from an env would poison the learner: fail naming the env."""
        if np.isfinite(rewards).all() and all(np.isfinite(obs[n]).all() for n in pool.float_obs):
            return  # the per-step cost: a reduction per float entry, no per-env flags
        bad_reward = ~np.isfinite(rewards)
        bad_obs = np.zeros(len(rewards), bool)
        for n in pool.float_obs:
            bad_obs |= ~np.isfinite(obs[n].reshape(len(rewards), -1)).all(axis=1)
        col = int(np.flatnonzero(bad_reward | bad_obs)[0])
        i = col // pool.lanes
        what = f"reward {rewards[col]}" if bad_reward[col] else "observation with NaN/Inf"
        if self.lanes is not None:
            what += f" for agent {self.lanes.lane_agent(self.groups[group_idx], pool.k, col)!r}"
        env_idx = self.worker_idx * self.cfg.num_envs_per_worker + group_idx * self.cfg.envs_per_group + i
        raise ValueError(f"env {env_idx} ({self.name}, group {group_idx}, env {i}: "
                         f"{self.groups[group_idx].envs[i]}) returned a non-finite {what}")

    def _claim_slots(self) -> None:
        """Give every group a free slot of each pool it lacks one of, and ask for the first
        actions of a group that holds them all. Never waits inside a queue (see ipc): whoever
        frees slots rings the worker's pipe."""
        for group_idx, group in enumerate(self.groups):
            if group.has_slots:
                continue
            for pool, s in zip(self.pools, group.slots):
                if s.slot_idx is not None:
                    continue
                # Up while a slot taken from the queue is not marked as this worker's: the
                # learner's audit waits for live workers' flags to drop, and finds a slot a
                # worker killed here left in neither a queue nor anyone's hands (the main
                # process drops its flag).
                pool.claiming_np[self.worker_idx] = 1
                try:
                    slot = pool.free_slot_queue.get(block=False)
                except queue.Empty:
                    continue
                else:
                    pool.slot_owner_np[slot] = self.worker_serial  # reclaimed if this worker is killed
                finally:
                    pool.claiming_np[self.worker_idx] = 0
                for name, a in pool.observed.items():
                    a[slot, 0] = s.last_obs[name]
                s.slot_idx = slot
            group.has_slots = all(s.slot_idx is not None for s in group.slots)
            if group.has_slots:
                group.t = 0
                self._request(group_idx)

    def _request(self, group_idx: int, pools: Optional[List[SlotPool]] = None) -> None:
        """Ask every trained policy (or those of ``pools`` again) for the actions of the
        group's row t."""
        group = self.groups[group_idx]
        if pools is None:
            group.waiting, pools = self.all_pools, self.pools
        for pool in pools:
            pool.request_queue.put(PolicyRequest(self.worker_idx, group_idx, group.slots[pool.k].slot_idx,
                                                 group.t, self.incarnation, pool.policy_incarnation))

    def _ask_again(self, pool: SlotPool, policy_incarnation: int) -> None:
        """A policy worker of this pool was replaced: the new one drops requests sent to its
        predecessor, whose answers were all read (they precede the move), so every group still
        waiting for this pool asks again."""
        pool.policy_incarnation = policy_incarnation
        for group_idx, group in enumerate(self.groups):
            if group.has_slots and group.waiting >> pool.k & 1:
                self._request(group_idx, [pool])

    def _check_stuck(self) -> None:
        trained = self.ctl.column(Ctl.TRAINED_ENV_STEPS)
        # A slow learner (a busy CPU) is not a stuck one, nor one that reached its target while
        # the main process is busy (a long callback) before pausing everyone.
        if trained != self.trained_seen or all(self.ctl.column(Ctl.LEARNER_DONE)):
            self.trained_seen, self.last_progress = trained, time.perf_counter()
            return
        waited = time.perf_counter() - self.last_progress
        if not self.serial and waited > self.cfg.worker_timeout:
            what = ("a free trajectory slot (a learner is not returning slots)"
                    if not all(g.has_slots for g in self.groups)
                    else "actions from the policy workers")
            raise TimeoutError(f"{self.name} waited {waited:.0f} s for {what}; "
                               f"raise worker_timeout if this is expected")

    def report(self) -> None:
        if self.lanes is None:
            finished, self.episodes = {None: self.episodes}, []
        else:
            finished = self.lanes.take_finished()
        by_policy = {pid: ([r for r, _ in eps], [n for _, n in eps]) for pid, eps in finished.items()}
        self.report_queue.put(Report(ReportKind.EPISODES, self.name,
                                     (by_policy, self.steps_since_report, self.env_restarts)))
        self.env_restarts = 0
        self.report_queue.put(Report(ReportKind.TIMING, self.name, self.timer.snapshot()))
        self.steps_since_report = 0
        self.last_report = time.perf_counter()
