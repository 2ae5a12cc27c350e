"""Processes that die: a rollout worker killed with SIGKILL (even inside a queue operation) is
replaced and training goes on; a dead learner or policy worker ends the run naming it."""
import functools
import os
import signal
import threading
import time

import psutil
import pytest

import custom_envs
from asyncrl import APPO, WorkerError, ipc
from test_multiprocess import SMALL, worker_children

# 2 x 2 env groups hold 4 of the 20 slots and a batch takes 8: five kills without reclaiming
# their 2 slots each would leave too few for a batch, and the learner would wait for ever.
KILLS = 5


def children_named(name):
    out = []
    for c in worker_children():
        try:
            if c.name() == name:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.timeout(180)
def test_sigkilled_rollout_workers_are_replaced_and_training_goes_on():
    killed_pids, training, done_killing = [], threading.Event(), threading.Event()

    def killer():
        training.wait(timeout=60)
        for k in range(KILLS):
            victims = children_named(f"rollout-{k % 2}")
            if victims:
                killed_pids.append(victims[0].pid)
                os.kill(victims[0].pid, signal.SIGKILL)
            time.sleep(2.5)  # the replacement starts and reports
        done_killing.set()

    steps_after = {}

    def stop_when_trained_on_after_the_kills(model):
        if model.num_timesteps:
            training.set()
        if not done_killing.is_set():
            return None
        steps_after.setdefault("start", model.num_timesteps)
        return False if model.num_timesteps >= steps_after["start"] + 10 * 256 else None

    model = APPO("CartPole-v1", **SMALL)
    thread = threading.Thread(target=killer)
    thread.start()
    try:
        model.train(10 ** 8, callback=stop_when_trained_on_after_the_kills, callback_interval=0.1)
        thread.join()
        assert len(killed_pids) == KILLS
        assert model.logger.worker_restarts == KILLS
        assert model.num_timesteps >= steps_after["start"] + 10 * 256
        live = {c.pid for c in worker_children()}
        assert not live & set(killed_pids)
        assert len(live) == SMALL["num_workers"] + 2
        model.train(model.num_timesteps + 1024)  # the replaced graph pauses and resumes too
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
    with APPO(env, **SMALL) as model:
        model.train(6000)
        assert (tmp_path / "died").exists()
        assert model.logger.worker_restarts == 1
        assert model.num_timesteps >= 6000
    assert worker_children() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("victim", ["learner", "policy-0"])
def test_dead_learner_or_policy_worker_ends_the_run_naming_it(victim):
    model = APPO("CartPole-v1", **SMALL)
    state = {}

    def kill_once(m):
        if m.num_timesteps > 0 and "pid" not in state:
            state["pid"] = children_named(victim)[0].pid
            state["version"] = m.num_timesteps
            os.kill(state["pid"], signal.SIGKILL)

    try:
        with pytest.raises(WorkerError, match=f"{victim} \\(pid {state.get('pid', '')}"):
            model.train(10 ** 8, callback=kill_once, callback_interval=0.1)
        assert model.num_timesteps >= state["version"]  # the last published weights were kept
        assert worker_children() == []
        model.train(model.num_timesteps + 1024)  # and a new graph trains on from them
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
    from asyncrl.runner import JOIN_TIMEOUT, Queues, shutdown_graph
    from asyncrl.config import Config

    procs = [mp.get_context("spawn").Process(target=_stubborn) for _ in range(2)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        shutdown_graph(SharedControl(), procs, [], Queues(Config()))
    assert time.monotonic() - t0 < JOIN_TIMEOUT
    assert procs == [] and worker_children() == []
