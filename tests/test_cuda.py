"""The engine on a GPU: policy workers and learners on CUDA (pinned staging buffers, weights
shared through CPU memory), checkpoints that load on a machine without one. Skipped where torch
sees no CUDA device (CI); run on a GPU machine with `pytest tests/test_cuda.py`."""
import numpy as np
import pytest
import torch

from asyncrl import APPO

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.timeout(240)
def test_cartpole_learns_on_cuda_and_loads_on_cpu(tmp_path):
    with APPO("CartPole-v1", device="cuda", seed=0, verbose=0) as model:
        assert model.device == "cuda"
        model.train(120_000)
        mean_return, _ = model.evaluate(10)
        if mean_return < 450:
            model.train(80_000)
            mean_return, _ = model.evaluate(10)
        assert mean_return >= 450, f"{mean_return:.1f} after {model.num_timesteps} steps"
        params = model.get_parameters()  # copies on the CPU, whatever the device
        assert all(t.device.type == "cpu" for t in params["policy"].values())
        model.save(tmp_path / "m.pt")
    loaded = APPO.load(tmp_path / "m.pt", device="cpu")
    assert loaded.device == "cpu"
    obs = np.zeros((3, 4), dtype=np.float32)
    actions, _ = loaded.predict(obs, deterministic=True)
    assert actions.shape == (3,)
    assert next(loaded.policy.parameters()).device.type == "cpu"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("overrides", [dict(use_rnn=True), dict(algo="ppo"),
                                       dict(num_policy_workers=2)],
                         ids=["rnn", "ppo", "two_policy_workers"])
def test_variants_train_on_cuda(overrides):
    with APPO("CartPole-v1", device="cuda", seed=0, verbose=0, **overrides) as model:
        model.train(30_000)
        assert model.num_timesteps >= 30_000
        mean_return, _ = model.evaluate(3)
        assert np.isfinite(mean_return)
