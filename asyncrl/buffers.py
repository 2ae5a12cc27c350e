"""Preallocated shared-memory tensors: trajectory slots, published weights, run control.

Every process maps the same memory; queues carry only slot indices and small messages. New
buffers are filled with sentinel values (NaN, -1) so a slot that was never written shows.
Tensors are shared with torch's file-descriptor strategy: no name lingers in /dev/shm, even
after a crash.
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch
from torch import nn

from .config import Config


class TrajectoryBuffers:
    """``num_slots`` slots, each one env group's trajectory of ``rollout`` steps:

    obs [S, T+1, E, *obs_shape] (obs[:, T] is the state after the last step), and
    actions, log_probs, values, rewards, dones, policy_versions, each [S, T, E].
    """

    def __init__(self, cfg: Config, obs_shape: tuple, obs_dtype: np.dtype):
        S, T, E = cfg.num_slots, cfg.rollout, cfg.envs_per_group
        torch_dtype = torch.from_numpy(np.zeros(0, obs_dtype)).dtype

        def shared(shape, dtype, fill):
            return torch.full(shape, fill, dtype=dtype).share_memory_()

        self.obs = shared((S, T + 1, E, *obs_shape), torch_dtype, 0)
        self.actions = shared((S, T, E), torch.int64, -1)
        self.log_probs = shared((S, T, E), torch.float32, float("nan"))
        self.values = shared((S, T, E), torch.float32, float("nan"))
        self.rewards = shared((S, T, E), torch.float32, float("nan"))
        self.dones = shared((S, T, E), torch.bool, False)
        self.policy_versions = shared((S, T, E), torch.int64, -1)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in vars(self).values())


class Ctl(IntEnum):
    """Fields of the shared control vector."""
    STOP = 0               # 1: every component leaves its loop
    TARGET_ENV_STEPS = 1   # the learner stops once it has trained on this many samples
    TRAINED_ENV_STEPS = 2  # samples the learner has trained on, cumulative over train() calls
    COLLECTED_ENV_STEPS = 3  # env steps written by rollout workers in this run (approximate)
    LEARNER_DONE = 4       # 1: the learner reached the target and published its final weights


class SharedControl:
    """A small int64 vector every process reads without locking (single writer per field)."""

    def __init__(self):
        self.values = torch.zeros(len(Ctl), dtype=torch.int64).share_memory_()

    def __getitem__(self, key: Ctl) -> int:
        return int(self.values[key])

    def __setitem__(self, key: Ctl, value: int) -> None:
        self.values[key] = value

    @property
    def stopping(self) -> bool:
        return bool(self.values[Ctl.STOP])


class SharedWeights:
    """The learner's parameters as one flat shared vector, plus a version counter.

    Readers reload only when the version moved (``load_if_newer``); a lock makes each copy whole.
    """

    def __init__(self, model: nn.Module, lock, version: int = 0):
        self.flat = torch.zeros(sum(p.numel() for p in model.parameters())).share_memory_()
        self.version = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.lock = lock
        self.publish(model, version)

    @torch.no_grad()
    def publish(self, model: nn.Module, version: int) -> None:
        vec = nn.utils.parameters_to_vector(model.parameters()).to("cpu")
        with self.lock:
            self.flat.copy_(vec)
            self.version[0] = version

    @torch.no_grad()
    def load(self, model: nn.Module, lock_timeout: float = 60.0) -> int:
        device = next(model.parameters()).device
        if not self.lock.acquire(timeout=lock_timeout):
            raise TimeoutError("the shared weights stayed locked: a writer died mid-publish")
        try:
            vec = self.flat.to(device, copy=True)
            version = int(self.version[0])
        finally:
            self.lock.release()
        nn.utils.vector_to_parameters(vec, model.parameters())
        return version

    def load_if_newer(self, model: nn.Module, have_version: int) -> int:
        if int(self.version[0]) == have_version:
            return have_version
        return self.load(model)
