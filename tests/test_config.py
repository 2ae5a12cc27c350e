"""Config.from_kwargs and APPO(...) reject what asyncrl cannot run, saying what to change."""
import dataclasses
import os

import gymnasium as gym
import numpy as np
import pytest
import torch

import custom_envs
from asyncrl import APPO, Config, ConfigError

SMALL = dict(num_workers=1, num_envs_per_worker=4, rollout=16, batch_size=128, minibatch_size=64,
             device="cpu", verbose=0)


def make(env="CartPole-v1", **kwargs):
    model = APPO(env, **kwargs)
    model.close()
    return model


def test_defaults_are_valid_and_frozen():
    cfg = Config.from_kwargs({})
    assert cfg == Config()
    assert cfg.batch_size % cfg.slot_size == 0 and cfg.batch_size % cfg.minibatch_size == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.num_workers = 3


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_unknown_keyword_suggests_close_field():
    expected = r"unknown argument 'learnig_rate' \(did you mean 'learning_rate'\?\)"
    with pytest.raises(ConfigError, match=expected):
        Config.from_kwargs({"learnig_rate": 1e-3})
    with pytest.raises(ConfigError, match=r"did you mean 'num_envs_per_worker'"):
        make(num_env_per_worker=4)


def test_odd_num_envs_per_worker():
    with pytest.raises(ConfigError, match=r"num_envs_per_worker=3.*even") as e:
        Config.from_kwargs({"num_envs_per_worker": 3})
    assert "num_envs_per_worker" in str(e.value)


def test_batch_size_not_multiple_of_slot_suggests_value():
    # slot = rollout x envs per group = 32 x 4 = 128; the nearest multiple of 1000 is 1024.
    with pytest.raises(ConfigError) as e:
        Config.from_kwargs({"rollout": 32, "num_envs_per_worker": 8, "batch_size": 1000,
                            "minibatch_size": 500})
    msg = str(e.value)
    assert "batch_size=1000" in msg and "128" in msg
    assert "try batch_size=1024" in msg
    Config.from_kwargs({"rollout": 32, "num_envs_per_worker": 8, "batch_size": 1024,
                        "minibatch_size": 512})  # the suggestion is accepted


def test_minibatch_must_divide_batch():
    with pytest.raises(ConfigError, match=r"minibatch_size=300 must divide batch_size=1024"):
        Config.from_kwargs({"batch_size": 1024, "minibatch_size": 300})


@pytest.mark.parametrize("device", ["gpu", "cuda:", "cuda:x", "tpu:0", ""])
def test_bad_device_string(device):
    with pytest.raises(ConfigError, match=r"device=.*cpu"):
        Config.from_kwargs({"device": device})


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "auto"])
def test_valid_device_strings(device):
    assert Config.from_kwargs({"device": device}).device == device


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_gpu_is_config_error(device):
    with pytest.raises(ConfigError, match=r"device='cuda.*no CUDA"):
        make(device=device)


def test_auto_device_resolves_to_something_usable():
    model = make(**{**SMALL, "device": "auto"})
    assert model.device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_invalid_algo():
    expected = r"algo='a2c': must be one of \('appo', 'impala', 'ppo'\)"
    with pytest.raises(ConfigError, match=expected):
        make(algo="a2c")


def test_several_errors_in_one_message():
    with pytest.raises(ConfigError) as e:
        Config.from_kwargs({"num_workers": 0, "learning_rate": -1.0, "activation": "sigmoid",
                            "gamma": 1.5})
    msg = str(e.value)
    for field in ("num_workers=0", "learning_rate=-1.0", "activation='sigmoid'", "gamma=1.5"):
        assert field in msg


def test_bad_values_are_reported_before_cross_field_checks():
    """rollout=0 would divide by zero in the batch_size check: it must come out as a ConfigError."""
    with pytest.raises(ConfigError, match=r"rollout=0: must be an integer >= 1"):
        Config.from_kwargs({"rollout": 0, "batch_size": 1000})
    with pytest.raises(ConfigError, match=r"num_envs_per_worker='8'"):
        Config.from_kwargs({"num_envs_per_worker": "8"})


def test_impala_with_explicit_epochs_is_error():
    with pytest.raises(ConfigError, match=r"num_epochs=4: algo='impala'"):
        make(algo="impala", num_epochs=4)


def test_dual_clip_is_an_error_without_a_clipped_surrogate():
    with pytest.raises(ConfigError, match=r"dual_clip=3.0: algo='impala' has no clipped surrogate"):
        Config.from_kwargs({"algo": "impala", "dual_clip": 3.0})
    with pytest.raises(ConfigError, match=r"dual_clip=0.5: must be None or a number > 1"):
        Config.from_kwargs({"dual_clip": 0.5})


def test_impala_defaults_to_one_epoch():
    assert make(algo="impala", **SMALL).config.num_epochs == 1


def test_ppo_default_batch_is_one_rollout_of_every_env():
    cfg = make(algo="ppo", num_workers=2, num_envs_per_worker=4, rollout=16, device="cpu").config
    assert cfg.batch_size == 2 * 4 * 16
    assert cfg.batch_size % cfg.minibatch_size == 0
    assert cfg.num_slots == cfg.slots_per_batch  # synchronous: one batch of slots
    # An explicit, inconsistent batch_size is reported, not silently replaced.
    with pytest.raises(ConfigError, match=r"batch_size=256: algo='ppo'.*= 128"):
        make(algo="ppo", num_workers=2, num_envs_per_worker=4, rollout=16, batch_size=256,
             minibatch_size=128)


def test_batches_to_accumulate_sizes_the_slots_the_sampling_may_fill_ahead():
    """One slot per env group (each fills one while the learner trains) and this many batches;
    synchronous PPO keeps exactly one batch whatever it says."""
    cfg = Config(num_workers=2, num_envs_per_worker=4, rollout=16, batch_size=256)
    assert cfg.slots_per_batch == 8 and cfg.num_groups == 4
    assert cfg.num_slots == 4 + cfg.batches_to_accumulate * 8
    assert cfg.replace(batches_to_accumulate=3).num_slots == 4 + 3 * 8
    assert cfg.replace(algo="ppo", batch_size=128, batches_to_accumulate=3).num_slots == 4
    with pytest.raises(ConfigError, match=r"batches_to_accumulate=0: must be an integer >= 1"):
        cfg.replace(batches_to_accumulate=0)


@pytest.mark.parametrize("bad", [dict(num_workers=None), dict(rollout=0), dict(num_workers="2")])
def test_ppo_with_bad_count_is_config_error(bad):
    """algo='ppo' derives batch_size from the counts: a bad count must still be a ConfigError."""
    (name,) = bad
    with pytest.raises(ConfigError, match=name):
        make(algo="ppo", **bad)


def test_unregistered_env_id_suggests_close_match():
    with pytest.raises(ConfigError, match=r"'CartPol-v1' is not a registered.*'CartPole-v1'"):
        make("CartPol-v1")


def test_env_instance_rejected():
    env = gym.make("CartPole-v1")
    try:
        with pytest.raises(ConfigError, match=r"not an env instance"):
            make(env)
    finally:
        env.close()


def test_unpicklable_factory_rejected():
    """A lambda is pickled by value; one that captures a lock cannot be pickled at all."""
    import threading
    make(lambda: gym.make("CartPole-v1"))
    with pytest.raises(ConfigError, match=r"env factory .* cannot be pickled, not even by value.*locks"):
        make(lambda lock=threading.Lock(): gym.make("CartPole-v1"))


def test_box_action_space_gets_the_continuous_defaults_and_keywords_win():
    model = make(custom_envs.box_action_env)
    assert model.config.normalize_obs and model.config.normalize_returns
    assert model.config.learning_rate == 3e-4 and model.config.gamma == 0.99
    assert model.config.minibatch_size == 256 and model.config.num_epochs == 10
    tuned = make(custom_envs.box_action_env, learning_rate=1e-3, normalize_obs=False).config
    assert tuned.learning_rate == 1e-3 and not tuned.normalize_obs and tuned.gamma == 0.99
    cartpole = make(custom_envs.cartpole).config  # discrete actions: the Config defaults
    assert cartpole.normalize_obs and cartpole.learning_rate == Config.learning_rate


def test_multidiscrete_actions_get_the_factored_defaults_and_keywords_win():
    import space_envs
    from asyncrl.config import FACTORED_DEFAULTS
    assert make(space_envs.copy_env).config.ent_coef == FACTORED_DEFAULTS["ent_coef"]
    assert make(space_envs.copy_env, ent_coef=0.01).config.ent_coef == 0.01


def test_dict_observation_space_accepted():
    model = make(custom_envs.dict_obs_env)
    action, _ = model.predict({"pos": np.zeros(2, np.float32)})
    assert int(action) in (0, 1)


def test_sequence_observation_key_rejected_naming_key_and_wrapper():
    with pytest.raises(ConfigError, match=r"observation key 'seen' is a Sequence space.*"
                       r"ObservationWrapper"):
        make(custom_envs.sequence_obs_env)


def test_unsupported_top_level_key_names_the_filter_that_drops_it():
    """A Sequence beside other keys of a Dict: the error says how to drop it."""
    from asyncrl.spaces import flatten_space
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    seq = gym.spaces.Sequence(gym.spaces.Discrete(3))
    space = gym.spaces.Dict({"image": box, "seen": seq, "direction": box})
    with pytest.raises(ConfigError, match=r"'seen'.*FilterObservation\(env, \['direction', "
                       r"'image'\]\)"):  # a Dict sorts its keys
        flatten_space(space)
    # only a top-level Dict key is the wrapper's to drop, and only beside another key
    nested = gym.spaces.Dict({"a": gym.spaces.Dict({"t": seq, "x": box})})
    for other, key in ((nested, "'a.t'"),
                       (gym.spaces.Tuple((seq, box)), "'0'"),
                       (gym.spaces.Dict({"seen": seq}), "'seen'")):
        with pytest.raises(ConfigError) as e:
            flatten_space(other)
        assert key in str(e.value) and "FilterObservation" not in str(e.value), str(e.value)


def test_observation_outside_declared_space_rejected():
    with pytest.raises(ConfigError, match=r"first observation.*observation_space"):
        make(custom_envs.out_of_space_env)


def test_module_level_factory_accepted():
    model = make(custom_envs.cartpole, **SMALL)
    assert model.observation_space.shape == (4,)
    assert model.action_space.n == 2
    action, _ = model.predict(model.observation_space.sample())
    assert int(action) in (0, 1)


def test_env_kwargs_with_factory_rejected():
    with pytest.raises(ConfigError, match=r"env_kwargs"):
        APPO(custom_envs.cartpole, env_kwargs={"max_episode_steps": 10})


@pytest.mark.parametrize("steps", [0, -5, 1.5, "100"])
def test_bad_train_budget(steps):
    model = make(**SMALL)
    with pytest.raises(ConfigError, match=r"train_for_env_steps"):
        model.train(steps)


def test_factory_returning_none_is_config_error():
    with pytest.raises(ConfigError, match="NoneType, not a gymnasium.Env"):
        make(custom_envs.returns_none)


def test_channel_last_images_accepted():
    model = make(custom_envs.channel_last_image_env, cnn="tiny")
    action, _ = model.predict(model.observation_space.sample())
    assert 0 <= int(action) < 3


@pytest.mark.timeout(120)
def test_classes_defined_in_a_function_reach_the_workers():
    """An env class, its factory (a lambda) and an SB3-style extractor class made inside a
    function cannot be imported by the spawned workers: they are pickled by value and train."""
    from torch import nn

    class LocalEnv(gym.Env):
        observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.zeros(3, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.zeros(3, np.float32), float(action), False, self.t >= 8, {}

    class LocalExtractor(nn.Module):
        def __init__(self, observation_space, features_dim=8):
            super().__init__()
            self.features_dim = features_dim
            self.net = nn.Sequential(nn.Linear(3, features_dim), nn.Tanh())

        def forward(self, obs):
            return self.net(obs)

    with APPO(lambda: LocalEnv(), policy_kwargs=dict(features_extractor_class=LocalExtractor),
              num_workers=2, num_envs_per_worker=2, rollout=16, batch_size=64,
              minibatch_size=32, device="cpu", verbose=0, seed=0) as model:
        model.train(2000)
        assert model.num_timesteps >= 2000


def test_hyperparameter_attributes_update_the_config_at_once():
    """model.learning_rate = x shows in model.config at once (not at the next train()); a bad
    value raises where it is set and is not kept; a schedule stays what was set, its value at
    the start in the config."""
    model = make("CartPole-v1")
    model.learning_rate = 1e-4
    assert model.config.learning_rate == 1e-4
    with pytest.raises(ConfigError, match="learning_rate=-1"):
        model.learning_rate = -1
    assert model.learning_rate == 1e-4 and model.config.learning_rate == 1e-4
    model.clip_range = 0.3  # SB3's name
    assert model.clip_coef == 0.3 and model.config.clip_coef == 0.3
    schedule = lambda progress: 3e-4 * progress  # noqa: E731
    model.learning_rate = schedule
    assert model.learning_rate is schedule and model.config.learning_rate == 3e-4


def test_appo_signature_lists_every_config_field_with_its_type_and_default():
    """IDEs and type checkers read ConfigKwargs (``**kwargs: Unpack[ConfigKwargs]``); help(),
    inspect and notebooks read the runtime signature and docstring: all three name every field
    of Config but the engine's own, with Config's type and default."""
    import inspect

    from asyncrl.config import ENGINE_SET, MUTABLE_HPARAMS, ConfigKwargs
    fields = {f.name: f for f in dataclasses.fields(Config) if f.name not in ENGINE_SET}
    hints = {k: getattr(v, "__forward_arg__", v) for k, v in ConfigKwargs.__annotations__.items()}
    assert list(hints) == list(fields)
    for name, f in fields.items():
        assert hints[name] == (f"Union[{f.type}, Schedule]" if name in MUTABLE_HPARAMS else f.type), name
    params = inspect.signature(APPO).parameters
    for name, f in fields.items():
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[name].default == f.default and params[name].annotation == hints[name]
        assert f":param {name}: {f.metadata['doc']}" in APPO.__init__.__doc__
    assert "lanes_per_env" not in params
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        APPO("CartPole-v1", learning_rat=1e-3)


@pytest.mark.timeout(30)
def test_a_model_that_fails_to_build_leaves_no_scratch_folder():
    import glob
    import tempfile
    mine = lambda: set(glob.glob(os.path.join(tempfile.gettempdir(), f"asyncrl-{os.getpid()}-*")))  # noqa: E731
    before = mine()
    with pytest.raises(ConfigError, match="net_arch") as error:  # kept, as a notebook keeps it
        APPO("CartPole-v1", policy_kwargs={"net_arch": "wide"})  # fails building the model
    assert mine() == before and error.traceback  # (its frames hold the half-built model)


@pytest.mark.timeout(30)
def test_every_switch_must_be_a_bool():
    """Each bool field of Config refuses a string or a number, naming itself (a "yes" must not
    read as True, nor 0 as False)."""
    switches = [f.name for f in dataclasses.fields(Config) if f.type in ("bool", bool)]
    assert {"spread_first_episodes", "centralized_critic", "use_rnn"} <= set(switches)
    for name in switches:
        with pytest.raises(ConfigError, match=rf"{name}='yes': must be True or False"):
            Config.from_kwargs({name: "yes"})
        with pytest.raises(ConfigError, match=rf"{name}=0: must be True or False"):
            Config.from_kwargs({name: 0})
