"""VizDoom (envs/doom.py): Sample Factory's preprocessing, the Doom defaults, a multi-process run."""
import os

import numpy as np
import pytest
import torch

from asyncrl import APPO
from asyncrl.config import DOOM_CPU_DEFAULTS, DOOM_DEFAULTS
from asyncrl.encoders import ConvEncoder
from asyncrl.envs import env_family, make_env

pytest.importorskip("vizdoom")
pytest.importorskip("cv2")


@pytest.fixture(scope="module")
def hgs():
    env = make_env("VizdoomHealthGatheringSupreme-v1")
    yield env
    env.close()


@pytest.mark.timeout(60)
def test_observations_are_128x72_rgb_with_game_variables(hgs):
    space = hgs.observation_space
    assert space["screen"].shape == (72, 128, 3) and space["screen"].dtype == np.uint8
    assert space["gamevariables"].shape == (1,)  # HEALTH
    obs, _ = hgs.reset(seed=0)
    assert obs["screen"].shape == (72, 128, 3) and 0 < obs["gamevariables"][0] <= 100
    assert obs["screen"].std() > 0  # a rendered frame, not a blank one
    obs, *_ = hgs.step(0)
    assert space.contains(obs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kwargs, tics, shape", [({}, 4, (72, 128, 3)),
                                                 ({"frame_skip": 2, "width": None}, 2, (120, 160, 3))])
def test_each_step_is_four_tics_and_the_keywords_reach_the_env(kwargs, tics, shape, tmp_path,
                                                               monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = make_env("VizdoomBasic-v1", **kwargs)
    try:
        assert env.observation_space["screen"].shape == shape  # width=None: as rendered
        env.reset(seed=0)
        game = env.unwrapped.game
        t0 = game.get_episode_time()
        env.step(0)
        assert game.get_episode_time() - t0 == tics
    finally:
        env.close()
    assert os.listdir(tmp_path) == []  # the engine's _vizdoom.ini went to the temp directory


@pytest.mark.timeout(60)
def test_a_machines_first_game_leaves_no_folder_in_the_working_directory(tmp_path, monkeypatch):
    """Without its settings file (a fresh machine, a cleaned /tmp) the engine makes ./_vizdoom as
    it starts; a user's folder keeps nothing of it."""
    import asyncrl.envs.doom as doom
    work, settings = tmp_path / "work", tmp_path / "settings" / "vizdoom.ini"
    work.mkdir(), settings.parent.mkdir()
    monkeypatch.setattr(doom, "DOOM_CONFIG_PATH", str(settings))
    monkeypatch.chdir(work)
    env = make_env("VizdoomBasic-v1")
    try:
        env.reset(seed=0)
        env.step(0)
    finally:
        env.close()
    assert settings.exists() and os.listdir(work) == []


@pytest.mark.timeout(60)
def test_doom_ids_get_sample_factorys_doom_defaults_and_keywords_win(tmp_path):
    assert env_family("VizdoomBasic-v1") == "doom" and env_family("CartPole-v1") is None
    with APPO("VizdoomBasic-v1", device="cpu", verbose=0) as model:
        cfg = model.config
        assert (cfg.use_rnn, cfg.rnn_type, cfg.rnn_size, cfg.cnn) == (True, "gru", 512, "doom_relu")
        assert all(getattr(cfg, k) == v for k, v in DOOM_DEFAULTS.items())
        assert cfg.sampler_nice == DOOM_CPU_DEFAULTS["sampler_nice"] > 0  # learning on the CPU
        model.save(tmp_path / "doom.pt")
    # loaded, its factory knows the id: the CPU's niceness is derived again, not lost
    with APPO.load(tmp_path / "doom.pt", device="cpu") as loaded:
        assert loaded.config == cfg
        encoder = model.policy.encoders[list(model.policy.keys).index("screen")]
        assert isinstance(encoder, ConvEncoder)
        acts = {type(m) for m in encoder.modules() if isinstance(m, (torch.nn.ReLU, torch.nn.ELU))}
        assert acts == {torch.nn.ReLU}  # Sample Factory's stack, ReLU for its ELU
        # Sample Factory's convnet_simple on 128 x 72: 128 channels of 3 x 6 into 512 units
        assert encoder.fc[0].in_features == 128 * 3 * 6
    # cnn="doom" stays Sample Factory's ELU: a model saved with it before ReLU became the default
    # is rebuilt as it was trained
    elu = ConvEncoder((3, 72, 128), hwc=True, name="doom")
    assert any(isinstance(m, torch.nn.ELU) for m in elu.modules())
    with APPO("VizdoomBasic-v1", device="cpu", verbose=0, use_rnn=False, rollout=16) as model:
        assert not model.config.use_rnn and model.config.rollout == 16
        assert model.config.rnn_size == 512  # the other defaults stay


@pytest.mark.timeout(120)
def test_doom_trains_in_worker_processes_and_predicts_with_state():
    """The rollout workers (spawned) register vizdoom's ids themselves, as they do ALE's."""
    # sampler_nice=0 (the CPU default is 19): on a machine busy with other work the sampling
    # would get a few percent of a core, and these tests are about mechanics, not speed
    with APPO("VizdoomBasic-v1", device="cpu", verbose=0, seed=0, cnn="tiny", rnn_size=16,
              num_workers=1, num_envs_per_worker=2, rollout=16, batch_size=64,
              minibatch_size=32, sampler_nice=0) as model:
        model.train(640)
        assert model.num_timesteps >= 640 and model.policy_version >= 1
        env = make_env("VizdoomBasic-v1")
        obs, _ = env.reset(seed=0)
        action, state = model.predict(obs, state=None, episode_start=np.ones(1, bool))
        env.close()
        assert env.action_space.contains(int(action)) and state.shape == (1, 1, 16)


def _engines() -> set:
    import psutil
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "vizdoom"}


@pytest.mark.timeout(120)
def test_engines_of_a_killed_rollout_worker_do_not_outlive_it():
    """VizDoom runs each game in an engine process of its own: a rollout worker SIGKILLed (and
    replaced), and the run closed, leave none behind."""
    import signal
    import time
    before = _engines()
    with APPO("VizdoomBasic-v1", device="cpu", verbose=0, seed=0, cnn="tiny", use_rnn=False,
              num_workers=1, num_envs_per_worker=2, rollout=16, batch_size=64,
              minibatch_size=32, sampler_nice=0) as model:  # as above
        model.train(320)
        worker = next(p for p in model._runner.procs if p.name == "rollout-0")
        assert len(_engines() - before) == 2
        os.kill(worker.pid, signal.SIGKILL)
        model.train(640)  # the replacement trains on
        assert model._runner.worker_restarts == 1
    deadline = time.monotonic() + 5
    while _engines() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _engines() - before == set()
    # The killed engines' files in /dev/shm (3 a game) are swept, those of live games kept (a
    # new Doom env sweeps files older than 60 s)
    from asyncrl.envs.doom import remove_orphaned_shm_files
    assert len(remove_orphaned_shm_files(min_age=0.0)) >= 6
