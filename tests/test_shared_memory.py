"""Shared tensors written in a spawned child are read in the parent (and back), as workers do."""
import sys

import numpy as np
import torch
import torch.multiprocessing as mp
from torch import nn

import gymnasium as gym

from asyncrl import Config
from asyncrl.buffers import SharedWeights, TrajectoryBuffers, buffer_spec
from asyncrl.distributions import make_distribution
from asyncrl.spaces import EnvSpec

CFG = Config.from_kwargs(dict(num_workers=1, num_envs_per_worker=4, rollout=8, batch_size=16,
                              minibatch_size=16))
OBS_SHAPE = (4,)
SLOT, T_IDX = 2, 5


def spec_of(obs_space, action_space=gym.spaces.Discrete(2)):
    return buffer_spec(EnvSpec(obs_space, action_space), make_distribution(action_space))


VECTOR_SPEC = spec_of(gym.spaces.Box(-1, 1, OBS_SHAPE, np.float32))


def _spawn(target, *args):
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=target, args=args, daemon=True)
    proc.start()
    proc.join(timeout=90)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError("child process did not finish")
    return proc.exitcode


def _write_trajectory(buffers):
    """Child: writes one step of one slot as a rollout + policy worker would."""
    buffers.tensors["obs/obs"][SLOT, T_IDX] = torch.arange(2 * 4, dtype=torch.float32).view(2, 4) + 0.5
    buffers.actions[SLOT, T_IDX] = torch.tensor([[1], [0]])
    buffers.log_probs[SLOT, T_IDX] = torch.tensor([-0.25, -1.5])
    buffers.rewards[SLOT, T_IDX] = 1.0
    buffers.dones[SLOT, T_IDX, 1] = True
    buffers.policy_versions[SLOT, T_IDX] = 42


def _check_and_publish(weights, expected_flat, expected, new):
    """Child: load what the parent published, check it, publish new weights.
    ``expected`` and ``new`` are (version, env steps trained)."""
    model = nn.Linear(3, 2)
    loaded = weights.load(model)
    got = nn.utils.parameters_to_vector(model.parameters())
    ok = tuple(loaded) == expected and torch.equal(got, expected_flat)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.arange(p.numel(), dtype=torch.float32).view_as(p) * 0.1)
    weights.publish(model, *new)
    sys.exit(0 if ok else 3)


def test_new_buffers_hold_sentinels():
    b = TrajectoryBuffers(CFG, VECTOR_SPEC)
    S, T, E = CFG.num_slots, CFG.rollout, CFG.envs_per_group
    obs = b.tensors["obs/obs"]
    assert obs.shape == (S, T + 1, E, *OBS_SHAPE) and obs.dtype == torch.float32
    assert b.actions.shape == (S, T, E, 1)
    for name in ("log_probs", "values", "rewards", "dones", "policy_versions"):
        assert getattr(b, name).shape == (S, T, E), name
    assert torch.isnan(b.log_probs).all() and torch.isnan(b.values).all()
    assert torch.isnan(b.rewards).all()
    assert (b.actions == -1).all() and (b.policy_versions == -1).all()
    assert not b.dones.any()
    for t in [*b.tensors.values(), *b.bookkeeping()]:
        assert t.is_shared()


def test_image_obs_stay_uint8():
    b = TrajectoryBuffers(CFG, spec_of(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)))
    obs = b.tensors["obs/obs"]
    assert obs.dtype == torch.uint8 and obs.shape[3:] == (4, 84, 84)


def test_spec_has_a_leaf_per_key_in_its_own_dtype_and_nbytes_counts_every_entry():
    space = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
                             "pos": gym.spaces.Tuple((gym.spaces.Discrete(5), gym.spaces.MultiBinary(3))),
                             "action_mask": gym.spaces.MultiBinary(4)})
    action_space = gym.spaces.Tuple((gym.spaces.Discrete(4), gym.spaces.Box(-1, 1, (2,), np.float32)))
    dist = make_distribution(action_space)
    spec = buffer_spec(EnvSpec(space, action_space, "obs", dist.mask_size), dist)
    dtypes = {name: (e.shape, e.dtype) for name, e in spec.items()}
    assert dtypes["obs/image"] == ((7, 7, 3), torch.uint8)
    assert dtypes["obs/pos.0"] == ((), torch.int64) and dtypes["obs/pos.1"] == ((3,), torch.uint8)
    assert dtypes["action_mask"] == ((4,), torch.bool) and "obs/action_mask" not in spec
    assert dtypes["actions"] == ((3,), torch.float32)  # one discrete + two continuous, flat
    b = TrajectoryBuffers(CFG, spec)
    assert set(b.tensors) == set(spec)
    assert TrajectoryBuffers.nbytes(CFG, spec) == sum(
        t.numel() * t.element_size() for t in [*b.tensors.values(), *b.bookkeeping()])


def test_trajectory_written_in_child_is_read_in_parent():
    b = TrajectoryBuffers(CFG, VECTOR_SPEC)
    assert _spawn(_write_trajectory, b) == 0
    torch.testing.assert_close(b.tensors["obs/obs"][SLOT, T_IDX],
                               torch.arange(8, dtype=torch.float32).view(2, 4) + 0.5)
    assert b.actions[SLOT, T_IDX].tolist() == [[1], [0]]
    assert b.log_probs[SLOT, T_IDX].tolist() == [-0.25, -1.5]
    assert b.rewards[SLOT, T_IDX].tolist() == [1.0, 1.0]
    assert b.dones[SLOT, T_IDX].tolist() == [False, True]
    assert b.policy_versions[SLOT, T_IDX].tolist() == [42, 42]
    # Nothing else was touched: the sentinels still show everywhere else.
    assert (b.actions == -1).sum() == b.actions.numel() - 2
    assert torch.isnan(b.log_probs).sum() == b.log_probs.numel() - 2
    assert (b.tensors["obs/obs"] != 0).sum() == 8


def test_shared_weights_round_trip_across_processes():
    torch.manual_seed(0)
    parent_model = nn.Linear(3, 2)
    weights = SharedWeights(parent_model, version=3, env_steps=300)
    assert weights.version == 3
    expected = nn.utils.parameters_to_vector(parent_model.parameters()).detach().clone()

    assert _spawn(_check_and_publish, weights, expected, (3, 300), (4, 400)) == 0, \
        "the child did not see the parent's weights, version and env steps"
    assert weights.version == 4

    reader = nn.Linear(3, 2)
    assert weights.load_if_newer(reader, 3) == 4
    for p in reader.parameters():
        torch.testing.assert_close(p.detach(),
                                   torch.arange(p.numel(), dtype=torch.float32).view_as(p) * 0.1)

    # Same version: nothing is copied, the local weights stay as they are.
    other = nn.Linear(3, 2)
    before = [p.detach().clone() for p in other.parameters()]
    assert weights.load_if_newer(other, 4) == 4
    for p, q in zip(other.parameters(), before):
        assert torch.equal(p.detach(), q)
    # load() always copies, and the counters come with the weights.
    assert tuple(weights.load(other)) == (4, 400)
    for p in other.parameters():
        torch.testing.assert_close(p.detach(),
                                   torch.arange(p.numel(), dtype=torch.float32).view_as(p) * 0.1)


def _load_batchnorm_and_check(weights, expected_mean):
    """Child: a fresh BatchNorm loads the published state, running statistics included."""
    bn = nn.BatchNorm1d(3)
    weights.load(bn)
    sys.exit(0 if torch.equal(bn.running_mean, expected_mean) and int(bn.num_batches_tracked) == 5 else 3)


def test_shared_weights_carry_module_buffers_to_another_process():
    """Normalisers and BatchNorm statistics are buffers, not parameters: they must reach the
    policy workers with the weights (they used to stay at their initial values there)."""
    bn = nn.BatchNorm1d(3)
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([1.0, -2.0, 3.5]))
        bn.num_batches_tracked.fill_(5)
    weights = SharedWeights(bn)
    assert _spawn(_load_batchnorm_and_check, weights, bn.running_mean.clone()) == 0
