"""Preallocated shared-memory tensors: trajectory slots, published weights, run control.

Every process maps the same memory; queues carry only slot indices and small messages. New
buffers are filled with sentinel values (NaN, -1) so a slot that was never written shows.
Tensors are shared with torch's file-descriptor strategy: no name lingers in /dev/shm, even
after a crash.
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading
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


RNN_STATE = "rnn_state"  # a recurrent model's state per step: written by the policy worker
WAITING = "waiting"      # a turn-based game's: the lane's agent did not move in the step


def buffer_spec(env: EnvSpec, dist, state_size: int = 0,
                global_state: bool = False) -> Dict[str, Entry]:
    """The one description of a trajectory slot: the observed leaves (the action mask, and the
    global state for a centralised critic: ``global_state``) from the env spec, a recurrent
    model's state (``state_size`` floats: the state each step was acted from; row T, the state
    after the last step, starts the next slot as observations do), the actions from the
    distribution, then STEP_ENTRIES, and for a turn-based game ``WAITING`` (see turns)."""
    actions = Entry((dist.action_size,), torch.int64 if dist.discrete else torch.float32, False)
    state = {RNN_STATE: Entry((state_size,), torch.float32, True)} if state_size else {}
    turns = {WAITING: Entry((), torch.bool, False)} if env.turn_based else {}
    return {**env.obs_entries(global_state), **state, "actions": actions, **STEP_ENTRIES, **turns}


class SlotState:
    """What ``slot_owner`` holds for a slot. A rollout worker process is named by its serial,
    ``incarnation * num_workers + worker_idx``, unique in the run of a process graph.

    - ``>= 0``: the serial of the rollout worker filling the slot;
    - ``FREE`` (-1): in the free queue, or accepted by the learner;
    - ``<= -2``: full, handed to the learner by serial ``-2 - state``: marked before it is
      queued, so that a worker killed in between leaves the slot visible (the learner takes it
      as full); the learner accepts a queued slot only in this state, so one queued twice (by
      its worker and after its worker's death) is trained on once.
    """
    FREE = -1

    @staticmethod
    def serial(worker_idx: int, incarnation: int, num_workers: int) -> int:
        return incarnation * num_workers + worker_idx

    @staticmethod
    def handing(serial: int) -> int:
        return -2 - serial


class TrajectoryBuffers:
    """``num_slots`` slots, each one env group's trajectory of ``rollout`` steps: for every entry
    of the spec a tensor ``[S, rows, E, *shape]`` (rows T+1 for observed entries, whose row T is
    the state after the last step; T for the rest), in ``tensors`` by name. E counts columns:
    one per env, or per agent lane of a multi-agent env (see multiagent).

    The pool's bookkeeping for replacing a killed component (see ``SlotState``; what belongs
    to each rollout worker whatever pool it fills lives in ``SharedControl.workers``):
    ``slot_owner`` [S] (each slot's state), ``claiming`` [num_workers] (1 while a rollout worker
    holds a slot taken from this pool's free queue that it has not marked as its own yet),
    ``policy_ticks`` [num_policy_workers] (each of the pool's policy workers counts its loop
    passes: once every one has moved, no request of a dead rollout worker is being served any
    more) and ``policy_incarnation`` [num_policy_workers] (moved when a policy worker is
    replaced: rollout workers send their unanswered requests again).
    """

    @staticmethod
    def nbytes(cfg: Config, spec: Dict[str, Entry]) -> int:
        """Shared memory the buffers take."""
        S, T, E = cfg.num_slots, cfg.rollout, cfg.columns_per_group
        total = 8 * (S + cfg.num_workers + 2 * cfg.num_policy_workers)
        for e in spec.values():
            itemsize = torch.empty((), dtype=e.dtype).element_size()
            total += S * (T + e.observed) * E * int(np.prod(e.shape)) * itemsize
        return total

    def __init__(self, cfg: Config, spec: Dict[str, Entry]):
        S, T, E = cfg.num_slots, cfg.rollout, cfg.columns_per_group
        self.spec = spec

        def shared(shape, dtype, fill):
            return torch.full(shape, fill, dtype=dtype).share_memory_()

        self.tensors = {name: shared((S, T + e.observed, E, *e.shape), e.dtype,
                                     0 if e.observed else SENTINELS.get(e.dtype, 0))
                        for name, e in spec.items()}
        W, P = cfg.num_workers, cfg.num_policy_workers
        self.slot_owner = shared((S,), torch.int64, SlotState.FREE)
        self.claiming = shared((W,), torch.int64, 0)
        self.policy_ticks = shared((P,), torch.int64, 0)
        self.policy_incarnation = shared((P,), torch.int64, 0)

    def bookkeeping(self) -> list:
        return [self.slot_owner, self.claiming, self.policy_ticks, self.policy_incarnation]

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
    """Fields of a trained policy's row of the shared control matrix. The main process writes
    all but the learner's."""
    TARGET_ENV_STEPS = 0   # the learner stops once it has trained on this many samples
    TRAINED_ENV_STEPS = 1  # samples the learner has trained on (learner; main resets it)
    LEARNER_DONE = 2       # 1: the learner reached the target and published its final weights
    LEARNER_PAUSED = 3     # the run the learner has paused after (learner): its state is saved
    MIN_VERSION = 4        # samples of older policy versions are masked (weights set by the user)
    OPTIMIZER_EPOCH = 5    # moves when the user replaced the optimizer state file
    SNAPSHOT_REQUEST = 6   # moves when the main process wants the learner's exact state on disk
    SNAPSHOT_DONE = 7      # the request the learner has written its state for (learner)
    RECLAIM = 8            # moves when a rollout worker was replaced: the learner takes its slots back
    SLOTS_RECLAIMED = 9    # slots the learner took back from dead workers, in this graph (learner)


class Graph(IntEnum):
    """The whole graph's fields of the control block (written by the main process)."""
    STOP = 0       # 1: every component closes and its process exits
    RUN_STATE = 1  # 2 x run + paused, one word so it is read whole: run counts the train() calls
                   # served (a new one resumes the components); paused: between calls


class Worker(IntEnum):
    """Columns of the control block's row per rollout worker, whatever pools it fills."""
    INCARNATION = 0  # moved by the main process when it replaces the worker: the dead one's
                     # requests are dropped, the new one draws new env seeds
    RECLAIMABLE = 1  # slots of its incarnations below this may be taken back (main process, once
                     # no policy worker serves the dead one any more)
    PAUSED_RUN = 2   # the train() call after which it paused and sent its last report (worker)


class SharedControl:
    """The process graph's control block, small int64 tensors every process reads without
    locking (single writer per field): the whole graph's ``Graph`` fields (stop, run state), a
    row of ``Worker`` fields per rollout worker (``workers``) and a row of ``Ctl`` fields per
    trained policy (its learner's counters and requests). ``row(k)`` is the view a component of
    trained policy ``k`` is given; indexing it with a ``Ctl`` field reads that row."""

    def __init__(self, num_policies: int = 1, num_workers: int = 1):
        self.values = torch.zeros((num_policies, len(Ctl)), dtype=torch.int64).share_memory_()
        self.graph = torch.zeros(len(Graph), dtype=torch.int64).share_memory_()
        self.worker_values = torch.zeros((num_workers, len(Worker)), dtype=torch.int64).share_memory_()
        self.policy_idx = 0
        self.set_run_state(0, paused=True)

    def __getstate__(self):
        return {"values": self.values, "graph": self.graph, "worker_values": self.worker_values,
                "policy_idx": self.policy_idx}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def _view(self, name: str) -> np.ndarray:
        """A numpy view of tensor ``name`` (read in every loop pass: faster than torch's)."""
        view = self.__dict__.get("_np_" + name)
        if view is None:
            view = self.__dict__["_np_" + name] = getattr(self, name).numpy()
        return view

    @property
    def _np(self) -> np.ndarray:
        return self._view("values")

    @property
    def workers(self) -> np.ndarray:
        """[num_workers, len(Worker)]: each rollout worker's row (a view of the shared memory)."""
        return self._view("worker_values")

    @property
    def num_policies(self) -> int:
        return self.values.shape[0]

    def row(self, policy_idx: int) -> "SharedControl":
        """The same memory, indexed at trained policy ``policy_idx``'s row."""
        view = object.__new__(SharedControl)
        view.__setstate__({**self.__getstate__(), "policy_idx": policy_idx})
        return view

    def column(self, key: Ctl) -> list:
        """Field ``key`` of every trained policy."""
        return self._np[:, key].tolist()

    def __getitem__(self, key: Ctl) -> int:
        return int(self._np[self.policy_idx, key])

    def __setitem__(self, key: Ctl, value: int) -> None:
        self._np[self.policy_idx, key] = value

    @property
    def stopping(self) -> bool:
        return bool(self._view("graph")[Graph.STOP])

    def stop(self) -> None:
        """Every component closes and its process exits."""
        self._view("graph")[Graph.STOP] = 1

    def run_state(self) -> Tuple[int, bool]:
        """(run, paused), from one read."""
        state = int(self._view("graph")[Graph.RUN_STATE])
        return state >> 1, bool(state & 1)

    def set_run_state(self, run: int, paused: bool) -> None:
        self._view("graph")[Graph.RUN_STATE] = 2 * run + int(paused)


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


def load_adam_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """``optimizer.load_state_dict(state_dict)``, then each moment in its parameter's memory
    layout. A state handed on flat (SharedOptimizerState) or saved from another optimizer comes
    back in the default layout, where a channels-last convolution weight (the image encoders')
    has its own: the fused Adam kernels walk the tensors in memory order, so on a CPU each
    weight would take another element's moments, silently, and on a GPU the step refuses
    ("must have same dtype, device, and layout")."""
    optimizer.load_state_dict(state_dict)
    for p, state in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            moment = state[key]
            if moment.stride() != p.stride():
                state[key] = torch.empty_like(p).copy_(moment)  # empty_like keeps p's layout


class SharedOptimizerState:
    """Adam's moments and step counts after every update, beside the published weights, so that
    a learner that replaces a killed one goes on from the optimizer state the current weights
    came from, losing only the update in flight. Two copies written in turn, each tagged with
    the weights version it belongs to and the optimizer epoch (an optimizer file the user set
    later wins). The learner writes; only its replacement reads."""

    def __init__(self, model: nn.Module):
        params = list(model.parameters())
        self.flat = torch.zeros(2, 2 * sum(p.numel() for p in params) + len(params)).share_memory_()
        self.tags = torch.full((2, 2), -1, dtype=torch.int64).share_memory_()  # version, epoch

    @staticmethod
    def _params(optimizer: torch.optim.Optimizer) -> list:
        return [p for group in optimizer.param_groups for p in group["params"]]

    @torch.no_grad()
    def write(self, optimizer: torch.optim.Optimizer, version: int, epoch: int) -> None:
        params, state = self._params(optimizer), optimizer.state
        if not state:
            return  # no step taken yet: the file state (or a fresh Adam) is the state
        copy = 0 if int(self.tags[0, 0]) <= int(self.tags[1, 0]) else 1  # the older one
        self.tags[copy, 0] = -1  # invalid while written: a learner killed here leaves the other
        out, offset = self.flat[copy], 0
        for key in ("exp_avg", "exp_avg_sq"):
            for p in params:  # a parameter that never had a gradient has no state: step 0
                if p in state:
                    out[offset:offset + p.numel()].copy_(state[p][key].reshape(-1))
                offset += p.numel()
        out[offset:].copy_(torch.tensor([float(state[p]["step"]) if p in state else 0.0
                                         for p in params]))
        self.tags[copy, 1] = epoch
        self.tags[copy, 0] = version

    @torch.no_grad()
    def read(self, optimizer: torch.optim.Optimizer, version: int, epoch: int) -> bool:
        """Load the copy that belongs to weights ``version`` into ``optimizer``; False if none."""
        for copy in (0, 1):
            if self.tags[copy].tolist() == [version, epoch]:
                break
        else:
            return False
        params, flat = self._params(optimizer), self.flat[copy].clone()
        sizes = [p.numel() for p in params]
        exp_avg, exp_avg_sq, steps = flat.split([sum(sizes), sum(sizes), len(params)])
        state_dict = optimizer.state_dict()
        state_dict["state"] = {  # a parameter that had no gradient has step 0: no state
            i: {"step": steps[i].clone(), "exp_avg": m.view(p.shape), "exp_avg_sq": v.view(p.shape)}
            for i, (p, m, v) in enumerate(zip(params, exp_avg.split(sizes), exp_avg_sq.split(sizes)))
            if steps[i] > 0}
        load_adam_state(optimizer, state_dict)
        return True


_RECOVERY = threading.Lock()  # SharedWeights.recover_from_death, within the main process


def _state_tensors(model: nn.Module) -> list:
    """Parameters and buffers (normalisers' statistics, BatchNorm's), in state_dict order: what
    policy workers, a resumed learner and checkpoints must all see."""
    return list(model.state_dict(keep_vars=True).values())


class SharedWeights:
    """The learner's state (parameters and module buffers) as flat shared float vectors, plus a
    version counter. Integer buffers pass through it exactly up to 2**24.

    Readers reload only when the version moved (``load_if_newer``); a lock makes each copy whole.
    Two copies, written in turn: a learner killed while publishing leaves the previous weights
    whole (``recover_from_death`` then hands back the lock it held), which a replacement
    learner and the main process read on.
    """

    CURRENT, HOLDER = 0, 1  # meta fields; then (version, env steps) of copy 0 and of copy 1

    def __init__(self, model: nn.Module, version: int = 0, env_steps: int = 0):
        self.flat = torch.zeros(2, sum(t.numel() for t in _state_tensors(model))).share_memory_()
        self.meta = torch.zeros(6, dtype=torch.int64).share_memory_()
        self.lock = QueueLock()
        self.publish(model, version, env_steps)

    def _counters(self, copy: int) -> Tuple[int, int]:
        return int(self.meta[2 + 2 * copy]), int(self.meta[3 + 2 * copy])

    @property
    def version(self) -> int:
        return self._counters(int(self.meta[self.CURRENT]))[0]

    @contextlib.contextmanager
    def _locked(self, timeout: float):
        if not self.lock.acquire(timeout=timeout):
            raise TimeoutError(f"the shared weights stayed locked for {timeout:.0f} s: a process "
                               "died or hangs holding them")
        self.meta[self.HOLDER] = os.getpid()
        try:
            yield
        finally:
            self.meta[self.HOLDER] = 0
            self.lock.release()

    def recover_from_death(self, pid: int) -> bool:
        """Process ``pid`` is dead: if it held the lock, hand the lock back (the copy it was
        writing is not the current one; one it was reading is unchanged). Returns whether it
        did."""
        with _RECOVERY:  # the main thread and the lock watcher may both see the death
            if int(self.meta[self.HOLDER]) != pid:
                return False
            self.meta[self.HOLDER] = 0
            self.lock.release()
            return True

    @torch.no_grad()
    def publish(self, model: nn.Module, version: int, env_steps: int) -> None:
        """Write the weights with their version and the env steps they were trained on."""
        # reshape, not view: conv weights may be channels-last; the vector is in logical order
        vec = torch.cat([t.detach().reshape(-1).float() for t in _state_tensors(model)]).to("cpu")
        if not bool(torch.isfinite(vec).all()):
            raise FloatingPointError(f"refusing to publish non-finite weights (version {version})")
        with self._locked(60.0):
            spare = 1 - int(self.meta[self.CURRENT])
            self.flat[spare].copy_(vec)
            self.meta[2 + 2 * spare], self.meta[3 + 2 * spare] = version, env_steps
            self.meta[self.CURRENT] = spare  # one write: the new copy is whole

    @torch.no_grad()
    def load(self, model: nn.Module, lock_timeout: float = 60.0) -> Tuple[int, int]:
        """Copy the published weights into ``model``; returns (version, env steps trained)."""
        tensors = _state_tensors(model)
        device = tensors[0].device
        with self._locked(lock_timeout):
            current = int(self.meta[self.CURRENT])
            vec = self.flat[current].to(device, copy=True)
            version, env_steps = self._counters(current)
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
