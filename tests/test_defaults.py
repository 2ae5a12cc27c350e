"""What the defaults derive from the env: a space in, the values out; and the docs' table of
them checked against the code."""
import pathlib

import gymnasium as gym
import numpy as np
import pytest
import torch

from asyncrl.config import (ACTION_DEFAULTS, CONTINUOUS_CPU_DEFAULTS, CONTINUOUS_DEFAULTS,
                            FACTORED_DEFAULTS, SEVERAL_AGENTS_CPU_DEFAULTS,
                            SEVERAL_AGENTS_CRITIC_DEFAULTS, TURN_BASED_DEFAULTS, Config,
                            ConfigError, portable, with_defaults)
from asyncrl.distributions import LOG_STD_INIT, LOG_STD_INIT_MANY, MANY_ACTUATORS, make_distribution
from asyncrl.encoders import SmallCNN, SmallFlat, image_encoder
from asyncrl.models import ActorCritic
from asyncrl.spaces import CRITIC_STATE_MAX

pytestmark = pytest.mark.timeout(60)

# the configuration page of the docs site (docs/configuration.md) holds the tables
CONFIG_DOC = (pathlib.Path(__file__).parent.parent / "docs" / "configuration.md").read_text()


def test_continuous_actions_get_the_continuous_preset_and_keywords_win():
    assert with_defaults({}, actions="continuous") == CONTINUOUS_DEFAULTS
    out = with_defaults({"learning_rate": 1e-3}, actions="continuous")
    assert out["learning_rate"] == 1e-3 and out["num_epochs"] == CONTINUOUS_DEFAULTS["num_epochs"]


def test_more_than_four_actuators_learnt_on_a_cpu_are_sampled_synchronously():
    cpu = with_defaults({}, actions="continuous_many", cpu_only=True, cores=2)
    assert cpu == {**CONTINUOUS_DEFAULTS, **CONTINUOUS_CPU_DEFAULTS, "batch_size": 1024}
    cfg = Config.from_kwargs(cpu)  # one rollout of each of the 2 x 8 envs: the batch of appo's
    assert (cfg.algo, cfg.batch_size, cfg.num_slots) == ("ppo", 1024, cfg.slots_per_batch)
    # the caller's algo wins; up to four dimensions, a GPU learner and turn-based games keep
    # asynchronous sampling
    assert with_defaults({"algo": "appo"}, actions="continuous_many", cpu_only=True) == {
        **CONTINUOUS_DEFAULTS, "algo": "appo"}
    assert "algo" not in with_defaults({}, actions="continuous_many", cpu_only=False, cores=2)
    assert "algo" not in with_defaults({}, actions="continuous_many", cpu_only=True,
                                       turn_based=True)
    # several agents too (simple_spread's continuous forces: asynchronous, three lanes an env,
    # trained at a lag of ~3.4 updates and ended below random play), the batch one rollout of
    # every lane: 2 x 8 envs x 64 steps x 3 agents, in minibatches of 128 (one agent's: 256)
    agents = with_defaults({"lanes_per_env": 3}, actions="continuous_many", cpu_only=True,
                           multi_agent=True)
    assert (agents["algo"], agents["batch_size"]) == ("ppo", 3072)
    assert Config.from_kwargs(agents).minibatch_size == SEVERAL_AGENTS_CPU_DEFAULTS[
        "minibatch_size"] == 128
    assert Config.from_kwargs(with_defaults({"lanes_per_env": 3, "minibatch_size": 512},
                                            actions="continuous_many", cpu_only=True,
                                            multi_agent=True)).minibatch_size == 512
    # asynchronous several agents (a caller's batch_size) keep the continuous preset's 256
    assert Config.from_kwargs(with_defaults({"lanes_per_env": 3, "batch_size": 1536},
                                            actions="continuous_many", cpu_only=True,
                                            multi_agent=True)).minibatch_size == 256
    assert "algo" not in with_defaults({}, actions="continuous", cpu_only=True)
    assert "algo" not in with_defaults({}, actions="categorical", cpu_only=True)
    # fewer envs make a smaller synchronous batch, in whole minibatches
    few = Config.from_kwargs(with_defaults({"num_envs_per_worker": 4}, actions="continuous_many",
                                           cpu_only=True))
    assert (few.batch_size, few.minibatch_size) == (512, 256)
    # a caller's batch is kept, sampled asynchronously
    out = with_defaults({"batch_size": 2048}, actions="continuous_many", cpu_only=True)
    assert out == {**CONTINUOUS_DEFAULTS, "batch_size": 2048}
    assert Config.from_kwargs(out).algo == "appo"
    # asked for with a batch_size its layout does not make: the error names the counts that make
    # it, and appo
    with pytest.raises(ConfigError, match=r"batch_size=2048: algo='ppo' .*num_envs_per_worker=16"
                                          r".*algo='appo'"):
        Config.from_kwargs(with_defaults({"algo": "ppo", "batch_size": 2048},
                                         actions="continuous_many", cpu_only=True))
    # a model saved on a CPU loads with a GPU as asynchronous, and back (config.MACHINE_FIELDS)
    gpu = dict(actions="continuous_many", cpu_only=False, cores=2)
    saved = Config.from_kwargs(cpu).__dict__
    assert Config.from_kwargs(with_defaults(portable(saved, ()), **gpu)).algo == "appo"
    back = Config.from_kwargs(with_defaults({}, **gpu)).__dict__
    assert Config.from_kwargs(with_defaults(portable(back, ()), actions="continuous_many",
                                            cpu_only=True)) == Config.from_kwargs(cpu)


@pytest.mark.parametrize("size, kwargs, algo", [(6, {}, "ppo"), (4, {}, "appo"),
                                                 (6, {"batch_size": 2048}, "appo")])
def test_a_models_algo_follows_its_action_space_on_a_cpu(size, kwargs, algo):
    """What APPO(env) derives from the env it reads (no process is started)."""
    import space_envs
    from asyncrl import APPO
    env = space_envs.space_env(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (size,)))
    model = APPO(env, device="cpu", **kwargs)
    try:
        assert model.config.algo == algo
    finally:
        model.close()


def test_discrete_actions_take_the_config_defaults():
    assert with_defaults({}, actions="categorical") == {}
    cfg = Config()
    # the discount and trace lambda of SB3's, CleanRL's and Sample Factory's PPO (the suite's
    # evidence is in docs/benchmarks/learning-suite.md)
    assert (cfg.gamma, cfg.vtrace_lambda, cfg.normalize_returns) == (0.99, 0.95, True)


@pytest.mark.parametrize("space, kind", [
    (gym.spaces.Discrete(4), "categorical"),
    (gym.spaces.MultiDiscrete([5]), "categorical"),  # one choice, however it is spelt
    (gym.spaces.MultiDiscrete([6, 4, 5, 3, 3, 2]), "factored"),  # NASim's parameterised actions
    (gym.spaces.MultiBinary(3), "factored"),
    (gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Discrete(2))), "factored"),
    (gym.spaces.Box(-1, 1, (2,)), "continuous"),
    (gym.spaces.Box(-1, 1, (4,)), "continuous"),
    (gym.spaces.Box(-1, 1, (6,)), "continuous_many"),  # HalfCheetah's
    (gym.spaces.Box(-1, 1, (2, 3)), "continuous_many"),  # dimensions, not the first axis
    (gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(-1, 1, (1,)))), "continuous"),
    (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (3,)), "b": gym.spaces.Box(-1, 1, (2,))}),
     "continuous_many"),  # the Box parts' dimensions in all
])
def test_the_action_space_decides_which_preset_applies(space, kind):
    assert make_distribution(space).kind == kind
    assert with_defaults({}, actions=kind) == ACTION_DEFAULTS.get(kind, {})


def test_a_gaussian_starts_with_the_measured_noise_scaled_to_the_range_and_policy_kwargs_win():
    obs, box = gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, (3,))
    # std 0.61 of the half range, not SB3's 1 (HalfCheetah's runs stalled at std 1, Pendulum's
    # [-2, 2] needed the range: docs/benchmarks/learning-suite.md)
    assert LOG_STD_INIT == -0.5
    assert torch.equal(ActorCritic.from_spaces(obs, box).dist.log_std.detach(), torch.full((3,), -0.5))
    hybrid = gym.spaces.Tuple((gym.spaces.Discrete(2), box))  # a Box inside a Tuple too
    assert torch.equal(make_distribution(hybrid).parts[1].log_std.detach(), torch.full((3,), -0.5))
    # per dimension: Pendulum's [-2, 2], a dimension fixed by its bounds, one unbounded side, none,
    # and float32's largest value standing in for no bound (five dimensions: -1.0 each, below)
    big = np.finfo(np.float32).max
    mixed = gym.spaces.Box(np.array([-2.0, 3.0, 0.0, -np.inf, -big], np.float32),
                           np.array([2.0, 3.0, np.inf, np.inf, big], np.float32))
    stds = make_distribution(mixed).log_std.detach().exp().numpy()
    np.testing.assert_allclose(stds, [2 * np.exp(-1.0)] + [np.exp(-1.0)] * 4, rtol=1e-6)
    # a log_std_init the user gives is in the env's units (SB3's meaning), whatever the range
    own = ActorCritic.from_spaces(obs, gym.spaces.Box(-2, 2, (3,)), log_std_init=0.0)
    assert torch.equal(own.dist.log_std.detach(), torch.zeros(3))


@pytest.mark.parametrize("shape, log_std", [((4,), -0.5), ((2, 2), -0.5), ((5,), -1.0),
                                            ((6,), -1.0), ((2, 3), -1.0), ((17,), -1.0)])
def test_a_gaussian_of_more_than_four_dimensions_starts_with_less_noise_in_each(shape, log_std):
    # HalfCheetah's six and Ant's eight start at std 0.37, Hopper's three and BipedalWalker's four
    # at 0.61 (MountainCarContinuous's one found its goal less often at 0.37); the number is the
    # Box's own, whatever its shape, and the range still scales it
    n = int(np.prod(shape))
    log_stds = make_distribution(gym.spaces.Box(-1, 1, shape)).log_std.detach()
    assert torch.equal(log_stds, torch.full((n,), log_std))
    pusher = make_distribution(gym.spaces.Box(-2, 2, shape)).log_std.detach().exp().numpy()
    np.testing.assert_allclose(pusher, np.full(n, 2 * np.exp(log_std)), rtol=1e-6)
    # a value the user gives wins, whatever the size
    own = ActorCritic.from_spaces(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(-1, 1, shape),
                                  log_std_init=-0.5)
    assert torch.equal(own.dist.log_std.detach(), torch.full((n,), -0.5))


def test_each_box_of_a_dict_starts_by_its_own_number_of_dimensions():
    assert (LOG_STD_INIT, LOG_STD_INIT_MANY, MANY_ACTUATORS) == (-0.5, -1.0, 4)
    # a six-dimensional arm beside a one-dimensional gripper
    both = make_distribution(gym.spaces.Dict(arm=gym.spaces.Box(-1, 1, (6,)),
                                             grip=gym.spaces.Box(-1, 1, (1,))))
    assert [float(p.log_std[0]) for p in both.parts] == [-1.0, -0.5]


def test_factored_actions_get_the_larger_entropy_bonus_and_keywords_win():
    assert with_defaults({}, actions="factored")["ent_coef"] > Config.ent_coef
    assert with_defaults({"ent_coef": 0.0}, actions="factored")["ent_coef"] == 0.0
    # a family's preset is the family's, whatever its action space
    assert with_defaults({}, family="doom", actions="factored")["ent_coef"] == 0.001
    with pytest.raises(ValueError, match="actions='multi'"):
        with_defaults({}, actions="multi")


def test_a_turn_based_game_gets_its_entropy_bonus_over_the_action_spaces_preset_and_keywords_win():
    bonus = TURN_BASED_DEFAULTS["ent_coef"]
    assert with_defaults({}, turn_based=True)["ent_coef"] == bonus > Config.ent_coef
    assert with_defaults({"ent_coef": 0.0}, turn_based=True)["ent_coef"] == 0.0
    assert with_defaults({}, actions="factored", turn_based=True)["ent_coef"] == bonus
    continuous = with_defaults({}, actions="continuous", turn_based=True)
    assert continuous["num_epochs"] == CONTINUOUS_DEFAULTS["num_epochs"]  # the rest stays


def test_atari_keeps_its_measured_preset_and_doom_its_return_normalisation():
    atari, doom = with_defaults({}, family="atari"), with_defaults({}, family="doom")
    assert atari["normalize_returns"] is False and atari["reward_clip"] == 1.0
    assert doom["normalize_returns"] is True
    # learning on a CPU, Doom's sampling yields to its learner; with a GPU it does not
    assert with_defaults({}, family="doom", cpu_only=True)["sampler_nice"] == 19
    assert "sampler_nice" not in with_defaults({}, family="doom", cpu_only=False, cores=16)
    assert with_defaults({"sampler_nice": 0}, family="doom", cpu_only=True)["sampler_nice"] == 0


def test_readme_configuration_table_matches_the_code():
    missing = [row for row in Config().describe().splitlines() if row not in CONFIG_DOC]
    assert not missing, f"docs/configuration.md's table lacks or misstates: {missing}"


def test_readme_table_of_implied_defaults_matches_the_code():
    rows = [f"| continuous actions (a `Box` in the action space) | `{key}` | `{value!r}` |"
            for key, value in CONTINUOUS_DEFAULTS.items()]
    rows.append(f"| continuous actions (a `Box` in the action space) | `policy_kwargs` `log_std_init` "
                f"(the Gaussian's initial log std, in units of each bounded dimension's half range: "
                f"std 0.61 for [-1, 1], 1.21 for [-2, 2]; a value you give is in the env's units, as "
                f"in SB3) | `{LOG_STD_INIT!r}` |")
    rows.append(f"| continuous actions, a `Box` of more than {MANY_ACTUATORS} dimensions (HalfCheetah's "
                f"6, Ant's 8) | `policy_kwargs` `log_std_init` (as above: std 0.37 for [-1, 1]) | "
                f"`{LOG_STD_INIT_MANY!r}` |")
    rows += [f"| continuous actions of more than {MANY_ACTUATORS} dimensions in all (HalfCheetah's "
             f"6, Pusher's 7; MPE's 5 forces an agent), learnt on a CPU (no GPU), not a "
             f"turn-based game, "
             f"`batch_size` not set | `{key}` | `{value!r}` |"
             for key, value in CONTINUOUS_CPU_DEFAULTS.items()]
    rows += [f"| as above, several agents (PettingZoo) | `{key}` | `{value!r}` |"
             for key, value in SEVERAL_AGENTS_CPU_DEFAULTS.items()]
    rows += [f"| factored discrete actions (`MultiDiscrete`, `MultiBinary`, a `Tuple` or `Dict` of "
             f"`Discrete`s) | `{key}` | `{value!r}` |" for key, value in FACTORED_DEFAULTS.items()]
    rows += [f"| a turn-based game (a PettingZoo `AECEnv`; over the action space's row) | `{key}` | "
             f"`{value!r}` |" for key, value in TURN_BASED_DEFAULTS.items()]
    rows += [f"| several agents acting at once (a PettingZoo `ParallelEnv`), a trained policy with "
             f"discrete actions (`Discrete`), a global state of at most {CRITIC_STATE_MAX:,} floats, "
             f"no image observations, no `use_rnn`, the built-in network | `{key}` | `{value!r}` |"
             for key, value in SEVERAL_AGENTS_CRITIC_DEFAULTS.items()]
    missing = [row for row in rows if row not in CONFIG_DOC]
    assert not missing, f"docs/configuration.md's implied-defaults table lacks or misstates: {missing}"


def grid_space():
    """MiniGrid's view: a uint8 Box declared 0..255 holding ids 0..10."""
    return gym.spaces.Box(0, 255, (7, 7, 3), np.uint8)


@pytest.mark.parametrize("small_images", ["flat", "conv"])
def test_a_small_uint8_grid_is_normalised_per_channel_not_divided_by_255(small_images):
    enc = image_encoder(grid_space(), "nature", ortho=True, small_images=small_images)
    assert isinstance(enc, SmallFlat if small_images == "flat" else SmallCNN)
    rng = np.random.default_rng(0)
    ids = np.stack([rng.integers(1, 11, (64, 7, 7)), rng.integers(0, 6, (64, 7, 7)),
                    rng.integers(0, 3, (64, 7, 7))], -1).astype(np.uint8)
    x = enc.scale(torch.as_tensor(ids))
    assert x.shape == (64, 3, 7, 7) and float(x.max()) == 10.0  # values kept, channels first
    enc.update_stats(x)
    expected_mean = ids.reshape(-1, 3).mean(0)
    assert np.allclose(enc.norm.mean.flatten().numpy(), expected_mean, atol=1e-4)
    normalised = (x - enc.norm.mean.view(1, 3, 1, 1)) / enc.norm.std().view(1, 3, 1, 1)
    assert abs(float(normalised.mean())) < 1e-4 and abs(float(normalised.std()) - 1) < 0.05
    if small_images == "conv":
        assert enc.convs[0](normalised).shape == (64, 16, 7, 7)
    else:  # the normalised cells themselves, for the MLP
        assert enc.out_size == 147 and torch.allclose(enc(x), normalised.flatten(1), atol=1e-5)


@pytest.mark.parametrize("obs_space", [grid_space(), gym.spaces.Dict(
    {"image": grid_space(), "direction": gym.spaces.Discrete(4)})], ids=["image", "dict"])
def test_a_flattened_small_image_goes_through_the_mlp(obs_space):
    """The default small-image encoder has no hidden layer of its own: the model's MLP follows it,
    also where the image is the only observation (a convolutional encoder's output goes to the
    heads directly)."""
    model = ActorCritic.from_spaces(obs_space, gym.spaces.Discrete(3))
    assert [m.out_features for m in model.pi_net if isinstance(m, torch.nn.Linear)] == [64, 64]
    conv = ActorCritic.from_spaces(grid_space(), gym.spaces.Discrete(3), Config(small_images="conv"))
    assert isinstance(conv.encoders[0], SmallCNN) and len(conv.pi_net) == 0


def test_a_models_small_image_statistics_move_with_the_learner_batches():
    space = gym.spaces.Dict({"image": grid_space(), "direction": gym.spaces.Discrete(4)})
    model = ActorCritic.from_spaces(space, gym.spaces.Discrete(3))
    obs = {"image": torch.full((8, 7, 7, 3), 5, dtype=torch.uint8),
           "direction": torch.zeros(8, dtype=torch.int64)}
    prepared = model.prepare(obs)
    model.update_normalizers(prepared, torch.zeros(8), torch.ones(8, dtype=torch.bool))
    enc = model.encoders[model.keys.index("image")]
    assert torch.allclose(enc.norm.mean.flatten(), torch.full((3,), 5.0))
    assert "encoders.%d.norm.mean" % model.keys.index("image") in model.state_dict()  # travels with the weights


def test_a_small_image_state_dict_saved_before_the_statistics_loads_as_it_was_trained():
    """Saved when this encoder divided by 255: it loads (no missing keys) and sees the same input."""
    enc = image_encoder(grid_space(), "nature", ortho=True, small_images="conv")
    old = {k: v for k, v in enc.state_dict().items() if not k.startswith("norm.")}
    fresh = image_encoder(grid_space(), "nature", ortho=True, small_images="conv")
    fresh.load_state_dict(old)
    x = enc.scale(torch.randint(0, 11, (4, 7, 7, 3), dtype=torch.uint8))
    assert torch.allclose(fresh(x), enc.fc(enc.convs(x / 255.0)), atol=1e-5)
    fresh.update_stats(x)  # resumed training keeps that scale
    assert torch.allclose(fresh(x), enc.fc(enc.convs(x / 255.0)), atol=1e-4)


def test_the_policy_workers_fused_forward_gives_the_models_denormalised_values():
    """Return normalisation is on by default: the fused inference folds its scale into the
    value row, and must give what the model gives."""
    model = ActorCritic.from_spaces(gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2))
    model.value_norm.update(torch.randn(256) * 300 + 100)
    obs = {"obs": torch.randn(16, 4)}
    with torch.no_grad():
        params, values = model(obs)
    fused_params, fused_values = model.fused_forward()(obs)
    assert model.fused_forward() != model.forward  # the fused path was taken
    assert torch.allclose(fused_params, params, atol=1e-5) and torch.allclose(fused_values, values, atol=1e-3)
    assert float(values.abs().mean()) > 10  # in the returns' units, not normalised ones


def test_return_normalisation_starts_unlearnt_values_one_std_above_a_negative_mean():
    """The value head learns values in units of the targets' std. Where their mean is negative,
    its untrained output 0 (what a state the policy rarely visits keeps) is a value one std above
    the mean, never above 0: centred on the mean, CliffWalking's early falls made every unvisited
    state look worse than standing still; at a value of 0, every unvisited state looked better
    than anything simple_spread's agents could reach. A positive mean is centred on, as before
    2026-12-01 (MuJoCo's returns)."""
    model = ActorCritic.from_spaces(gym.spaces.Discrete(48), gym.spaces.Discrete(4))
    torch.nn.init.zeros_(model.value_head.weight)
    torch.nn.init.zeros_(model.value_head.bias)
    model.value_norm.update(torch.tensor([-600.0, -1200.0] * 512))  # falls: -900 +- 300
    obs = {"obs": torch.arange(48)}
    with torch.no_grad():
        assert torch.allclose(model(obs)[1], torch.full((48,), -600.0))
        assert torch.allclose(model.fused_forward()(obs)[1], torch.full((48,), -600.0))
        returns = torch.tensor([-13.0, -100.0, -900.0])
        assert torch.allclose(model.denormalize_values(model.normalize_values(returns)), returns)
        assert float(model.normalize_values(torch.tensor(-900.0))) == pytest.approx(-1.0, rel=1e-4)
    # returns that barely vary about a large negative mean still give outputs of about +-1
    penalised = ActorCritic.from_spaces(gym.spaces.Discrete(4), gym.spaces.Discrete(2))
    penalised.value_norm.update(torch.randn(4096) - 1000.0)  # -1 a step, always: -1000 +- 1
    assert float(penalised.normalize_values(torch.tensor(-1000.0))) == pytest.approx(-1.0, abs=0.05)
    # the optimism stops at a value of 0: a mean of -0.5 with a std of 5
    near_zero = ActorCritic.from_spaces(gym.spaces.Discrete(4), gym.spaces.Discrete(2))
    near_zero.value_norm.update(torch.tensor([-5.5, 4.5] * 512))
    assert float(near_zero.normalize_values(torch.tensor(0.0))) == pytest.approx(0.0, abs=1e-5)
    assert float(near_zero.normalize_values(torch.tensor(-5.0))) == pytest.approx(-1.0, rel=1e-4)
    survived = ActorCritic.from_spaces(gym.spaces.Discrete(4), gym.spaces.Discrete(2))
    survived.value_norm.update(torch.randn(4096) * 30 + 1000.0)  # a positive mean: centred on it
    mean, std = float(survived.value_norm.mean), float(survived.value_norm.var.sqrt())
    assert float(survived.normalize_values(torch.tensor(1030.0))) == pytest.approx((1030 - mean) / std, rel=1e-4)
    with torch.no_grad():
        four = {"obs": torch.arange(4)}
        assert torch.allclose(survived.fused_forward()(four)[1], survived(four)[1], atol=1e-3)


def test_a_model_saved_before_uncentred_returns_reads_its_values_as_it_learnt_them():
    """A state dict without ``value_norm.centred`` (saved before 2026-12-01) keeps its value
    head's meaning, value = output x std + mean, when loaded, also past set_parameters' exact
    check, and keeps it when saved again."""
    from asyncrl.parameters import _check_state_dict
    box, two = gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Discrete(2)
    trained = ActorCritic.from_spaces(box, two)
    trained.value_norm.update(torch.randn(256) * 30 + 100)
    old_state = {k: v for k, v in trained.state_dict().items() if k != "value_norm.centred"}
    model = ActorCritic.from_spaces(box, two)
    _check_state_dict(model, old_state, exact_match=True)  # nothing reported missing
    model.load_state_dict(old_state)
    assert float(model.value_norm.centred) == 1.0
    bare = ActorCritic.from_spaces(box, two, Config(normalize_returns=False))  # the head's output
    bare.load_state_dict({k: v for k, v in old_state.items() if not k.startswith("value_norm.")})
    obs = {"obs": torch.randn(16, 4)}
    with torch.no_grad():
        mean, std = trained.value_norm.mean, trained.value_norm.var.sqrt()
        expected = bare(obs)[1] * std + mean
        assert torch.allclose(model(obs)[1], expected, atol=1e-3)
        assert torch.allclose(model.fused_forward()(obs)[1], expected, atol=1e-3)
    again = ActorCritic.from_spaces(box, two)
    again.load_state_dict(model.state_dict())
    assert float(again.value_norm.centred) == 1.0


def test_the_fused_forward_folds_the_observation_normalisers_and_clips_as_they_do():
    """A Dict of a normalised Box beside a one-hot Discrete: the fused first layer divides the
    Box's columns (not the one-hot's) by the running std, and an outlier is clipped at +-10 std
    as the model's normaliser clips it."""
    space = gym.spaces.Dict({"pos": gym.spaces.Box(-1e3, 1e3, (3,), np.float32),
                             "room": gym.spaces.Discrete(5)})
    model = ActorCritic.from_spaces(space, gym.spaces.Discrete(4))
    assert model.norm_keys == ["pos"]
    model.obs_norm[0].update(torch.randn(512, 3) * torch.tensor([0.01, 5.0, 300.0]) + 40.0)
    model.value_norm.update(torch.randn(256) * 3)
    pos = torch.randn(16, 3) * torch.tensor([0.01, 5.0, 300.0]) + 40.0
    pos[0] = torch.tensor([50.0, -400.0, 1e3])  # far outside +-10 std in the first two entries
    obs = {"pos": pos, "room": torch.randint(0, 5, (16,))}
    with torch.no_grad():
        assert ((pos[0] - model.obs_norm[0].mean) / model.obs_norm[0].std()).abs().max() > 10
        params, values = model(obs)
    fused = model.fused_forward()
    assert fused != model.forward
    fused_params, fused_values = fused(obs)
    assert torch.allclose(fused_params, params, atol=1e-4) and torch.allclose(fused_values, values, atol=1e-4)


@pytest.mark.parametrize("family", [None, "atari", "doom"])
@pytest.mark.parametrize("caller", [{}, {"num_envs_per_worker": 4, "learning_rate": 1e-4}])
def test_a_saved_config_on_another_machine_takes_that_machines_fields(family, caller):
    """portable() leaves out what the machine implied and the caller did not set: a config made
    on a 2-core CPU, made again on a 16-core machine with a GPU (and back), is the one a new model
    gets there (Atari: the layout of its 16 envs that the cores give; VizDoom:
    no sampler niceness); what the caller set stays."""
    from asyncrl.config import MACHINE_FIELDS, portable
    machines = [dict(cpu_only=True, cores=2), dict(cpu_only=False, cores=16)]
    for there, here in (machines, machines[::-1]):
        saved = Config.from_kwargs(with_defaults(dict(caller), family=family, **there)).__dict__
        again = Config.from_kwargs(with_defaults(portable(saved, caller), family=family, **here))
        assert again == Config.from_kwargs(with_defaults(dict(caller), family=family, **here))
        if family == "atari" and caller:  # 4 envs a worker make 4 x 4 on either machine
            assert again == Config.from_kwargs(saved)
        else:
            assert again != Config.from_kwargs(saved)  # the machines differ in some field
        assert all(getattr(again, k) == v for k, v in caller.items())
    # a file saved before the caller's fields were recorded: kept whole, as before
    assert portable(saved, None) == saved
    assert {"sampler_nice", "num_workers", "batch_size"} <= MACHINE_FIELDS


def test_with_a_gpu_the_layout_follows_the_cores_and_keeps_few_batches_in_flight():
    from asyncrl.config import GPU_BATCHES_IN_FLIGHT, gpu_layout
    # two cores (this machine, CI): the Config defaults, so nothing is implied
    assert with_defaults({}, cpu_only=False, cores=2) == {}
    assert gpu_layout(2, 128, 1024) == dict(num_workers=2, num_envs_per_worker=8)
    # 16 cores: a rollout worker on every core but the policy worker's and the learner's
    assert with_defaults({}, cpu_only=False, cores=16) == dict(num_workers=14)  # 3.5 batches
    pong = Config.from_kwargs(with_defaults({"algo": "appo"}, family="atari", cpu_only=False, cores=16))
    assert (pong.num_workers, pong.num_envs_per_worker, pong.batch_size) == (14, 2, 1024)
    # many cores: fewer workers rather than more than GPU_BATCHES_IN_FLIGHT batches sampled at once
    for cores, rollout, lanes in ((64, 128, 1), (64, 32, 1), (64, 32, 2), (16, 32, 4)):
        layout = gpu_layout(cores, rollout, 1024, lanes)
        in_flight = layout["num_workers"] * layout["num_envs_per_worker"] * rollout * lanes
        assert in_flight <= GPU_BATCHES_IN_FLIGHT * 1024 and layout["num_envs_per_worker"] >= 2
    assert gpu_layout(64, 128, 1024) == dict(num_workers=16, num_envs_per_worker=2)
    # the caller's counts win; the one left unset still follows the cores, within the budget
    mine = {"num_workers": 6, "num_envs_per_worker": 4}
    assert with_defaults(mine, cpu_only=False, cores=16) == mine
    doom = with_defaults({"num_envs_per_worker": 16}, family="doom", cpu_only=False, cores=16)
    assert (doom["num_workers"], doom["num_envs_per_worker"]) == (8, 16)  # 4 batches of 1024
    assert with_defaults({"num_workers": 4}, cpu_only=False, cores=16) == {"num_workers": 4}
    few = with_defaults({"num_workers": 14, "algo": "appo"}, family="atari", cpu_only=False, cores=16)
    assert few["num_envs_per_worker"] == 2  # 14 x 2 x 128 steps: 3.5 batches of 1024
    assert with_defaults({"num_envs_per_worker": 4}, cpu_only=False, cores=2) == {
        "num_envs_per_worker": 4}  # two cores: the default 2 workers
    assert with_defaults({"num_workers": 0}, cpu_only=False, cores=16) == {"num_workers": 0}
    # a CPU-only run is left alone
    assert with_defaults({}, cpu_only=True, cores=16) == {}


def test_the_policy_heads_initial_gain_is_a_setting():
    """0.01 by default (a nearly uniform first policy); Sample Factory's 1 where one gradient
    step a batch must move the policy (Doom)."""
    space, actions = gym.spaces.Box(-1, 1, (8,), np.float32), gym.spaces.Discrete(4)
    for gain in (0.01, 1.0):
        model = ActorCritic.from_spaces(space, actions, Config(policy_head_gain=gain))
        rows = model.action_head.weight.norm(dim=1)  # orthogonal rows, each of norm gain
        assert torch.allclose(rows, torch.full_like(rows, gain), rtol=1e-4)
    assert Config().policy_head_gain == 0.01
