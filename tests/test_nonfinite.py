"""NaN/Inf: skipped updates, an abort after several in a row, never published or saved; a
non-finite reward from an env is reported naming the env."""
import pytest
import torch

import custom_envs
from asyncrl import APPO, WorkerError
from asyncrl.buffers import SharedControl, SharedWeights
from test_learner import make_learner, on_policy_batch


def unpaused_learner(**overrides):
    learner = make_learner(minibatch_size=5, batch_size=15, rollout=5, num_envs_per_worker=6,
                           **overrides)
    learner.ctl = SharedControl()
    learner.version = 0
    learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=1e-3)
    return learner


def test_nonfinite_steps_are_skipped_then_abort():
    learner = unpaused_learner(max_nonfinite_updates=6)
    before = [p.detach().clone() for p in learner.model.parameters()]
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=False)
    bad = batch._replace(rewards=torch.full_like(batch.rewards, float("nan")))
    learner.cfg = learner.cfg.replace(num_epochs=1)  # 3 minibatch steps per batch
    stats = learner.train_on(bad)
    assert stats["nonfinite_skipped"] == 3 and learner.nonfinite_in_a_row == 3
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    assert learner.train_on(batch)["nonfinite_skipped"] == 0  # a finite batch resets the count
    assert learner.nonfinite_in_a_row == 0
    learner.train_on(bad)
    with pytest.raises(FloatingPointError, match="6 minibatch steps in a row"):
        learner.train_on(bad)
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())


def test_nonfinite_weights_are_never_published_or_saved(tmp_path):
    with APPO("CartPole-v1", serial_mode=True, device="cpu", verbose=0) as model:
        weights = SharedWeights(model.policy)
        with torch.no_grad():
            next(model.policy.parameters())[0, 0] = float("inf")
        with pytest.raises(FloatingPointError, match="non-finite weights"):
            weights.publish(model.policy, 1, 0)
        assert torch.isfinite(weights.flat).all()
        with pytest.raises(FloatingPointError, match="non-finite weights"):
            model.save(tmp_path / "m.pt")
        assert not (tmp_path / "m.pt").exists()


def test_nonfinite_reward_from_an_env_names_it():
    with APPO(custom_envs.nan_reward_env, num_workers=1, num_envs_per_worker=2, rollout=16,
              batch_size=32, minibatch_size=32, device="cpu", verbose=0) as model:
        with pytest.raises(WorkerError, match=r"env \d+ \(rollout-0, group \d, env \d: .*NaNRewardCartPole.*\) returned a non-finite reward nan"):
            model.train(100_000)
