"""Checkpoints written while training are of one moment: weights, Adam state and counters of
the same update (the learner writes them between two updates), with its RNG state; a model
loaded from one trains on."""
import os
import signal

import pytest
import torch

from asyncrl import APPO
from asyncrl.config import Config
from test_multiprocess import SMALL, worker_children

# every minibatch of every epoch steps (target_kl would end some updates early)
EXACT = dict(SMALL, target_kl=None)
STEPS_PER_UPDATE = Config().num_epochs * SMALL["batch_size"] // SMALL["minibatch_size"]


def adam_steps(optimizer_state: dict) -> int:
    return int(next(iter(optimizer_state["state"].values()))["step"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("serial", [False, True])
def test_checkpoint_saved_while_training_is_consistent(tmp_path, serial):
    saved = []

    def save_mid_run(m):
        if m.num_timesteps >= 2048 and not saved:
            m.save(tmp_path / "mid.pt")
            saved.append(torch.load(tmp_path / "mid.pt", weights_only=False))

    with APPO("CartPole-v1", **EXACT, serial_mode=serial) as model:
        model.train(8192, callback=save_mid_run, callback_interval=0.05)
    blob = saved[0]
    version, steps = blob["policy_version"], blob["num_timesteps"]
    assert 0 < version and steps == version * SMALL["batch_size"]  # counters of these weights
    # Adam took exactly the minibatch steps of the updates that made these weights
    assert adam_steps(blob["optimizer"]) == version * STEPS_PER_UPDATE
    assert isinstance(blob["learner_rng"], torch.Tensor)

    resumed = APPO.load(tmp_path / "mid.pt")
    try:
        assert resumed.num_timesteps == steps
        resumed.train(2048)
        assert resumed.num_timesteps >= steps + 2048
        assert adam_steps(resumed.get_parameters()["policy.optimizer"]) == \
            resumed.policy_version * STEPS_PER_UPDATE
    finally:
        resumed.close()
    assert worker_children() == []


@pytest.mark.timeout(120)
def test_adam_state_kept_when_the_workers_are_killed_with_the_main_process(tmp_path):
    """A SIGTERM to every process of the run (Slurm's ``scancel``, systemd's stop) kills the
    learner before it writes Adam's state; the save after the interruption still holds the
    state that made the weights kept (the save had no optimizer state before), and the model
    trains on from it."""
    def killed_with_the_group(m):
        if m.num_timesteps >= 2048:
            for proc in m._runner.procs:  # the workers die by the signal, as in the group
                os.kill(proc.pid, signal.SIGTERM)
            for proc in m._runner.procs:
                proc.join(timeout=10)
            raise KeyboardInterrupt  # the main process unwinds, as its own handler makes it

    model = APPO("CartPole-v1", **EXACT)
    try:
        with pytest.raises(KeyboardInterrupt):
            model.train(100_000, callback=killed_with_the_group, callback_interval=0.05)
        model.save(tmp_path / "stopped.pt")
        blob = torch.load(tmp_path / "stopped.pt", weights_only=False)
        assert blob["policy_version"] > 0
        assert blob["optimizer"] is not None
        assert adam_steps(blob["optimizer"]) == blob["policy_version"] * STEPS_PER_UPDATE
        model.train(512)  # a new graph, from the kept weights and Adam's state
        assert adam_steps(model.get_parameters()["policy.optimizer"]) == \
            model.policy_version * STEPS_PER_UPDATE
    finally:
        model.close()
    assert worker_children() == []


@pytest.mark.timeout(60)
def test_parameters_set_after_the_with_block_train_on():
    """The with block removed the scratch folder; set_parameters with Adam's state makes it
    again (it raised a RuntimeError from torch.save before) and the model trains on."""
    with APPO("CartPole-v1", **EXACT, serial_mode=True) as model:
        model.train(256)
        params = model.get_parameters()
    model.set_parameters(params)
    try:
        model.train(256)
        assert model.num_timesteps == 512
        # Adam's state went on from the one set: both calls' updates (one batch each)
        assert adam_steps(model.get_parameters()["policy.optimizer"]) == 2 * STEPS_PER_UPDATE
    finally:
        model.close()


def test_set_parameters_device_is_checked_not_ignored():
    """SB3's device argument: the weights stay on the CPU here (each process moves them), so any
    valid device loads the same; a typo raises instead of being ignored."""
    model = APPO("CartPole-v1", device="cpu", verbose=0)
    params = model.get_parameters()
    model.set_parameters(params, device="cuda")  # valid, and without effect: no GPU needed
    assert next(model.policy.parameters()).device.type == "cpu"
    with pytest.raises(ValueError, match="device='gpu'"):
        model.set_parameters(params, device="gpu")


def test_a_model_loaded_on_another_machine_takes_its_layout(tmp_path, machine):
    """A model saved where a GPU learns with 16 cores (14 rollout workers) loads on a 2-core CPU
    with the CPU's 2, and saved again there, loads on the GPU machine with 14: the layout the
    machine implied is derived again where it loads. What the caller set, before or at the load,
    stays."""
    machine(True, 16)
    model = APPO("CartPole-v1", verbose=0, num_envs_per_worker=4)
    model.learning_rate = 3e-4
    assert (model.config.num_workers, model.device) == (14, "cuda")
    model.save(tmp_path / "gpu.pt")
    machine(False, 2)
    loaded = APPO.load(tmp_path / "gpu.pt", ent_coef=0.02)
    cfg = loaded.config
    assert (cfg.num_workers, cfg.num_envs_per_worker, loaded.device) == (2, 4, "cpu")
    assert (cfg.learning_rate, cfg.ent_coef) == (3e-4, 0.02)
    loaded.save(tmp_path / "cpu.pt")
    machine(True, 16)
    again = APPO.load(tmp_path / "cpu.pt")
    assert (again.config.num_workers, again.config.num_envs_per_worker, again.device) == (14, 4, "cuda")
    assert (again.config.learning_rate, again.config.ent_coef) == (3e-4, 0.02)
    # a machine field given to load(), or set by replacing the config, is the caller's from then on
    APPO.load(tmp_path / "cpu.pt", num_workers=3).save(tmp_path / "three.pt")
    again.config = again.config.replace(num_workers=5)
    again.save(tmp_path / "five.pt")
    machine(False, 2)
    assert APPO.load(tmp_path / "three.pt").config.num_workers == 3
    assert APPO.load(tmp_path / "five.pt").config.num_workers == 5
