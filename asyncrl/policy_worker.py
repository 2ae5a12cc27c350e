"""Policy worker: batches every pending request into one forward pass on its device.

Observations are gathered from the shared slots by index; actions, log-probs, values and the policy
version are written back in place, then each rollout worker gets the indices of its ready groups.
"""
from __future__ import annotations

import queue
import time
from collections import defaultdict

import numpy as np
import torch

from .buffers import RNN_STATE, SharedControl, SharedWeights, TrajectoryBuffers, Worker
from .config import Config
from .messages import Report, ReportKind, ready_code
from .models import ActorCritic, PolicySpec
from .spaces import MASK_KEY, split_obs_names
from .timing import StageTimer

REPORT_INTERVAL = 1.0


class PolicyWorker:
    def __init__(self, cfg: Config, policy_idx: int, policy_spec: PolicySpec, device: str,
                 buffers: TrajectoryBuffers, weights: SharedWeights, ctl: SharedControl, queues,
                 serial: bool = False, trained_idx: int = 0, name_prefix: str = "policy-"):
        """``queues``: its trained policy's (``PolicyQueues``); ``trained_idx``: that policy's
        index, part of every answer (see ``ready_code``)."""
        self.cfg, self.policy_idx, self.device = cfg, policy_idx, torch.device(device)
        self.policy_spec, self.trained_idx = policy_spec, trained_idx
        self.buffers, self.weights, self.ctl, self.serial = buffers, weights, ctl, serial
        self.name = f"{name_prefix}{policy_idx}"
        self.request_queue = queues.policy_request[policy_idx]
        self.action_ready_queues = queues.action_ready
        self.report_queue = queues.report
        self.timer = StageTimer()

    def init(self) -> None:
        if self.cfg.seed is not None:
            torch.manual_seed(self.cfg.seed + 10_000 + self.policy_idx)
        self.model = ActorCritic(self.policy_spec, self.cfg).to(self.device)
        self.model.eval()
        b = self.buffers  # numpy views: small fancy-indexed copies are cheaper than in torch
        arrays = b.numpy()
        self.incarnation_np = self.ctl.workers[:, Worker.INCARNATION]
        self.ticks_np = b.policy_ticks.numpy()
        self.incarnation = int(b.policy_incarnation[self.policy_idx])
        # Observed entries flattened to [S * (T+1), E, ...], gathered by slot * (T+1) + t into
        # (pinned) staging buffers; the results are written back into the step entries.
        S, T, E = arrays["log_probs"].shape  # step entries: [S, T, E]
        self.steps_per_slot = T1 = T + 1
        max_requests = 2 * len(self.action_ready_queues)  # each group has one request in flight at most
        pin = self.device.type == "cuda"
        self.observed = {}  # name -> (flat source, staging tensor, its numpy view)
        for name in b.obs_names():
            src = arrays[name]
            staging = torch.empty((max_requests, E, *src.shape[3:]), dtype=b.tensors[name].dtype,
                                  pin_memory=pin)
            self.observed[name] = (src.reshape(S * T1, E, *src.shape[3:]), staging, staging.numpy())
        self.actions_np, self.log_probs_np = arrays["actions"], arrays["log_probs"]
        self.values_np, self.versions_np = arrays["values"], arrays["policy_versions"]
        self.state_np = arrays.get(RNN_STATE)
        self.version, _ = self.weights.load(self.model)
        self.forward = self.model.fused_forward()
        self.last_report = time.perf_counter()

    def close(self) -> None:
        pass

    def pause(self, run: int) -> None:
        self.ticks_np[self.policy_idx] += 1

    def resume(self) -> None:  # new weights, if the user set them, load with the next request
        pass

    def step(self, timeout: float) -> bool:
        try:
            return self._serve(timeout)
        finally:  # this pass is over: requests it took are written (see Runner's restart)
            self.ticks_np[self.policy_idx] += 1

    def _serve(self, timeout: float) -> bool:
        t0 = time.perf_counter()
        try:
            requests = self.request_queue.get_many(block=timeout > 0, timeout=timeout)
        except queue.Empty:
            self.timer.add("wait_requests", time.perf_counter() - t0)
            return False
        self.timer.add("wait_requests", time.perf_counter() - t0)
        # Requests of a rollout worker that was killed and replaced (its slots were reclaimed),
        # and those sent to this worker's killed predecessor (they are sent again).
        rollout_incarnation, incarnation = self.incarnation_np, self.incarnation
        if any(r.incarnation != rollout_incarnation[r.worker_idx]
               or r.policy_incarnation != incarnation for r in requests):
            requests = [r for r in requests if r.incarnation == rollout_incarnation[r.worker_idx]
                        and r.policy_incarnation == incarnation]
            if not requests:
                return True
        with self.timer("load_weights"):
            version = self.weights.load_if_newer(self.model, self.version)
            if version != self.version:
                self.version, self.forward = version, self.model.fused_forward()
        with self.timer("inference"):
            self._infer(requests)
        with self.timer("notify"):
            ready = defaultdict(list)
            for r in requests:
                ready[r.worker_idx].append(ready_code(self.trained_idx, r.group_idx))
            for worker_idx, groups in ready.items():
                self.action_ready_queues[worker_idx].put_many(groups)
        now = time.perf_counter()
        if now - self.last_report > REPORT_INTERVAL:
            self.report_queue.put(Report(ReportKind.TIMING, self.name, self.timer.snapshot()))
            self.last_report = now
        return True

    @torch.inference_mode()
    def _infer(self, requests) -> None:
        slot_idx = np.array([r.slot_idx for r in requests])
        t_idx = np.array([r.t for r in requests])
        num_requests = len(requests)
        rows = slot_idx * self.steps_per_slot + t_idx
        inputs = {}
        for name, (src, staging, staging_np) in self.observed.items():
            # One gather of [R, E, ...] straight into the (pinned) staging buffer.
            np.take(src, rows, axis=0, out=staging_np[:num_requests])
            x = staging[:num_requests].flatten(0, 1)
            if self.device.type == "cuda":
                x = x.to(self.device, non_blocking=True)
            inputs[name] = x
        obs, rest = split_obs_names(inputs)
        mask = rest.get(MASK_KEY)
        shape = (num_requests, -1)
        if self.state_np is None:
            params, values = self.forward(obs)
        else:  # the state this step acts from (zeroed where an episode started) -> the next
            params, values, state = self.forward(obs, state=rest[RNN_STATE])
            self.state_np[slot_idx, t_idx + 1] = state.cpu().numpy().reshape(*shape, state.shape[-1])
        actions, log_probs = self.model.dist.sample(params, mask)
        self.actions_np[slot_idx, t_idx] = actions.cpu().numpy().reshape(*shape, actions.shape[-1])
        self.log_probs_np[slot_idx, t_idx] = log_probs.cpu().numpy().reshape(shape)
        self.values_np[slot_idx, t_idx] = values.cpu().numpy().reshape(shape)
        self.versions_np[slot_idx, t_idx] = self.version
