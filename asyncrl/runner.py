"""The whole process graph, built in one place, run, watched and torn down.

    rollout-i --PolicyRequest--> policy_request[p] --> policy-p     (p = i % num_policy_workers)
    policy-p  --group index----> action_ready[i]   --> rollout-i
    rollout-i --slot index-----> full_slot         --> learner
    learner   --slot indices---> free_slot         --> rollout-*
    everyone  --Report---------> report            --> main process (logs, errors)
    learner   --weights+version (SharedWeights)----> policy-*
"""
from __future__ import annotations

import ctypes
import os
import pickle
import queue
import signal
import time
import traceback
import warnings
from typing import Any, Callable, List, Optional

import faster_fifo
import torch
import torch.multiprocessing as mp

from .buffers import Ctl, SharedControl, SharedWeights, TrajectoryBuffers
from .config import Config
from .env_utils import storage_dtype
from .learner import Learner
from .logger import TrainLogger
from .messages import Report, ReportKind
from .policy_worker import PolicyWorker
from .rollout_worker import RolloutWorker

JOIN_TIMEOUT = 5.0     # seconds a component gets to leave its loop before it is terminated
LOOP_TIMEOUT = 0.1     # seconds of any single wait inside a component loop
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1


class WorkerError(RuntimeError):
    """A component (rollout-i, policy-p, learner) failed; the message holds its traceback."""


class Queues:
    """Every queue of the graph (see the module docstring for who writes and reads each)."""

    def __init__(self, cfg: Config):
        self.policy_request = [faster_fifo.Queue(1_000_000) for _ in range(cfg.num_policy_workers)]
        self.action_ready = [faster_fifo.Queue(100_000) for _ in range(cfg.num_workers)]
        self.free_slot = faster_fifo.Queue(1_000_000)
        self.full_slot = faster_fifo.Queue(1_000_000)
        self.report = faster_fifo.Queue(10_000_000)

    def all(self) -> list:
        return [*self.policy_request, *self.action_ready, self.free_slot, self.full_slot, self.report]

    def close(self) -> None:
        for q in self.all():
            q.close()


def _prepare_child(name: str, parent_pid: int) -> None:
    """In a spawned component: die with the parent, leave Ctrl-C to the parent, one torch thread."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        libc.prctl(_PR_SET_NAME, name.encode()[:15])
    except OSError:  # not Linux: the parent-pid check in the loop still applies
        pass
    if os.getppid() != parent_pid:
        os._exit(1)
    torch.set_num_threads(1)


def component_main(name: str, make: Callable, ctl: SharedControl, report_queue, parent_pid: int):
    """Entry point of every component process: init, step until stopped, report any failure."""
    _prepare_child(name, parent_pid)
    component = None
    try:
        component = make()
        component.init()
        while not ctl.stopping and not getattr(component, "finished", False):
            component.step(LOOP_TIMEOUT)
            if os.getppid() != parent_pid:
                break
    except Exception:
        report_queue.put(Report(ReportKind.ERROR, name, traceback.format_exc()), timeout=1.0)
    finally:
        if component is not None:
            component.close()


class Make:
    """A picklable deferred constructor: the component is built inside its own process."""

    def __init__(self, cls, **kwargs):
        self.cls, self.kwargs = cls, kwargs

    def __call__(self):
        return self.cls(**self.kwargs)


class Runner:
    """One ``train()`` call: allocates buffers and queues, runs the graph, tears it down."""

    def __init__(self, cfg: Config, env_factory: Callable, obs_space, action_space, device: str,
                 optimizer_path: str, logger: TrainLogger, run_idx: int = 0):
        # Each train() call draws fresh env resets and sampling noise: the seed moves per call.
        self.cfg = cfg.replace(seed=(cfg.seed + 1_000_003 * run_idx) % 2 ** 31)
        self.env_factory, self.device = env_factory, device
        self.version = self.trained_env_steps = None  # set by run()
        self.obs_space, self.action_space = obs_space, action_space
        self.optimizer_path, self.logger = optimizer_path, logger
        self.ctx = mp.get_context("spawn")

    def components(self, serial: bool) -> List[tuple]:
        """(name, constructor) of every component; the wiring is in the Queues they are given."""
        common = dict(cfg=self.cfg, buffers=self.buffers, ctl=self.ctl, queues=self.queues,
                      serial=serial)
        out = [(f"rollout-{i}", Make(RolloutWorker, worker_idx=i, env_factory=pickle.dumps(self.env_factory),
                                     **common))
               for i in range(self.cfg.num_workers)]
        out += [(f"policy-{p}", Make(PolicyWorker, policy_idx=p, obs_space=self.obs_space,
                                     action_space=self.action_space, device=self.device,
                                     weights=self.weights, **common))
                for p in range(self.cfg.num_policy_workers)]
        out.append(("learner", Make(Learner, obs_space=self.obs_space, action_space=self.action_space,
                                    device=self.device, weights=self.weights,
                                    optimizer_path=self.optimizer_path, **common)))
        return out

    def run(self, model: torch.nn.Module, version: int, start_env_steps: int,
            target_env_steps: int, callback: Optional[Callable[[int, int], Any]] = None,
            callback_interval: float = 1.0) -> tuple:
        """Train ``model`` (CPU, updated in place) until the learner has trained on
        ``target_env_steps`` samples in total, or ``callback(version, trained_env_steps)`` returns False. It runs
        in this process every ``callback_interval`` seconds, after ``model`` received the latest
        published weights. Returns (new version, trained env steps)."""
        cfg = self.cfg
        self.model, self.callback, self.callback_interval = model, callback, callback_interval
        self.last_callback = time.monotonic()
        self.version, self.trained_env_steps = version, start_env_steps
        self.logger.reset_run()
        self.buffers = TrajectoryBuffers(cfg, self.obs_space.shape, storage_dtype(self.obs_space))
        self.weights = SharedWeights(model, version, start_env_steps)
        self.ctl = SharedControl()
        self.ctl[Ctl.TRAINED_ENV_STEPS] = start_env_steps
        self.ctl[Ctl.TARGET_ENV_STEPS] = target_env_steps
        self.queues = Queues(cfg)
        try:
            self.queues.free_slot.put_many(list(range(cfg.num_slots)))
            if cfg.serial_mode:
                self._run_serial()
            else:
                self._run_processes()
        finally:
            self.ctl[Ctl.STOP] = 1
            # Keep whatever the learner last published, even after an error or Ctrl-C, with the
            # counters that match it.
            try:
                self.version, self.trained_env_steps = self.weights.load(model, lock_timeout=5.0)
            except TimeoutError as e:  # never mask the error that ended the run
                warnings.warn(f"could not read the last published weights: {e}")
            self._drain_reports(raise_errors=False)
            self.logger.maybe_log(self.trained_env_steps, force=True)
            self.queues.close()
            del self.buffers, self.weights
        return self.version, self.trained_env_steps

    # --- serial mode: every component in this process, stepped in turn ---------------------
    def _run_serial(self) -> None:
        components = [make() for _, make in self.components(serial=True)]
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in the worker processes; restored below
        try:
            for c in components:
                c.init()
            learner = components[-1]
            while not learner.finished:
                for c in components:
                    c.step(0.0)
                self._drain_reports(raise_errors=True)
                self.logger.maybe_log(self.ctl[Ctl.TRAINED_ENV_STEPS])
                if self._callback_says_stop():
                    break
        finally:
            self.ctl[Ctl.STOP] = 1
            torch.set_num_threads(threads)
            for c in components:
                c.close()

    # --- multi-process mode ---------------------------------------------------------------
    def _run_processes(self) -> None:
        self.procs = []
        try:
            for name, make in self.components(serial=False):
                # Not daemonic, so that an env may start processes of its own; every exit path
                # joins them below, and they die with this process (parent-death signal).
                p = self.ctx.Process(target=component_main, name=name, daemon=False,
                                     args=(name, make, self.ctl, self.queues.report, os.getpid()))
                p.start()
                self.procs.append(p)
            while not self.ctl[Ctl.LEARNER_DONE]:
                self._drain_reports(raise_errors=True, timeout=LOOP_TIMEOUT)
                self._check_alive()
                self.logger.maybe_log(self.ctl[Ctl.TRAINED_ENV_STEPS])
                if self._callback_says_stop():
                    break
        finally:
            self.ctl[Ctl.STOP] = 1
            self._join_all()

    def _callback_says_stop(self) -> bool:
        if self.callback is None or time.monotonic() - self.last_callback < self.callback_interval:
            return False
        self.version, self.trained_env_steps = self.weights.load(self.model)
        self.last_callback = time.monotonic()
        return self.callback(self.version, self.trained_env_steps) is False

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.exitcode is not None and not self.ctl[Ctl.LEARNER_DONE]:
                self._drain_reports(raise_errors=True)  # a traceback beats an exit code
                raise WorkerError(f"{p.name} (pid {p.pid}) exited unexpectedly with code "
                                  f"{p.exitcode}" + (f" (signal {-p.exitcode})" if p.exitcode < 0 else ""))

    def _join_all(self) -> None:
        deadline = time.monotonic() + JOIN_TIMEOUT
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join()
        for p in self.procs:
            p.close()
        self.procs = []

    def _drain_reports(self, raise_errors: bool, timeout: float = 0.0) -> None:
        try:
            reports = self.queues.report.get_many(block=timeout > 0, timeout=timeout)
        except queue.Empty:
            return
        errors = []
        for r in reports:
            if r.kind is ReportKind.ERROR:
                errors.append(r)
            else:
                self.logger.on_report(r)
        if errors and raise_errors:
            first = errors[0]
            raise WorkerError(f"{first.component} failed:\n{first.payload}\n"
                              f"time since each component's last report: {self.logger.silence()}")
