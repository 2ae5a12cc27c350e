"""The engine on a GPU: policy workers and learners on CUDA (pinned staging buffers, weights
shared through CPU memory), checkpoints that load on a machine without one. Skipped where torch
sees no CUDA device (CI); run on a GPU machine with `pytest tests/test_cuda.py`."""
import os
import signal

import numpy as np
import pytest
import torch

from asyncrl import APPO
from custom_envs import tiny_image_env
from test_checkpoints import adam_steps
from test_worker_faults import children_named

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


@pytest.mark.timeout(240)
def test_an_image_model_resumes_adam_on_cuda_after_a_killed_learner_and_a_load(tmp_path):
    """The Nature CNN's convolution weights are channels-last; Adam's moments handed on flat (a
    replacement learner reads them from shared memory) or loaded from a file come back in the
    default layout, which the fused CUDA kernel refuses at the first step (resuming Pong on a
    lent H200 failed so). Both ways the learner goes on from Adam's state of the weights kept:
    its step count stays the updates' count."""
    cfg = dict(device="cuda", seed=0, verbose=0, num_workers=2, num_envs_per_worker=4, rollout=16,
               batch_size=256, minibatch_size=128, target_kl=None, worker_timeout=30)
    state = {}

    def kill_the_learner_once(m):
        if m.num_timesteps > 0 and "steps" not in state:
            state["steps"] = m.num_timesteps
            os.kill(children_named("learner")[0].pid, signal.SIGKILL)
        elif "steps" in state and m.num_timesteps >= state["steps"] + 10 * cfg["batch_size"]:
            return False

    with APPO(tiny_image_env, **cfg) as model:
        per_update = model.config.num_epochs * cfg["batch_size"] // cfg["minibatch_size"]
        model.train(10 ** 7, callback=kill_the_learner_once, callback_interval=0.1)
        assert model.logger.worker_restarts == 1
        assert model.num_timesteps >= state["steps"] + 10 * cfg["batch_size"]
        optimizer = model.get_parameters()["policy.optimizer"]
        assert adam_steps(optimizer) == model.policy_version * per_update
        model.save(tmp_path / "image.pt")
    loaded = APPO.load(tmp_path / "image.pt", device="cuda")
    try:
        version = loaded.policy_version
        loaded.train(2048)
        assert loaded.policy_version > version
        optimizer = loaded.get_parameters()["policy.optimizer"]
        assert adam_steps(optimizer) == loaded.policy_version * per_update
    finally:
        loaded.close()
