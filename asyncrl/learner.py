"""Learner: gathers full slots into a time-major batch, computes V-trace targets with the current
policy, optimises the clipped PPO objective, publishes the weights with a new version and returns
the slots. Samples older than ``max_policy_lag`` versions are masked out of the loss."""
from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import queue
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch
from torch import nn

from .buffers import (Ctl, SharedControl, SharedHyperParams, SharedOptimizerState, SharedWeights,
                      SlotState, TrajectoryBuffers, Worker, load_adam_state)
from .config import KL_ADAPTIVE_LR_MIN, MUTABLE_HPARAMS, Config
from .fileio import PolicyFiles, atomic_torch_save
from .losses import masked_mean, ppo_loss
from .messages import Report, ReportKind
from .models import ActorCritic, PolicySpec
from .spaces import split_obs_names
from .timing import StageTimer
from .vtrace import VTraceReturns, vtrace


HPARAM_LOG_NAMES = {"clip_coef": "clip_range"}  # logged under SB3's names
STOP = object()  # a minibatch step's answer when target_kl ends the update before it
MINIBATCH_STATS = ("policy_loss", "value_loss", "entropy_loss", "approx_kl", "clip_fraction",
                   "grad_norm", "loss")


class Batch(NamedTuple):
    """Time-major training data: T steps of B trajectories."""
    obs: Dict[str, torch.Tensor]   # {key: [T+1, B, ...]}, stored leaves
    actions: torch.Tensor          # [T, B, action_size]
    log_probs: torch.Tensor        # [T, B] behaviour policy
    rewards: torch.Tensor          # [T, B]
    dones: torch.Tensor            # [T, B] terminated or truncated
    truncated: torch.Tensor        # [T, B] time-limit ends
    policy_versions: torch.Tensor  # [T, B]
    values: Optional[torch.Tensor] = None       # [T, B] behaviour policy's V(x_t), when recorded
    action_mask: Optional[torch.Tensor] = None  # [T+1, B, mask_size], when the env masks
    rnn_state: Optional[torch.Tensor] = None    # [T+1, B, state_size], a recurrent model's
    waiting: Optional[torch.Tensor] = None      # [T, B] a turn-based game's: no move (see turns)

    def episode_starts(self) -> torch.Tensor:
        """[T+1, B]: where the recurrent state is zeroed before the step, as the rollout worker
        did (row 0's stored state already was)."""
        return torch.cat([torch.zeros_like(self.dones[:1]), self.dones])

    def actions_with_bootstrap_row(self) -> torch.Tensor:
        """[(T+1)*B, action_size]: the actions flat, time-major, and a row for the bootstrap
        observations x_T, where the model is evaluated for its value (its actions are not used:
        the first row's stand in)."""
        actions = self.actions.flatten(0, 1)
        return torch.cat([actions, actions[:self.actions.shape[1]]])


def make_batch(tensors: Dict[str, torch.Tensor]) -> Batch:
    """A Batch from buffer-spec names: "obs/<key>" entries become ``obs``."""
    obs, rest = split_obs_names(tensors)
    return Batch(obs, **rest)


class BatchGatherer:
    """Copies slots out of shared memory into a time-major Batch on the learner's device, through
    preallocated (pinned, when the device is a GPU) staging tensors, one per entry of the buffer
    spec: no allocation per batch."""

    def __init__(self, buffers: TrajectoryBuffers, slots_per_batch: int, device: torch.device):
        self.buffers, self.device = buffers, device
        pin = device.type == "cuda"
        self.staging = {name: torch.empty((slots_per_batch, *src.shape[1:]), dtype=src.dtype,
                                          pin_memory=pin)
                        for name, src in buffers.tensors.items()}

    def __call__(self, slots: List[int]) -> Batch:
        idx = torch.tensor(slots)
        out = {}
        for name, src in self.buffers.tensors.items():
            x = torch.index_select(src, 0, idx, out=self.staging[name])
            x = x.to(self.device, non_blocking=True).transpose(0, 1)  # [k, T, E, ...] -> [T, k, E, ...]
            out[name] = x.reshape(x.shape[0], -1, *x.shape[3:])      # -> [T, k*E, ...]
        return make_batch(out)


def index_obs(obs: Dict[str, torch.Tensor], idx) -> Dict[str, torch.Tensor]:
    return {k: v[idx] for k, v in obs.items()}


def keep_freed_memory() -> bool:
    """Have glibc serve blocks up to 32 MiB from the heap and keep freed heap memory, instead of
    mapping each large tensor afresh and unmapping it when freed (its default above 128 KiB,
    raised only as far as the largest block freed so far). An update allocates and frees the
    same activation tensors every minibatch, and every fresh mapping page-faults on first touch
    (the measured gain: docs/benchmarks/measured.md). Freed memory is reused, so the peak does
    not grow. For the learner's process (not the user's: the serial mode leaves it alone).
    False where mallopt is missing or refuses (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 2**31 - 1))


def explained_variance(pred: torch.Tensor, target: torch.Tensor) -> float:
    if target.numel() < 2:
        return float("nan")
    var = target.var()
    return float("nan") if var == 0 else float(1 - (target - pred).var() / var)


def make_optimizer(model: nn.Module, cfg: Config) -> torch.optim.Optimizer:
    """The learner's Adam: the fused kernel where torch has it for the device (~7% faster per
    update on a CPU, torch >= 2.4)."""
    try:
        return torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps,
                                fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps)


def adam_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` of the learner's fused Adam without torch.optim's per-call Python
    (its wrappers, profiler hook and grouping by device: ~0.15 ms of a 64 x 64 MLP's ~3 ms
    minibatch step on a CPU): the same step counters and fused kernel on the same state
    tensors, so ``state_dict``, ``load_state_dict`` and a changed learning rate stay torch's.
    Anything else (not fused, several groups or devices, amsgrad, a tensor learning rate, no
    state before the first step, a parameter without a gradient) takes ``optimizer.step()``."""
    groups = optimizer.param_groups
    group = groups[0]
    if (len(groups) != 1 or not group.get("fused") or group.get("amsgrad") or group.get("maximize")
            or group.get("capturable") or group.get("differentiable")
            or group.get("decoupled_weight_decay") or torch.is_tensor(group["lr"])):
        optimizer.step()
        return
    params = group["params"]
    states = [optimizer.state.get(p) for p in params]
    device = params[0].device
    if not all(states) or any(p.grad is None or p.device != device for p in params):
        optimizer.step()
        return
    steps = [s["step"] for s in states]
    beta1, beta2 = group["betas"]
    torch._foreach_add_(steps, 1)
    torch._fused_adam_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                       [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False,
                       lr=group["lr"], beta1=float(beta1), beta2=float(beta2),
                       weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                       grad_scale=None, found_inf=None)


class FlatGrads:
    """The trained parameters' gradients as views of one flat buffer per dtype and device, which
    backward accumulates into: zeroing and clipping them take one operation each instead of a
    few per parameter (~10% of a 64 x 64 MLP's minibatch step on a CPU). A parameter the loss
    did not reach has a zero gradient rather than None: Adam moves it only by the momentum it
    gathered before."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.params = [p for p in model.parameters() if p.requires_grad]
        groups: Dict[tuple, list] = {}
        for p in self.params:
            groups.setdefault((p.dtype, p.device), []).append(p)
        self.flats, views = [], {}
        for (dtype, device), ps in groups.items():
            flat = torch.zeros(sum(p.numel() for p in ps), dtype=dtype, device=device)
            self.flats.append(flat)
            for p, v in zip(ps, flat.split([p.numel() for p in ps])):
                # laid out as autograd lays out a gradient (a channels-last kernel's strides):
                # fused Adam pairs a parameter's and its gradient's elements in memory order
                views[p] = v.as_strided(p.shape, torch.empty_like(p).stride())
        self.views = [views[p] for p in self.params]

    def zero(self) -> None:
        """Zero the gradients and (re)bind them to the buffer: backward adds into it in place."""
        for flat in self.flats:
            flat.zero_()
        for p, v in zip(self.params, self.views):
            p.grad = v

    def clip(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients to a global L2 norm of at most ``max_norm`` (as
        ``nn.utils.clip_grad_norm_``); returns the norm before clipping."""
        norms = [torch.linalg.vector_norm(flat) for flat in self.flats]
        norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for flat in self.flats:
            flat.mul_(scale)
        return norm


class BatchTargets:
    """The V-trace targets of a whole batch, computed before the epochs (``Learner.targets``),
    as the minibatches take them: the normalised returns and old values, the advantages, the
    PPO ratio's reference and the policy's log-probabilities at the update's start. The running
    normalisers move once per batch, after the targets were computed with the statistics the
    samples were drawn with; values are learnt in the normalised scale."""

    def __init__(self, learner: "Learner", batch: Batch, obs: Dict[str, torch.Tensor],
                 vt: VTraceReturns, old_values: torch.Tensor, old_log_probs: torch.Tensor,
                 keep: torch.Tensor):
        model = learner.model
        T, B = batch.rewards.shape
        returns = vt.vs.flatten()
        self.ev = explained_variance(old_values.flatten()[keep], returns[keep])
        model.update_normalizers(index_obs(obs, slice(0, T * B)), returns, keep)
        self.returns = model.normalize_values(returns)
        self.old_values = model.normalize_values(old_values.flatten())
        self.advantages = vt.pg_advantages.flatten()
        self.start_log_probs = old_log_probs.flatten()
        self.ratio_ref = self._ratio_ref(learner, batch)

    def _ratio_ref(self, learner: "Learner", batch: Batch) -> torch.Tensor:
        """The ratio's reference: the learner's policy at the targets (the lag is in V-trace's
        weight), or the policy that sampled."""
        return self.start_log_probs if learner.cfg.decoupled_clip else batch.log_probs.flatten()

    def samples(self) -> tuple:
        """The per-sample targets [T*B] in ``Learner._minibatch_step``'s order."""
        return self.ratio_ref, self.advantages, self.old_values, self.returns

    def explained_variance(self) -> float:
        return self.ev


class FirstEpochTargets(BatchTargets):
    """The same targets made in the first epoch (``Learner.targets_in_first_epoch``): each of
    its minibatches of whole trajectories is evaluated with grad over its T+1 steps (the last
    one's value bootstraps), the loss takes the T steps' outputs and V-trace the detached ones,
    so no forward pass over the batch comes before the epochs. The normalisers move a
    minibatch at a time, after its targets; the later epochs reuse the targets, the returns and
    old values normalised again with the batch's final statistics."""

    def __init__(self, learner: "Learner", batch: Batch, obs: Dict[str, torch.Tensor],
                 mask: Optional[torch.Tensor], keep: torch.Tensor):
        T, B = batch.rewards.shape
        self.learner, self.batch, self.obs, self.mask, self.keep = learner, batch, obs, mask, keep
        (self.returns, self.old_values, self.advantages, self.start_log_probs, self.raw_returns,
         self.raw_values) = torch.empty(6, T * B, device=learner.device)
        self.ratio_ref = self._ratio_ref(learner, batch)

    def first_epoch(self, rng: torch.Generator):
        """Per minibatch of the first epoch, its targets filled in first: (sample indices
        [T*C], {}, the model's (log-probabilities, entropies, values) of them, with grad)."""
        learner, batch, model = self.learner, self.batch, self.learner.model
        T, B = batch.rewards.shape
        actions = batch.actions_with_bootstrap_row()
        for cols, idx, rec in learner._columns(batch, T + 1, torch.randperm(B, generator=rng)):
            mb_obs = index_obs(self.obs, idx)
            lp, entropy, v = model.evaluate(mb_obs, actions[idx],
                                            None if self.mask is None else self.mask[idx], **rec)
            n = T * len(cols)
            rows = idx[:n]  # time-major: the chunk's first T steps
            with torch.no_grad():
                log_probs = lp.detach().view(T + 1, -1)[:T]
                values = model.denormalize_values(v.detach().view(T + 1, -1))
                vt = learner._vtrace(batch, log_probs, values, cols)
                returns, old_values = vt.vs.flatten(), values[:T].flatten()
                model.update_normalizers(index_obs(mb_obs, slice(0, n)), returns, self.keep[rows])
                self.raw_returns[rows], self.raw_values[rows] = returns, old_values
                self.returns[rows] = model.normalize_values(returns)
                self.old_values[rows] = model.normalize_values(old_values)
                self.advantages[rows] = vt.pg_advantages.flatten()
                self.start_log_probs[rows] = log_probs.flatten()
            yield rows, {}, (lp[:n], entropy[:n], v[:n])
        with torch.no_grad():  # the later epochs: every target in the statistics' final scale
            self.returns.copy_(model.normalize_values(self.raw_returns))
            self.old_values.copy_(model.normalize_values(self.raw_values))

    def explained_variance(self) -> float:
        return explained_variance(self.raw_values[self.keep], self.raw_returns[self.keep])


class Learner:
    def __init__(self, cfg: Config, policy_spec: PolicySpec, device: str, buffers: TrajectoryBuffers,
                 weights: SharedWeights, optimizer_state: SharedOptimizerState,
                 shared_hparams: SharedHyperParams, ctl: SharedControl, queues, files: PolicyFiles,
                 serial: bool = False, name: str = "learner", trained_idx: int = 0):
        """``ctl``: its trained policy's row; ``queues``: that policy's (``PolicyQueues``);
        ``trained_idx``: the policy's index among the run's trained ones (its RNG's seed)."""
        self.cfg, self.device = cfg, torch.device(device)
        self.policy_spec = policy_spec
        self.buffers, self.weights, self.ctl, self.serial = buffers, weights, ctl, serial
        self.shared_optimizer = optimizer_state
        self.shared_hparams, self.hparams_version = shared_hparams, None
        self.lr_scale = 1.0  # kl_adaptive_lr's factor on learning_rate (its schedule's value)
        self.files, self.optimizer_epoch = files, 0
        self.snapshot_served = 0
        self.full_slot_queue, self.free_slot_queue = queues.full_slot, queues.free_slot
        self.wake_rollout_workers = queues.ring_all
        self.report_queue = queues.report
        self.name = name
        # Its own generator of minibatch orders (saved and restored with Adam's state): trained
        # policies sharing a process (serial mode) or a seed draw their own streams.
        self.rng, self.trained_idx = torch.Generator(), trained_idx
        # Beside other trained policies, one that reached its target goes on training until the
        # pause (all have reached theirs): its agents keep playing, its slots must keep flowing.
        self.train_past_target = ctl is not None and ctl.num_policies > 1
        self.trained_seen: list = []  # every learner's trained-env-steps counter, last seen
        self.timer = StageTimer()
        self.pending: List[int] = []  # full slots accepted, not yet trained on
        self.reclaim_seen = -1        # the first step audits the slots (a replaced learner's)
        self.finished = False
        self.optimizer = None
        self._grads: Optional[FlatGrads] = None
        self.nonfinite_in_a_row = 0
        self.prepared_cache: dict = {}  # float frames of the batch, reused

    @property
    def grads(self) -> FlatGrads:
        """The model's gradient buffer, made for whichever model the learner holds."""
        if self._grads is None or self._grads.model is not self.model:
            self._grads = FlatGrads(self.model)
        return self._grads

    def init(self) -> None:
        cfg = self.cfg
        if not self.serial:  # the backward pass of a CNN on a CPU can use more than one core
            torch.set_num_threads(cfg.learner_threads)
            keep_freed_memory()
        if cfg.seed is not None:
            torch.manual_seed(cfg.seed + 20_000)
            self.rng.manual_seed(cfg.seed + 20_000 + 1_000 * self.trained_idx)
        else:
            self.rng.seed()
        self.model = ActorCritic(self.policy_spec, cfg).to(self.device)
        # A learner replacing a killed one goes on from the last published weights, their
        # counters and Adam's state after the update that made them.
        self.version, trained = self.weights.load(self.model)
        self.ctl[Ctl.TRAINED_ENV_STEPS] = trained
        self.optimizer = make_optimizer(self.model, cfg)
        self.optimizer_epoch = self.ctl[Ctl.OPTIMIZER_EPOCH]
        self._load_optimizer()
        self.shared_optimizer.read(self.optimizer, self.version, self.optimizer_epoch)
        self.map_slot_states()
        self.gather = BatchGatherer(self.buffers, cfg.slots_per_batch, self.device)
        # The first batch also waits for env construction and the policy worker's start-up.
        self.last_progress = time.perf_counter() + cfg.worker_timeout

    def close(self) -> None:
        if self.ctl is not None and self.ctl.stopping:  # stopped (Ctrl-C, close()): keep Adam's
            self.save_optimizer()                       # state with the last published weights

    def pause(self, run: int) -> None:
        """Between train() calls (the update in progress was finished and published): save
        Adam's state (for get_parameters/save) and tell the main process that the weights and
        counters it reads now are final."""
        self.save_optimizer()
        self.ctl[Ctl.LEARNER_PAUSED] = run

    def resume(self) -> None:
        """A new train() call: take the weights the main process published (the user may have
        set them), and the optimizer state if the user replaced it."""
        self.version, _ = self.weights.load(self.model)
        if self.ctl[Ctl.OPTIMIZER_EPOCH] != self.optimizer_epoch:
            self.optimizer_epoch = self.ctl[Ctl.OPTIMIZER_EPOCH]
            self._load_optimizer()
        self.finished = False
        self.last_progress = max(self.last_progress, time.perf_counter())  # keeps init's grace

    def _load_optimizer(self) -> None:
        if os.path.exists(self.files.optimizer):
            state = torch.load(self.files.optimizer, map_location=self.device)
            load_adam_state(self.optimizer, state)
            self.hparams_version = None  # re-apply the learning rate
        if os.path.exists(self.files.rng):  # minibatch order continues on resume
            self.rng.set_state(torch.load(self.files.rng))

    def _apply_hparams(self) -> None:
        """Pick up hyper-parameters the main process changed (validated there)."""
        if self.shared_hparams.version == self.hparams_version:
            return
        self.hparams_version = self.shared_hparams.version
        self.cfg = dataclasses.replace(self.cfg, **self.shared_hparams.read())
        for group in self.optimizer.param_groups:
            group["eps"] = self.cfg.adam_eps
        self._set_lr()

    def _set_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.learning_rate * self.lr_scale

    def step(self, timeout: float) -> bool:
        if self.ctl[Ctl.SNAPSHOT_REQUEST] != self.snapshot_served:
            self.snapshot()
        if self.ctl[Ctl.RECLAIM] != self.reclaim_seen:
            self._take_back_slots()
        if self.finished:  # reached the target: wait for the pause
            time.sleep(min(timeout, 0.005))
            return False
        spb = self.cfg.slots_per_batch
        need = spb - len(self.pending)
        t0 = time.perf_counter()
        try:
            if need > 0:
                self._accept(self.full_slot_queue.get_many(
                    block=timeout > 0, timeout=timeout, max_messages_to_get=need))
        except queue.Empty:
            pass
        self.timer.add("wait_batch", time.perf_counter() - t0)
        if len(self.pending) < spb:
            self._check_stuck()
            return False
        slots, self.pending = self.pending[:spb], self.pending[spb:]
        self._apply_hparams()
        with self.timer("gather"):
            batch = self.gather(slots)
        with self.timer("train"):
            stats = self.train_on(batch)
        if stats is None:  # stopped mid-update: publish nothing half-trained
            return False
        if not stats:  # every sample came from a policy the user replaced: drop them
            self._free(slots)
            return False
        self.version += 1
        trained = self.ctl[Ctl.TRAINED_ENV_STEPS] + self.cfg.batch_size
        with self.timer("publish"):  # Adam's state first: the weights it belongs to may follow
            self.shared_optimizer.write(self.optimizer, self.version, self.optimizer_epoch)
            self.weights.publish(self.model, self.version, trained)
        self.ctl[Ctl.TRAINED_ENV_STEPS] = trained
        self._free(slots)
        self.report_queue.put(Report(ReportKind.TRAIN, self.name, stats))
        self.report_queue.put(Report(ReportKind.TIMING, self.name, self.timer.snapshot()))
        self.last_progress = time.perf_counter()
        if trained >= self.ctl[Ctl.TARGET_ENV_STEPS]:
            self.ctl[Ctl.LEARNER_DONE] = 1
            self.finished = not self.train_past_target
        return True

    def _free(self, slots: List[int]) -> None:
        self.free_slot_queue.put_many(slots)
        self.wake_rollout_workers()

    def map_slot_states(self) -> None:
        b = self.buffers
        self.slot_owner_np = b.slot_owner.numpy()
        self.claiming_np = b.claiming.numpy()
        self.reclaimable_np = self.ctl.workers[:, Worker.RECLAIMABLE]

    def _accept(self, slots: List[int]) -> None:
        """Full slots from the queue: each is taken once, in the state its worker marked it with
        before queueing it (a slot of a killed worker may also have been taken back: see
        SlotState)."""
        owner = self.slot_owner_np
        for slot in slots:
            if owner[slot] <= SlotState.handing(0):
                owner[slot] = SlotState.FREE
                self.pending.append(slot)

    def _take_back_slots(self) -> None:
        """The audit after a rollout worker was replaced (and when this learner starts, which
        may be in place of a killed one): slots of dead workers come back, full ones to be
        trained on, others to the free queue, and so do slots that are nowhere: lost by a
        worker killed between taking a free slot and marking it, or held by a dead learner.
        This process is the only one that frees slots, so with the free queue drained and no
        live worker inside a claim, a free-marked slot that is neither drained nor pending is
        lost. A worker dead inside a claim and not replaced yet keeps its flag up: the audit is
        tried again later."""
        request = self.ctl[Ctl.RECLAIM]
        drained = []
        while True:
            try:
                drained += self.free_slot_queue.get_many(block=False)
            except queue.Empty:
                break
        deadline = time.perf_counter() + 1.0
        while self.claiming_np.any():
            if time.perf_counter() > deadline:
                self._free(drained)
                return
            time.sleep(0.001)
        W, owner, reclaimable = self.cfg.num_workers, self.slot_owner_np, self.reclaimable_np
        known, free, full = set(drained) | set(self.pending), [], []
        for slot, state in enumerate(owner.tolist()):
            if state == SlotState.FREE:
                if slot not in known:
                    free.append(slot)
                continue
            serial = state if state >= 0 else SlotState.handing(state)  # handing() is its inverse
            if serial // W < reclaimable[serial % W]:
                owner[slot] = SlotState.FREE
                (free if state >= 0 else full).append(slot)
        self.pending += full
        self._free(drained + free)
        self.ctl[Ctl.SLOTS_RECLAIMED] += len(free) + len(full)
        self.reclaim_seen = request

    def _check_stuck(self) -> None:
        if self.train_past_target:  # beside other learners: their slowness holds ours back
            trained = self.ctl.column(Ctl.TRAINED_ENV_STEPS)
            if trained != self.trained_seen:
                self.trained_seen, self.last_progress = trained, time.perf_counter()
                return
        waited = time.perf_counter() - self.last_progress
        if not self.serial and waited > self.cfg.worker_timeout:
            raise TimeoutError(f"{self.name} waited {waited:.0f} s for full trajectory slots "
                               f"(has {len(self.pending)} of {self.cfg.slots_per_batch}); "
                               "the rollout or policy workers are not producing")

    def save_optimizer(self) -> None:
        """Adam's state and the learner's RNG state, beside the last published weights."""
        if self.optimizer is None or not os.path.isdir(self.files.folder):
            return  # the model was dropped and its scratch directory removed: nobody reads them
        try:
            atomic_torch_save(self.optimizer.state_dict(), self.files.optimizer, durable=False)
            atomic_torch_save(self.rng.get_state(), self.files.rng, durable=False)
        except FileNotFoundError:
            if os.path.isdir(self.files.folder):
                raise  # removed while writing: as above

    def snapshot(self) -> None:
        """Between updates, on the main process's request: everything a checkpoint needs, from
        one moment (weights, Adam, counters, RNG), to its snapshot file."""
        request = self.ctl[Ctl.SNAPSHOT_REQUEST]
        state = {"policy": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
                 "optimizer": self.optimizer.state_dict(), "learner_rng": self.rng.get_state(),
                 "policy_version": self.version, "num_timesteps": self.ctl[Ctl.TRAINED_ENV_STEPS]}
        atomic_torch_save(state, self.files.snapshot, durable=False)
        self.snapshot_served = request
        self.ctl[Ctl.SNAPSHOT_DONE] = request

    def recorded_exact(self, batch: Batch) -> bool:
        """Every sample was drawn by these very weights (synchronous PPO: always)."""
        return batch.values is not None and bool((batch.policy_versions == self.version).all())

    def targets_in_first_epoch(self, batch: Batch) -> bool:
        """Whether the first epoch's forward passes give the targets too, a minibatch's columns at
        a time (Sample Factory's V-trace per minibatch): then no forward pass over the batch
        comes before the epochs. It takes minibatches of whole trajectories, which a recurrent
        model's are, and a feed-forward model's when one minibatch holds the batch; and samples
        whose values must be recomputed (not ``recorded_exact``). With more than one minibatch a
        chunk's targets come from the weights the chunks before it trained, so the update's
        starting policy is not known to the later ones: not with ``decoupled_clip`` or
        ``target_kl``, which measure from it."""
        T, B = batch.rewards.shape
        cfg = self.cfg
        one_pass = cfg.minibatch_size >= T * B
        columns = one_pass or batch.rnn_state is not None
        return (columns and not self.recorded_exact(batch)
                and (one_pass or (not cfg.decoupled_clip and cfg.target_kl is None
                                  and cfg.kl_adaptive_lr is None)))

    @torch.no_grad()
    def targets(self, batch: Batch, obs: Dict[str, torch.Tensor],
                mask: Optional[torch.Tensor]) -> Tuple[VTraceReturns, torch.Tensor, torch.Tensor]:
        """V-trace targets of ``batch`` under the current model, once per batch, and the
        model's values V(x_t) and log-probabilities of the taken actions [T, B] before this
        update (for value clipping and the decoupled PPO ratio). ``obs``: the batch's
        [(T+1)*B, ...] observations as ``model.prepare`` made them; ``mask`` [(T+1)*B, M]."""
        T, B = batch.rewards.shape
        if self.recorded_exact(batch):
            # Every sample was drawn by these very weights (synchronous PPO: always): the policy
            # worker's log-probabilities and values are this model's, so only the bootstrap
            # values V(x_T) are computed; a forward pass over the batch saved (~6% of a Nature
            # CNN update). For a recurrent model too: the stored state after the last step is
            # the one these weights computed. The same up to float rounding (an encoder in
            # bfloat16, cnn_precision, rounds differently in the worker's smaller batches).
            log_probs = batch.log_probs
            last = index_obs(obs, slice(T * B, None))
            state = None if batch.rnn_state is None else batch.rnn_state[T]
            values = torch.cat([batch.values, self.model(last, prepared=True, state=state)[1].view(1, B)])
        else:
            actions = batch.actions_with_bootstrap_row()
            # In minibatch-sized chunks: activations of the whole batch at once would be fresh
            # mappings (> 32 MiB for a Nature CNN on 1024 frames), page-faulted on every update.
            # A recurrent model's chunks are whole trajectories, run from their stored state.
            log_probs = torch.empty(T + 1, B, device=self.device)
            values = torch.empty(T + 1, B, device=self.device)
            for idx, rec in self._chunks(batch, T + 1):
                lp, _, v = self.model.evaluate(index_obs(obs, idx), actions[idx],
                                               None if mask is None else mask[idx], **rec)
                log_probs.view(-1)[idx], values.view(-1)[idx] = lp, v
            log_probs, values = log_probs[:T], self.model.denormalize_values(values)
        return self._vtrace(batch, log_probs, values), values[:T], log_probs

    def _vtrace(self, batch: Batch, log_probs: torch.Tensor, values: torch.Tensor,
                cols=slice(None)) -> VTraceReturns:
        """V-trace targets of ``batch``'s trajectories ``cols`` from the model's ``log_probs``
        [T, C] of the taken actions and ``values`` [T+1, C] (in the returns' scale)."""
        cfg = self.cfg
        T = log_probs.shape[0]
        rewards = batch.rewards[:, cols]
        if cfg.reward_clip is not None:  # logged returns stay raw: the workers sum raw rewards
            rewards = rewards.clamp(-cfg.reward_clip, cfg.reward_clip)
        if cfg.bootstrap_truncation:  # a time limit is not a terminal state
            rewards = rewards + cfg.gamma * values[:T] * batch.truncated[:, cols]
        dones = batch.dones[:, cols]
        discounts = cfg.gamma * (~dones).float()
        log_rhos, lam = log_probs - batch.log_probs[:, cols], cfg.vtrace_lambda
        if batch.waiting is not None:  # rows without a move pass the return on, undiscounted
            waiting = batch.waiting[:, cols]
            discounts = torch.where(waiting, (~dones).float(), discounts)
            log_rhos = log_rhos.masked_fill(waiting, 0.0)
            lam = torch.where(waiting, 1.0, lam)
        return vtrace(log_rhos, discounts, rewards, values[:T], values[T],
                      clip_rho_threshold=cfg.vtrace_rho_clip,
                      clip_pg_rho_threshold=cfg.vtrace_pg_rho_clip,
                      clip_c_threshold=cfg.vtrace_c_clip, lam=lam)

    def train_on(self, batch: Batch) -> Optional[dict]:
        """One update over ``batch``; None if the run was stopped in the middle of it (a pause
        waits for the update to end), {} if no sample may be trained on."""
        cfg, model = self.cfg, self.model
        # Prepared once here (images scaled into reused buffers), not per minibatch and epoch.
        obs = model.prepare({k: v.flatten(0, 1) for k, v in batch.obs.items()}, self.prepared_cache)
        mask = batch.action_mask.flatten(0, 1) if batch.action_mask is not None else None
        lag = (self.version - batch.policy_versions).float()
        valid = (lag <= cfg.max_policy_lag) & (batch.policy_versions >= self.ctl[Ctl.MIN_VERSION])
        if not valid.any():
            return {}
        keep = valid.flatten()
        # A turn-based game's rows without a move train the value, not the policy.
        moves = keep if batch.waiting is None else keep & ~batch.waiting.flatten()
        if self.targets_in_first_epoch(batch):
            targets = FirstEpochTargets(self, batch, obs, mask, keep)
        else:
            vt, old_values, old_log_probs = self.targets(batch, obs, mask)
            targets = BatchTargets(self, batch, obs, vt, old_values, old_log_probs, keep)
        stats = self._epochs(batch, obs, mask, targets, keep, moves)
        if stats is None:
            return None
        valid_lag = lag[valid]
        stats.update(explained_variance=targets.explained_variance(),
                     policy_lag_mean=float(valid_lag.mean()), policy_lag_max=float(valid_lag.max()),
                     masked_fraction=1.0 - float(valid.float().mean()), version=self.version + 1)
        stats.update({HPARAM_LOG_NAMES.get(n, n): getattr(cfg, n) for n in MUTABLE_HPARAMS})
        stats["learning_rate"] = self.optimizer.param_groups[0]["lr"]  # in use (kl_adaptive_lr)
        return stats

    def _columns(self, batch: Batch, rows: int, order: Optional[torch.Tensor] = None):
        """(columns, flat time-major indices, recurrent arguments) of minibatch-sized groups of
        whole trajectories (the first ``rows`` steps of columns of ``batch``, in ``order``), a
        recurrent model's run from their stored state."""
        T, B = batch.rewards.shape
        starts = None if batch.rnn_state is None else batch.episode_starts()[:rows]
        order = torch.arange(B) if order is None else order
        for cols in order.split(max(1, self.cfg.minibatch_size // T)):
            cols = cols.to(self.device)
            idx = (torch.arange(rows, device=self.device)[:, None] * B + cols).flatten()
            yield cols, idx, ({} if starts is None else
                              dict(state=batch.rnn_state[0, cols], starts=starts[:, cols]))

    def _chunks(self, batch: Batch, rows: int, order: Optional[torch.Tensor] = None):
        """(flat time-major indices, recurrent arguments) of minibatch-sized parts of the first
        ``rows`` steps of ``batch``: samples for a feed-forward model, whole trajectories
        (``_columns``) for a recurrent one; ``order`` permutes a recurrent model's columns (a
        feed-forward model's parts are contiguous slices, no copies: its epochs shuffle the
        samples themselves)."""
        T, B = batch.rewards.shape
        n = self.cfg.minibatch_size
        if batch.rnn_state is None:
            for i in range(0, rows * B, n):
                yield slice(i, i + n), {}
            return
        for _, idx, rec in self._columns(batch, rows, order):
            yield idx, rec

    def _epochs(self, batch, obs, mask, targets, keep, moves) -> Optional[dict]:
        """num_epochs passes of shuffled minibatches over the batch's [T*B] samples (whole
        trajectories for a recurrent model); masked (stale or restarted) samples take part in
        no loss and no advantage normalisation, and only ``moves`` of the kept ones in the
        policy's terms. ``targets`` (BatchTargets or FirstEpochTargets) holds the per-sample
        targets, or makes them in the first epoch."""
        T, B = batch.rewards.shape
        cfg = self.cfg
        n = T * B
        clip_coef = None if cfg.algo == "impala" else cfg.clip_coef
        # Where every sample counts (none stale or restarted: the usual case), plain means.
        weight = None if bool(keep.all()) else keep.float()
        pg_weight = weight if moves is keep else moves.float()
        # the per-sample tensors beside the observations, in _minibatch_step's order
        samples = (batch.actions.flatten(0, 1), None if mask is None else mask[:n],
                   *targets.samples(), weight, pg_weight, targets.start_log_probs)

        def take(tensors: tuple, idx) -> tuple:
            return tuple(None if x is None else x[idx] for x in tensors)

        def minibatches():
            """(observations, samples, recurrent arguments, evaluated outputs) per minibatch."""
            for epoch in range(cfg.num_epochs):
                if epoch == 0 and isinstance(targets, FirstEpochTargets):
                    for idx, rec, evaluated in targets.first_epoch(self.rng):
                        yield None, take(samples, idx), rec, evaluated
                    continue
                # drawn from the CPU generator (saved in checkpoints) also when training on a GPU
                order = torch.randperm(n if batch.rnn_state is None else B, generator=self.rng)
                if batch.rnn_state is None:
                    # The samples shuffled once an epoch, their minibatches contiguous views: one
                    # gather a tensor an epoch, not one a minibatch (~20 us each on a CPU). The
                    # observations are gathered a minibatch at a time (a whole shuffled copy of
                    # a batch of frames would be a fresh mapping every epoch).
                    order = order.to(self.device)
                    shuffled = take(samples, order)
                    for start in range(0, n, cfg.minibatch_size):
                        rows = slice(start, start + cfg.minibatch_size)
                        yield index_obs(obs, order[rows]), take(shuffled, rows), {}, None
                else:
                    for idx, rec in self._chunks(batch, T, order):
                        yield index_obs(obs, idx), take(samples, idx), rec, None

        sums, num_steps, skipped = torch.zeros(len(MINIBATCH_STATS), device=self.device), 0, 0
        stopped_early = 0
        for mb_obs, mb, rec, evaluated in minibatches():
            if self.ctl.stopping:
                return None
            out = self._minibatch_step(mb_obs, *mb, clip_coef, rec, evaluated)
            if out is STOP:
                stopped_early = 1
                break
            if out is None:
                skipped += 1
                continue
            sums, num_steps = sums + out, num_steps + 1
        stats = dict(zip(MINIBATCH_STATS, (sums / max(num_steps, 1)).tolist()))  # one device sync
        stats["nonfinite_skipped"] = skipped
        stats["stopped_early"] = stopped_early
        return stats

    def _advantage_scale(self, std: torch.Tensor) -> torch.Tensor:
        """The divisor of a minibatch's centred advantages: their std, but never below
        ``cfg.advantage_std_floor`` x the value targets' running std (the return normaliser's;
        1 without one)."""
        scale, floor, norm = std + 1e-8, self.cfg.advantage_std_floor, self.model.value_norm
        if not floor:
            return scale
        return torch.maximum(scale, floor * norm.std()) if norm is not None else scale.clamp(min=floor)

    def _adapt_lr(self, kl: float) -> None:
        """kl_adaptive_lr's rule, after a minibatch found the policy moved by ``kl`` from the
        update's start: the factor on learning_rate falls 1.5x above twice the target, rises
        1.5x below half of it, within [KL_ADAPTIVE_LR_MIN, kl_adaptive_lr_max]."""
        target, scale = self.cfg.kl_adaptive_lr, self.lr_scale
        if kl > 2.0 * target:
            scale = max(scale / 1.5, KL_ADAPTIVE_LR_MIN)
        elif kl < 0.5 * target:
            scale = min(scale * 1.5, self.cfg.kl_adaptive_lr_max)
        if scale != self.lr_scale:
            self.lr_scale = scale
            self._set_lr()

    def _minibatch_step(self, obs, actions, action_mask, ratio_ref, advantages, old_values,
                        returns, weight, pg_weight, start_log_probs: torch.Tensor,
                        clip_coef: Optional[float], rec: dict,
                        evaluated: Optional[tuple] = None) -> Any:
        """One gradient step; returns the MINIBATCH_STATS values as one tensor, None when the
        loss or a gradient was not finite (the step is skipped: the weights stay finite), or
        STOP, without a step, when ``cfg.target_kl`` is set and the policy has moved by more
        than 1.5 x it from ``start_log_probs`` (the update's starting policy) on these samples.
        ``weight``: 1 for samples trained on, 0 for masked ones; ``pg_weight``: the same for the
        policy's terms; None: all samples."""
        cfg = self.cfg
        if cfg.normalize_advantages:
            if pg_weight is None:
                if advantages.numel() > 1:
                    advantages = (advantages - advantages.mean()) / self._advantage_scale(advantages.std())
            elif (n := pg_weight.sum()) > 1:
                mean = masked_mean(advantages, pg_weight)
                std = masked_mean((advantages - mean) ** 2, pg_weight).mul(n / (n - 1)).sqrt()
                advantages = (advantages - mean) / self._advantage_scale(std)
        if evaluated is None:
            new_log_probs, entropy, new_values = self.model.evaluate(obs, actions, action_mask, **rec)
        else:
            new_log_probs, entropy, new_values = evaluated
        if cfg.target_kl is not None or cfg.kl_adaptive_lr is not None:
            # KL from the policy at the update's start, as this minibatch finds it (SB3's check)
            d = new_log_probs.detach() - start_log_probs
            kl = float(masked_mean(d.exp() - 1.0 - d, pg_weight))
            if cfg.target_kl is not None and kl > 1.5 * cfg.target_kl:
                return STOP
            if cfg.kl_adaptive_lr is not None:
                self._adapt_lr(kl)
        out = ppo_loss(new_log_probs, ratio_ref, advantages, new_values,
                       old_values, returns, entropy, clip_coef=clip_coef,
                       vf_clip_coef=cfg.vf_clip_coef, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
                       dual_clip=cfg.dual_clip, mask=weight, pg_mask=pg_weight)
        self.grads.zero()
        out.loss.backward()
        grad_norm = self.grads.clip(cfg.max_grad_norm)
        # two scalar reads (torch.isfinite is four operations a tensor on a CPU)
        norm_value, loss_value = grad_norm.item(), out.loss.item()
        if not (math.isfinite(norm_value) and math.isfinite(loss_value)):  # no step on these
            self.nonfinite_in_a_row += 1
            if self.nonfinite_in_a_row >= cfg.max_nonfinite_updates:
                raise FloatingPointError(
                    f"{self.nonfinite_in_a_row} minibatch steps in a row had a non-finite loss "
                    f"({loss_value}) or gradient norm ({norm_value}); the last finite "
                    "weights are kept. Lower learning_rate or check the env's rewards")
            return None
        self.nonfinite_in_a_row = 0
        adam_step(self.optimizer)
        return torch.stack([out.pg_loss, out.v_loss, -out.entropy_loss, out.approx_kl,
                            out.clipfrac, grad_norm, out.loss.detach()])
