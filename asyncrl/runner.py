"""The whole process graph, built in one place, run, watched and torn down.

    rollout-i --PolicyRequest--> policy_request[p] --> policy-p     (p = i % num_policy_workers)
    policy-p  --2k + group-----> action_ready[i]   --> rollout-i   (a pipe: see ipc)
    rollout-i --slot index-----> full_slot         --> learner
    learner   --slot indices---> free_slot         --> rollout-*
    everyone  --Report---------> report            --> main process (logs, errors)
    learner   --weights+version (SharedWeights)----> policy-*

Everything but the rollout workers, the report queue and the action_ready pipes exists once per
trained policy k (``PolicyPart``: its slot pool, queues, weights, policy workers and learner);
with one trained policy the names are those above, with several ``policy-<id>-p`` and
``learner-<id>``.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from typing import Any, Callable, List, NamedTuple, Optional

import faster_fifo
import torch
from multiprocessing import util as mp_util

from . import ipc, pickling
from .buffers import (Ctl, SharedControl, SharedHyperParams, SharedOptimizerState, SharedWeights,
                      TrajectoryBuffers, Worker, buffer_spec)
from .config import Config
from .fileio import PolicyFiles, atomic_torch_save
from .learner import Learner, make_optimizer
from .logger import TrainLogger
from .messages import ReportKind, dump_int, dump_request, load_int, load_request
from .models import PolicySpec
from .multiagent import AgentLayout
from .policy_worker import PolicyWorker
from .fork_server import process_context
from .processes import (LOOP_TIMEOUT, PAUSE_POLL, Make, check_main_guard, check_shm_space,
                        component_main, kill_group, shutdown_graph, watch_queue_locks)
from .rollout_worker import RolloutWorker

REPORT_WAIT = 2.0      # seconds a pause waits for the rollout workers' last reports



class WorkerError(RuntimeError):
    """A component (rollout-i, policy-p, learner) failed; the message holds its traceback."""


class PolicyQueues:
    """One trained policy's queues: requests to its policy workers, its full and free slots;
    with the graph's report queue and rollout workers' pipes, what its policy workers and
    learner are given."""

    def __init__(self, cfg: Config, graph: "Queues"):
        # Rollout workers write to these: their readers wait on a bell pipe, not in the queue
        # (see ipc: a rollout worker may be SIGKILLed at any moment).
        self.policy_request = [ipc.BelledQueue(faster_fifo.Queue(1_000_000, dumps=dump_request,
                                                                 loads=load_request))
                               for _ in range(cfg.num_policy_workers)]
        self.full_slot = ipc.BelledQueue(faster_fifo.Queue(1_000_000, dumps=dump_int, loads=load_int))
        # rollout workers take without waiting
        self.free_slot = faster_fifo.Queue(1_000_000, dumps=dump_int, loads=load_int)
        self.graph = graph

    @property
    def report(self):
        return self.graph.report

    @property
    def action_ready(self) -> list:
        return self.graph.action_ready

    def ring_all(self) -> None:
        self.graph.ring_all()


class Queues:
    """Every queue of the graph (see the module docstring for who writes and reads each):
    ``policy[k]`` holds trained policy k's."""

    def __init__(self, cfg: Config, policy_cfgs: Optional[List[Config]] = None):
        self.report = ipc.BelledQueue(faster_fifo.Queue(10_000_000))
        self.action_ready = [ipc.BytePipe() for _ in range(cfg.num_workers)]
        self.policy = [PolicyQueues(c, self) for c in (policy_cfgs or [cfg])]
        self.rings = 0  # ring_all calls in this process

    def all(self) -> list:
        """The faster-fifo queues (whose locks a dead process may hold)."""
        return [*(q.fifo for pq in self.policy for q in pq.policy_request),
                *(pq.free_slot for pq in self.policy), *(pq.full_slot.fifo for pq in self.policy),
                self.report.fifo]

    def ring_all(self) -> None:
        """Wake every rollout worker: free slots were returned. The first one woken tends to take
        them all, so the order rotates: in a fixed order, with the learner the bottleneck,
        worker 0 took nearly every freed slot and the other workers' envs sampled a fraction as
        much (their share of the data with them)."""
        n = len(self.action_ready)
        self.rings += 1
        for i in range(n):
            self.action_ready[(self.rings + i) % n].ring()

    def close(self) -> None:
        for pq in self.policy:
            for q in [*pq.policy_request, pq.full_slot, pq.free_slot]:
                q.close()
        for q in [self.report, *self.action_ready]:
            q.close()


class TrainedPolicy(NamedTuple):
    """What the facade gives the graph of one trained policy: its id, config (the graph's, with
    the policy's own learner settings), model spec, a model of its shape (CPU) and its scratch
    files."""
    policy_id: str
    cfg: Config
    spec: PolicySpec
    model: torch.nn.Module
    files: PolicyFiles


class Job(NamedTuple):
    """One trained policy's part of a ``Runner.run`` call. ``model`` (CPU) is updated in place;
    ``hparams_at(progress_remaining)`` gives its MUTABLE_HPARAMS values (validated); samples of
    versions below ``min_version`` are not trained on; a new ``optimizer_epoch`` makes its
    learner reload the optimizer file."""
    model: torch.nn.Module
    version: int
    start_env_steps: int
    target_env_steps: int
    hparams_at: Callable[[float], dict]
    min_version: int = 0
    optimizer_epoch: int = 0


class PolicyPart:
    """Trained policy ``k``'s part of the graph (the policy dimension is this index): its slot
    pool, queues, shared weights, Adam state, hyper-parameters and control row; its policy
    workers and learner are given these, the rollout workers every part's pool and queues."""

    def __init__(self, k: int, trained: TrainedPolicy, seed: int, ctl: SharedControl,
                 queues: PolicyQueues, several: bool):
        self.k, self.policy_id, self.spec = k, trained.policy_id, trained.spec
        self.cfg = trained.cfg.replace(seed=(seed + 100_003 * k) % 2 ** 31)
        self.files = trained.files
        self.buffers = TrajectoryBuffers(self.cfg, self.slot_spec(trained))
        self.weights = SharedWeights(trained.model)
        self.optimizer_state = SharedOptimizerState(trained.model)
        self.shared_hparams = SharedHyperParams(self.cfg)
        self.ctl, self.queues = ctl.row(k), queues
        queues.free_slot.put_many(list(range(self.cfg.num_slots)))
        # process names: those of a single-policy graph, or with the policy id
        self.learner_name = f"learner-{self.policy_id}" if several else "learner"
        self.policy_prefix = f"policy-{self.policy_id}-" if several else "policy-"
        self.process_names = {self.learner_name, *(f"{self.policy_prefix}{p}"
                                                   for p in range(self.cfg.num_policy_workers))}
        self.version = self.trained_env_steps = None  # set by run()

    @staticmethod
    def slot_spec(trained: TrainedPolicy) -> dict:
        return buffer_spec(trained.spec.env, trained.model.dist, trained.model.state_size,
                           trained.model.centralized)

    def pool(self) -> tuple:
        """What a rollout worker needs of this policy: (config, env spec, buffers, queues)."""
        return self.cfg, self.spec.env, self.buffers, self.queues

    def components(self, device: str, common: dict) -> List[tuple]:
        common = dict(common, cfg=self.cfg, buffers=self.buffers, ctl=self.ctl, queues=self.queues)
        out = [(f"{self.policy_prefix}{p}", Make(PolicyWorker, policy_idx=p, policy_spec=self.spec,
                                                 device=device, weights=self.weights,
                                                 trained_idx=self.k, name_prefix=self.policy_prefix,
                                                 **common))
               for p in range(self.cfg.num_policy_workers)]
        out.append((self.learner_name, Make(Learner, policy_spec=self.spec, device=device,
                                            weights=self.weights, optimizer_state=self.optimizer_state,
                                            shared_hparams=self.shared_hparams, files=self.files,
                                            name=self.learner_name, trained_idx=self.k,
                                            **common)))
        return out

    def start(self, job: Job) -> None:
        """A run begins: publish the weights and counters the caller holds."""
        self.job, self.version, self.trained_env_steps = job, job.version, job.start_env_steps
        self.weights.publish(job.model, job.version, job.start_env_steps)
        self.shared_hparams.write(job.hparams_at(1.0))
        ctl = self.ctl
        ctl[Ctl.TRAINED_ENV_STEPS], ctl[Ctl.TARGET_ENV_STEPS] = job.start_env_steps, job.target_env_steps
        ctl[Ctl.LEARNER_DONE], ctl[Ctl.MIN_VERSION] = 0, job.min_version
        ctl[Ctl.OPTIMIZER_EPOCH] = job.optimizer_epoch

    def progress(self) -> None:
        """The hyper-parameter schedules at this policy's progress."""
        trained, job = self.ctl[Ctl.TRAINED_ENV_STEPS], self.job
        total = max(1, job.target_env_steps - job.start_env_steps)
        self.shared_hparams.write(job.hparams_at(1.0 - min(1.0, (trained - job.start_env_steps) / total)))

    def keep_optimizer_state(self, model: torch.nn.Module) -> None:
        """After the graph was shut down by an error or Ctrl-C, with its processes gone: the
        optimizer file gets the Adam state of the weights kept (``self.version``: the learner
        writes each update's state to shared memory before it publishes the weights). A learner
        killed by a signal (a SIGTERM to every process of the run: Slurm's ``scancel``, systemd)
        never wrote its file, and one that finished an update while stopping wrote a later
        state than the weights kept. Nothing changes where no update was made in this graph.
        The learner's RNG state (its minibatch order) is not in shared memory: a killed one's
        next run draws a new order."""
        if self.version is None or not os.path.isdir(self.files.folder):
            return  # the model was dropped and its scratch directory removed
        optimizer = make_optimizer(model, self.cfg)
        if self.optimizer_state.read(optimizer, self.version, self.ctl[Ctl.OPTIMIZER_EPOCH]):
            atomic_torch_save(optimizer.state_dict(), self.files.optimizer, durable=False)

    def fetch(self, model: torch.nn.Module) -> None:
        """The last published weights into ``model``, with their counters, when they moved."""
        if self.weights.version != self.version:
            self.version, self.trained_env_steps = self.weights.load(model)


class Runner:
    """The process graph of one model: started by its first ``run()``, paused between runs (envs
    keep their episodes, workers their processes), shut down by ``close()``, an error, garbage
    collection or interpreter exit. ``trained``: one ``TrainedPolicy`` per trained policy (the
    policy dimension: each has its own part, ``PolicyPart``)."""

    def __init__(self, cfg: Config, env_factory: Callable, trained: List[TrainedPolicy], device: str,
                 logger: TrainLogger, scratch_dir: Optional[str] = None, graph_idx: int = 0,
                 agents: Optional[AgentLayout] = None, frozen: Optional[dict] = None):
        # A graph started after an error draws fresh env resets and sampling noise.
        self.base_cfgs = [cfg, *(t.cfg for t in trained)]  # as given: the facade compares them
        self.cfg = cfg.replace(seed=(cfg.seed + 1_000_003 * graph_idx) % 2 ** 31)
        self.env_factory, self.device, self.agents = env_factory, device, agents
        self.logger = logger
        self.scratch_dir = scratch_dir  # the model's: its workers remove it if it is killed
        check_shm_space(sum(TrajectoryBuffers.nbytes(t.cfg, PolicyPart.slot_spec(t))
                            for t in trained))  # every pool together, before any is made
        self.ctl = SharedControl(len(trained), self.cfg.num_workers)
        self.queues = Queues(self.cfg, [t.cfg for t in trained])
        self.parts = [PolicyPart(k, t, self.cfg.seed, self.ctl, self.queues.policy[k], len(trained) > 1)
                      for k, t in enumerate(trained)]
        logger.trained({part.learner_name: part.policy_id for part in self.parts})
        # frozen policies of a multi-agent env (run in the rollout workers): id -> (model, weights)
        self.frozen = {pid: (m, SharedWeights(m)) for pid, (_, m) in (frozen or {}).items()}
        self.frozen_specs = {pid: spec for pid, (spec, _) in (frozen or {}).items()}
        self.procs: list = []       # multi-process mode
        self.makes: dict = {}       # process name -> constructor, to restart a killed component
        self.worker_restarts = 0
        self.reported: set = set()  # components that have reported at least once: up and running
        self.components: list = []  # serial mode
        self.started = False
        self._shutdown = mp_util.Finalize(self, shutdown_graph, exitpriority=10,
                                          args=(self.ctl, self.procs, self.components, self.queues))

    @property
    def slots_reclaimed(self) -> int:
        """Trajectory slots taken back from dead rollout workers (by the learners)."""
        return sum(self.ctl.column(Ctl.SLOTS_RECLAIMED))

    def locks(self) -> list:
        """Every faster-fifo queue whose lock a dead process may hold (see ipc)."""
        return [*self.queues.all(), *(w.lock.token_queue for w in self.all_weights())]

    def all_weights(self) -> List[SharedWeights]:
        """The trained policies' shared weights, then the frozen policies'."""
        return [*(part.weights for part in self.parts), *(w for _, w in self.frozen.values())]

    @property
    def alive(self) -> bool:
        return not self.ctl.stopping

    def close(self) -> None:
        self._shutdown()

    def components_to_make(self, serial: bool) -> List[tuple]:
        """(name, constructor) of every component, learners last; the wiring is in the queues
        they are given."""
        pools = [part.pool() for part in self.parts]
        env_factory = pickling.dumps(self.env_factory, "env factory")
        out = [(f"rollout-{i}", Make(RolloutWorker, cfg=self.cfg, worker_idx=i, pools=pools,
                                     env_factory=env_factory, ctl=self.ctl,
                                     queues=self.queues, agents=self.agents, serial=serial,
                                     frozen={pid: (self.frozen_specs[pid], w)
                                             for pid, (_, w) in self.frozen.items()}))
               for i in range(self.cfg.num_workers)]
        parts = [part.components(self.device, dict(serial=serial)) for part in self.parts]
        out += [c for made in parts for c in made[:-1]]  # policy workers
        out += [made[-1] for made in parts]              # learners
        return out

    @property
    def learners(self) -> list:
        """Serial mode: the learner components, one per trained policy."""
        return self.components[-len(self.parts):]

    def run(self, jobs: List[Job], callback: Optional[Callable[[list], Any]] = None,
            callback_interval: float = 1.0) -> List[tuple]:
        """Train every trained policy (``jobs[k]`` for part k) until each learner has trained
        on its ``target_env_steps`` samples in total (one that gets there first goes on
        training until all have: its agents keep playing), or ``callback([(version,
        trained_env_steps)] per policy)`` returns False. The callback runs in this process
        every ``callback_interval`` seconds, after the jobs' models received the latest
        published weights. On an error or Ctrl-C the graph is shut down (the next run starts a
        new one). Returns [(new version, trained env steps)] per policy."""
        if not self.alive:
            raise RuntimeError("this Runner was shut down; create a new one")
        ctl = self.ctl
        self.callback, self.callback_interval = callback, callback_interval
        self.last_callback = time.monotonic()
        self.logger.reset_run()
        for part, job in zip(self.parts, jobs):
            part.start(job)
        for frozen_model, weights in self.frozen.values():  # as the user last set them
            weights.publish(frozen_model, weights.version + 1, 0)
        self.run_idx = ctl.run_state()[0] + 1
        ctl.set_run_state(self.run_idx, paused=False)
        ok = False
        try:
            if self.cfg.serial_mode:
                self._run_serial()
            else:
                self._run_processes()
            ok = True
        finally:
            ctl.set_run_state(self.run_idx, paused=True)
            self.callback = None  # no cycle with the caller
            # Keep whatever the learners last published, even after an error or Ctrl-C, with
            # the counters that match it.
            models = [part.job.model for part in self.parts]
            for part, model in zip(self.parts, models):
                try:
                    part.version, part.trained_env_steps = part.weights.load(model, lock_timeout=5.0)
                except TimeoutError as e:  # never mask the error that ended the run
                    warnings.warn(f"could not read the last published weights: {e}")
                part.job = None
            late_errors = self._drain_reports(raise_errors=False)
            self._log(force=True)
            if late_errors and ok:  # a component failed while pausing: the next call starts anew
                warnings.warn(f"{late_errors[0].component} failed after the target was reached; "
                              f"its processes are restarted at the next call:\n{late_errors[0].payload}")
            if not ok or late_errors:  # an error or Ctrl-C: nothing is left running
                self.close()
                for part, model in zip(self.parts, models):  # and Adam's state is the weights'
                    try:
                        part.keep_optimizer_state(model)
                    except Exception as e:  # never mask the error that ended the run
                        warnings.warn(f"could not keep {part.policy_id}'s optimizer state: {e!r}")
        return [(part.version, part.trained_env_steps) for part in self.parts]

    def _all_done(self) -> bool:
        return all(self.ctl.column(Ctl.LEARNER_DONE))

    def _progress(self) -> None:
        """Per main-loop pass: hyper-parameter schedules, console/TensorBoard logging."""
        for part in self.parts:
            part.progress()
        self._log()

    def _log(self, force: bool = False) -> None:
        steps = self.ctl.column(Ctl.TRAINED_ENV_STEPS)
        self.logger.maybe_log({part.policy_id: n for part, n in zip(self.parts, steps)}, force)

    # --- serial mode: every component in this process, stepped in turn ---------------------
    def _run_serial(self) -> None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in the worker processes; restored below
        try:
            if not self.started:
                for _, make in self.components_to_make(serial=True):
                    self.components.append(make())
                    self.components[-1].init()
                self.started = True
            for c in self.components:
                c.resume()
            while not self._all_done():
                for c in self.components:
                    c.step(0.0)
                self._drain_reports(raise_errors=True)
                self._progress()
                if self._callback_says_stop():
                    break
            self.ctl.set_run_state(self.run_idx, paused=True)
            for c in self.components:
                c.pause(self.run_idx)
        finally:
            torch.set_num_threads(threads)

    # --- multi-process mode ---------------------------------------------------------------
    def _run_processes(self) -> None:
        if not self.started:
            check_main_guard()  # before the first spawn, which it would hang
            self.started = True
            self.makes = dict(self.components_to_make(serial=False))
            for name in self.makes:
                self.procs.append(self._spawn(name))
            if ipc.supported() and hasattr(os, "pidfd_open"):
                threading.Thread(target=watch_queue_locks, name="asyncrl-lock-watch", daemon=True,
                                 args=(self.procs, self.locks(), self.all_weights(), self.ctl)).start()
        while not self._all_done():
            self._drain_reports(raise_errors=True, timeout=LOOP_TIMEOUT)
            self._check_alive()
            self._progress()
            if self._callback_says_stop():
                break
        self._pause()

    def _spawn(self, name: str):
        # Not daemonic, so that an env may start processes of its own; every exit path joins
        # them (shutdown_graph), and they die with this process (parent-death signal).
        p = process_context().Process(
            target=component_main, name=name, daemon=False,
            args=(name, self.makes[name], self.ctl, self.queues.report, os.getpid(),
                  threading.current_thread() is threading.main_thread(), self.scratch_dir,
                  0 if name.startswith("learner") else self.cfg.sampler_nice,  # sampling yields
                  dict(os.environ)))
        p.start()
        return p

    def _pause(self) -> None:
        """Pause every component and wait until the learners have left their updates and saved
        their state, so the weights and counters read next are final; then, for at most
        REPORT_WAIT seconds, for the rollout workers' last reports (episodes and env restarts
        up to the pause: the statistics a caller reads after train())."""
        self.ctl.set_run_state(self.run_idx, paused=True)
        deadline = time.monotonic() + self.cfg.worker_timeout
        while any(paused != self.run_idx for paused in self.ctl.column(Ctl.LEARNER_PAUSED)):
            self._drain_reports(raise_errors=True, timeout=0.01)
            self._check_alive()
            if time.monotonic() > deadline:
                raise WorkerError(f"a learner did not pause within worker_timeout="
                                  f"{self.cfg.worker_timeout} s")
        self.queues.ring_all()  # a rollout worker waiting for actions or slots sees the pause now
        deadline = time.monotonic() + REPORT_WAIT
        paused_run = self.ctl.workers[:, Worker.PAUSED_RUN]
        while bool((paused_run < self.run_idx).any()) and time.monotonic() < deadline:
            self._drain_reports(raise_errors=True, timeout=0.01)
            self._check_alive()

    def snapshot(self, k: int = 0) -> dict:
        """Trained policy ``k``'s learner's exact state, taken between two updates: weights,
        Adam, counters and RNG of one moment (for a checkpoint written while training). Waits
        at most ``worker_timeout``."""
        part = self.parts[k]
        if self.cfg.serial_mode:  # the learner is here, between two of its steps
            self.learners[k].snapshot()
        else:
            request = part.ctl[Ctl.SNAPSHOT_REQUEST] + 1
            part.ctl[Ctl.SNAPSHOT_REQUEST] = request
            deadline = time.monotonic() + self.cfg.worker_timeout
            while part.ctl[Ctl.SNAPSHOT_DONE] != request:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise WorkerError(f"{part.learner_name} did not write its state within "
                                      f"worker_timeout={self.cfg.worker_timeout} s")
                time.sleep(PAUSE_POLL)
        return torch.load(part.files.snapshot, map_location="cpu")

    def _callback_says_stop(self) -> bool:
        if self.callback is None or time.monotonic() - self.last_callback < self.callback_interval:
            return False
        for part in self.parts:  # published with their counters, once per update
            part.fetch(part.job.model)
        self.last_callback = time.monotonic()
        return self.callback([(part.version, part.trained_env_steps) for part in self.parts]) is False

    def _check_alive(self) -> None:
        for idx, p in enumerate(self.procs):
            if p.exitcode is None:
                continue
            ipc.release_locks_of_dead(p.pid, self.locks())  # before reading the reports
            for weights in self.all_weights():
                weights.recover_from_death(p.pid)
            for _ in range(4):  # a traceback beats an exit code (one read may get part of a backlog)
                self._drain_reports(raise_errors=True)
            how = f"exited unexpectedly with code {p.exitcode}" + (
                f" (signal {-p.exitcode})" if p.exitcode < 0 else "")
            # Killed (a signal), or died after it was up: no error of its own, so replace it.
            if p.exitcode < 0 or p.name in self.reported:
                if self.worker_restarts < self.cfg.max_worker_restarts:
                    self._replace(idx, how)
                    continue
                how += (f"; {self.worker_restarts} component deaths were survived already "
                        f"(max_worker_restarts={self.cfg.max_worker_restarts})")
            elif p.exitcode == 1:
                how += ("; it never reported: if training starts from a script, keep that code "
                        "under `if __name__ == \"__main__\":` (workers are spawned and import the "
                        "script)")
            raise WorkerError(f"{p.name} (pid {p.pid}) {how}")

    def _replace(self, idx: int, how: str) -> None:
        """A component died without an error of its own (SIGKILL, the OOM killer, a segfault
        in an env): a new process takes its place and training goes on.

        - A rollout worker: policy workers drop its pending requests, the learners take its
          slots back (see ``Learner._take_back_slots``), the new one draws new env seeds.
        - A policy worker holds no state: rollout workers send their unanswered requests to
          the new one.
        - A learner: the new one goes on from the last published weights, their counters and
          Adam's state after the update that made them, losing the update in flight (its slots
          are resampled)."""
        dead = self.procs[idx]
        if dead.name.startswith("rollout-"):
            what = self._retire_rollout_worker(int(dead.name.rpartition("-")[2]))
        elif dead.name.startswith("policy-"):
            part = next(part for part in self.parts if dead.name in part.process_names)
            part.buffers.policy_incarnation[int(dead.name.rpartition("-")[2])] += 1
            what = "its unanswered requests are sent again"
        else:
            part = next(part for part in self.parts if dead.name in part.process_names)
            what = (f"it goes on from the weights of version {part.weights.version} and Adam's "
                    "state after that update")
        self.procs[idx] = self._spawn(dead.name)
        self.worker_restarts += 1
        self.logger.worker_restarts += 1
        if self.cfg.verbose >= 1:
            self.logger.write(f"[asyncrl] {dead.name} (pid {dead.pid}) {how}: restarted as pid "
                              f"{self.procs[idx].pid}, {what} ({self.worker_restarts} of "
                              f"max_worker_restarts={self.cfg.max_worker_restarts})")
        kill_group(dead.pid)
        dead.close()

    def _retire_rollout_worker(self, worker_idx: int) -> str:
        """Stop serving a dead rollout worker and let every learner take its slots back."""
        buffers = [part.buffers for part in self.parts]
        ticks = [b.policy_ticks.clone() for b in buffers]
        worker = self.ctl.workers[worker_idx]
        worker[Worker.INCARNATION] += 1
        # Every policy worker finishes the pass it is in (which may serve the dead worker's
        # requests) before its slots change hands; later passes drop those requests.
        t0 = time.monotonic()
        while any(bool((b.policy_ticks == before).any()) for b, before in zip(buffers, ticks)):
            waited = time.monotonic() - t0
            if self.ctl.run_state()[1] and waited > 0.5:
                break  # paused: an idle policy worker makes no passes (and serves nothing)
            if any(p.exitcode is not None for p in self.procs if p.name.startswith("policy-")):
                break  # dead: serves nothing; _check_alive replaces it next
            if waited > self.cfg.worker_timeout:
                raise WorkerError(f"a policy worker made no progress within worker_timeout="
                                  f"{self.cfg.worker_timeout} s while rollout-{worker_idx} was "
                                  "replaced")
            time.sleep(PAUSE_POLL)
        worker[Worker.RECLAIMABLE] = worker[Worker.INCARNATION]
        for part in self.parts:
            # it died inside a claim: the learner's audit finds the slot
            part.buffers.claiming[worker_idx] = 0
            part.ctl[Ctl.RECLAIM] += 1
        return "its trajectory slots go back to the learner" + ("s" if len(self.parts) > 1 else "")

    def _drain_reports(self, raise_errors: bool, timeout: float = 0.0) -> list:
        """Hand queued reports to the logger (one get_many: reading until empty starved the main
        loop and lost Ctrl-C in CI). Returns the error reports; with ``raise_errors`` the first
        one is raised as a WorkerError."""
        try:
            reports = self.queues.report.get_many(block=timeout > 0, timeout=timeout)
        except queue.Empty:
            return []
        errors = []
        for r in reports:
            self.reported.add(r.component)
            if r.kind is ReportKind.ERROR:
                errors.append(r)
            else:
                self.logger.on_report(r)
        if errors and raise_errors:
            first = errors[0]
            raise WorkerError(f"{first.component} failed:\n{first.payload}\n"
                              f"time since each component's last report: {self.logger.silence()}")
        return errors
