"""Preallocated shared-memory tensors: trajectory slots, published weights, run control.

Every process maps the same memory; queues carry only slot indices and small messages. New
buffers are filled with sentinel values (NaN, -1) so a slot that was never written shows.
Tensors are shared with torch's file-descriptor strategy: no name lingers in /dev/shm, even
after a crash.
"""
from __future__ import annotations

import queue
from enum import IntEnum
from typing import Tuple

import numpy as np
import torch
from torch import nn

from .config import MUTABLE_HPARAMS, Config


class TrajectoryBuffers:
    """``num_slots`` slots, each one env group's trajectory of ``rollout`` steps:

    obs [S, T+1, E, *obs_shape] (obs[:, T] is the state after the last step), and
    actions, log_probs, values, rewards, dones, truncated, policy_versions, each [S, T, E]
    (``dones`` is terminated or truncated; ``truncated`` marks time-limit ends among them).

    Bookkeeping for restarting a killed rollout worker: ``slot_owner`` [S] (the rollout worker
    filling each slot, -1 when none is), ``incarnation`` [num_workers] (moved by the main
    process when it replaces a worker: requests of the dead one are then dropped) and
    ``policy_ticks`` [num_policy_workers] (each policy worker counts its loop passes: once every
    one has moved, no request of the dead worker is being served any more).
    """

    @staticmethod
    def nbytes(cfg: Config, obs_shape: tuple, obs_dtype: np.dtype) -> int:
        """Shared memory the buffers take."""
        S, T, E = cfg.num_slots, cfg.rollout, cfg.envs_per_group
        obs = S * (T + 1) * E * int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
        return obs + S * T * E * (8 + 4 + 4 + 4 + 1 + 1 + 8) + 8 * (S + cfg.num_workers + cfg.num_policy_workers)

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
        self.truncated = shared((S, T, E), torch.bool, False)
        self.policy_versions = shared((S, T, E), torch.int64, -1)
        self.slot_owner = shared((S,), torch.int64, -1)
        self.incarnation = shared((cfg.num_workers,), torch.int64, 0)
        self.policy_ticks = shared((cfg.num_policy_workers,), torch.int64, 0)


class Ctl(IntEnum):
    """Fields of the shared control vector. The main process writes all but the learner's two."""
    STOP = 0               # 1: every component closes and its process exits
    TARGET_ENV_STEPS = 1   # the learner stops once it has trained on this many samples
    TRAINED_ENV_STEPS = 2  # samples the learner has trained on (learner; main resets it)
    LEARNER_DONE = 3       # 1: the learner reached the target and published its final weights
    RUN_STATE = 4          # 2 x run + paused, one word so it is read whole: run counts the train()
                           # calls served (a new one resumes the components); paused: between calls
    LEARNER_PAUSED = 5     # the run the learner has paused after (learner): its state is saved
    MIN_VERSION = 6        # samples of older policy versions are masked (weights set by the user)
    OPTIMIZER_EPOCH = 7    # moves when the user replaced the optimizer state file
    SNAPSHOT_REQUEST = 8   # moves when the main process wants the learner's exact state on disk
    SNAPSHOT_DONE = 9      # the request the learner has written its state for (learner)


class SharedControl:
    """A small int64 vector every process reads without locking (single writer per field)."""

    def __init__(self):
        self.values = torch.zeros(len(Ctl), dtype=torch.int64).share_memory_()
        self.set_run_state(0, paused=True)

    def __getitem__(self, key: Ctl) -> int:
        return int(self.values[key])

    def __setitem__(self, key: Ctl, value: int) -> None:
        self.values[key] = value

    @property
    def stopping(self) -> bool:
        return bool(self.values[Ctl.STOP])

    def run_state(self) -> Tuple[int, bool]:
        """(run, paused), from one read."""
        state = int(self.values[Ctl.RUN_STATE])
        return state >> 1, bool(state & 1)

    def set_run_state(self, run: int, paused: bool) -> None:
        self.values[Ctl.RUN_STATE] = 2 * run + int(paused)


class SharedHyperParams:
    """The hyper-parameters a running learner picks up without a restart (``MUTABLE_HPARAMS``),
    as a shared float64 vector with a change counter. The main process validates and writes;
    the learner reads when the counter moved."""

    def __init__(self, cfg: Config):
        self.values = torch.zeros(len(MUTABLE_HPARAMS) + 1, dtype=torch.float64).share_memory_()
        self.write({name: getattr(cfg, name) for name in MUTABLE_HPARAMS})

    @property
    def version(self) -> int:
        return int(self.values[-1])

    def write(self, hparams: dict) -> None:
        new = torch.tensor([float(hparams[name]) for name in MUTABLE_HPARAMS], dtype=torch.float64)
        if not torch.equal(new, self.values[:-1]) or self.version == 0:
            self.values[:-1] = new
            self.values[-1] += 1

    def read(self) -> dict:
        return dict(zip(MUTABLE_HPARAMS, self.values[:-1].tolist()))


class QueueLock:
    """A cross-process lock made of a one-token faster-fifo queue: a process-shared pthread
    mutex in anonymous shared memory, so unlike ``multiprocessing.Lock`` it leaves no named
    semaphore in /dev/shm, even if its owner is killed. ``acquire`` takes a timeout."""

    def __init__(self):
        import faster_fifo
        self.token_queue = faster_fifo.Queue(1000)
        self.token_queue.put(True)

    def acquire(self, timeout: float) -> bool:
        try:
            self.token_queue.get(timeout=timeout)
            return True
        except queue.Empty:
            return False

    def release(self) -> None:
        self.token_queue.put(True)

    def __enter__(self):
        if not self.acquire(timeout=60.0):
            raise TimeoutError("a shared lock stayed taken for 60 s: its holder died or hangs")
        return self

    def __exit__(self, *exc):
        self.release()


class SharedWeights:
    """The learner's parameters as one flat shared vector, plus a version counter.

    Readers reload only when the version moved (``load_if_newer``); a lock makes each copy whole.
    """

    def __init__(self, model: nn.Module, version: int = 0, env_steps: int = 0):
        self.flat = torch.zeros(sum(p.numel() for p in model.parameters())).share_memory_()
        self.meta = torch.zeros(2, dtype=torch.int64).share_memory_()  # version, env steps trained
        self.lock = QueueLock()
        self.publish(model, version, env_steps)

    @property
    def version(self) -> int:
        return int(self.meta[0])

    @torch.no_grad()
    def publish(self, model: nn.Module, version: int, env_steps: int) -> None:
        """Write the weights with their version and the env steps they were trained on."""
        # reshape, not view: conv weights may be channels-last; the vector is in logical order
        vec = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to("cpu")
        if not bool(torch.isfinite(vec).all()):
            raise FloatingPointError(f"refusing to publish non-finite weights (version {version})")
        with self.lock:
            self.flat.copy_(vec)
            self.meta[0], self.meta[1] = version, env_steps

    @torch.no_grad()
    def load(self, model: nn.Module, lock_timeout: float = 60.0) -> Tuple[int, int]:
        """Copy the published weights into ``model``; returns (version, env steps trained)."""
        device = next(model.parameters()).device
        if not self.lock.acquire(timeout=lock_timeout):
            raise TimeoutError("the shared weights stayed locked: a writer died mid-publish")
        try:
            vec = self.flat.to(device, copy=True)
            version, env_steps = self.meta.tolist()
        finally:
            self.lock.release()
        offset = 0
        for p in model.parameters():  # copy_ keeps each parameter's memory format
            p.copy_(vec[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return version, env_steps

    def load_if_newer(self, model: nn.Module, have_version: int) -> int:
        """Reload only when the version moved; returns the version ``model`` now holds."""
        if self.version == have_version:
            return have_version
        return self.load(model)[0]
