"""Atari preprocessing (envs/atari.py), reward clipping in the learner, and a Pong smoke run."""
import numpy as np
import pytest
import torch

from asyncrl.encoders import ConvEncoder
from asyncrl import APPO, Config
from asyncrl.config import ConfigError
from asyncrl.envs import make_env

pytest.importorskip("ale_py")
pytest.importorskip("cv2")


@pytest.fixture(scope="module")
def pong():
    env = make_env("ALE/Pong-v5")
    yield env
    env.close()


def test_observations_are_stacked_uint8_84x84(pong):
    assert pong.observation_space.shape == (4, 84, 84)
    assert pong.observation_space.dtype == np.uint8
    obs, _ = pong.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8


def test_stack_shifts_by_one_frame_per_step(pong):
    obs, _ = pong.reset(seed=1)
    for _ in range(30):  # play until frames differ
        nxt, *_ = pong.step(pong.action_space.sample())
        np.testing.assert_array_equal(nxt[:-1], obs[1:])  # oldest frame dropped, newest appended
        obs = nxt
    assert not np.array_equal(obs[0], obs[-1])


@pytest.mark.parametrize("env_id,sticky", [("ALE/Pong-v5", 0.25), ("PongNoFrameskip-v4", 0.0)])
def test_sticky_actions_as_the_id_defines(env_id, sticky):
    env = make_env(env_id)
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == pytest.approx(sticky)
    env.close()
    off = make_env(env_id, repeat_action_probability=0.0)
    assert off.unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    off.close()


def test_frame_skip_max_pools_the_last_two_frames():
    """Against a raw env stepped in lockstep: each step repeats the action 4 frames and keeps the
    max of the last two grayscale frames, resized to 84 x 84."""
    import cv2
    import gymnasium as gym
    from asyncrl.envs.atari import make_atari, register
    register()
    env = make_atari("ALE/Pong-v5", frame_stack=1, noop_max=0, repeat_action_probability=0.0)
    raw = gym.make("ALE/Pong-v5", frameskip=1, repeat_action_probability=0.0, obs_type="grayscale")
    env.reset(seed=3)
    raw.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(40):
        a = int(rng.integers(env.action_space.n))
        obs, *_ = env.step(a)
        frames = [raw.step(a)[0] for _ in range(4)]
        expected = cv2.resize(np.maximum(frames[2], frames[3]), (84, 84), interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(obs[0], expected)
    env.close()
    raw.close()


def test_reward_clipping_in_learner_clips_targets_not_the_stored_rewards():
    from asyncrl.learner import Batch
    from test_learner import make_learner
    learner = make_learner(reward_clip=1.0)
    T, B = 3, 2
    obs, actions = torch.randn(T + 1, B, 4), torch.zeros(T, B, 1, dtype=torch.int64)
    with torch.no_grad():
        log_probs, _, _ = learner.model.evaluate({"obs": obs[:T].flatten(0, 1)}, actions.flatten(0, 1))
    dones = torch.ones(T, B, dtype=torch.bool)  # every step terminal: v_s = clipped r_s
    batch = Batch({"obs": obs}, actions, log_probs.view(T, B), torch.tensor([[21.0, -5.0]] * T), dones,
                  torch.zeros(T, B, dtype=torch.bool), torch.zeros(T, B, dtype=torch.int64))
    vt, _, _ = learner.targets(batch, {"obs": obs.flatten(0, 1)}, None)
    torch.testing.assert_close(vt.vs, torch.tensor([[1.0, -1.0]] * T))
    # the batch keeps the raw rewards (the workers' logged returns are summed from them)
    assert batch.rewards.tolist() == [[21.0, -5.0]] * T


@pytest.mark.timeout(300)
def test_pong_smoke_run_in_worker_processes():
    with APPO("ALE/Pong-v5", num_workers=1, num_envs_per_worker=2, rollout=16, batch_size=32,
              minibatch_size=32, num_epochs=1, reward_clip=1.0, device="cpu", seed=0,
              verbose=0) as model:
        assert isinstance(model.policy.encoders[0], ConvEncoder)
        model.train(128)
        assert model.num_timesteps == 128
        obs, _ = make_env("ALE/Pong-v5").reset(seed=0)
        action, _ = model.predict(obs)
        assert 0 <= int(action) < model.action_space.n


def test_atari_defaults_apply_to_ale_ids_and_yield_to_the_caller():
    from asyncrl.config import ATARI_DEFAULTS, ATARI_SYNC_DEFAULTS, with_defaults
    # On any device: synchronous, one rollout of 16 envs = CleanRL's batch of 1024, the envs over
    # a rollout worker per core but two (one of 16 on two cores), unless the caller chose a layout.
    for cpu_only in (True, False):
        for cores, layout in ((1, (1, 16)), (2, (1, 16)), (4, (2, 8)), (6, (4, 4)), (16, (8, 2)),
                              (64, (8, 2))):
            cfg = Config.from_kwargs(with_defaults({}, family="atari", cpu_only=cpu_only, cores=cores))
            for name, value in {**ATARI_DEFAULTS, **ATARI_SYNC_DEFAULTS}.items():
                assert getattr(cfg, name) == value, name
            assert (cfg.num_workers, cfg.num_envs_per_worker) == layout, cores
            assert cfg.algo == "ppo" and cfg.batch_size == 1024 and cfg.num_slots == 2 * layout[0]
    # a count the caller gives is kept, the other keeps the 16 envs where it can
    for given, layout in (({"num_envs_per_worker": 4}, (4, 4)), ({"num_workers": 2}, (2, 8)),
                          ({"num_workers": 3}, (3, 4))):
        cfg = Config.from_kwargs(with_defaults(given, family="atari", cpu_only=True, cores=2))
        assert (cfg.num_workers, cfg.num_envs_per_worker) == layout, given
        assert cfg.batch_size == layout[0] * layout[1] * 64
    # algo="ppo" asked for is the same preset
    assert with_defaults({"algo": "ppo"}, family="atari", cores=16) == \
        {**with_defaults({}, family="atari", cores=16), "algo": "ppo"}
    # asynchronous when asked for: the preset's rollout 128 and batch 1024, the GPU's layout
    cfg = Config.from_kwargs(with_defaults({"algo": "appo"}, family="atari", cpu_only=False, cores=16))
    for name, value in ATARI_DEFAULTS.items():
        assert getattr(cfg, name) == value, name
    assert (cfg.algo, cfg.num_workers, cfg.num_envs_per_worker, cfg.batch_size) == ("appo", 14, 2, 1024)
    with APPO("ALE/Pong-v5", verbose=0, device="cpu") as model:  # this machine's cores
        expected = Config.from_kwargs(with_defaults({"device": "cpu", "verbose": 0}, family="atari",
                                                    cpu_only=True))
        assert model.config.replace(seed=None) == expected.replace(seed=None)
    with APPO("ALE/Pong-v5", verbose=0, device="cpu", algo="appo") as model:  # asked for
        assert model.config.rollout == 128 and model.config.batch_size == 1024
    # a caller's batch_size without an algo is kept, sampled asynchronously (as for many
    # actuators); with algo="ppo" it must be the layout's one rollout of every env
    with APPO("ALE/Pong-v5", verbose=0, device="cpu", batch_size=2048) as model:
        cfg = model.config
        assert (cfg.algo, cfg.rollout, cfg.batch_size) == ("appo", 128, 2048)
    with pytest.raises(ConfigError, match=r"batch_size=2048: algo='ppo' .*algo='appo'"):
        APPO("ALE/Pong-v5", verbose=0, device="cpu", batch_size=2048, algo="ppo")
    with APPO("ALE/Pong-v5", verbose=0, device="cpu", gamma=0.995, num_envs_per_worker=6) as model:
        assert model.config.gamma == 0.995 and model.config.reward_clip == 1.0
        assert model.config.batch_size % model.config.slot_size == 0  # re-derived for 3 envs/group
    with APPO("ALE/Pong-v5", verbose=0, device="cpu", algo="impala") as model:
        assert model.config.num_epochs == 1
    with APPO("CartPole-v1", verbose=0) as model:
        assert model.config.reward_clip is None and model.config.rollout == 32


def test_episodic_life_ends_learning_episodes_but_not_the_game():
    env = make_env("ALE/Breakout-v5", episodic_life=True, repeat_action_probability=0.0)
    env.reset(seed=0)
    lives_at_end, game_overs = [], []
    for _ in range(5000):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            lives_at_end.append(env.unwrapped.ale.lives())
            game_overs.append(info["game_over"])
            if info["game_over"]:
                break
            env.reset()
    # one learning episode per life (5 in Breakout), and only the last one is the game's end
    assert game_overs[-1] and not any(game_overs[:-1])
    assert len(game_overs) == 5 and lives_at_end[:-1] == [4, 3, 2, 1]
    env.close()


@pytest.mark.parametrize("env_id", ["ALE/Pong-v5", "BreakoutNoFrameskip-v4"])
def test_same_observations_as_gymnasiums_reference_wrappers(env_id):
    """The ALE env renders grayscale, the preprocessing steps the emulator directly and the stack
    is our own (all for speed): observations, rewards, ends and infos must equal gymnasium's
    reference pipeline (RGB ALE env, AtariPreprocessing, FrameStackObservation) step for step,
    across resets, sticky actions (v5) included."""
    import gymnasium as gym
    from asyncrl.envs.atari import make_atari, register
    register()
    ours = make_atari(env_id, noop_max=30)
    assert ours.env.direct  # the fast path is the one under test
    ref = gym.wrappers.FrameStackObservation(gym.wrappers.AtariPreprocessing(
        gym.make(env_id, frameskip=1, obs_type="rgb"), noop_max=30), 4)
    assert ours.observation_space == ref.observation_space
    rng = np.random.default_rng(0)
    for episode in range(2):
        a, info_a = ours.reset(seed=episode)
        b, info_b = ref.reset(seed=episode)
        np.testing.assert_array_equal(a, b)
        assert info_a == info_b
        for _ in range(200):
            action = int(rng.integers(ours.action_space.n))
            a, *rest_a = ours.step(action)
            b, *rest_b = ref.step(action)
            np.testing.assert_array_equal(a, b)
            assert rest_a == rest_b  # reward, terminated, truncated, info
    ours.close()
    ref.close()


def test_an_atari_model_saved_where_a_gpu_learns_loads_with_a_cpus_layout(tmp_path, machine):
    """Saved on a 16-core machine with a GPU (synchronous, 8 x 2), loaded on a 2-core CPU: the
    CPU's layout (one worker of 16), as a new model there; the same algorithm and batch. One
    trained asynchronously as asked keeps that. A batch the caller set that the CPU's layout
    cannot make (a multiple of the slot) keeps the saved values, and says so."""
    machine(True, 16)
    with APPO("ALE/Pong-v5", verbose=0) as model, \
            APPO("ALE/Pong-v5", verbose=0, algo="appo") as asked, \
            APPO("ALE/Pong-v5", verbose=0, algo="appo", batch_size=1792) as big:
        assert (model.config.algo, model.config.num_workers, model.config.num_envs_per_worker) == ("ppo", 8, 2)
        assert (asked.config.num_workers, asked.config.num_envs_per_worker) == (14, 2)
        assert (big.config.num_workers, big.config.num_envs_per_worker) == (14, 4)
        for m, name in ((model, "gpu"), (asked, "asked"), (big, "big")):
            m.save(tmp_path / f"{name}.pt")
    machine(False, 2)
    with APPO.load(tmp_path / "gpu.pt") as cpu:
        cfg = cpu.config
        assert (cfg.algo, cfg.rollout, cfg.num_workers, cfg.num_envs_per_worker, cfg.batch_size) == \
            ("ppo", 64, 1, 16, 1024)
    with APPO.load(tmp_path / "asked.pt") as cpu:
        cfg = cpu.config
        assert (cfg.algo, cfg.rollout, cfg.num_workers, cfg.num_envs_per_worker) == ("appo", 128, 2, 8)
    with pytest.warns(UserWarning, match="clashes with the fields the model's caller set"):
        kept = APPO.load(tmp_path / "big.pt")
    with kept:
        assert (kept.config.algo, kept.config.batch_size, kept.config.num_workers) == ("appo", 1792, 14)
