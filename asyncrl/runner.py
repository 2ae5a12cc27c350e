"""The whole process graph, built in one place, run, watched and torn down.

    rollout-i --PolicyRequest--> policy_request[p] --> policy-p     (p = i % num_policy_workers)
    policy-p  --group index----> action_ready[i]   --> rollout-i   (a pipe: see ipc)
    rollout-i --slot index-----> full_slot         --> learner
    learner   --slot indices---> free_slot         --> rollout-*
    everyone  --Report---------> report            --> main process (logs, errors)
    learner   --weights+version (SharedWeights)----> policy-*
"""
from __future__ import annotations

import ast
import ctypes
import functools
import os
import pickle
import queue
import select
import shutil
import signal
import sys
import threading
import time
import traceback
import warnings
from typing import Any, Callable, List, Optional

import faster_fifo
import torch
import torch.multiprocessing as mp
from multiprocessing import util as mp_util

from . import ipc
from .buffers import (Ctl, SharedControl, SharedHyperParams, SharedOptimizerState, SharedWeights,
                      TrajectoryBuffers, buffer_spec)
from .config import Config, ConfigError
from .learner import Learner, snapshot_path
from .logger import TrainLogger
from .messages import Report, ReportKind
from .models import PolicySpec
from .multiagent import AgentLayout
from .policy_worker import PolicyWorker
from .rollout_worker import RolloutWorker

JOIN_TIMEOUT = 5.0     # seconds a component gets to leave its loop before it is terminated
LOOP_TIMEOUT = 0.1     # seconds of any single wait inside a component loop
PAUSE_POLL = 0.005     # seconds between looks at the control vector while paused
REPORT_WAIT = 2.0      # seconds a pause waits for the rollout workers' last reports
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1


class WorkerError(RuntimeError):
    """A component (rollout-i, policy-p, learner) failed; the message holds its traceback."""


class Queues:
    """Every queue of the graph (see the module docstring for who writes and reads each)."""

    def __init__(self, cfg: Config):
        # Rollout workers write to these: their readers wait on a bell pipe, not in the queue
        # (see ipc: a rollout worker may be SIGKILLed at any moment).
        self.policy_request = [ipc.BelledQueue(faster_fifo.Queue(1_000_000))
                               for _ in range(cfg.num_policy_workers)]
        self.full_slot = ipc.BelledQueue(faster_fifo.Queue(1_000_000))
        self.report = ipc.BelledQueue(faster_fifo.Queue(10_000_000))
        self.action_ready = [ipc.BytePipe() for _ in range(cfg.num_workers)]
        self.free_slot = faster_fifo.Queue(1_000_000)  # rollout workers take without waiting
        self.rings = 0  # ring_all calls in this process

    def all(self) -> list:
        """The faster-fifo queues (whose locks a dead process may hold)."""
        return [*(q.fifo for q in self.policy_request), self.free_slot, self.full_slot.fifo,
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
        for q in [*self.policy_request, self.full_slot, self.report, self.free_slot,
                  *self.action_ready]:
            q.close()


def _prepare_child(name: str, parent_pid: int, parent_death_signal: bool,
                   scratch_dir: Optional[str]) -> None:
    """In a spawned component: die with the parent, leave Ctrl-C to the parent, one torch thread.
    The parent-death signal (SIGHUP) follows the thread that started the process, so it is only
    set when that was the main thread (the graph outlives a train() called from another
    thread); the parent-pid check in the loop covers the other case."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, functools.partial(_on_parent_death, parent_pid, scratch_dir))
    # Its own process group, which the processes its envs start (VizDoom's engines) inherit:
    # whoever reaps this component kills the group, so none outlives a SIGKILL (kill_group).
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if parent_death_signal:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)
        libc.prctl(_PR_SET_NAME, name.encode()[:15])
    except OSError:  # not Linux: the parent-pid check in the loop still applies
        pass
    if os.getppid() != parent_pid:
        _remove_if_orphaned(parent_pid, scratch_dir)
        os._exit(1)
    torch.set_num_threads(1)


def _remove_if_orphaned(parent_pid: int, scratch_dir: Optional[str]) -> None:
    """The main process died (SIGKILL) without removing the model's scratch directory: its
    children do, on their way out."""
    if scratch_dir and os.getppid() != parent_pid:
        shutil.rmtree(scratch_dir, ignore_errors=True)


def _on_parent_death(parent_pid: int, scratch_dir: Optional[str], signum, frame) -> None:
    """SIGHUP: the parent's thread that started this process ended. The kernel sends it before
    it hands this process to a new parent, so wait (up to 2 s) for that, remove the scratch
    directory if the parent is gone, and die as SIGHUP's default action does."""
    deadline = time.monotonic() + 2.0
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(0.01)
    _remove_if_orphaned(parent_pid, scratch_dir)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.killpg(0, signal.SIGHUP)  # with the processes its envs started


def kill_group(pid: int) -> None:
    """SIGKILL what is left of a reaped component's process group (processes its envs started;
    the group outlives its leader while they run)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def component_main(name: str, make: Callable, ctl: SharedControl, report_queue, parent_pid: int,
                   parent_death_signal: bool = True, scratch_dir: Optional[str] = None,
                   niceness: int = 0):
    """Entry point of every component process: init, then step while a train() call runs, idle
    while paused, until stopped; any failure is reported with its traceback."""
    _prepare_child(name, parent_pid, parent_death_signal, scratch_dir)
    if niceness:
        os.nice(niceness)
    component = None
    try:
        component = make()
        component.init()
        run_idx = paused_run = 0
        while not ctl.stopping and os.getppid() == parent_pid:
            run, paused = ctl.run_state()
            if paused:
                if paused_run != run:
                    paused_run = run
                    component.pause(run)
                time.sleep(PAUSE_POLL)
            elif run_idx != run:
                run_idx = run
                component.resume()
            else:
                component.step(LOOP_TIMEOUT)
    except Exception:
        report_queue.put(Report(ReportKind.ERROR, name, traceback.format_exc()), timeout=1.0)
    finally:
        if component is not None:
            component.close()
        _remove_if_orphaned(parent_pid, scratch_dir)


def watch_queue_locks(procs: list, queues: list, weights: List[SharedWeights],
                      ctl: SharedControl) -> None:
    """A thread of the main process: when a component process dies, free the queue locks it held
    (see ipc) and the shared weights' locks, before anyone, the main thread included, blocks on
    them for good. Deaths are
    seen through pidfds (Linux >= 5.3): unlike a process's sentinel pipe, which a grandchild
    forked by an env inherits, a pidfd turns readable when that process itself ends. Holds no
    reference to the Runner, so that garbage collection still shuts the graph down."""
    pidfds, handled = {}, set()
    try:
        while not ctl.stopping:
            for p in list(procs):
                pid = p.pid
                if pid is None or pid in pidfds or pid in handled:
                    continue
                try:
                    pidfds[pid] = os.pidfd_open(pid)
                except ProcessLookupError:  # gone already
                    handled.add(pid)
                    ipc.release_locks_of_dead(pid, queues)
                    for w in weights:
                        w.recover_from_death(pid)
            if not pidfds:
                time.sleep(LOOP_TIMEOUT)
                continue
            by_fd = {fd: pid for pid, fd in pidfds.items()}
            poller = select.poll()  # not select(): descriptors may be >= 1024
            for fd in by_fd:
                poller.register(fd, select.POLLIN)
            for fd, _ in poller.poll(LOOP_TIMEOUT * 1000):
                pid = by_fd[fd]
                os.close(pidfds.pop(pid))
                handled.add(pid)
                ipc.release_locks_of_dead(pid, queues)
                for w in weights:
                    w.recover_from_death(pid)
    finally:
        for fd in pidfds.values():
            os.close(fd)


def shutdown_graph(ctl: SharedControl, procs: list, components: list, queues: "Queues") -> None:
    """Stop every component: processes are joined (terminated, then killed, past a timeout;
    killed at once on a Ctrl-C during the wait), serial components closed, queues closed.
    Idempotent; also run at garbage collection and interpreter exit (before multiprocessing
    joins its children)."""
    ctl[Ctl.STOP] = 1
    forced = False
    try:
        deadline = time.monotonic() + JOIN_TIMEOUT
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2.0)
    except KeyboardInterrupt:  # a second Ctrl-C while waiting: no more grace
        forced = True
    for p in procs:  # SIGKILL what is left; its exit is immediate, the join too
        if p.exitcode is None:
            p.kill()
        while True:
            try:
                p.join()
                break
            except KeyboardInterrupt:
                forced = True
        kill_group(p.pid)
        p.close()
    procs.clear()
    for c in components:
        c.close()
    components.clear()
    queues.close()
    if forced:
        raise KeyboardInterrupt


class Make:
    """A picklable deferred constructor: the component is built inside its own process."""

    def __init__(self, cls, **kwargs):
        self.cls, self.kwargs = cls, kwargs

    def __call__(self):
        return self.cls(**self.kwargs)


def check_shm_space(needed: int, path: str = "/dev/shm") -> None:
    """Shared tensors live in /dev/shm (unlinked at once, but they take its space): fail early
    and say by how much it is short, instead of a bus error in a worker later."""
    if not os.path.isdir(path):
        return
    free = shutil.disk_usage(path).free
    if needed > 0.9 * free:
        raise ConfigError(
            f"the trajectory buffers need {needed / 2**20:,.1f} MiB of shared memory but {path} has "
            f"{free / 2**20:,.1f} MiB free (missing {(needed - 0.9 * free) / 2**20:,.1f} MiB, "
            "keeping a 10% margin). Lower num_envs_per_worker, rollout or batch_size, or give "
            f"{path} more room (docker run --shm-size=8g; mount -o remount,size=8G {path})")


def check_main_guard() -> None:
    """Fail, before any worker starts, when training is started from the top level of the main
    script outside ``if __name__ == "__main__":``. Workers are spawned, and a spawned process runs
    the main script's top level again before it unpickles its task: there that call would train
    anew (and fail), and the parent could hang for good writing the task into the pipe of a child
    that died before reading it (Python's spawn writes it whole; a task over the pipe's 64 KiB,
    as with an Atari observation space, blocks). Mirrors what spawn runs again: a script file,
    not ``python -m pkg`` of a ``__main__`` module, ``-c`` or an interactive session. The call's
    line is taken from the script's own frame on this thread's stack; a line inside any ``if``
    that tests ``__name__`` counts as guarded."""
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    path = getattr(main, "__file__", None)
    if spec_name is None and path is not None and not os.path.isfile(path):
        raise RuntimeError(
            f"the main script was read from {path} (e.g. `python - <<EOF`), not from a file: "
            "asyncrl starts its workers with multiprocessing's 'spawn', and a spawned process must "
            "import the main script again, which it cannot do from standard input. Save the "
            "script to a file and run `python file.py` (or use serial_mode=True)")
    if not path or not path.endswith(".py") or (
            spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__"))):
        return
    path = os.path.abspath(path)
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "<module>"
                                     and os.path.abspath(frame.f_code.co_filename) == path):
        frame = frame.f_back
    if frame is None:  # called from another thread, or from code the script did not run
        return
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno <= line <= node.end_lineno and any(
                isinstance(n, ast.Name) and n.id == "__name__" for n in ast.walk(node.test)):
            return
    raise RuntimeError(
        f"training was started at the top level of {path} (line {line}), outside "
        '`if __name__ == "__main__":`. asyncrl starts its workers with multiprocessing\'s '
        "'spawn', which runs the script's top level again in each worker, where this would "
        'start training anew. Put the code that trains under `if __name__ == "__main__":`')


class Runner:
    """The process graph of one model: started by its first ``run()``, paused between runs (envs
    keep their episodes, workers their processes), shut down by ``close()``, an error, garbage
    collection or interpreter exit."""

    def __init__(self, cfg: Config, env_factory: Callable, policy_spec: PolicySpec, device: str,
                 model: torch.nn.Module, optimizer_path: str, logger: TrainLogger, graph_idx: int = 0,
                 agents: Optional[AgentLayout] = None, frozen: Optional[dict] = None):
        # A graph started after an error draws fresh env resets and sampling noise.
        self.base_cfg = cfg
        self.cfg = cfg.replace(seed=(cfg.seed + 1_000_003 * graph_idx) % 2 ** 31)
        self.env_factory, self.device, self.agents = env_factory, device, agents
        self.policy_spec = policy_spec
        self.optimizer_path, self.logger = optimizer_path, logger
        self.version = self.trained_env_steps = None  # set by run()
        spec = buffer_spec(policy_spec.env, model.dist, model.state_size)
        check_shm_space(TrajectoryBuffers.nbytes(cfg, spec))
        self.buffers = TrajectoryBuffers(cfg, spec)
        self.weights = SharedWeights(model)
        # frozen policies of a multi-agent env (run in the rollout workers): id -> (model, weights)
        self.frozen = {pid: (m, SharedWeights(m)) for pid, (_, m) in (frozen or {}).items()}
        self.frozen_specs = {pid: spec for pid, (spec, _) in (frozen or {}).items()}
        self.optimizer_state = SharedOptimizerState(model)
        self.hparams = SharedHyperParams(cfg)
        self.ctl = SharedControl()
        self.queues = Queues(cfg)
        self.queues.free_slot.put_many(list(range(cfg.num_slots)))
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
        """Trajectory slots taken back from dead rollout workers (by the learner)."""
        return self.ctl[Ctl.SLOTS_RECLAIMED]

    def locks(self) -> list:
        """Every faster-fifo queue whose lock a dead process may hold (see ipc)."""
        return [*self.queues.all(), *(w.lock.token_queue for w in self.all_weights())]

    def all_weights(self) -> List[SharedWeights]:
        """The trained policy's shared weights, then the frozen policies'."""
        return [self.weights, *(w for _, w in self.frozen.values())]

    @property
    def alive(self) -> bool:
        return not self.ctl.stopping

    def close(self) -> None:
        self._shutdown()

    def components_to_make(self, serial: bool) -> List[tuple]:
        """(name, constructor) of every component; the wiring is in the Queues they are given."""
        common = dict(cfg=self.cfg, buffers=self.buffers, ctl=self.ctl, queues=self.queues,
                      serial=serial)
        out = [(f"rollout-{i}", Make(RolloutWorker, worker_idx=i, env_factory=pickle.dumps(self.env_factory),
                                     env_spec=self.policy_spec.env, agents=self.agents,
                                     frozen={pid: (self.frozen_specs[pid], w)
                                             for pid, (_, w) in self.frozen.items()}, **common))
               for i in range(self.cfg.num_workers)]
        out += [(f"policy-{p}", Make(PolicyWorker, policy_idx=p, policy_spec=self.policy_spec,
                                     device=self.device, weights=self.weights, **common))
                for p in range(self.cfg.num_policy_workers)]
        out.append(("learner", Make(Learner, policy_spec=self.policy_spec, device=self.device,
                                    weights=self.weights, optimizer_state=self.optimizer_state,
                                    hparams=self.hparams, optimizer_path=self.optimizer_path,
                                    **common)))
        return out

    def run(self, model: torch.nn.Module, version: int, start_env_steps: int,
            target_env_steps: int, hparams: Callable[[float], dict], min_version: int = 0,
            optimizer_epoch: int = 0, callback: Optional[Callable[[int, int], Any]] = None,
            callback_interval: float = 1.0) -> tuple:
        """Train ``model`` (CPU, updated in place) until the learner has trained on
        ``target_env_steps`` samples in total, or ``callback(version, trained_env_steps)`` returns
        False. The callback runs in this process every ``callback_interval`` seconds, after
        ``model`` received the latest published weights. ``hparams(progress_remaining)`` gives
        the MUTABLE_HPARAMS values (validated), polled while training. Samples of policy versions
        below ``min_version`` are not trained on; a new ``optimizer_epoch`` makes the learner
        reload the optimizer file. On an error or Ctrl-C the graph is shut down (the next run
        starts a new one). Returns (new version, trained env steps)."""
        if not self.alive:
            raise RuntimeError("this Runner was shut down; create a new one")
        cfg, ctl = self.cfg, self.ctl
        self.model, self.callback, self.callback_interval = model, callback, callback_interval
        self.hparams_fn, self.start_env_steps = hparams, start_env_steps
        self.last_callback = time.monotonic()
        self.version, self.trained_env_steps = version, start_env_steps
        self.logger.reset_run()
        self.weights.publish(model, version, start_env_steps)
        for frozen_model, weights in self.frozen.values():  # as the user last set them
            weights.publish(frozen_model, weights.version + 1, 0)
        self.hparams.write(hparams(1.0))
        ctl[Ctl.TRAINED_ENV_STEPS], ctl[Ctl.TARGET_ENV_STEPS] = start_env_steps, target_env_steps
        ctl[Ctl.LEARNER_DONE], ctl[Ctl.MIN_VERSION] = 0, min_version
        ctl[Ctl.OPTIMIZER_EPOCH] = optimizer_epoch
        self.run_idx = ctl.run_state()[0] + 1
        ctl.set_run_state(self.run_idx, paused=False)
        ok = False
        try:
            if cfg.serial_mode:
                self._run_serial()
            else:
                self._run_processes()
            ok = True
        finally:
            ctl.set_run_state(self.run_idx, paused=True)
            self.model = self.callback = self.hparams_fn = None  # no cycle with the caller
            # Keep whatever the learner last published, even after an error or Ctrl-C, with the
            # counters that match it.
            try:
                self.version, self.trained_env_steps = self.weights.load(model, lock_timeout=5.0)
            except TimeoutError as e:  # never mask the error that ended the run
                warnings.warn(f"could not read the last published weights: {e}")
            late_errors = self._drain_reports(raise_errors=False)
            self.logger.maybe_log(self.trained_env_steps, force=True)
            if late_errors and ok:  # a component failed while pausing: the next call starts anew
                warnings.warn(f"{late_errors[0].component} failed after the target was reached; "
                              f"its processes are restarted at the next call:\n{late_errors[0].payload}")
            if not ok or late_errors:  # an error or Ctrl-C: nothing is left running
                self.close()
        return self.version, self.trained_env_steps

    def _progress(self) -> None:
        """Per main-loop pass: hyper-parameter schedules, console/TensorBoard logging."""
        trained = self.ctl[Ctl.TRAINED_ENV_STEPS]
        total = max(1, self.ctl[Ctl.TARGET_ENV_STEPS] - self.start_env_steps)
        self.hparams.write(self.hparams_fn(1.0 - min(1.0, (trained - self.start_env_steps) / total)))
        self.logger.maybe_log(trained)

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
            learner = self.components[-1]
            while not learner.finished:
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
        while not self.ctl[Ctl.LEARNER_DONE]:
            self._drain_reports(raise_errors=True, timeout=LOOP_TIMEOUT)
            self._check_alive()
            self._progress()
            if self._callback_says_stop():
                break
        self._pause()

    def _spawn(self, name: str):
        # Not daemonic, so that an env may start processes of its own; every exit path joins
        # them (shutdown_graph), and they die with this process (parent-death signal).
        p = mp.get_context("spawn").Process(
            target=component_main, name=name, daemon=False,
            args=(name, self.makes[name], self.ctl, self.queues.report, os.getpid(),
                  threading.current_thread() is threading.main_thread(),
                  os.path.dirname(self.optimizer_path),
                  0 if name == "learner" else self.cfg.sampler_nice))  # sampling yields to it
        p.start()
        return p

    def _pause(self) -> None:
        """Pause every component and wait until the learner has left its update and saved its
        state, so the weights and counters read next are final; then, for at most
        REPORT_WAIT seconds, for the rollout workers' last reports (episodes and env restarts
        up to the pause: the statistics a caller reads after train())."""
        self.ctl.set_run_state(self.run_idx, paused=True)
        deadline = time.monotonic() + self.cfg.worker_timeout
        while self.ctl[Ctl.LEARNER_PAUSED] != self.run_idx:
            self._drain_reports(raise_errors=True, timeout=0.01)
            self._check_alive()
            if time.monotonic() > deadline:
                raise WorkerError(f"the learner did not pause within worker_timeout="
                                  f"{self.cfg.worker_timeout} s")
        self.queues.ring_all()  # a rollout worker waiting for actions or slots sees the pause now
        deadline = time.monotonic() + REPORT_WAIT
        while bool((self.buffers.paused_run < self.run_idx).any()) and time.monotonic() < deadline:
            self._drain_reports(raise_errors=True, timeout=0.01)
            self._check_alive()

    def snapshot(self) -> dict:
        """The learner's exact state, taken between two updates: weights, Adam, counters and
        RNG of one moment (for a checkpoint written while training). Waits at most
        ``worker_timeout``."""
        if self.cfg.serial_mode:  # the learner is here, between two of its steps
            self.components[-1].snapshot()
        else:
            request = self.ctl[Ctl.SNAPSHOT_REQUEST] + 1
            self.ctl[Ctl.SNAPSHOT_REQUEST] = request
            deadline = time.monotonic() + self.cfg.worker_timeout
            while self.ctl[Ctl.SNAPSHOT_DONE] != request:
                self._check_alive()
                if time.monotonic() > deadline:
                    raise WorkerError(f"the learner did not write its state within worker_timeout="
                                      f"{self.cfg.worker_timeout} s")
                time.sleep(PAUSE_POLL)
        return torch.load(snapshot_path(self.optimizer_path), map_location="cpu")

    def _callback_says_stop(self) -> bool:
        if self.callback is None or time.monotonic() - self.last_callback < self.callback_interval:
            return False
        if self.weights.version != self.version:  # published with their counters, once per update
            self.version, self.trained_env_steps = self.weights.load(self.model)
        self.last_callback = time.monotonic()
        return self.callback(self.version, self.trained_env_steps) is False

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

        - A rollout worker: policy workers drop its pending requests, the learner takes its
          slots back (see ``Learner._take_back_slots``), the new one draws new env seeds.
        - A policy worker holds no state: rollout workers send their unanswered requests to
          the new one.
        - The learner: the new one goes on from the last published weights, their counters and
          Adam's state after the update that made them, losing the update in flight (its slots
          are resampled)."""
        dead = self.procs[idx]
        kind = dead.name.split("-")[0]
        if kind == "rollout":
            what = self._retire_rollout_worker(int(dead.name.split("-")[1]))
        elif kind == "policy":
            self.buffers.policy_incarnation[int(dead.name.split("-")[1])] += 1
            what = "its unanswered requests are sent again"
        else:
            what = (f"it goes on from the weights of version {self.weights.version} and Adam's "
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
        """Stop serving a dead rollout worker and let the learner take its slots back."""
        b = self.buffers
        ticks = b.policy_ticks.clone()
        b.incarnation[worker_idx] += 1
        # Every policy worker finishes the pass it is in (which may serve the dead worker's
        # requests) before its slots change hands; later passes drop those requests.
        t0 = time.monotonic()
        while bool((b.policy_ticks == ticks).any()):
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
        b.claiming[worker_idx] = 0  # it died inside a claim: the learner's audit finds the slot
        b.reclaimable[worker_idx] = b.incarnation[worker_idx]
        self.ctl[Ctl.RECLAIM] += 1
        return "its trajectory slots go back to the learner"

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
