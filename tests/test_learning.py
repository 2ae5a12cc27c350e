"""The documented default contract: CartPole-v1 solved in 200k env steps with default settings
(300k at most: see the test)."""
import pytest

from asyncrl import APPO


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cartpole_reaches_450_within_200k_steps():
    """Greedy mean return >= 450 over 10 episodes, checked after 120k steps and, if short, after
    80k more: asynchronous sampling is not deterministic (the learning suite's seeds 0-2 with
    the defaults: 500 at 100k, the training return past 475 at 83k-98k)."""
    with APPO("CartPole-v1", num_workers=2, num_envs_per_worker=8, device="cpu", seed=0,
              verbose=0) as model:
        model.train(120_000)
        assert model.num_timesteps >= 120_000
        mean_return, _ = model.evaluate(10)
        if mean_return < 450:
            model.train(80_000)
            mean_return, _ = model.evaluate(10)
        assert mean_return >= 450, \
            f"mean return {mean_return:.1f} after {model.num_timesteps} steps"