"""How a component process of the graph lives and dies: started (spawned) with a name, the
parent-death signal and its own process group, stepped while a train() call runs and idle
while paused, and stopped with a grace period, then terminated and killed; the locks a dead
process held are freed by a watching thread of the main process. Also the checks made before
anything is spawned (shared memory, the main-script guard)."""
from __future__ import annotations

import ast
import atexit
import ctypes
import functools
import os
import select
import shutil
import signal
import sys
import time
import traceback
from typing import Callable, List, Optional

import psutil
import torch

from . import ipc
from .buffers import SharedControl, SharedWeights
from .config import ConfigError
from .messages import Report, ReportKind

JOIN_TIMEOUT = 5.0     # seconds a component gets to leave its loop before it is terminated
LOOP_TIMEOUT = 0.1     # seconds of any single wait inside a component loop
PAUSE_POLL = 0.005     # seconds between looks at the control vector while paused
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1


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
    _exit_closed()


def _exit_closed() -> None:
    """End a component's process once it has closed what it opened and sent its reports
    (queues and shared memory take effect at once; nothing is buffered). The atexit handlers
    run (an env's, multiprocessing's); the interpreter's teardown of its modules does not: with
    torch imported it would add the better part of a second to every process's exit, and so
    to every close() of a model."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or gone
            pass
    os._exit(0)


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


def shutdown_graph(ctl: SharedControl, procs: list, components: list, queues) -> None:
    """Stop every component: processes are joined (terminated, then killed, past a timeout;
    killed at once on a Ctrl-C during the wait), serial components closed, queues closed.
    Idempotent; also run at garbage collection and interpreter exit (before multiprocessing
    joins its children). ``queues``: the graph's (runner.Queues)."""
    ctl.stop()
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
        if os.path.getmtime(path) > psutil.Process().create_time() + 1.0:
            return  # edited since it started: the lines on disk are not the ones running
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
