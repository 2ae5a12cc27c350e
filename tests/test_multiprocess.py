"""A real multi-process run: it trains, and every way out of train() (done, a worker's exception,
Ctrl-C) leaves no child process and no shared-memory entry behind."""
import multiprocessing
import multiprocessing.resource_tracker as resource_tracker
import os
import signal
import subprocess
import sys
import threading
import time

import gymnasium as gym
import psutil
import pytest
import torch

import custom_envs
from asyncrl import APPO, WorkerError
from asyncrl.env_utils import time_limit

SMALL = dict(num_workers=2, num_envs_per_worker=4, rollout=16, batch_size=256, minibatch_size=128,
             device="cpu", seed=0, verbose=0)
NUM_COMPONENTS = SMALL["num_workers"] + 2  # rollout-0, rollout-1, policy-0, learner


def multiprocessing_helper(proc: psutil.Process, parent_pid: int) -> bool:
    """Whether ``proc`` is the resource tracker or the fork server multiprocessing started for
    ``parent_pid`` (its direct children; the components forked from the fork server carry its
    command line too, but are its children)."""
    cmdline = " ".join(proc.cmdline())
    return proc.ppid() == parent_pid and ("multiprocessing.resource_tracker" in cmdline
                                          or "multiprocessing.forkserver" in cmdline)


def worker_children():
    """Live descendants of this process, except multiprocessing's resource tracker and fork
    server (each started once, for the life of the interpreter)."""
    tracker_pid = getattr(resource_tracker._resource_tracker, "_pid", None)
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.pid == tracker_pid or multiprocessing_helper(c, os.getpid()):
                continue
        except psutil.NoSuchProcess:
            continue
        out.append(c)
    return out


def shm_entries():
    return set(os.listdir("/dev/shm"))


def shm_inodes_used_by_other_processes():
    """Inodes of the /dev/shm files mapped or held open by a process other than this one. Matched
    by inode, not name: glibc creates a named semaphore under a temporary name and then links it,
    so its creator's maps show the temporary name."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        inodes.add(int(line.split()[4]))
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/dev/shm/"):
                    inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
        except OSError:
            continue
    return inodes


def new_shm_entries(before):
    """Entries of /dev/shm created since ``before`` and not in use by another program running
    beside the tests (this machine may be shared): what this process left behind."""
    others = shm_inodes_used_by_other_processes()
    leftover = set()
    for name in shm_entries() - before:
        try:
            if os.stat(os.path.join("/dev/shm", name)).st_ino not in others:
                leftover.add(name)
        except FileNotFoundError:  # removed meanwhile
            continue
    return leftover


def params(model):
    return [p.detach().clone() for p in model.policy.parameters()]


def changed(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


def test_run_trains_and_shuts_down_cleanly():
    assert worker_children() == []
    shm_before = shm_entries()
    with APPO("CartPole-v1", **SMALL) as model:
        before = params(model)
        model.train(20_000)
        workers = {p.pid for p in worker_children()}
        assert len(workers) == NUM_COMPONENTS  # paused between calls, not gone
        assert model.num_timesteps == 79 * 256  # the smallest multiple of batch_size >= 20_000
        assert model.policy_version == 79
        assert changed(before, model)
        assert model.logger.num_episodes > 0
        # The slots bound the lag: a batch's slots were claimed at most a few versions ago
        # (not the 50 of max_policy_lag, which only masks what a stalled worker sends).
        slots_per_batch = model.config.batch_size // model.config.slot_size
        assert 0 <= model.logger.last_train["policy_lag_max"] <= 2 * model.config.num_slots // slots_per_batch
        # The model goes on training from where it stopped, in the same processes.
        model.train(256)
        assert model.num_timesteps == 80 * 256 and model.policy_version == 80
        assert {p.pid for p in worker_children()} == workers
    assert worker_children() == []
    assert new_shm_entries(shm_before) == set()


def test_a_closed_model_s_workers_close_their_envs_and_run_their_atexit_handlers(tmp_path):
    """Stopping the graph: each rollout worker closes its envs and runs the atexit handlers
    registered in it (a user's clean-up) before its process ends (which skips the
    interpreter's teardown of its modules)."""
    model = APPO(custom_envs.marks_its_end(str(tmp_path)), **SMALL)
    model.train(256)
    workers = {p.pid for p in worker_children() if p.name().startswith("rollout")}
    assert len(workers) == SMALL["num_workers"]
    model.close()
    assert worker_children() == []
    marks = set(os.listdir(tmp_path))
    for pid in workers:
        assert {f"close-{pid}", f"atexit-{pid}"} <= marks, (pid, sorted(marks))


def run_until_exception(model, steps, exc_type, shm_before):
    """train() until it raises ``exc_type``; then what it left behind, as seen from the ``except``
    block that caught it."""
    t0 = time.monotonic()
    error = None
    try:
        model.train(steps)
    except exc_type as exc:
        error = exc
    elapsed = time.monotonic() - t0
    # Looked at while the exception (its traceback, every frame it holds) is still referenced.
    return dict(error_type=type(error), message=str(error), elapsed=elapsed,
                children=worker_children(), new_shm=new_shm_entries(shm_before))


@pytest.fixture(scope="module")
def failed_run():
    """A rollout worker's env raises in step() after a few steps."""
    shm_before = shm_entries()
    with APPO(custom_envs.failing_env, on_env_error="abort", **SMALL) as model:
        yield run_until_exception(model, 10_000_000, WorkerError, shm_before)


def test_env_exception_raises_worker_error_and_cleans_up(failed_run):
    assert failed_run["error_type"] is WorkerError
    msg = failed_run["message"]
    assert "rollout-" in msg
    assert custom_envs.FAIL_MESSAGE in msg and "RuntimeError" in msg  # the env's own traceback
    assert failed_run["elapsed"] < 60, f"the failure took {failed_run['elapsed']:.0f} s to surface"
    assert failed_run["children"] == []
    assert failed_run["new_shm"] == set()


@pytest.fixture(scope="module")
def interrupted_run():
    """train() in the main thread; another thread sends SIGINT to this process once every
    component runs, the learner has published at least once and ~4 s have passed."""
    shm_before = shm_entries()
    model = APPO("CartPole-v1", **SMALL)
    initial = params(model)
    running, sent = threading.Event(), threading.Event()

    def interrupt():
        start = time.monotonic()
        while running.is_set() and time.monotonic() - start < 60:
            ready = len(worker_children()) >= NUM_COMPONENTS and model.logger.last_train
            if ready and time.monotonic() - start >= 4.0:
                break
            time.sleep(0.2)
        if running.is_set():
            sent.set()
            os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=interrupt, daemon=True)
    running.set()
    sender.start()
    try:
        out = run_until_exception(model, 100_000_000, KeyboardInterrupt, shm_before)
    finally:
        running.clear()
    sender.join(timeout=5)
    out.update(model=model, sent=sent.is_set(), weights_changed=changed(initial, model))
    yield out
    model.close()


def test_ctrl_c_propagates_and_cleans_up(interrupted_run):
    assert interrupted_run["sent"], "train() ended before the interrupt was sent"
    assert interrupted_run["error_type"] is KeyboardInterrupt
    assert interrupted_run["elapsed"] < 90
    assert interrupted_run["children"] == []
    assert interrupted_run["new_shm"] == set()
    # What the learner had published is kept in the model.
    assert interrupted_run["weights_changed"]


def test_ctrl_c_keeps_counters_consistent_with_weights(interrupted_run):
    """The weights kept after Ctrl-C come with the env steps and version they were trained to."""
    model = interrupted_run["model"]
    assert interrupted_run["weights_changed"]
    assert os.path.exists(model.trainees[model.policy_id].files.optimizer)  # the stopped learner saved Adam's state
    assert model.num_timesteps > 0
    assert model.num_timesteps % model.config.batch_size == 0
    assert model.policy_version == model.num_timesteps // model.config.batch_size
    before, steps = params(model), model.num_timesteps
    model.train(256)  # and training goes on from there
    assert model.num_timesteps == steps + 256
    assert model.policy_version == model.num_timesteps // model.config.batch_size
    assert changed(before, model)
    model.close()


def test_short_dev_shm_fails_early_with_what_is_missing(monkeypatch):
    import collections
    import shutil
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 1024, 1024))
    from asyncrl import ConfigError
    before = {p.pid for p in worker_children()}
    with APPO("CartPole-v1", **SMALL) as model:
        with pytest.raises(ConfigError, match=r"need 0\.\d MiB of shared memory but /dev/shm has 0\.0 MiB "
                                              r"free \(missing 0\.\d MiB.*--shm-size"):
            model.train(256)
        assert {p.pid for p in worker_children()} == before  # nothing was started


def test_sampler_nice_lowers_the_priority_of_sampling_only():
    """sampler_nice: rollout and policy workers run that much nicer than the main process, the
    learner as nice as it."""
    base = psutil.Process().nice()
    if base + 3 > 19:
        pytest.skip("this process is already too nice")
    with APPO("CartPole-v1", sampler_nice=3, **SMALL) as model:
        model.train(2_000)
        nice = {c.name(): c.nice() for c in worker_children()}
    assert nice == {"rollout-0": base + 3, "rollout-1": base + 3, "policy-0": base + 3,
                    "learner": base}, nice


EARLY_PROBE = """
import multiprocessing as mp, time
from multiprocessing import forkserver
import psutil
import asyncrl

def torch_loaded(pid):  # the fork server imports torch in the background, before it serves
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any("torch" in m.path for m in psutil.Process(pid).memory_maps()):
            return True
        time.sleep(0.05)
    return False

def child(q):
    import asyncrl  # a process multiprocessing started: starts no fork server of its own
    q.put(forkserver._forkserver._forkserver_pid is None)

if __name__ == "__main__":
    pid = forkserver._forkserver._forkserver_pid
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=child, args=(q,))
    p.start()
    print(pid is not None and torch_loaded(pid), q.get(timeout=60))
    p.join()
"""


@pytest.mark.timeout(240)
@pytest.mark.skipif("forkserver" not in multiprocessing.get_all_start_methods(),
                    reason="no fork server on this platform")
def test_importing_asyncrl_starts_the_fork_server_in_the_main_process_only(tmp_path):
    """The fork server imports torch while the main process does (a first train() forks its
    components at once); a child process importing asyncrl starts none, nor does the main
    process with ASYNCRL_NO_EARLY_FORK_SERVER set; nothing is left once the interpreter ends."""
    script = tmp_path / "probe.py"
    script.write_text(EARLY_PROBE)
    # marked, so that another asyncrl run on the machine (its components are forks of a fork
    # server too) is not taken for the probes' leftovers
    mark = f"probe-{os.getpid()}-{time.monotonic_ns()}"
    env = {k: v for k, v in os.environ.items() if k != "ASYNCRL_NO_EARLY_FORK_SERVER"}
    env["ASYNCRL_TEST_PROBE"] = mark

    def probes(p: psutil.Process) -> bool:
        try:
            return p.environ().get("ASYNCRL_TEST_PROBE") == mark
        except psutil.Error:
            return False
    before = {p.pid for p in psutil.process_iter()}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=110, cwd=tmp_path)
    assert out.stdout.split() == ["True", "True"], out.stderr
    out = subprocess.run([sys.executable, str(script)], env={**env, "ASYNCRL_NO_EARLY_FORK_SERVER": "1"},
                         capture_output=True, text=True, timeout=110, cwd=tmp_path)
    assert out.stdout.split() == ["False", "True"], out.stderr
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the fork servers end with their interpreters
        left = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before and
                "multiprocessing.forkserver" in " ".join(p.info["cmdline"] or []) and probes(p)]
        if not left:
            break
        time.sleep(0.1)
    assert not left


@pytest.mark.timeout(120)
@pytest.mark.parametrize("spread", [True, False])
def test_envs_with_a_time_limit_start_spread_over_it(tmp_path, spread):
    """Every episode runs to the limit: env k of N cuts its first episode at (k + 1) / N of the
    limit (the last one plays it whole), so the envs do not stay in step; the cut episodes are
    not logged. Off, every env plays whole episodes from the start, in step."""
    limit, n = 40, SMALL["num_workers"] * SMALL["num_envs_per_worker"]
    out = tmp_path / "lengths"
    out.mkdir()
    with APPO(custom_envs.records_episode_lengths(str(out), limit), spread_first_episodes=spread,
              **SMALL) as model:
        assert model.config.spread_first_episodes is spread
        model.train(2_000)
        episodes = model.logger.num_episodes
        assert episodes > 0 and model.logger.ep_rew_mean == limit  # only whole episodes
    played = [[int(x) for x in p.read_text().split()] for p in out.iterdir()]
    played = [lengths for lengths in played if lengths]  # not the main process's probe
    assert len(played) == n
    firsts = sorted(lengths[0] for lengths in played)
    want = [-(-limit * (k + 1) // n) for k in range(n)] if spread else [limit] * n
    assert firsts == want
    assert all(length == limit for lengths in played for length in lengths[1:])


def test_the_time_limit_read_from_the_spec_or_the_wrapper():
    assert time_limit(gym.make("Pendulum-v1")) == 200
    assert time_limit(gym.wrappers.TimeLimit(gym.make("Pendulum-v1").unwrapped, 7)) == 7
    assert time_limit(gym.make("Pendulum-v1").unwrapped) is None
