"""The whole graph in serial mode (every component stepped in turn in this process) on CartPole."""
import math

import pytest
import torch

from asyncrl import APPO

TINY = dict(num_workers=1, num_envs_per_worker=4, rollout=16, minibatch_size=64, serial_mode=True,
            device="cpu", seed=0, verbose=0)


def params(model):
    return [p.detach().clone() for p in model.policy.parameters()]


def changed(before, model):
    return any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))


@pytest.fixture
def model():
    with APPO("CartPole-v1", batch_size=128, **TINY) as m:
        yield m


def test_train_counts_whole_batches_and_updates_weights(model):
    before = params(model)
    assert model.num_timesteps == 0 and model.policy_version == 0
    assert model.train(2000) is model
    assert model.num_timesteps == 2048  # the smallest multiple of batch_size >= 2000
    assert model.policy_version == 2048 // 128  # one published version per update
    assert changed(before, model)
    stats = model.logger.last_train
    for key in ("policy_loss", "value_loss", "approx_kl", "policy_lag_max"):
        assert math.isfinite(stats[key]), key
    assert model.logger.num_episodes > 0


def test_second_train_call_continues(model):
    model.train(256)
    assert (model.num_timesteps, model.policy_version) == (256, 2)
    before = params(model)
    model.train(100)
    assert (model.num_timesteps, model.policy_version) == (384, 3)
    assert changed(before, model)


def test_same_seed_same_weights():
    """Serial mode is reproducible: one process, seeded envs, seeded sampling."""
    results = []
    for _ in range(2):
        with APPO("CartPole-v1", batch_size=128, **TINY) as m:
            m.train(512)
            results.append(params(m))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_impala_runs_serial():
    with APPO("CartPole-v1", algo="impala", batch_size=128, **TINY) as m:
        before = params(m)
        m.train(1024)
        assert m.config.num_epochs == 1
        assert m.num_timesteps == 1024 and m.policy_version == 8
        assert changed(before, m)
        assert m.logger.last_train["clip_fraction"] == 0.0  # no ratio clipping in IMPALA


def test_ppo_runs_serial_with_zero_policy_lag():
    kw = dict(TINY, minibatch_size=32)
    with APPO("CartPole-v1", algo="ppo", **kw) as m:
        assert m.config.batch_size == 1 * 4 * 16
        before = params(m)
        m.train(1024)
        assert m.num_timesteps == 1024 and m.policy_version == 1024 // 64
        assert changed(before, m)
        # Synchronous collection: every sample of every batch came from the latest policy.
        assert m.logger.last_train["policy_lag_max"] == 0
        assert m.logger.last_train["masked_fraction"] == 0.0


def test_tensorboard_scalars_under_sb3_names(tmp_path):
    with APPO("CartPole-v1", batch_size=128, tensorboard_log=str(tmp_path), log_interval=0.01,
              **TINY) as m:
        m.train(1024)
    run_dirs = sorted(p.name for p in tmp_path.iterdir())
    assert run_dirs == ["APPO_1"]
    data = b"".join(f.read_bytes() for f in (tmp_path / "APPO_1").iterdir())
    for tag in (b"rollout/ep_rew_mean", b"time/fps", b"train/policy_loss", b"train/value_loss",
                b"train/entropy_loss", b"train/approx_kl", b"train/clip_fraction",
                b"train/explained_variance", b"train/learning_rate", b"train/policy_lag_mean",
                b"train/policy_lag_max"):
        assert tag in data, tag


def test_logged_return_spans_lives_until_game_over():
    import custom_envs
    with APPO(custom_envs.three_lives_env, num_workers=1, num_envs_per_worker=2, rollout=16,
              batch_size=16, minibatch_size=16, serial_mode=True, seed=0, verbose=0) as m:
        m.train(400)
        assert m.logger.num_episodes > 0
        assert set(m.logger.ep_returns) == {30.0} and set(m.logger.ep_lengths) == {30}
