"""How a component process of the graph lives and dies: started (from multiprocessing's fork
server, or spawned) with a name, the parent-death signal and its own process group, stepped
while a train() call runs and idle while paused, and stopped with a grace period, then
terminated and killed; the locks a dead process held are freed by a watching thread of the
main process. Also the checks made before anything is started (shared memory, the main-script
guard)."""
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
from typing import Callable, List, Optional, Tuple

import psutil
import torch
import torch.multiprocessing as mp  # multiprocessing, its tensor reductions registered
from multiprocessing import forkserver as mp_forkserver

from . import ipc
from .buffers import SharedControl, SharedWeights
from .config import ConfigError
from .messages import Report, ReportKind

JOIN_TIMEOUT = 5.0     # seconds a component gets to leave its loop before it is terminated
LOOP_TIMEOUT = 0.1     # seconds of any single wait inside a component loop
PAUSE_POLL = 0.005     # seconds between looks at the control vector while paused
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1
def _prepare_child(name: str, main_pid: int, main_thread: bool, scratch_dir: Optional[str],
                   environ: dict) -> Tuple[int, Callable[[], None]]:
    """In a component: die with the main process, leave Ctrl-C to it, one torch thread, the
    main process's environment variables. Returns the parent's pid, watched from then on (the
    main process's, spawned, or the fork server's, which ends with the main process or, killed
    by a SIGTERM to the process group, before it), and what to call on the way out: it removes
    the folders the main process would have removed (``_orphan_dirs``) if the main process is
    gone (``_remove_if_orphaned``). The parent-death signal (SIGHUP) follows the parent's
    thread that started the process: a spawned process's is only set when that was the main
    thread (the graph outlives a train() called from another thread; the parent-pid check in
    the loop covers that case); the fork server has one thread."""
    parent = os.getppid()
    dirs = _orphan_dirs(scratch_dir, forked=parent != main_pid)
    try:
        main = psutil.Process(main_pid)  # pins its start time: a reused pid is not it
    except psutil.NoSuchProcess:  # dead already: the check below ends this process
        main = None
    leave = functools.partial(_remove_if_orphaned, main, dirs)
    _leave_fork_server()
    if os.environ != environ:  # the fork server's are those of the moment it started
        os.environ.clear()
        os.environ.update(environ)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, functools.partial(_on_parent_death, parent, leave))
    # Its own process group, which the processes its envs start (VizDoom's engines) inherit:
    # whoever reaps this component kills the group, so none outlives a SIGKILL (kill_group).
    os.setpgid(0, 0)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        if main_thread or parent != main_pid:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGHUP)
        libc.prctl(_PR_SET_NAME, name.encode()[:15])
    except OSError:  # not Linux: the parent-pid check in the loop still applies
        pass
    if os.getppid() != parent or not _alive(main):  # it died meanwhile
        leave()
        os._exit(1)
    torch.set_num_threads(1)
    return parent, leave


def _orphan_dirs(scratch_dir: Optional[str], forked: bool) -> List[str]:
    """What the main process would remove at its exit and cannot if it is killed: the model's
    scratch folder and, for a component forked from the fork server, multiprocessing's temporary
    folder of the main process (the fork server's socket), which every component inherits."""
    temp = mp.current_process()._config.get("tempdir") if forked else None
    return [d for d in (scratch_dir, temp) if d]


def _leave_fork_server() -> None:
    """A process forked from the fork server holds the write end of its "alive" pipe (to start
    processes of its own through it). The fork server ends when every copy is closed: that of
    the main process as it exits or dies, and, closed here, the component's. Then the fork
    server's end sends the components the parent-death signal; held open, the fork server and
    the components would wait for each other after the main process's death."""
    server = mp_forkserver._forkserver
    if getattr(server, "_forkserver_pid", None) is None and getattr(
            server, "_forkserver_alive_fd", None) is not None:  # inherited, not its own server's
        try:
            os.close(server._forkserver_alive_fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _remove_if_orphaned(main: Optional[psutil.Process], dirs: List[str]) -> None:
    """The main process died (SIGKILL) without removing ``dirs`` (``_orphan_dirs``): its
    components do, on their way out. Only then: a parent that is gone is not proof of it (the
    fork server, killed by a SIGTERM to the process group that the components, in groups of
    their own, do not get, while the main process goes on to save what the folder holds)."""
    if not _alive(main):
        _remove(dirs)


def _alive(proc: Optional[psutil.Process]) -> bool:
    """Running, and not a zombie (dead, its exit status not yet collected by its parent);
    None: gone before it could be looked at."""
    try:
        return proc is not None and proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _remove(dirs: List[str]) -> None:
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _on_parent_death(parent_pid: int, leave: Callable[[], None], signum, frame) -> None:
    """SIGHUP: the parent's thread that started this process ended. The kernel sends it before
    it hands this process to a new parent, so wait (up to 2 s) for that, remove the scratch
    directory if the main process is gone (``leave``), and die as SIGHUP's default action
    does."""
    deadline = time.monotonic() + 2.0
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(0.01)
    leave()
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    os.killpg(0, signal.SIGHUP)  # with the processes its envs started


def kill_group(pid: int) -> None:
    """SIGKILL what is left of a reaped component's process group (processes its envs started;
    the group outlives its leader while they run)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def component_main(name: str, make: Callable, ctl: SharedControl, report_queue, main_pid: int,
                   main_thread: bool, scratch_dir: Optional[str], niceness: int, environ: dict):
    """Entry point of every component process: init, then step while a train() call runs, idle
    while paused, until stopped; any failure is reported with its traceback. ``main_thread``:
    started from the main process's main thread; ``environ``: its environment variables."""
    parent_pid, leave = _prepare_child(name, main_pid, main_thread, scratch_dir, environ)
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
        leave()
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


def _started_at() -> float:
    """When this process started, wall-clock seconds. On Linux from its start in clock ticks
    since boot and ``CLOCK_BOOTTIME``, to a tick: psutil's ``create_time`` adds the ticks to
    /proc/stat's boot time, which is whole seconds, up to a second early, so that a script
    written just before it was run could look edited since. psutil's elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
        return time.time() - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return psutil.Process().create_time()


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
            "asyncrl starts its workers as new processes (multiprocessing's fork server or "
            "spawn), which must import the main script again, and cannot from standard input. "
            "Save the script to a file and run `python file.py` (or use serial_mode=True)")
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
        if os.path.getmtime(path) > _started_at() + 1.0:
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
        '`if __name__ == "__main__":`. asyncrl starts its workers as new processes '
        "(multiprocessing's fork server or spawn), which run the script's top level again, "
        'where this would start training anew. Put the code that trains under '
        '`if __name__ == "__main__":`')
