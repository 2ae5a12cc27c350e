"""Preallocated shared-memory tensors: trajectory slots, published weights, run control.

Every process maps the same memory; queues carry only slot indices and small messages. New
buffers are filled with sentinel values (NaN, -1) so a slot that was never written shows.
Tensors are shared with torch's file-descriptor strategy: no name lingers in /dev/shm, even
after a crash.
"""
from __future__ import annotations

import queue
from enum import IntEnum
from typing import Dict, Tuple

import numpy as np
import torch
from torch import nn

from .config import MUTABLE_HPARAMS, Config
from .spaces import Entry, EnvSpec


STEP_ENTRIES = {  # what every trajectory records per step, whatever the spaces
    "log_probs": Entry((), torch.float32, False),
    "values": Entry((), torch.float32, False),
    "rewards": Entry((), torch.float32, False),
    "dones": Entry((), torch.bool, False),       # terminated or truncated
    "truncated": Entry((), torch.bool, False),   # time-limit ends among them
    "policy_versions": Entry((), torch.int64, False),
}
SENTINELS = {torch.float32: float("nan"), torch.int64: -1}  # unwritten step data shows


def buffer_spec(env: EnvSpec, dist) -> Dict[str, Entry]:
    """The one description of a trajectory slot: the observed leaves (and the action mask) from
    the env spec, the actions from the distribution, then STEP_ENTRIES."""
    actions = Entry((dist.action_size,), torch.int64 if dist.discrete else torch.float32, False)
    return {**env.obs_entries(), "actions": actions, **STEP_ENTRIES}


class TrajectoryBuffers:
    """``num_slots`` slots, each one env group's trajectory of ``rollout`` steps: for every entry
    of the spec a tensor ``[S, rows, E, *shape]`` (rows T+1 for observed entries, whose row T is
    the state after the last step; T for the rest), in ``tensors`` by name.

    Bookkeeping for restarting a killed rollout worker: ``slot_owner`` [S] (the rollout worker
    filling each slot, -1 when none is), ``incarnation`` [num_workers] (moved by the main
    process when it replaces a worker: requests of the dead one are then dropped) and
    ``policy_ticks`` [num_policy_workers] (each policy worker counts its loop passes: once every
    one has moved, no request of the dead worker is being served any more).
    """

    @staticmethod
    def nbytes(cfg: Config, spec: Dict[str, Entry]) -> int:
        """Shared memory the buffers take."""
        S, T, E = cfg.num_slots, cfg.rollout, cfg.envs_per_group
        total = 8 * (S + cfg.num_workers + cfg.num_policy_workers)
        for e in spec.values():
            itemsize = torch.empty((), dtype=e.dtype).element_size()
            total += S * (T + e.observed) * E * int(np.prod(e.shape)) * itemsize
        return total

    def __init__(self, cfg: Config, spec: Dict[str, Entry]):
        S, T, E = cfg.num_slots, cfg.rollout, cfg.envs_per_group
        self.spec = spec

        def shared(shape, dtype, fill):
            return torch.full(shape, fill, dtype=dtype).share_memory_()

        self.tensors = {name: shared((S, T + e.observed, E, *e.shape), e.dtype,
                                     0 if e.observed else SENTINELS.get(e.dtype, 0))
                        for name, e in spec.items()}
        self.slot_owner = shared((S,), torch.int64, -1)
        self.incarnation = shared((cfg.num_workers,), torch.int64, 0)
        self.policy_ticks = shared((cfg.num_policy_workers,), torch.int64, 0)

    def __getattr__(self, name: str) -> torch.Tensor:  # buffers.rewards etc.
        tensors = self.__dict__.get("tensors", {})
        if name in tensors:
            return tensors[name]
        raise AttributeError(name)

    def numpy(self) -> Dict[str, np.ndarray]:
        """Every tensor as a numpy view of the same memory (cheap small fancy-indexed copies)."""
        return {name: t.numpy() for name, t in self.tensors.items()}

    def obs_names(self) -> list:
        return [name for name, e in self.spec.items() if e.observed]


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


def _state_tensors(model: nn.Module) -> list:
    """Parameters and buffers (normalisers' statistics, BatchNorm's), in state_dict order: what
    policy workers, a resumed learner and checkpoints must all see."""
    return list(model.state_dict(keep_vars=True).values())


class SharedWeights:
    """The learner's state (parameters and module buffers) as one flat shared float vector,
    plus a version counter. Integer buffers pass through it exactly up to 2**24.

    Readers reload only when the version moved (``load_if_newer``); a lock makes each copy whole.
    """

    def __init__(self, model: nn.Module, version: int = 0, env_steps: int = 0):
        self.flat = torch.zeros(sum(t.numel() for t in _state_tensors(model))).share_memory_()
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
        vec = torch.cat([t.detach().reshape(-1).float() for t in _state_tensors(model)]).to("cpu")
        if not bool(torch.isfinite(vec).all()):
            raise FloatingPointError(f"refusing to publish non-finite weights (version {version})")
        with self.lock:
            self.flat.copy_(vec)
            self.meta[0], self.meta[1] = version, env_steps

    @torch.no_grad()
    def load(self, model: nn.Module, lock_timeout: float = 60.0) -> Tuple[int, int]:
        """Copy the published weights into ``model``; returns (version, env steps trained)."""
        tensors = _state_tensors(model)
        device = tensors[0].device
        if not self.lock.acquire(timeout=lock_timeout):
            raise TimeoutError("the shared weights stayed locked: a writer died mid-publish")
        try:
            vec = self.flat.to(device, copy=True)
            version, env_steps = self.meta.tolist()
        finally:
            self.lock.release()
        offset = 0
        for t in tensors:  # copy_ keeps each tensor's memory format
            t.copy_(vec[offset:offset + t.numel()].view(t.shape))
            offset += t.numel()
        return version, env_steps

    def load_if_newer(self, model: nn.Module, have_version: int) -> int:
        """Reload only when the version moved; returns the version ``model`` now holds."""
        if self.version == have_version:
            return have_version
        return self.load(model)[0]
