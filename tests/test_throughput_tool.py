"""benchmarks/throughput.py, the throughput tool for any env: its parts that need no long run."""
import os
import subprocess
import sys
import uuid

import psutil
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
throughput = pytest.importorskip("throughput")
import _common  # noqa: E402  (beside throughput, in benchmarks/)

import custom_envs  # noqa: E402

LOG_LINE = "[2026-11-24 07:00:{:02d},000][1] Fps is (10 sec: 1.0). Total num frames: {}."


def sf_log(readings):
    """A Sample Factory log: its first line, then (second, frame counter) readings."""
    return "\n".join(["[2026-11-24 07:00:00,000][1] start"]
                     + [LOG_LINE.format(t, n) for t, n in readings])


def test_sample_factory_rate_is_read_after_the_warm_up_between_counter_moves():
    # a synchronous SF counts 8,192 frames at a time; the window runs between readings at which
    # the counter had just moved, after the warm-up (the reading at 31 s moved before it ended)
    log = sf_log([(31, 8192), (36, 16384), (41, 16384), (46, 24576), (51, 24576), (56, 32768)])
    assert throughput.steady_rate_from_log(log, seconds=30, warmup=32) == pytest.approx(16384 / 20)


def test_a_run_too_short_for_a_steady_rate_is_an_error_that_says_what_to_raise():
    """The issue's case: --seconds 45 --warmup 20 printed nan for Sample Factory."""
    log = sf_log([(26, 8192), (31, 8192), (36, 16384)])
    with pytest.raises(throughput.BenchmarkError, match=r"moved 1 time.*Raise --seconds \(now 45"):
        throughput.steady_rate_from_log(log, seconds=45, warmup=20)
    with pytest.raises(throughput.BenchmarkError, match="0 readings"):
        throughput.steady_rate_from_log("[2026-11-24 07:00:00,000][1] start", 60, 30)


def test_sf_is_refused_for_an_env_without_an_example_and_variants_must_be_field_value():
    with pytest.raises(throughput.BenchmarkError, match="no Sample Factory example.*CartPole-v1"):
        throughput.main(["--env", "Acrobot-v1", "--sf"])
    with pytest.raises(throughput.BenchmarkError, match="'use_rnn' is not field=value"):
        throughput.main(["--variant", "use_rnn"])
    assert _common.parse_variant("use_rnn=True, rnn_size=64,cnn=tiny") == {
        "use_rnn": True, "rnn_size": 64, "cnn": "tiny"}


def test_a_dotted_variant_sets_one_key_of_a_dict_argument_and_keeps_the_others():
    over = _common.parse_variant("policy_kwargs.log_std_init=0.0,policy_kwargs.ortho_init=False,"
                                 "num_epochs=10")
    assert over == {"policy_kwargs": {"log_std_init": 0.0, "ortho_init": False}, "num_epochs": 10}
    base = {"policy_kwargs": {"net_arch": [64, 64], "log_std_init": -0.5}, "num_epochs": 4}
    assert _common.merged(base, over) == {
        "policy_kwargs": {"net_arch": [64, 64], "log_std_init": 0.0, "ortho_init": False},
        "num_epochs": 10}
    assert base["policy_kwargs"]["log_std_init"] == -0.5  # the run's own dict is not changed
    # a comma inside brackets or quotes is its value's: tuples, lists and dicts, as RL Zoo writes
    assert _common.parse_variant("hidden_sizes=(256, 256),policy_kwargs.net_arch={'pi': [256, 256],"
                                 " 'vf': [256]},cnn='a,b'") == {
        "hidden_sizes": (256, 256), "policy_kwargs": {"net_arch": {"pi": [256, 256], "vf": [256]}},
        "cnn": "a,b"}
    for bad in ("policy_kwargs.=1", ".x=1", "num_epochs=4,num_epochs.x=1", "x.k=1,x=2",
                "hidden_sizes=(256, 256", "hidden_sizes=[256, 256)", "cnn='a"):
        with pytest.raises(ValueError, match="--variant"):
            _common.parse_variant(bad)


def test_env_argument_is_an_id_or_a_module_factory():
    assert throughput.resolve_env("CartPole-v1") == "CartPole-v1"
    assert throughput.resolve_env("space_envs:copy_env").__name__ == "copy_env"
    # Gymnasium's module:EnvId (the module has no such attribute): left to APPO as an id
    assert throughput.resolve_env("space_envs:NoSuch-v0") == "space_envs:NoSuch-v0"
    with pytest.raises(throughput.BenchmarkError, match="cannot import"):
        throughput.resolve_env("no_such_module_xyz:env")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flags", [{}, {"use_rnn": True, "rnn_size": 16, "algo": "ppo"}])
def test_stage_costs_of_a_dict_observation_env(flags):
    """Each stage's cost is measured on the env's own spaces (a Dict, a recurrent core)."""
    costs = throughput.stage_costs(custom_envs.dict_obs_env, {}, {
        "rollout": 8, "batch_size": 64, "minibatch_size": 32, "num_envs_per_worker": 4, **flags})
    assert set(costs) == {"env", "inference", "learning"}
    assert all(0 < v < 0.1 for v in costs.values()), costs


def test_sample_factory_greedy_returns_are_read_back_from_enjoys_running_means():
    # what enjoy logs after each of 5 CartPole episodes (colour codes included): running means
    means = ["500.000", "406.000", "359.667", "325.000", "293.600"]
    log = "\n".join(f"\x1b[37m[2026-12-02 03:16:27,022][02015] Avg episode rewards: #0: {m}, true "
                    f"rewards: #0: {m}\n[2026-12-02 03:16:27,022][02015] Avg episode reward: {m}, avg "
                    f"true_objective: {m}\x1b[0m\n[2026-12-02 03:16:27,068][02015] Num frames 600..."
                    for m in means)
    assert _common.sf_enjoy_returns(log) == pytest.approx([500, 312, 267, 221, 168], abs=0.01)
    assert _common.sf_enjoy_returns("[2026-12-02 03:16:27,022][1] start") == []
    # its means are over the last 100 episodes: more cannot be read back, refused before a run
    with pytest.raises(ValueError, match="at most 100 episodes"):
        _common.sample_factory("sf_examples.train_gym_env", [], 1000, 0, eval_episodes=101)


@pytest.mark.timeout(60)
def test_ending_sample_factorys_session_removes_its_dead_vizdoom_games_files_only():
    """A killed Sample Factory leaves its VizDoom games' /dev/shm files (their engines die with
    it): ending its session removes those, not files there before nor those of a live engine."""
    tag = uuid.uuid4().hex[:10]
    older, dead, live = (f"ViZDoomMQCtr{tag}old", f"ViZDoomSM{tag}dead", f"ViZDoomMQDoom{tag}live")
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                               "+viz_instance_id", f"{tag}live"])
    paths = [os.path.join("/dev/shm", n) for n in (older, dead, live)]
    try:
        open(paths[0], "w").close()
        before = set(os.listdir("/dev/shm"))
        session = subprocess.Popen(["sleep", "60"], start_new_session=True)
        for p in paths[1:]:
            open(p, "w").close()
        _common.end_sf_session(session.pid, before)
        session.wait(timeout=10)  # reaped already by the kill's wait: its status is not kept
        assert not psutil.pid_exists(session.pid)
        assert [os.path.exists(p) for p in paths] == [True, False, True]
    finally:
        engine.kill()
        engine.wait()
        for p in paths:
            if os.path.exists(p):
                os.remove(p)
