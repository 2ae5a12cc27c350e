"""Worker processes stay alive, paused, between train() calls; hyper-parameters assigned on the
model reach the running learner; close(), garbage collection and interpreter exit stop them."""
import functools
import gc
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import custom_envs
from asyncrl import APPO, ConfigError
from test_multiprocess import NUM_COMPONENTS, SMALL, worker_children

pytestmark = pytest.mark.timeout(180)


def test_second_call_resumes_the_same_processes_within_a_second(tmp_path):
    env = functools.partial(custom_envs.StampedCartPole, str(tmp_path))
    with APPO(env, **SMALL) as model:
        model.train(2048)
        pids = {p.pid for p in worker_children()}
        assert len(pids) == NUM_COMPONENTS
        time.sleep(1.0)  # paused: no env steps
        paused_stamps = custom_envs.read_stamps(str(tmp_path))
        time.sleep(0.5)
        np.testing.assert_array_equal(custom_envs.read_stamps(str(tmp_path)), paused_stamps)
        t_call = time.time()
        model.train(2048)
        stamps = custom_envs.read_stamps(str(tmp_path))
        first_new_step = stamps[:, 1][stamps[:, 1] > t_call].min()
        assert first_new_step - t_call < 1.0, f"{first_new_step - t_call:.3f} s to the first step"
        assert {p.pid for p in worker_children()} == pids


def test_assigned_hyperparameters_reach_the_running_learner():
    with APPO("CartPole-v1", **SMALL) as model:
        model.train(512)
        pids = {p.pid for p in worker_children()}
        model.learning_rate, model.ent_coef, model.gamma = 3e-4, 0.02, 0.95
        model.clip_range = 0.3  # SB3's name for clip_coef
        model.train(512)
        last = model.logger.last_train
        assert (last["learning_rate"], last["ent_coef"], last["gamma"], last["clip_range"]) == \
            (3e-4, 0.02, 0.95, 0.3)
        assert model.config.clip_coef == 0.3 and model.config.learning_rate == 3e-4
        assert {p.pid for p in worker_children()} == pids  # nothing restarted


def test_learning_rate_schedule_follows_progress_remaining():
    """SB3's linear schedule falls to exactly 0 where the run ends: the run ends normally."""
    seen = []
    with APPO("CartPole-v1", learning_rate=lambda p: 1e-3 * p, **SMALL) as model:
        model.train(4096, callback=lambda m: seen.append(m.logger.last_train.get("learning_rate")),
                    callback_interval=0.05)
        lrs = [x for x in seen if x is not None]
        assert lrs and lrs[-1] < lrs[0] <= 1e-3  # annealed while training
        assert model.config.learning_rate < 1e-3


def test_bad_assigned_hyperparameter_is_rejected_before_anything_runs():
    """Rejected where it is assigned (before: at the next train()), and not kept."""
    with APPO("CartPole-v1", **SMALL) as model:
        with pytest.raises(ConfigError, match=r"learning_rate=-1.0: must be a number >= 0"):
            model.learning_rate = -1.0
        assert model.learning_rate != -1.0 and worker_children() == []
        model.learning_rate = 1e-3
        model.train(256)  # fixed: trains
        assert model.num_timesteps == 256


def test_structural_config_change_restarts_the_graph():
    with APPO("CartPole-v1", **SMALL) as model:
        model.train(256)
        pids = {p.pid for p in worker_children()}
        model.config = model.config.replace(num_workers=1, batch_size=128)
        model.train(128)
        now = {p.pid for p in worker_children()}
        assert len(now) == NUM_COMPONENTS - 1 and not now & pids


def test_garbage_collection_stops_the_workers():
    model = APPO("CartPole-v1", **SMALL)
    model.train(256)
    assert len(worker_children()) == NUM_COMPONENTS
    del model
    gc.collect()
    assert worker_children() == []


def test_interpreter_exit_stops_the_workers(tmp_path):
    script = textwrap.dedent("""
        import psutil
        from asyncrl import APPO
        model = APPO("CartPole-v1", num_workers=2, num_envs_per_worker=4, rollout=16,
                     batch_size=256, minibatch_size=128, device="cpu", verbose=0)
        model.train(256)
        print(" ".join(str(c.pid) for c in psutil.Process().children(recursive=True)), flush=True)
        # no close(): the interpreter exits with the workers paused
    """)
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 60
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) >= NUM_COMPONENTS
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_closed_model_trains_again_in_new_processes():
    model = APPO("CartPole-v1", **SMALL)
    try:
        model.train(256)
        old = {p.pid for p in worker_children()}
        model.close()
        assert worker_children() == []
        model.train(256)
        assert model.num_timesteps == 512
        assert not {p.pid for p in worker_children()} & old
    finally:
        model.close()
    assert worker_children() == []
    assert os.path.isdir(model._tmpdir)  # close() keeps the optimizer state for later calls


BIG_OBS_ENV = """
import gymnasium as gym, numpy as np
class BigObs(gym.Env):  # an Atari-sized Box: its bounds alone make a worker's task > 64 KiB
    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(2)
    def reset(self, *, seed=None, options=None):
        return np.zeros((4, 84, 84), np.uint8), {}
    def step(self, action):
        return np.zeros((4, 84, 84), np.uint8), 0.0, False, False, {}
"""


@pytest.mark.parametrize("env", ["'CartPole-v1'", "BigObs"])
def test_script_without_main_guard_fails_before_any_worker_starts(tmp_path, env):
    """A script that trains at its top level: spawned workers would run it again. With a large
    observation space the parent used to hang for good (writing a worker's task into the pipe of
    a child that had died of it); now it fails at once, naming the line, and starts nothing."""
    script = tmp_path / "train.py"
    script.write_text("from asyncrl import APPO\n" + (BIG_OBS_ENV if env == "BigObs" else "")
                      + f"model = APPO({env}, num_workers=1, device='cpu', verbose=0)\n"
                      "model.train(1024)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.returncode != 0
    last = out.stderr.splitlines()[-1]
    assert 'if __name__ == "__main__":' in last and f"{script} (line" in last
    assert "exited unexpectedly" not in out.stderr and "bootstrapping phase" not in out.stderr


def run_guarded_script(tmp_path, before_training: str = "") -> None:
    """A script that trains under ``if __name__ == "__main__":``, ``before_training`` (lines of
    four-space-indented code) run first in its main(); it must train its 512 steps."""
    script = tmp_path / "train.py"
    script.write_text("import time\n"
                      "from asyncrl import APPO\n"
                      "def main():\n"
                      + before_training +
                      "    with APPO('CartPole-v1', num_workers=1, device='cpu', verbose=0) as m:\n"
                      "        m.train(512)\n"
                      "    print('trained', m.num_timesteps)\n"
                      "if __name__ == '__main__':\n"
                      "    main()\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip().splitlines()[-1].split()[1]) >= 512


def test_script_with_main_guard_trains(tmp_path):
    run_guarded_script(tmp_path)


def test_script_edited_while_running_still_trains(tmp_path):
    """The guard check reads the script from disk: one edited since it started (lines moved, as
    when a user edits a running experiment) is not judged by lines that are not the ones running."""
    run_guarded_script(tmp_path, "    time.sleep(1.5)\n"
                                 "    src = open(__file__).read()\n"
                                 "    open(__file__, 'w').write('\\n' * 40 + src)\n")


def test_callback_stop_then_train_again():
    """A callback stop in the middle of training leaves a graph that trains on (the learner
    finishes its update before pausing)."""
    with APPO("CartPole-v1", **SMALL) as model:
        model.train(10 ** 7, callback=lambda m: False if m.num_timesteps else None,
                    callback_interval=0.05)
        steps = model.num_timesteps
        assert 0 < steps < 10 ** 7 and steps % 256 == 0
        model.train(512)
        assert model.num_timesteps == steps + 512 and model.policy_version == model.num_timesteps // 256


def test_first_call_from_a_thread_that_then_exits():
    import threading
    with APPO("CartPole-v1", **SMALL) as model:
        t = threading.Thread(target=model.train, args=(512,))
        t.start()
        t.join()
        time.sleep(0.5)
        assert len(worker_children()) == NUM_COMPONENTS  # the thread's end killed nobody
        model.train(512)
        assert model.num_timesteps == 1024


def test_long_callback_at_the_end_is_not_a_stall():
    # The timeout is short for the callback to outlast it, and not shorter: the rollout workers'
    # clock starts with them, so the learner's start-up and first update count (over 2 s seen
    # on a slow machine). Started first, so the long callback comes at the end of a warm run.
    with APPO("CartPole-v1", worker_timeout=5.0, **SMALL) as model:
        model.train(256)
        model.train(1024, callback=lambda m: time.sleep(6.0), callback_interval=0.01)
        model.train(256)
        assert model.num_timesteps == 1536


def test_set_parameters_inside_a_callback_is_refused():
    with APPO("CartPole-v1", **SMALL) as model:
        seen = []

        def callback(m):
            try:
                m.set_parameters(m.get_parameters())
            except RuntimeError as e:
                seen.append(str(e))
            return False
        model.train(10 ** 6, callback=callback, callback_interval=0.05)
        assert seen and "between train() calls" in seen[0]


def test_deleting_the_model_stops_the_workers_without_gc():
    model = APPO("CartPole-v1", **SMALL)
    model.train(256)
    assert len(worker_children()) == NUM_COMPONENTS
    gc.disable()
    try:
        del model
        assert worker_children() == []
    finally:
        gc.enable()
