"""The documented default contract: CartPole-v1 solved in 200k env steps with default settings."""
import pytest

from asyncrl import APPO


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_cartpole_reaches_450_in_200k_steps():
    with APPO("CartPole-v1", num_workers=2, num_envs_per_worker=8, device="cpu", seed=0,
              verbose=0) as model:
        model.train(200_000)
        assert model.num_timesteps >= 200_000
        mean_return, _ = model.evaluate(10)
        assert mean_return >= 450, \
            f"mean return {mean_return:.1f} after {model.num_timesteps} steps"
