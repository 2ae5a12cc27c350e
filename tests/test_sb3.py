"""Stable-Baselines3's own tools accept APPO, and a PBT loop written for SB3's PPO runs on it
unchanged."""
import tempfile

import numpy as np
import pytest

from asyncrl import APPO

sb3 = pytest.importorskip("stable_baselines3")
from stable_baselines3.common.callbacks import BaseCallback, EvalCallback  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

SERIAL = dict(serial_mode=True, num_workers=1, num_envs_per_worker=2, rollout=16, batch_size=128,
              minibatch_size=64, device="cpu", verbose=0)
SMALL = dict(num_workers=2, num_envs_per_worker=4, rollout=16, batch_size=256, minibatch_size=128,
             device="cpu", verbose=0)


def test_evaluate_policy_accepts_model_and_get_env():
    with APPO("CartPole-v1", seed=0, **SERIAL) as model:
        model.learn(1024)
        rewards, lengths = evaluate_policy(model, model.get_env(), n_eval_episodes=5,
                                           return_episode_rewards=True)
        assert len(rewards) == len(lengths) == 5
        assert rewards == [float(n) for n in lengths]  # CartPole: +1 per step, raw returns
        assert all(1 <= r <= 500 for r in rewards)


class CountingCallback(BaseCallback):
    def __init__(self, stop_after_calls=None):
        super().__init__()
        self.stop_after_calls, self.events = stop_after_calls, []

    def _on_training_start(self):
        self.events.append("start")

    def _on_rollout_end(self):
        self.events.append("rollout_end")

    def _on_step(self):
        self.logger.record("custom/n_calls", self.n_calls)
        return self.stop_after_calls is None or self.n_calls < self.stop_after_calls

    def _on_training_end(self):
        self.events.append("end")


def test_learn_drives_sb3_callbacks_like_sb3():
    with APPO("CartPole-v1", seed=0, **SERIAL) as model:
        cb = CountingCallback()
        model.learn(1024, callback=cb)
        num_envs = 2
        assert cb.n_calls == model.num_timesteps // num_envs  # one call per vectorised step
        assert cb.events[0] == "start" and cb.events[-1] == "end" and "rollout_end" in cb.events
        assert cb.num_timesteps == model.num_timesteps == 1024
        stopper = CountingCallback(stop_after_calls=100)
        model.learn(100_000, callback=[stopper])  # a list, as SB3 accepts; False stops early
        assert stopper.n_calls == 100 and model.num_timesteps < 100_000


def test_eval_callback_runs_on_appo(tmp_path):
    with APPO("CartPole-v1", seed=0, **SERIAL) as model:
        cb = EvalCallback(model.get_env(), n_eval_episodes=2, eval_freq=128, verbose=0,
                          log_path=str(tmp_path))
        model.learn(1024, callback=cb)
        assert cb.n_calls == 512 and len(cb.evaluations_results) == 512 // 128
        assert np.isfinite(cb.last_mean_reward)
        # the model's count when the callback ran (the learner trains whole batches meanwhile)
        timesteps = np.load(tmp_path / "evaluations.npz")["timesteps"]
        assert len(timesteps) == 4 and np.all(np.diff(timesteps) >= 0) and timesteps[-1] == 1024


def test_learn_counts_timesteps_as_sb3():
    with APPO("CartPole-v1", seed=0, **SERIAL) as model:
        model.learn(256)
        model.learn(256, reset_num_timesteps=False)
        assert model.num_timesteps == 512
        model.learn(256)  # SB3's default restarts the count
        assert model.num_timesteps == 256


def test_progress_bar(capsys):
    with APPO("CartPole-v1", seed=0, **SERIAL) as model:
        model.learn(512, progress_bar=True)
    err = capsys.readouterr().err
    assert "asyncrl" in err and "512/512" in err


def sb3_style_pbt(make_model, generations=2, steps=512):
    """A PBT loop as one would write it for SB3's PPO: learn, rank by evaluate_policy, copy the
    best member's parameters into the worst and perturb its hyper-parameters."""
    members = [make_model(seed) for seed in range(2)]
    history = []
    for _ in range(generations):
        scores = []
        for m in members:
            m.learn(steps, reset_num_timesteps=False)
            scores.append(evaluate_policy(m, m.get_env(), n_eval_episodes=2)[0])
        order = np.argsort(scores, kind="stable")
        worst, best = members[order[0]], members[order[-1]]
        worst.set_parameters(best.get_parameters())
        lr = best.learning_rate if not callable(best.learning_rate) else best.learning_rate(1.0)
        worst.learning_rate = lr * 0.8
        worst.lr_schedule = lambda _, lr=lr * 0.8: lr
        worst.ent_coef = best.ent_coef * 1.2
        worst.clip_range = lambda _: 0.25
        history.append(scores)
    return members, history


def test_pbt_loop_written_for_sb3_runs_unchanged_on_appo(tmp_path, monkeypatch):
    from stable_baselines3 import PPO
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # SB3's logger leaves /tmp/SB3-* dirs
    sb3_members, _ = sb3_style_pbt(  # the loop is valid SB3 code ...
        lambda seed: PPO("MlpPolicy", "CartPole-v1", n_steps=128, batch_size=64, n_epochs=1,
                         seed=seed, device="cpu"))
    members, history = sb3_style_pbt(  # ... and APPO's (serial: the loop, not the graph, is tested)
        lambda seed: APPO("CartPole-v1", seed=seed, **dict(SMALL, serial_mode=True)))
    try:
        assert len(history) == 2 and all(len(s) == 2 for s in history)
        assert all(m.num_timesteps == 2 * 512 for m in members)
        changed = [m for m in members if callable(m.clip_range)]
        assert changed
        for m in changed:  # the exploited member trains on with its new hyper-parameters
            m.learn(256, reset_num_timesteps=False)
            assert m.logger.last_train["clip_range"] == 0.25
            assert m.logger.last_train["learning_rate"] == pytest.approx(m.config.learning_rate)
    finally:
        for m in members:
            m.close()
        for m in sb3_members:
            m.env.close()
