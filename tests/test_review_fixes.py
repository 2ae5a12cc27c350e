"""Defects a careful review found (issue 20), each with a test that failed before its fix."""
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import torch

import custom_envs
from asyncrl import APPO
from asyncrl.buffers import SharedControl
from asyncrl.learner import Batch
from asyncrl.models import ActorCritic

SMALL = dict(num_workers=1, num_envs_per_worker=2, rollout=16, batch_size=32, minibatch_size=32,
             device="cpu", verbose=0, seed=0)


def run_script(tmp_path, body: str, stdin: bool = False):
    script = textwrap.dedent(body)
    if stdin:
        return subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)
    path = tmp_path / "script.py"
    path.write_text(script)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.mark.timeout(150)
def test_no_traceback_however_a_model_ends(tmp_path):
    """Dropped without close() (a function that trains and returns a score, called twice),
    close(), a with block, and a model still alive when the script ends: the learner used to
    print a FileNotFoundError traceback for the dropped and the surviving ones (the scratch
    directory was removed while it still saved Adam's state there)."""
    out = run_script(tmp_path, f"""
        from asyncrl import APPO
        KW = {SMALL!r}
        def score(seed):
            model = APPO("CartPole-v1", **dict(KW, seed=seed))
            model.train(64)
            return model.num_timesteps
        if __name__ == "__main__":
            print([score(s) for s in range(2)])
            closed = APPO("CartPole-v1", **KW)
            closed.train(64)
            closed.close()
            with APPO("CartPole-v1", **KW) as m:
                m.train(64)
            alive = APPO("CartPole-v1", **KW)
            alive.train(64)
            print("done")
        """)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr and "Error" not in out.stderr, out.stderr
    assert out.stdout.split() == ["[64,", "64]", "done"]


@pytest.mark.timeout(60)
def test_script_from_standard_input_is_told_to_save_it_to_a_file(tmp_path):
    """Code under the main guard, read from standard input: spawn cannot import it again. It
    used to fail with "keep that code under if __name__ == '__main__'", which it was."""
    out = run_script(tmp_path, f"""
        from asyncrl import APPO
        if __name__ == "__main__":
            with APPO("CartPole-v1", **{SMALL!r}) as m:
                m.train(64)
        """, stdin=True)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "standard input" in last and "Save the script to a file" in last, out.stderr
    assert "__name__" not in last and "exited unexpectedly" not in out.stderr


def make_learner(**overrides):
    from asyncrl import Config
    from asyncrl.learner import Learner
    cfg = Config(seed=0, **overrides)
    env = gym.make("CartPole-v1")
    queues = type("Q", (), {"full_slot": None, "free_slot": None, "report": None,
                            "ring_all": lambda: None})
    learner = Learner(cfg, None, "cpu", buffers=None, weights=None, optimizer_state=None, hparams=None,
                      ctl=SharedControl(), queues=queues, optimizer_path="/nonexistent")
    learner.model = ActorCritic.from_spaces(env.observation_space, env.action_space, cfg)
    learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=1e-3)
    return learner


def batch_with_restarted_samples(T=8, B=4):
    """On-policy samples of version 5, except env 0's first half: version -1 (its env was
    restarted) with wild rewards that would dominate any statistic they took part in."""
    torch.manual_seed(0)
    obs = torch.randn(T + 1, B, 4)
    actions = torch.randint(0, 2, (T, B, 1))
    rewards = torch.randn(T, B)
    versions = torch.full((T, B), 5, dtype=torch.int64)
    versions[: T // 2, 0] = -1
    rewards[: T // 2, 0] = 1e4
    dones = torch.zeros(T, B, dtype=torch.bool)
    dones[T // 2 - 1, 0] = True  # the restart ended the broken episode
    return Batch({"obs": obs}, actions, torch.full((T, B), -0.69), rewards, dones,
                 torch.zeros(T, B, dtype=torch.bool), versions)


def test_masked_samples_count_in_no_statistic_and_no_advantage_normalisation(monkeypatch):
    import asyncrl.learner as learner_module
    learner = make_learner(num_epochs=1, batch_size=32, minibatch_size=32, rollout=8,
                           num_envs_per_worker=8, num_workers=1)
    learner.version = 5
    seen = []
    real_loss = learner_module.ppo_loss

    def spy(*args, **kwargs):
        seen.append((args[2].detach().clone(), kwargs["mask"].clone()))
        return real_loss(*args, **kwargs)
    monkeypatch.setattr(learner_module, "ppo_loss", spy)
    stats = learner.train_on(batch_with_restarted_samples())
    assert stats["policy_lag_max"] == 0 and stats["policy_lag_mean"] == 0  # not version + 1 = 6
    assert stats["masked_fraction"] == pytest.approx(4 / 32)
    assert -1.0 <= stats["explained_variance"] <= 1.0  # the 1e4 returns would swamp it
    (advantages, mask), = seen
    kept = advantages[mask > 0]
    assert kept.mean().abs() < 1e-5 and kept.std().item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.timeout(60)
def test_small_images_train_with_the_tiny_cnn_too():
    """Images under the Nature CNN's 36 x 36 were refused even with cnn="tiny"."""
    with APPO(custom_envs.small_image_env, cnn="tiny", serial_mode=True, **SMALL) as model:
        model.train(64)
        action, _ = model.predict(model.observation_space.sample())
        assert model.action_space.contains(action)


def test_uint8_observations_that_are_not_images_are_scaled():
    """A 2-D uint8 observation reached the MLP unscaled (0..255)."""
    space = gym.spaces.Box(0, 255, (5, 6), np.uint8)
    model = ActorCritic.from_spaces(space, gym.spaces.Discrete(2))
    obs = torch.full((3, 5, 6), 255, dtype=torch.uint8)
    prepared = model.prepare({"obs": obs})["obs"]
    assert prepared.shape == (3, 30) and float(prepared.max()) == pytest.approx(1.0)
