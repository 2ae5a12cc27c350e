"""Property-based: random configs and env specs thrown at the constructor either work or raise
a ConfigError that names a field; nothing else escapes, nothing hangs."""
import dataclasses
import functools
import re

import gymnasium as gym
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from asyncrl import APPO, Config, ConfigError  # noqa: E402

FIELDS = [f.name for f in dataclasses.fields(Config)]
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5000), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.tuples(st.integers(-2, 64)), st.sampled_from(
        ["cpu", "cuda", "cuda:7", "auto", "appo", "impala", "ppo", "tiny", "nature", "abort", "tanh"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), ANY_VALUE, max_size=4))
def test_random_configs_work_or_raise_config_error(kwargs):
    given = set(kwargs) - {"tensorboard_log"}
    kwargs = {**kwargs, "verbose": kwargs.get("verbose", 0), "tensorboard_log": None}
    try:
        cfg = Config.from_kwargs(kwargs)
    except ConfigError as e:
        named = [name for name in given if re.search(rf"\b{name}\b", str(e))]
        assert named, f"{e} names none of {sorted(given)}"
        return
    # accepted: every value given is the one the config holds (lists become tuples)
    for name, value in kwargs.items():
        held = getattr(cfg, name)
        assert held == (tuple(value) if isinstance(value, list) else value) or value != value, name


class SpecEnv(gym.Env):
    """An env whose spaces and first observation come from the test."""

    def __init__(self, obs_space, action_space, first_obs):
        self.observation_space, self.action_space, self.first_obs = obs_space, action_space, first_obs

    def reset(self, *, seed=None, options=None):
        return self.first_obs, {}

    def step(self, action):
        return self.first_obs, 0.0, True, False, {}


SPACES = st.sampled_from([
    gym.spaces.Box(-1, 1, (4,), np.float32), gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
    gym.spaces.Box(0, 255, (84, 84, 3), np.uint8), gym.spaces.Box(0, 255, (2, 8, 8), np.uint8),
    gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 3]), gym.spaces.Box(-1, 1, (2,), np.float64),
    gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Box(-1, 1, (3,), np.int64)])


@settings(max_examples=60, deadline=None)
@given(obs_space=SPACES, action_space=SPACES, shape_ok=st.booleans())
def test_random_env_specs_work_or_raise_config_error(obs_space, action_space, shape_ok):
    first = obs_space.sample()
    if not shape_ok and isinstance(first, np.ndarray):
        first = np.zeros((7,), first.dtype)

    factory = functools.partial(SpecEnv, obs_space, action_space, first)  # picklable
    bad_obs = not shape_ok and isinstance(first, np.ndarray)
    bad_action = isinstance(action_space, gym.spaces.Box) and action_space.dtype.kind != "f"
    try:
        with APPO(factory, serial_mode=True, verbose=0, device="cpu") as model:
            action, _ = model.predict(obs_space.sample())
    except ConfigError as e:
        # the action space is checked first, then the first observation
        if bad_action:
            assert "Box action space of dtype" in str(e), str(e)
        else:
            assert bad_obs and "first observation" in str(e), str(e)
        return
    assert not bad_obs and not bad_action, "a bad spec was accepted"
    assert action_space.contains(action), (action, action_space)
