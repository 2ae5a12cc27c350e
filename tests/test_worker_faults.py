"""Processes that die: a rollout worker, policy worker or learner killed with SIGKILL (even
inside a queue operation) is replaced and training goes on; past max_worker_restarts the run
ends naming it."""
import functools
import glob
import os
import signal
import tempfile
import threading
import time

import psutil
import pytest

import custom_envs
from asyncrl import APPO, WorkerError, ipc
from asyncrl.fileio import make_scratch_dir, stale_fork_server_dirs
from test_multiprocess import NUM_COMPONENTS, SMALL, worker_children

KILLS = 5


def children_named(name):
    """Live (not zombie) children whose process name is ``name``."""
    out = []
    for c in worker_children():
        try:
            if c.name() == name and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_for_child(name, timeout=60.0):
    """The process named ``name`` once it is up (a replacement names itself after importing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = children_named(name)
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no live {name} within {timeout} s")


@pytest.mark.timeout(180)
def test_sigkilled_rollout_workers_are_replaced_and_training_goes_on():
    killed_pids, training, done_killing = [], threading.Event(), threading.Event()

    def killer():
        training.wait(timeout=60)
        try:
            for k in range(KILLS):
                victim = wait_for_child(f"rollout-{k % 2}")
                time.sleep(1.0)  # let it work a little
                killed_pids.append(victim.pid)
                os.kill(victim.pid, signal.SIGKILL)
        finally:
            done_killing.set()

    steps_after = {}

    def stop_when_trained_on_after_the_kills(model):
        if model.num_timesteps:
            training.set()
        if not done_killing.is_set():
            return None
        steps_after.setdefault("start", model.num_timesteps)
        steps_after.setdefault("time", time.monotonic())
        # the learner takes the last victim's slots back once its replacement is up, which on a
        # busy machine can come after these steps: wait for it (up to 30 s), then assert below
        reclaimed = (model._runner.slots_reclaimed >= KILLS
                     or time.monotonic() > steps_after["time"] + 30)
        return False if model.num_timesteps >= steps_after["start"] + 10 * 256 and reclaimed else None

    model = APPO("CartPole-v1", **SMALL)
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        model.train(10 ** 8, callback=stop_when_trained_on_after_the_kills, callback_interval=0.1)
        thread.join()
        assert len(killed_pids) == KILLS
        assert model.logger.worker_restarts == KILLS
        assert model._runner.slots_reclaimed >= KILLS  # a worker holds a slot while it steps
        assert model.num_timesteps >= steps_after["start"] + 10 * 256
        live = {c.pid for c in worker_children()}
        assert not live & set(killed_pids)
        assert len(live) == SMALL["num_workers"] + 2
        model.train(1024)  # the replaced graph pauses and resumes too
    finally:
        thread.join()
        model.close()
    assert worker_children() == []


@pytest.mark.timeout(120)
@pytest.mark.skipif(not ipc.supported(), reason="mutex layout not recognised here")
@pytest.mark.parametrize("queue_attr", ["report_queue", "full_slot_queue", "request_queue"])
def test_worker_killed_holding_a_queue_lock_does_not_hang_the_graph(tmp_path, queue_attr):
    """The main process reads the report queue, the learner the full-slot queue, the policy
    worker the request queue: each would block for ever on a lock its dead holder kept."""
    env = functools.partial(custom_envs.die_holding_queue_lock, queue_attr, str(tmp_path / "died"))
    after_restart = {}

    def until_trained_after_the_restart(m):
        if m.logger.worker_restarts:
            after_restart.setdefault("steps", m.num_timesteps)
            return False if m.num_timesteps >= after_restart["steps"] + 4096 else None

    with APPO(env, **SMALL) as model:
        model.train(10 ** 8, callback=until_trained_after_the_restart, callback_interval=0.05)
        assert (tmp_path / "died").exists()
        assert model.logger.worker_restarts == 1
        assert model.num_timesteps >= after_restart["steps"] + 4096
    assert worker_children() == []


@pytest.mark.timeout(150)
@pytest.mark.parametrize("victim", ["learner", "policy-0"])
@pytest.mark.parametrize("algo", ["appo", "ppo"])
def test_killed_learner_or_policy_worker_is_replaced_and_training_goes_on(victim, algo):
    """A policy worker holds no state: its replacement answers the requests it left. A learner
    is replaced from the last published weights and Adam's state after that update: training
    goes on, its counters never go back, and the slots the dead one held are sampled again
    (synchronous PPO, which has no spare slot, would starve otherwise)."""
    state = {}
    cfg = dict(SMALL, algo=algo, worker_timeout=30)
    if algo == "ppo":  # one rollout of every env per update
        cfg.update(batch_size=128, minibatch_size=64)
    updates = 20

    def kill_once_then_train_on(m):
        if m.num_timesteps > 0 and "pid" not in state:
            state["pid"] = children_named(victim)[0].pid
            state["steps"], state["version"] = m.num_timesteps, m.policy_version
            os.kill(state["pid"], signal.SIGKILL)
        elif "pid" in state:
            return False if m.num_timesteps >= state["steps"] + updates * cfg["batch_size"] else None

    with APPO("CartPole-v1", **cfg) as model:
        t0 = time.monotonic()
        model.train(10 ** 8, callback=kill_once_then_train_on, callback_interval=0.1)
        assert time.monotonic() - t0 < 30  # no wait for worker_timeout
        assert model.logger.worker_restarts == 1
        assert model.num_timesteps >= state["steps"] + updates * cfg["batch_size"]
        assert model.policy_version >= state["version"] + updates
        replacement = wait_for_child(victim)
        assert replacement.pid != state["pid"]
        assert len({c.pid for c in worker_children()}) == NUM_COMPONENTS
        model.train(1024)  # the replaced graph pauses and resumes too
    assert worker_children() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["learner", "policy-0"])
def test_with_no_restarts_allowed_a_dead_component_ends_the_run_naming_it(victim):
    model = APPO("CartPole-v1", max_worker_restarts=0, **SMALL)
    state = {}

    def kill_once(m):
        if m.num_timesteps > 0 and "pid" not in state:
            state["pid"] = children_named(victim)[0].pid
            state["steps"] = m.num_timesteps
            os.kill(state["pid"], signal.SIGKILL)

    try:
        with pytest.raises(WorkerError) as error:
            model.train(10 ** 8, callback=kill_once, callback_interval=0.1)
        assert f"{victim} (pid {state['pid']}) exited unexpectedly" in str(error.value)
        assert "max_worker_restarts=0" in str(error.value)
        assert model.num_timesteps >= state["steps"]  # the last published weights were kept
        assert worker_children() == []
        before = model.num_timesteps
        model.train(1024)  # and a new graph trains on from them
        assert model.num_timesteps >= before + 1024
    finally:
        model.close()
    assert worker_children() == []


def _stubborn():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)


@pytest.mark.timeout(60)
def test_second_ctrl_c_during_shutdown_kills_at_once():
    """The first Ctrl-C stops the graph with JOIN_TIMEOUT of grace per process; a second one
    while it waits kills what is left at once, and still nothing is left behind."""
    import multiprocessing as mp

    from asyncrl.buffers import SharedControl
    from asyncrl.processes import JOIN_TIMEOUT, shutdown_graph
    from asyncrl.runner import Queues
    from asyncrl.config import Config

    ctl, queues = SharedControl(), Queues(Config())
    procs = [mp.get_context("spawn").Process(target=_stubborn) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        shutdown_graph(ctl, procs, [], queues)
    assert time.monotonic() - t0 < JOIN_TIMEOUT
    assert procs == [] and worker_children() == []


def _running(p) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(120)
def test_workers_exit_on_their_own_when_the_main_process_is_sigkilled(tmp_path):
    """No main process left to stop them: the parent-death signal (and the parent-pid check in
    every loop) ends the workers within seconds, with no orphan and no scratch file left."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        sys.path.insert(0, %r)
        from asyncrl import APPO
        from test_multiprocess import SMALL
        if __name__ == "__main__":
            def started(m):
                if m.num_timesteps:
                    print("training", flush=True)
            APPO("CartPole-v1", **SMALL).train(10 ** 9, callback=started, callback_interval=0.2)
    """ % os.path.dirname(__file__)))
    stale_before = set(stale_fork_server_dirs())
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    workers = []
    try:
        assert proc.stdout.readline().strip() == "training"
        children = psutil.Process(proc.pid).children(recursive=True)
        workers = [c for c in children if c.name().startswith(("rollout-", "policy-", "learner"))]
        assert len(workers) == SMALL["num_workers"] + 2
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            alive = [w for w in workers if _running(w)]  # a zombie is gone (exited, unreaped)
            if not alive:
                break
            time.sleep(0.1)
        assert alive == [], f"still running 10 s after the main process died: {alive}"
        # ... and they removed the dead model's scratch directory on their way out, and the
        # dead process's fork-server folder
        assert glob.glob(os.path.join(tempfile.gettempdir(), f"asyncrl-{proc.pid}-*")) == []
        assert set(stale_fork_server_dirs()) <= stale_before
    finally:
        proc.kill()
        proc.wait()
        for w in workers:  # only if the assertion above failed
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.timeout(120)
def test_env_factory_a_worker_cannot_import_is_named(tmp_path, monkeypatch):
    """A factory from a module only the main process can import (a path added and removed at
    run time): the run fails at once with a message that says so, not with a hang."""
    import importlib
    import sys

    (tmp_path / "only_here.py").write_text(
        "import gymnasium as gym\n\ndef make():\n    return gym.make('CartPole-v1')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("only_here")
    sys.path.remove(str(tmp_path))  # the spawned workers get this process's sys.path
    (tmp_path / "only_here.py").unlink()
    model = APPO(module.make, **SMALL)  # probed in this process: fine here
    try:
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match="could not unpickle the env factory"):
            model.train(10 ** 6)
        assert time.monotonic() - t0 < 60
    finally:
        model.close()
        sys.modules.pop("only_here", None)
    assert worker_children() == []


def test_a_stale_fork_server_folder_is_removed_by_the_next_model_and_a_live_one_kept():
    """A process killed with no component alive leaves multiprocessing's folder of its fork
    server's socket: the next model's start removes it, never one whose socket is bound, nor one
    whose owner still runs (its fork server killed by a SIGTERM to its group while it saves),
    nor another program's."""
    import shutil
    import socket
    import subprocess
    import sys
    from asyncrl.fileio import FORK_SERVER_OWNER
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    dirs = stale, live, saving, foreign = [tempfile.mkdtemp(prefix="pymp-") for _ in range(4)]
    for d, owner in ((stale, dead.pid), (live, dead.pid), (saving, os.getpid())):
        open(os.path.join(d, f"{FORK_SERVER_OWNER}{owner}"), "w").close()
    for d in (stale, saving, foreign):
        open(os.path.join(d, "listener-abc"), "w").close()  # no process binds it
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(os.path.join(live, "listener-xyz"))
            sock.listen()
            found = stale_fork_server_dirs()
            assert stale in found and not {live, saving, foreign} & set(found)
            shutil.rmtree(make_scratch_dir())
            assert [os.path.exists(d) for d in dirs] == [False, True, True, True]
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
