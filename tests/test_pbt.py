"""Population-based training: exploit copies weights and hyper-parameters, explore stays in the
search bounds, generations are checkpointed and summarised, locally and on a local Ray."""
import json
import os
import shutil
import tempfile

import pytest
import torch

from asyncrl import ConfigError
from asyncrl.pbt import PBT, LocalBackend, main

# Each member's components in its own process (serial mode): PBT, not the process graph, is
# under test here, and spawning three processes per member is most of a tiny member's time.
MEMBER = dict(num_workers=1, num_envs_per_worker=4, rollout=16, batch_size=128,
              minibatch_size=64, device="cpu", serial_mode=True)
SEARCH = {"learning_rate": (1e-4, 3e-3, True), "clip_coef": (0.05, 0.3, False)}


def test_exploit_copies_weights_optimizer_and_hparams():
    backend = LocalBackend([(i, "CartPole-v1", {"learning_rate": lr}, dict(MEMBER, verbose=0))
                            for i, lr in enumerate((1e-3, 2e-4))])
    try:
        backend.map("train", [(256,), (256,)])
        src, dst = backend.members
        backend.copy(0, 1, {"learning_rate": 5e-4})
        for (k, a), b in zip(src.get_parameters()["policy"].items(),
                             dst.get_parameters()["policy"].values()):
            assert torch.equal(a, b), k
        assert dst.model.learning_rate == 5e-4
        dst.train(128)  # trains on from the copy, with its new learning rate
        assert dst.model.logger.last_train["learning_rate"] == 5e-4
    finally:
        backend.close()


def test_explore_stays_in_bounds():
    pbt = PBT.__new__(PBT)  # only the search logic
    import random
    pbt.search, pbt.rng = SEARCH, random.Random(0)
    pbt.perturb_factors, pbt.resample_prob = (0.5, 2.0), 0.3
    hp = {"learning_rate": 2.9e-3, "clip_coef": 0.06}
    for _ in range(200):
        hp = pbt._explore(hp)
        for name, (low, high, _) in SEARCH.items():
            assert low <= hp[name] <= high


def test_bad_settings_fail_early_with_every_problem():
    with pytest.raises(ConfigError) as e:
        PBT("CartPole-v1", num_members=1, search={"num_workers": (1, 4, False)},
            exploit_fraction=0.9, backend="slurm")
    msg = str(e.value)
    for part in ("num_members=1", "'num_workers' is not tunable", "exploit_fraction=0.9",
                 "backend='slurm'"):
        assert part in msg


def test_local_pbt_runs_checkpoints_and_summarises(tmp_path, capsys):
    main(["--members", "2", "--generations", "2", "--steps", "512", "--eval_episodes", "2",
          "--out", str(tmp_path), "--num_workers", "1", "--num_envs_per_worker", "4",
          "--rollout", "16", "--batch_size", "128", "--minibatch_size", "64", "--device", "cpu",
          "--serial_mode", "True"])
    state = json.loads((tmp_path / "pbt.json").read_text())
    assert state["generation"] == 1 and len(state["history"]) == 4
    assert all(r["num_timesteps"] == 512 * (r["generation"] + 1) for r in state["history"])
    assert_copied_in_checkpoint(tmp_path)
    for gen in (0, 1):
        assert sorted(os.listdir(tmp_path / f"gen_{gen:03d}")) == ["member_0.pt", "member_1.pt"]
    out = capsys.readouterr().out
    assert "| generation | best score |" in out
    assert (tmp_path / "summary.md").exists() and (tmp_path / "pbt.png").stat().st_size > 1000


@pytest.mark.timeout(600)
def test_ray_backend_on_a_local_ray(tmp_path):
    ray = pytest.importorskip("ray")
    # Ray's session files (logs, sockets) in a folder of this test, not /tmp/ray, which outlived
    # the suite; short, since its socket paths must fit 107 characters
    ray_dir = tempfile.mkdtemp(prefix="ray-")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_dir)
    try:
        with pytest.raises(ValueError, match=r"3.0 CPUs, but the Ray cluster has 2 available.*wait to be placed"):
            PBT("CartPole-v1", num_members=2, backend="ray", ray_num_cpus=1.5, **MEMBER)
        pbt = PBT("CartPole-v1", num_members=2, search=SEARCH, steps_per_generation=256,
                  eval_episodes=2, out_dir=str(tmp_path), backend="ray", **MEMBER)
        history = pbt.run(generations=2)
        assert len(history) == 4 and all(r["num_timesteps"] > 0 for r in history)
        assert (tmp_path / "gen_001" / "member_1.pt").exists()
        assert_copied_in_checkpoint(tmp_path)
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)


def assert_copied_in_checkpoint(out_dir):
    """Checkpoints are written after exploit: the copy's weights equal its source's."""
    state = json.loads((out_dir / "pbt.json").read_text())
    assert len(state["copies"]) == 1
    (src, dst), = state["copies"]
    gen = out_dir / f"gen_{state['generation']:03d}"
    a = torch.load(gen / f"member_{src}.pt", weights_only=False)["state_dict"]
    b = torch.load(gen / f"member_{dst}.pt", weights_only=False)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
