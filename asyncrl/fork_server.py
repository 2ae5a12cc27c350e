"""The multiprocessing context components start from, and its fork server started early.

Imports nothing of torch's (``asyncrl/__init__`` calls ``start_early`` before its first torch
import), so the fork server's imports run beside the main process's own instead of after them.
"""
from __future__ import annotations

import atexit
import multiprocessing as mp
import os
from multiprocessing import forkserver as mp_forkserver, util as mp_util

from .fileio import mark_fork_server_dir

# Imported once in the fork server: torch, most of a component's import time, and torch._dynamo,
# which the first torch.optim optimizer imports (~1.5 s of a learner's start on a 2-core CPU).
# Not asyncrl: the fork server resolves imports on the interpreter's default path (its working
# directory first), not the main process's (Python 3.11 ignores the sys.path it is given), so a
# component could get another copy than the main process has; each component imports asyncrl
# itself, on the main process's path. A module that fails to import is skipped there.
PRELOAD = ["torch", "torch._dynamo"]
NO_EARLY_START = "ASYNCRL_NO_EARLY_FORK_SERVER"  # set (non-empty) in the environment: no start on import


def process_context():
    """The multiprocessing context components start from: the fork server where the platform
    has one (Linux), else spawn. The fork server is one process, started on asyncrl's import
    (``start_early``) or with the first graph and ending with this interpreter (as
    multiprocessing's resource tracker), that imported PRELOAD once: each component is forked
    from it with torch loaded, where a spawned one spends seconds of CPU importing it. Like a
    spawned one it shares nothing else with this process: the main script is imported again
    (hence the main guard), CUDA is initialised in the component, and it is given this
    process's environment variables (component_main)."""
    if "forkserver" not in mp.get_all_start_methods() or not hasattr(
            mp_forkserver._forkserver, "_forkserver_alive_fd"):  # see processes._leave_fork_server
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    # made now, so each component knows it (see processes._orphan_dirs); named ours, so that no
    # other asyncrl process takes it for a dead one's while we run (fileio.stale_fork_server_dirs)
    mark_fork_server_dir(mp_util.get_temp_dir())
    return ctx


def start_early() -> None:
    """Start the fork server now, in the main process: it imports PRELOAD in the background
    while this process imports torch and builds its model, so the first train() forks its
    components at once (a CartPole run's first trained batch ~2.5 s sooner on a 2-core CPU).
    Nothing is started in a process multiprocessing started (a component, a pool worker, a
    spawned child re-importing the main script), nor with ``ASYNCRL_NO_EARLY_FORK_SERVER`` set,
    nor where starting it fails: then the fork server starts with the first train(), as
    before."""
    proc = mp.current_process()
    if proc.name != "MainProcess" or getattr(proc, "_inheriting", False) or os.environ.get(NO_EARLY_START):
        return
    try:
        if process_context().get_start_method() == "forkserver":
            mp_forkserver.ensure_running()
            atexit.register(_stop_fork_server)
    except Exception:  # noqa: BLE001 (e.g. no usable interpreter to start): importing asyncrl
        pass           # must not fail on it; the first train() starts it and reports what fails


def _stop_fork_server() -> None:
    """At this interpreter's exit: ask the fork server to end (its pipe closed) and wait for it.
    It notices the closed pipe only once PRELOAD is imported, so a script that imports asyncrl
    and exits within a few seconds would otherwise leave it running, orphaned, until then.
    Registered after multiprocessing's own exit function, so it runs before that removes the
    server's socket's directory."""
    try:
        mp_forkserver._forkserver._stop()
    except (OSError, AttributeError):  # already gone, or another Python's internals
        pass
