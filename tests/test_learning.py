"""The documented default contract: CartPole-v1 solved in 200k env steps with default settings
(300k at most: see the test)."""
import pytest

from asyncrl import APPO


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cartpole_reaches_450_within_300k_steps():
    """Greedy mean return >= 450 over 10 episodes, checked after 200k steps and, if short, after
    100k more: asynchronous sampling is not deterministic, and with 2 workers x 8 envs a few runs
    in 28 end below 450 at 200k (as low as 338), most at 500."""
    with APPO("CartPole-v1", num_workers=2, num_envs_per_worker=8, device="cpu", seed=0,
              verbose=0) as model:
        model.train(200_000)
        assert model.num_timesteps >= 200_000
        mean_return, _ = model.evaluate(10)
        if mean_return < 450:
            model.train(100_000)
            mean_return, _ = model.evaluate(10)
        assert mean_return >= 450, \
            f"mean return {mean_return:.1f} after {model.num_timesteps} steps"