"""The stable-baselines-style facade: predict, get/set_parameters, save/load, context manager."""
import os

import numpy as np
import pytest
import torch

from asyncrl import APPO

SERIAL = dict(num_workers=1, num_envs_per_worker=4, rollout=16, batch_size=128, minibatch_size=64,
              serial_mode=True, device="cpu", verbose=0)


def make(seed=0, **kwargs):
    return APPO("CartPole-v1", seed=seed, **{**SERIAL, **kwargs})


@pytest.fixture
def model():
    with make(seed=0) as m:
        yield m


@pytest.fixture
def obs_batch():
    return np.random.default_rng(0).uniform(-2.0, 2.0, size=(64, 4)).astype(np.float32)


def greedy(model, obs):
    return model.predict(obs, deterministic=True)[0]


def test_predict_single_observation(model):
    action, state = model.predict(np.zeros(4, np.float32))
    assert np.shape(action) == ()
    assert int(action) in (0, 1)
    assert state is None
    # float64 and list observations are accepted too.
    assert np.shape(model.predict([0.1, 0.0, -0.1, 0.2])[0]) == ()


def test_predict_batch(model, obs_batch):
    actions, _ = model.predict(obs_batch)
    assert actions.shape == (64,)
    assert np.issubdtype(actions.dtype, np.integer)
    assert set(actions.tolist()) <= {0, 1}


@pytest.mark.parametrize("shape", [(3,), (5,), (2, 3), (2, 2, 2), ()])
def test_predict_wrong_shape_raises(model, shape):
    with pytest.raises(ValueError, match=r"observation"):
        model.predict(np.zeros(shape, np.float32))


def test_deterministic_predict_is_deterministic_and_greedy(model, obs_batch):
    first = greedy(model, obs_batch)
    for _ in range(5):
        np.testing.assert_array_equal(greedy(model, obs_batch), first)
    with torch.no_grad():
        logits, _ = model.policy(torch.as_tensor(obs_batch))
    np.testing.assert_array_equal(first, logits.argmax(-1).numpy())
    single = np.array([greedy(model, o) for o in obs_batch[:8]])
    np.testing.assert_array_equal(single, first[:8])


def test_stochastic_predict_samples_both_actions(model):
    """A fresh policy is close to uniform: sampling must not collapse to the greedy action."""
    obs = np.zeros((400, 4), np.float32)
    counts = np.bincount(model.predict(obs, deterministic=False)[0], minlength=2)
    assert counts.min() > 100


def test_get_parameters_returns_copies(model, obs_batch):
    params = model.get_parameters()
    assert list(params) == ["policy", "policy.optimizer"]  # Stable-Baselines3's layout
    state = params["policy"]
    reference = {k: v.clone() for k, v in model.policy.state_dict().items()}
    assert state.keys() == reference.keys()
    for k, v in reference.items():
        assert torch.equal(state[k], v)
    before = greedy(model, obs_batch)
    for v in state.values():  # mutating the returned tensors ...
        v.add_(1.0)
    for k, v in model.policy.state_dict().items():  # ... leaves the model as it was
        assert torch.equal(v, reference[k]), k
    np.testing.assert_array_equal(greedy(model, obs_batch), before)


def test_set_parameters_from_another_model(model, obs_batch):
    with make(seed=1) as other:
        assert any(not torch.equal(a, b) for a, b in
                   zip(model.policy.parameters(), other.policy.parameters()))
        assert not np.array_equal(greedy(model, obs_batch), greedy(other, obs_batch))
        version = model.policy_version
        model.set_parameters(other.get_parameters())
        np.testing.assert_array_equal(greedy(model, obs_batch), greedy(other, obs_batch))
        for (k, a), b in zip(model.policy.state_dict().items(), other.policy.state_dict().values()):
            assert torch.equal(a, b), k
        assert model.policy_version > version  # new weights are a new policy version


@pytest.mark.parametrize("as_path", [str, lambda p: p], ids=["str", "pathlib"])
def test_set_parameters_from_file(model, obs_batch, tmp_path, as_path):
    with make(seed=2) as other:
        path = tmp_path / "state.pt"
        torch.save(other.policy.state_dict(), path)
        model.set_parameters(as_path(path))
        np.testing.assert_array_equal(greedy(model, obs_batch), greedy(other, obs_batch))


def test_set_parameters_with_other_architecture_raises(model, obs_batch):
    before = greedy(model, obs_batch)
    state_before = model.get_parameters()["policy"]
    with make(seed=0, hidden_sizes=(32,)) as small:
        expected = r"pi_net\.0\.weight: expected \(64, 4\), got \(32, 4\)"
        with pytest.raises(ValueError, match=expected):
            model.set_parameters(small.get_parameters())
    # Nothing was loaded.
    for k, v in model.policy.state_dict().items():
        assert torch.equal(v, state_before[k])
    np.testing.assert_array_equal(greedy(model, obs_batch), before)


def test_set_parameters_unknown_group(model):
    with pytest.raises(KeyError, match=r"unknown parameter group.*'policy', 'policy.optimizer'"):
        model.set_parameters({0: model.get_parameters()["policy"]})


def test_save_load_round_trip(model, obs_batch, tmp_path):
    model.train(256)
    assert model.num_timesteps == 256
    path = tmp_path / "sub" / "model.pt"
    model.save(path)
    assert path.exists()
    with APPO.load(path) as loaded:
        np.testing.assert_array_equal(greedy(loaded, obs_batch), greedy(model, obs_batch))
        assert loaded.num_timesteps == 256
        assert loaded.policy_version == model.policy_version
        assert loaded.config == model.config.replace(device="auto")  # load()'s device, as in SB3
        loaded.train(128)  # goes on counting from where the saved model stopped
        assert loaded.num_timesteps == 384
    with APPO.load(path, learning_rate=3e-4) as overridden:  # overrides win over the saved config
        assert overridden.config.learning_rate == 3e-4
        assert overridden.num_timesteps == 256


def test_saved_file_loads_with_set_parameters(model, obs_batch, tmp_path):
    path = tmp_path / "model.pt"
    model.save(path)
    with make(seed=5) as other:
        other.set_parameters(path)
        np.testing.assert_array_equal(greedy(other, obs_batch), greedy(model, obs_batch))


def test_context_manager(obs_batch):
    with make(seed=0) as m:
        assert isinstance(m, APPO)
        tmpdir = m._tmpdir
        assert os.path.isdir(tmpdir)
        m.train(128)
        assert greedy(m, obs_batch).shape == (64,)
    assert not os.path.exists(tmpdir)  # the model's scratch directory is removed on exit

    with pytest.raises(RuntimeError, match="inside the block"):  # exceptions are not swallowed
        with make(seed=0) as m:
            tmpdir = m._tmpdir
            raise RuntimeError("inside the block")
    assert not os.path.exists(tmpdir)


def test_set_parameters_accepts_a_bare_state_dict_or_path(model, obs_batch, tmp_path):
    other = make(seed=123)
    sd = other.get_parameters()["policy"]
    model.set_parameters(sd)  # a bare state_dict
    assert np.array_equal(model.predict(obs_batch, deterministic=True)[0],
                          other.predict(obs_batch, deterministic=True)[0])
    path = tmp_path / "other.pt"
    other.save(path)
    model.set_parameters(str(path))
    assert np.array_equal(model.predict(obs_batch, deterministic=True)[0],
                          other.predict(obs_batch, deterministic=True)[0])
    other.close()


def test_save_killed_mid_write_leaves_the_previous_file_loadable(model, obs_batch, tmp_path):
    import subprocess
    import sys
    import textwrap
    path = tmp_path / "model.pt"
    model.save(path)
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import os, signal, torch
        from asyncrl import APPO
        model = APPO.load({str(path)!r})
        real_save = torch.save
        def torn_save(obj, f):  # half a file, then SIGKILL, as a crash mid-write
            real_save(obj, f)
            f.truncate(f.tell() // 2)
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        torch.save = torn_save
        model.save({str(path)!r})
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert out.returncode == -9, out.stderr.decode()
    assert path.read_bytes() == before
    with APPO.load(path) as loaded:
        np.testing.assert_array_equal(greedy(loaded, obs_batch), greedy(model, obs_batch))


def test_a_run_where_no_episode_ends_warns_once_with_the_fix(monkeypatch, recwarn):
    """An env without a time limit whose episodes never end trains on (values bootstrap), but
    ep_rew_mean stays nan: the model warns, once, and says how to add a limit."""
    import asyncrl.logger
    from custom_envs import never_ends_env
    monkeypatch.setattr(asyncrl.logger, "NO_EPISODE_WARN_STEPS", 1_000)
    with APPO(never_ends_env, **SERIAL) as model:
        model.learn(1_500)
        model.learn(1_500)
    ours = [w for w in recwarn.list if "no episode has ended" in str(w.message)]
    assert len(ours) == 1 and issubclass(ours[0].category, RuntimeWarning)
    assert "max_episode_steps" in str(ours[0].message)
    with make() as model:  # CartPole's episodes end: no warning
        model.learn(1_500)
    assert len([w for w in recwarn.list if "no episode has ended" in str(w.message)]) == 1
