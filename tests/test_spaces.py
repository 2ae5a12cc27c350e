"""Every Gymnasium space: observations (Box of any rank and dtype, images HWC/CHW, Discrete with a
start, MultiDiscrete, MultiBinary, nested Dict/Tuple), actions (Discrete with a start,
MultiDiscrete, MultiBinary, bounded/unbounded Box, hybrid Tuple/Dict), action masks in their three
conventions, SB3 extractors and custom networks. The envs raise on any illegal action and the
runs use on_env_error="abort", so an illegal action fails the test."""
import copy
import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Tuple

import custom_envs
import space_envs as se
from test_multiprocess import worker_children
from asyncrl import APPO, ConfigError
from asyncrl.models import ActorCritic

SERIAL = dict(serial_mode=True, num_workers=1, num_envs_per_worker=2, rollout=16, device="cpu",
              verbose=0, seed=0, on_env_error="abort")
DISCRETE_BATCH = dict(batch_size=64, minibatch_size=32)  # Box actions: the continuous defaults' own
SMALL = dict(num_workers=2, num_envs_per_worker=4, rollout=16, batch_size=256, minibatch_size=128,
             device="cpu", verbose=0, seed=0, on_env_error="abort")

F32 = np.float32
OBS = {
    "box3": Box(-1.0, 1.0, (3,), F32),
    "box2d": Box(-1.0, 1.0, (2, 3), F32),
    "int32": Box(-3, 3, (4,), np.int32),
    "image_hwc": Box(0, 255, (7, 7, 3), np.uint8),
    "discrete_start": Discrete(5, start=2),
    "multidiscrete": MultiDiscrete([3, 4]),
    "multidiscrete_start": MultiDiscrete([3, 4], start=[1, -2]),
    "multibinary": MultiBinary(4),
    "dict_nested": Dict({"image": Box(0, 255, (7, 7, 3), np.uint8), "cue": Discrete(3, start=1),
                         "inner": Dict({"pos": Box(-1.0, 1.0, (2,), F32),
                                        "pair": Tuple((Box(-2.0, 2.0, (1,), F32), Discrete(2)))})}),
}
ACT = {
    "discrete_start": Discrete(3, start=-1),
    "multidiscrete": MultiDiscrete([2, 3]),
    "multibinary": MultiBinary(3),
    "box": Box(-1.0, 1.0, (2,), F32),
    "box_unbounded": Box(-np.inf, np.inf, (2,), F32),
    "tuple_hybrid": Tuple((Discrete(2), Box(-1.0, 1.0, (1,), F32))),
    "dict_hybrid": Dict({"a": Discrete(3), "b": Box(0.0, 1.0, (2,), F32)}),
}
GRID = [
    ("box3", "discrete_start"),
    ("box2d", "multidiscrete"),
    ("int32", "multibinary"),
    ("image_hwc", "box"),
    ("box3", "box_unbounded"),
    ("multidiscrete", "tuple_hybrid"),
    ("multibinary", "dict_hybrid"),
    ("dict_nested", "discrete_start"),
    ("dict_nested", "tuple_hybrid"),
    ("image_hwc", "dict_hybrid"),
    ("discrete_start", "box_unbounded"),
    ("discrete_start", "multidiscrete"),
    ("multidiscrete_start", "discrete_start"),
]


# --- helpers -----------------------------------------------------------------------------------
def config_for(act_space, base=SERIAL, **kw):
    """The test layout with small batches (Box actions get the continuous defaults otherwise)."""
    out = dict(base, **kw)
    if "batch_size" not in kw and base is SERIAL:
        out.update(DISCRETE_BATCH)
    return out


def se_has_box(space) -> bool:
    if isinstance(space, Box):
        return True
    if isinstance(space, (Tuple, Dict)):
        subs = space.spaces.values() if isinstance(space, Dict) else space.spaces
        return any(se_has_box(s) for s in subs)
    return False


def stack(space, samples):
    """Samples of ``space`` as one batch: arrays with a leading N, Dict/Tuple batched per key."""
    if isinstance(space, Dict):
        return {k: stack(s, [x[k] for x in samples]) for k, s in space.spaces.items()}
    if isinstance(space, Tuple):
        return tuple(stack(s, [x[i] for x in samples]) for i, s in enumerate(space.spaces))
    return np.stack([np.asarray(x) for x in samples])


def unbatch(space, batch, i):
    """Action ``i`` of a batch of predicted actions."""
    if isinstance(space, Dict):
        return {k: unbatch(s, batch[k], i) for k, s in space.spaces.items()}
    if isinstance(space, Tuple):
        return tuple(unbatch(s, batch[j], i) for j, s in enumerate(space.spaces))
    return batch[i]


def batch_len(space, batch):
    if isinstance(space, Dict):
        lens = {batch_len(s, batch[k]) for k, s in space.spaces.items()}
    elif isinstance(space, Tuple):
        assert isinstance(batch, tuple) and len(batch) == len(space.spaces)
        lens = {batch_len(s, b) for s, b in zip(space.spaces, batch)}
    else:
        assert isinstance(batch, np.ndarray), type(batch)
        return len(batch)
    assert len(lens) == 1, lens
    return lens.pop()


def assert_same(a, b):
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def observations(space, n, seed=123):
    space = copy.deepcopy(space)
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def check_predictions(model, obs_space, act_space, n=6):
    """Single and batched predictions lie in the action space, in the env's format."""
    obs = observations(obs_space, n)
    for deterministic in (False, True):
        for o in obs[:3]:
            action, state = model.predict(o, deterministic=deterministic)
            assert state is None
            assert se.legal(act_space, action), (action, act_space)
        batch, _ = model.predict(stack(obs_space, obs), deterministic=deterministic)
        assert batch_len(act_space, batch) == n
        for i in range(n):
            assert se.legal(act_space, unbatch(act_space, batch, i)), (batch, act_space)
    return stack(obs_space, obs)


# --- 1. every space trains, predicts, saves and loads ----------------------------------------
@pytest.mark.timeout(60)
@pytest.mark.parametrize("obs_name,act_name", GRID)
def test_space_trains_predicts_and_round_trips(obs_name, act_name, tmp_path):
    obs_space, act_space = OBS[obs_name], ACT[act_name]
    factory = se.space_env(obs_space, act_space)
    with APPO(factory, **config_for(act_space)) as model:
        if se_has_box(act_space):  # the continuous defaults apply
            assert model.config.normalize_obs and model.config.normalize_returns
            assert model.config.gamma == 0.99 and model.config.ent_coef == 0.0
        model.train(3 * model.config.batch_size)
        assert model.num_timesteps == 3 * model.config.batch_size
        assert model.policy_version == 3
        assert model.logger.env_restarts == 0
        assert all(torch.isfinite(p).all() for p in model.policy.state_dict().values())
        batch = check_predictions(model, obs_space, act_space)
        mean, _ = model.evaluate(2)  # played in this process: an illegal action raises
        assert math.isfinite(mean)
        expected, _ = model.predict(batch, deterministic=True)

        path = tmp_path / "model.pt"
        model.save(path)
        params = model.get_parameters()
    assert set(params) == {"policy", "policy.optimizer"}
    with APPO.load(path, device="cpu") as loaded:
        assert_same(loaded.predict(batch, deterministic=True)[0], expected)
        assert loaded.num_timesteps == 3 * loaded.config.batch_size
        loaded.train(loaded.config.batch_size)  # a loaded model trains on
        check_predictions(loaded, obs_space, act_space)
    with APPO(factory, **config_for(act_space, seed=7)) as other:
        other.set_parameters(params)
        assert_same(other.predict(batch, deterministic=True)[0], expected)


# --- 2. a real multi-process run with a Dict observation and a hybrid action ------------------
@pytest.mark.timeout(120)
def test_multiprocess_dict_obs_hybrid_action():
    obs_space, act_space = OBS["dict_nested"], ACT["tuple_hybrid"]
    with APPO(se.space_env(obs_space, act_space), algo="appo", **SMALL) as model:
        model.train(512)
        assert model.num_timesteps >= 512 and model.logger.env_restarts == 0
        assert model.logger.num_episodes > 0
        check_predictions(model, obs_space, act_space)
        model.train(256)  # paused and resumed
        assert model.num_timesteps >= 768 and model.logger.env_restarts == 0
    assert worker_children() == []


@pytest.mark.timeout(120)
def test_multiprocess_continuous_defaults_and_normalizers():
    """Box actions with the continuous defaults (asynchronous, running observation and return
    normalisers); the normalisers' buffers reach the main process."""
    obs_space, act_space = Box(0.0, 2.0, (3,), F32), ACT["dict_hybrid"]  # obs mean 1, var 1/3
    with APPO(se.space_env(obs_space, act_space), **SMALL) as model:
        assert model.config.algo == "appo" and model.config.num_epochs == 10
        assert model.config.normalize_obs and model.config.normalize_returns
        model.train(768)
        assert model.num_timesteps == 768 and model.logger.env_restarts == 0
        norm = model.policy.obs_norm[0]
        assert float(norm.count) > 0 and float(model.policy.value_norm.count) > 0
        np.testing.assert_allclose(norm.mean.numpy(), 1.0, atol=0.15)
        np.testing.assert_allclose(norm.var.numpy(), 1 / 3, atol=0.1)
        check_predictions(model, obs_space, act_space)
    assert worker_children() == []


# --- 3. action masks ---------------------------------------------------------------------------
CONVENTIONS = ["method", "info", "obs"]
MASKED_ACTIONS = {"discrete": Discrete(4, start=1), "multidiscrete": MultiDiscrete([3, 4, 2])}
WHERE = {"method": "action_masks()", "info": 'info["action_mask"]', "obs": "observation"}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("act_name", list(MASKED_ACTIONS))
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_masked_env_never_gets_a_masked_action(convention, act_name):
    act_space = MASKED_ACTIONS[act_name]
    with APPO(se.masked_env(convention, act_space), **SERIAL, **DISCRETE_BATCH) as model:
        assert model.policy_spec.env.mask_source == convention
        model.train(640)  # an illegal action aborts the run
        assert model.num_timesteps == 640 and model.logger.env_restarts == 0
        assert model.logger.num_episodes > 0
        model.evaluate(3, deterministic=False)
        model.evaluate(2, deterministic=True)


@pytest.mark.timeout(120)
def test_masks_in_a_multiprocess_run():
    with APPO(se.masked_env("info", MASKED_ACTIONS["multidiscrete"]), **SMALL) as model:
        model.train(1024)  # an illegal action aborts the run
        # episodes reach the main process in the workers' reports (every second, and when they
        # pause, which a short call may return before reading): a second call reads them
        model.train(1024)
        assert model.num_timesteps >= 2048 and model.logger.env_restarts == 0
        assert model.logger.num_episodes > 0
    assert worker_children() == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("act_name", list(MASKED_ACTIONS))
def test_predict_with_action_masks_never_returns_a_masked_action(act_name):
    act_space = MASKED_ACTIONS[act_name]
    env = se.masked_env("method", act_space)()
    with APPO(se.masked_env("method", act_space), **SERIAL, **DISCRETE_BATCH) as model:
        model.train(128)
        rng = np.random.default_rng(0)
        n = 2000
        obs = rng.uniform(0, 1, (n, env.n)).astype(np.float32)
        masks = np.stack([se.random_mask(rng, act_space) for _ in range(n)])
        for deterministic in (False, True):
            actions, _ = model.predict(obs, deterministic=deterministic, action_masks=masks)
            assert len(actions) == n
            for a, m in zip(actions, masks):
                assert se.legal(act_space, a) and se.masked_ok(act_space, m, a), (a, m)
        # one observation at a time, a 1-D mask (MaskablePPO's call)
        for i in range(200):
            a, _ = model.predict(obs[i], action_masks=masks[i])
            assert se.legal(act_space, a) and se.masked_ok(act_space, masks[i], a)
        # a single legal action per dimension is always the one taken
        one = np.zeros_like(masks)
        sizes = [act_space.n] if isinstance(act_space, Discrete) else list(act_space.nvec)
        starts = np.cumsum([0] + sizes[:-1])
        picks = np.stack([rng.integers(0, k, n) for k in sizes], 1)
        for d, s in enumerate(starts):
            one[np.arange(n), s + picks[:, d]] = True
        actions, _ = model.predict(obs, action_masks=one)
        want = picks[:, 0] + act_space.start if isinstance(act_space, Discrete) else picks + act_space.start
        np.testing.assert_array_equal(actions, want)
        # all legal: every action of the first dimension is still sampled (nothing over-masked)
        seen = set()
        for _ in range(5):
            actions, _ = model.predict(obs[:400], action_masks=np.ones((400, masks.shape[1]), bool))
            seen |= {int(a) for a in np.asarray(actions).reshape(400, -1)[:, 0]}
        first = [act_space.n] if isinstance(act_space, Discrete) else [act_space.nvec[0]]
        assert len(seen) == first[0]


@pytest.mark.timeout(60)
def test_predict_takes_the_mask_from_a_dict_observation():
    act_space = MASKED_ACTIONS["discrete"]
    env = se.masked_env("obs", act_space)()
    with APPO(se.masked_env("obs", act_space), **SERIAL, **DISCRETE_BATCH) as model:
        rng = np.random.default_rng(1)
        n = 1000
        masks = np.stack([se.random_mask(rng, act_space) for _ in range(n)])
        obs = {"obs": rng.uniform(0, 1, (n, env.n)).astype(np.float32),
               "action_mask": masks.astype(np.int8)}
        actions, _ = model.predict(obs)
        for a, m in zip(actions, masks):
            assert se.masked_ok(act_space, m, a)
        single, _ = model.predict({"obs": obs["obs"][0], "action_mask": obs["action_mask"][0]})
        assert se.masked_ok(act_space, masks[0], single)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", ["size", "dtype"])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_bad_masks_raise_config_error_at_construction(convention, bad):
    act_space = Discrete(4)
    with pytest.raises(ConfigError) as e:
        APPO(se.masked_env(convention, act_space, bad_mask=bad), **SERIAL)
    msg = str(e.value)
    assert WHERE[convention] in msg, msg
    if bad == "size":
        assert "(3,)" in msg and "Discrete(4)" in msg and "4 entries" in msg, msg
    else:
        assert "dtype" in msg and "float32" in msg, msg


def test_bad_mask_message_for_action_masks_method():
    with pytest.raises(ConfigError, match=r"action_masks\(\) has shape \(3,\), but the action space "
                                          r"Discrete\(4\) needs 4 entries"):
        APPO(se.masked_env("method", Discrete(4), bad_mask="size"), **SERIAL)


def test_mask_for_a_continuous_action_space_is_a_config_error():
    with pytest.raises(ConfigError, match="no discrete part"):
        APPO(se.ContinuousMaskedEnv, **SERIAL)


# --- 4. property: random nested observation spaces and random action spaces --------------------
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

KEYS = st.sampled_from(["a", "b", "image", "pos", "x_1", "Cue"])
SHAPES = st.lists(st.integers(1, 3), min_size=1, max_size=2).map(tuple)
STARTS = st.integers(-2, 2)
LEAVES = st.one_of(
    SHAPES.map(lambda s: Box(-1.0, 1.0, s, F32)),
    SHAPES.map(lambda s: Box(-2.0, 2.0, s, np.float64)),
    SHAPES.map(lambda s: Box(-3, 3, s, np.int32)),
    st.sampled_from([(5, 5, 3), (6, 6, 1), (2, 6, 6), (3, 5, 5)]).map(lambda s: Box(0, 255, s, np.uint8)),
    st.builds(lambda n, s: Discrete(n, start=s), st.integers(1, 4), STARTS),
    st.builds(lambda nv, s: MultiDiscrete(nv, start=[s] * len(nv)),
              st.lists(st.integers(1, 4), min_size=1, max_size=3), STARTS),
    st.integers(1, 4).map(MultiBinary),
)
OBS_SPACES = st.recursive(
    LEAVES,
    lambda kids: st.one_of(st.dictionaries(KEYS, kids, min_size=1, max_size=3).map(Dict),
                           st.lists(kids, min_size=1, max_size=3).map(lambda xs: Tuple(tuple(xs)))),
    max_leaves=5)
ACT_LEAVES = st.one_of(
    st.builds(lambda n, s: Discrete(n, start=s), st.integers(1, 4), STARTS),
    st.builds(lambda n: Box(-1.0, 1.0, (n,), F32), st.integers(1, 3)),
    st.builds(lambda n: Box(-np.inf, np.inf, (n,), F32), st.integers(1, 2)),
)
ACT_SPACES = st.one_of(
    ACT_LEAVES,
    st.lists(st.integers(1, 4), min_size=1, max_size=3).map(MultiDiscrete),
    st.integers(1, 4).map(MultiBinary),
    st.lists(ACT_LEAVES, min_size=1, max_size=3).map(lambda xs: Tuple(tuple(xs))),
    st.dictionaries(KEYS, ACT_LEAVES, min_size=1, max_size=3).map(Dict),
    # not supported: must be a ConfigError naming it
    st.just(Tuple((MultiDiscrete([2, 3]), Box(-1.0, 1.0, (1,), F32)))),
    st.just(Box(-3, 3, (2,), np.int64)),
)


def supported_action(space) -> bool:
    if isinstance(space, Box):
        return np.issubdtype(space.dtype, np.floating)
    if isinstance(space, (Tuple, Dict)):
        subs = space.spaces.values() if isinstance(space, Dict) else space.spaces
        return all(isinstance(s, (Discrete, Box)) and supported_action(s) for s in subs)
    return True


@pytest.mark.timeout(300)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(obs_space=OBS_SPACES, act_space=ACT_SPACES)
def test_random_spaces_work_or_raise_config_error(obs_space, act_space, tmp_path_factory):
    factory = se.space_env(obs_space, act_space)
    try:
        model = APPO(factory, **config_for(act_space))
    except ConfigError as e:
        assert not supported_action(act_space), f"{obs_space} / {act_space}: {e}"
        assert "not supported" in str(e), str(e)
        return
    assert supported_action(act_space), f"{act_space} should have been refused"
    with model:
        model.train(2 * model.config.batch_size)
        assert model.policy_version == 2 and model.logger.env_restarts == 0
        batch = check_predictions(model, obs_space, act_space, n=4)
        expected, _ = model.predict(batch, deterministic=True)
        path = tmp_path_factory.mktemp("prop") / "m.pt"
        model.save(path)
    with APPO.load(path, device="cpu") as loaded:
        assert_same(loaded.predict(batch, deterministic=True)[0], expected)


# --- 5. short learning checks ------------------------------------------------------------------
def greedy_mean_return(model, env, episodes, seed=10_000):
    total = 0.0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        while True:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += reward
            if terminated or truncated:
                break
    return total / episodes


LEARN = dict(serial_mode=True, num_workers=1, num_envs_per_worker=8, rollout=16, device="cpu",
             verbose=0, seed=0, on_env_error="abort")


@pytest.mark.timeout(60)
def test_learns_continuous_target():
    """Reward -|a - target|: a policy ignoring the target scores about -0.5."""
    env = se.target_env()
    with APPO(se.target_env, batch_size=128, minibatch_size=64, **LEARN) as model:
        assert model.config.normalize_obs
        before = greedy_mean_return(model, env, 300)
        model.train(20_000)
        after = greedy_mean_return(model, env, 300)
    assert before < -0.4, before
    assert after > -0.33 and after > before + 0.15, (before, after)


@pytest.mark.timeout(60)
def test_learns_dict_observation_cue():
    """Reward 1 when the action is obs["cue"] (a distractor Box beside it): chance is 1/4."""
    env = se.cue_env()
    with APPO(se.cue_env, batch_size=128, minibatch_size=64, **LEARN) as model:
        model.train(3000)
        score = greedy_mean_return(model, env, 50) / 8
    assert score > 0.8, score


class WordSpace(gym.Space):
    """A space of strings that is not gymnasium's Text (as MiniGrid's MissionSpace is not)."""

    def __init__(self):
        super().__init__(dtype=str)

    def sample(self, mask=None, probability=None):
        return "go to the red door"

    def contains(self, x):
        return isinstance(x, str)


def test_text_leaves_are_stored_as_word_ids():
    from asyncrl.spaces import (TEXT_BUCKETS, TEXT_TOKENS, EnvSpec, encode_text, is_text,
                                token_id)
    ids = encode_text("Go to the RED ball, then open a door")
    assert ids.shape == (TEXT_TOKENS,) and ids.dtype == np.int64
    words = ["go", "to", "the", "red", "ball", ",", "then", "open", "a", "door"]
    assert list(ids[:10]) == [token_id(w) for w in words] and not ids[10:].any()
    with pytest.warns(UserWarning, match="more than 2 words and punctuation marks.*cut"):
        assert list(encode_text("a b c d", 2)) == [token_id("a"), token_id("b")]
    batch = encode_text(np.array([["go left"], ["go right"]]), 4)
    assert batch.shape == (2, 1, 4) and batch[0, 0, 1] != batch[1, 0, 1]
    # BabyAI's words (every word and mark of its missions): no two share an id
    babyai = (", a after and ball behind blue box door front go green grey in key left next "
              "object of on open pick purple put red right the then to up yellow you your").split()
    assert len({token_id(w) for w in babyai}) == len(babyai)
    assert all(1 <= token_id(w) <= TEXT_BUCKETS for w in babyai)
    # any space of strings is text; a Text space stores no more ids than it has characters
    assert is_text(WordSpace()) and is_text(gym.spaces.Text(5)) and not is_text(Discrete(3))
    spec = EnvSpec(Dict({"m": gym.spaces.Text(5), "w": WordSpace(), "x": OBS["box3"]}), Discrete(2))
    entries = spec.obs_entries()
    assert entries["obs/m"].shape == (5,) and entries["obs/w"].shape == (TEXT_TOKENS,)
    arrays, n, single = spec.batch_obs({"m": "ab c", "w": "go", "x": np.zeros(3, F32)})
    assert single and n == 1 and list(arrays["m"][0]) == [token_id("ab"), token_id("c"), 0, 0, 0]
    with pytest.raises(ValueError, match="'m' is text"):
        spec.batch_obs({"m": 3, "w": "go", "x": np.zeros(3, F32)})


def test_a_text_reads_the_same_alone_and_in_any_batch():
    """The text encoder reads each different text of a batch once, up to the batch's longest:
    a text's features (and their gradient) do not depend on what else is in the batch."""
    from asyncrl.encoders import TextEncoder
    from asyncrl.spaces import encode_text
    torch.manual_seed(0)
    encoder = TextEncoder()
    texts = np.array(["", "go", "go to the red door", "go to the red door", "a b c d e f g h i j"])
    with pytest.warns(UserWarning, match="more than 8 words"):  # the last one's 9th and 10th
        ids = torch.as_tensor(encode_text(texts, 8))
    batch = encoder(ids[[2, 0, 4, 1, 3, 2]])
    alone = torch.cat([encoder(ids[[i]]) for i in (2, 0, 4, 1, 3, 2)])
    torch.testing.assert_close(batch, alone)
    assert not batch[1].any() and batch[0].abs().sum() > 0  # the empty text reads as zeros
    every_position = encoder._read(ids[[2, 0, 4, 1, 3, 2]])  # what an exported policy computes
    torch.testing.assert_close(batch, every_position)
    grads = [torch.autograd.grad(f.square().sum(), list(encoder.gru.parameters()))
             for f in (batch, every_position)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_policy_worker_reads_each_text_once_per_weight_version():
    """Once a policy worker takes a model's fused_forward (per weight version), its forwards
    without gradients keep each text's features while the weights stay: the GRU reads a text
    the first time only, and weights changed in place are never answered from the old memo.
    The learner's reading of a batch's different texts is torch.unique's, in another order."""
    from asyncrl.encoders import TextEncoder, distinct_texts
    from asyncrl.models import ActorCritic
    from asyncrl.spaces import EnvSpec
    torch.manual_seed(0)
    env = se.text_cue_env()
    model = ActorCritic.from_spaces(env.observation_space, env.action_space)
    encoder = next(m for m in model.modules() if isinstance(m, TextEncoder))
    spec = EnvSpec(env.observation_space, env.action_space)
    missions = np.array(["go to the red", "", "now pick up the blue key, then stop",
                         "go to the red", "go to the grey"] * 4)
    arrays, _, _ = spec.batch_obs({"mission": missions,
                                   "noise": np.zeros((len(missions), 3), np.float32)})
    obs = {k: torch.as_tensor(a) for k, a in arrays.items()}
    texts, which = distinct_texts(obs["mission"])
    assert len(texts) == 4 and texts.shape[1] == 9  # 4 texts, the longest 9 words and marks
    torch.testing.assert_close(texts[which], obs["mission"][:, :9])
    assert len(torch.unique(which)) == len(torch.unique(obs["mission"], dim=0))

    read, calls = encoder._read, []
    encoder._read = lambda ids: calls.append(len(ids)) or read(ids)
    with torch.no_grad():
        plain = model(obs)  # no memo taken yet: read
        forward = model.fused_forward()
        for _ in range(2):  # the second pass from the memo
            for got, want in zip(forward(obs), plain):
                torch.testing.assert_close(got, want)
        forward({k: v[:2] for k, v in obs.items()})
        model(obs)  # any forward without gradients, while the weights stay
        assert calls == [4, 4]  # each text read once for the memo
        for p in encoder.gru.parameters():  # new weights without a new fused_forward
            p.add_(0.1)
        after = forward(obs)
        assert calls == [4, 4, 4]  # not from the old memo
        model.fused_forward()  # a memo of the new weights
    fresh = model(obs)  # with gradients: never from a memo
    assert calls == [4, 4, 4, 4]
    for got, want in zip(after, fresh):
        torch.testing.assert_close(got, want.detach())


@pytest.mark.timeout(90)
def test_learns_which_action_a_text_names(tmp_path):
    """Reward 1 when the action is the colour the mission names, in one of three phrasings
    (chance 1/4); predict, save and load take the mission as a string, one or a batch."""
    env = se.text_cue_env()
    with APPO(se.text_cue_env, batch_size=128, minibatch_size=64, **LEARN) as model:
        model.train(6000)
        score = greedy_mean_return(model, env, 50) / 8
        missions = np.array([p.format(c) for p in se.TextCueEnv.PHRASES
                             for c in se.TextCueEnv.COLOURS])
        noise = np.zeros((len(missions), 3), F32)
        actions, _ = model.predict({"mission": missions, "noise": noise}, deterministic=True)
        one, _ = model.predict({"mission": missions[1], "noise": noise[0]}, deterministic=True)
        model.save(tmp_path / "m")
    assert score > 0.8, score
    assert int(one) == actions[1]
    assert (actions == np.tile(np.arange(4), 3)).mean() > 0.8, actions
    with APPO.load(tmp_path / "m", device="cpu") as loaded:
        again, _ = loaded.predict({"mission": missions, "noise": noise}, deterministic=True)
    assert np.array_equal(again, actions)


@pytest.mark.timeout(60)
def test_learns_multidiscrete_copy():
    """Reward: dimensions of the MultiDiscrete action equal to the observation's. Chance per step
    1/3 + 1/4 + 1/2 ~ 1.08 of 3."""
    env = se.copy_env()
    with APPO(se.copy_env, batch_size=128, minibatch_size=64, **LEARN) as model:
        model.train(8000)
        per_step = greedy_mean_return(model, env, 50) / 8
    assert per_step > 2.5, per_step  # seeds 0-5 reach 2.96-3.0


# --- 6. SB3 extractors, policy_kwargs, custom policies -----------------------------------------
SB3_DICTS = {
    "image_discrete_box": Dict({"img": Box(0, 255, (36, 36, 3), np.uint8), "cue": Discrete(3),
                                "pos": Box(-1.0, 1.0, (2,), F32)}),
    "with_multidiscrete": Dict({"cue": Discrete(3), "code": MultiDiscrete([2, 3]),
                                "pos": Box(-1.0, 1.0, (2,), F32)}),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dict_name", [
    "image_discrete_box", "with_multidiscrete"])
def test_sb3_combined_extractor_trains_unchanged(dict_name, tmp_path):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.torch_layers import CombinedExtractor
    obs_space, act_space = SB3_DICTS[dict_name], Discrete(3)
    factory = se.space_env(obs_space, act_space)
    kw = dict(features_extractor_class=CombinedExtractor,
              features_extractor_kwargs=dict(cnn_output_dim=16), net_arch=[32])
    with APPO(factory, policy_kwargs=kw, **SERIAL, **DISCRETE_BATCH) as model:
        assert isinstance(model.policy.encoders, CombinedExtractor)
        before = [p.detach().clone() for p in model.policy.parameters()]
        model.train(128)
        assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))
        batch = check_predictions(model, obs_space, act_space)
        expected, _ = model.predict(batch, deterministic=True)
        model.save(tmp_path / "m.pt")
    with APPO.load(tmp_path / "m.pt", device="cpu") as loaded:
        assert isinstance(loaded.policy.encoders, CombinedExtractor)
        assert_same(loaded.predict(batch, deterministic=True)[0], expected)


@pytest.mark.timeout(60)
def test_user_features_extractor_and_sb3_policy_kwargs():
    pytest.importorskip("stable_baselines3")
    obs_space, act_space = Box(-1.0, 1.0, (5,), F32), Box(-1.0, 1.0, (2,), F32)
    kw = dict(features_extractor_class=se.SmallExtractor, features_extractor_kwargs=dict(features_dim=12),
              net_arch=dict(pi=[16], vf=[24, 8]), activation_fn=torch.nn.ReLU,
              share_features_extractor=False, log_std_init=-0.5, ortho_init=False)
    with APPO(se.space_env(obs_space, act_space), policy_kwargs=kw, batch_size=32, minibatch_size=32,
              **SERIAL) as model:
        pol = model.policy
        assert model.config.normalize_obs  # Box actions: the continuous defaults
        assert isinstance(pol.encoders, se.SmallExtractor) and isinstance(pol.vf_encoders, se.SmallExtractor)
        assert pol.encoders is not pol.vf_encoders
        widths = lambda seq: [m.out_features for m in seq if isinstance(m, torch.nn.Linear)]  # noqa: E731
        assert widths(pol.pi_net) == [16] and widths(pol.vf_net) == [24, 8]
        assert any(isinstance(m, torch.nn.ReLU) for m in pol.pi_net)
        assert torch.allclose(pol.dist.log_std, torch.full((2,), -0.5))
        model.train(64)
        assert model.policy_version == 2
        check_predictions(model, obs_space, act_space)


@pytest.mark.timeout(60)
def test_custom_policy_class_trains(tmp_path):
    obs_space = Dict({"img": Box(0, 255, (7, 7, 3), np.uint8), "cue": Discrete(3),
                      "pos": Box(-1.0, 1.0, (2,), F32)})
    act_space = Tuple((Discrete(3), Box(-1.0, 1.0, (2,), F32)))
    with APPO(se.space_env(obs_space, act_space), policy=se.CustomPolicy,
              policy_kwargs=dict(hidden=16), batch_size=32, minibatch_size=32, **SERIAL) as model:
        assert isinstance(model.policy.net, se.CustomPolicy)
        assert model.policy.net.pi.out_features == 3 + 2
        before = [p.detach().clone() for p in model.policy.net.parameters()]
        model.train(96)
        assert model.policy_version == 3
        assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.net.parameters()))
        batch = check_predictions(model, obs_space, act_space)
        expected, _ = model.predict(batch, deterministic=True)
        model.save(tmp_path / "m.pt")
    with APPO.load(tmp_path / "m.pt", device="cpu") as loaded:
        assert isinstance(loaded.policy.net, se.CustomPolicy) and loaded.policy.net.pi.in_features == 16
        assert_same(loaded.predict(batch, deterministic=True)[0], expected)


@pytest.mark.timeout(30)
def test_policy_kwargs_errors():
    factory = se.space_env(OBS["box3"], Discrete(2))
    with pytest.raises(ConfigError, match="net_arch"):
        APPO(factory, policy_kwargs=dict(net_arch="big"), **SERIAL)
    with pytest.raises(ConfigError, match="unknown"):
        APPO(factory, policy_kwargs=dict(net_arch=[8], hidden_layers=[8]), **SERIAL)
    # an extractor whose output (5 wide) is not its features_dim (8)
    with pytest.raises(ConfigError, match="features_dim"):
        APPO(factory, policy_kwargs=dict(features_extractor_class=se.SmallExtractor,
                                         features_extractor_kwargs=dict(features_dim=8, width=5)),
             **SERIAL)


@pytest.mark.timeout(30)
def test_unsupported_spaces_are_config_errors():
    with pytest.raises(ConfigError) as e:
        APPO(se.space_env(Dict({"seen": gym.spaces.Graph(Box(-1.0, 1.0, (2,), F32), None),
                                "x": OBS["box3"]}), Discrete(2)), **SERIAL)
    assert "'seen'" in str(e.value) and "Graph" in str(e.value), str(e.value)
    bad = Tuple((MultiDiscrete([2, 3]), Box(-1.0, 1.0, (1,), F32)))
    with pytest.raises(ConfigError) as e:
        APPO(se.space_env(OBS["box3"], bad), **SERIAL)
    assert "MultiDiscrete" in str(e.value) and "not supported" in str(e.value), str(e.value)


@pytest.mark.timeout(30)
def test_partially_bounded_box_action_is_clipped_to_its_finite_bounds():
    act_space = Box(np.array([-1.0, 0.0], F32), np.array([np.inf, 1.0], F32))
    with APPO(se.space_env(OBS["box3"], act_space), **SERIAL) as model:
        actions, _ = model.predict(np.zeros((500, 3), F32))
        assert all(se.legal(act_space, a) for a in actions), actions.min(0)
        model.train(64)


@pytest.mark.timeout(30)
def test_a_dotted_dict_key_does_not_hide_a_nested_key():
    obs_space = Dict({"a.b": Box(-1.0, 1.0, (2,), F32), "a": Dict({"b": Box(-1.0, 1.0, (3,), F32)})})
    try:
        model = APPO(se.space_env(obs_space, Discrete(2)), **SERIAL, **DISCRETE_BATCH)
    except ConfigError:
        return  # refusing the ambiguous keys is fine too
    with model:
        assert len(model.policy_spec.env.leaves) == 2, model.policy_spec.env.leaves


# --- 7. Discrete with a start ------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_discrete_start_sends_exactly_its_values():
    act_space = Discrete(3, start=-1)
    factory = se.space_env(OBS["box3"], act_space, 5, True)
    se.SEEN_ACTIONS.clear()
    with APPO(factory, **SERIAL, **DISCRETE_BATCH) as model:
        model.train(256)
        seen = {int(a) for a in se.SEEN_ACTIONS}
        assert seen == {-1, 0, 1}, seen
        se.SEEN_ACTIONS.clear()
        model.evaluate(2)
        model.evaluate(2, deterministic=False)
        assert len(se.SEEN_ACTIONS) == 4 * 5
        assert {int(a) for a in se.SEEN_ACTIONS} <= {-1, 0, 1}
        actions, _ = model.predict(np.zeros((600, 3), F32))
        assert set(actions.tolist()) == {-1, 0, 1}
        assert np.issubdtype(actions.dtype, np.integer)


# --- 8. the running normalisers reach the main process -----------------------------------------
@pytest.mark.timeout(60)
def test_obs_normalizer_buffers_reach_the_main_process(tmp_path):
    obs_space = Box(0.0, 2.0, (3,), F32)  # uniform: mean 1, variance 1/3
    factory = se.space_env(obs_space, Discrete(2))
    with APPO(factory, normalize_obs=True, **SERIAL, **DISCRETE_BATCH) as model:
        norm = model.policy.obs_norm[0]
        assert float(norm.count) == 0
        model.train(640)
        learner = model._runner.components[-1].model
        assert float(norm.count) > 0
        assert float(norm.count) == float(learner.obs_norm[0].count)
        assert torch.equal(norm.mean, learner.obs_norm[0].mean)
        np.testing.assert_allclose(norm.mean.numpy(), 1.0, atol=0.15)
        np.testing.assert_allclose(norm.var.numpy(), 1 / 3, atol=0.1)
        count = float(norm.count)
        model.save(tmp_path / "m.pt")
    with APPO.load(tmp_path / "m.pt", device="cpu") as loaded:
        assert float(loaded.policy.obs_norm[0].count) == count


@pytest.mark.timeout(60)
def test_small_images_train_with_the_tiny_cnn_too():
    """Images under the Nature CNN's 36 x 36 were refused even with cnn="tiny"."""
    with APPO(custom_envs.small_image_env, cnn="tiny", **SERIAL, batch_size=32, minibatch_size=32) as model:
        model.train(64)
        action, _ = model.predict(model.observation_space.sample())
        assert model.action_space.contains(action)


@pytest.mark.timeout(60)
def test_a_file_saved_before_small_images_existed_loads_with_its_convolutions(tmp_path):
    """Small images were encoded with convolutions before ``small_images`` (default "flat")."""
    from asyncrl.encoders import SmallCNN
    with APPO(custom_envs.small_image_env, small_images="conv", **SERIAL, batch_size=32,
              minibatch_size=32) as model:
        model.train(64)
        model.save(tmp_path / "m.pt")
        obs = [model.observation_space.sample() for _ in range(8)]
        expected = [int(model.predict(o, deterministic=True)[0]) for o in obs]
    blob = torch.load(tmp_path / "m.pt", weights_only=False)
    del blob["config"]["small_images"]
    torch.save(blob, tmp_path / "old.pt")
    with APPO.load(tmp_path / "old.pt", device="cpu") as loaded:
        assert loaded.config.small_images == "conv" and isinstance(loaded.policy.encoders[0], SmallCNN)
        assert [int(loaded.predict(o, deterministic=True)[0]) for o in obs] == expected


def test_uint8_observations_that_are_not_images_are_scaled():
    """A 2-D uint8 observation reached the MLP unscaled (0..255)."""
    space = gym.spaces.Box(0, 255, (5, 6), np.uint8)
    model = ActorCritic.from_spaces(space, gym.spaces.Discrete(2))
    obs = torch.full((3, 5, 6), 255, dtype=torch.uint8)
    prepared = model.prepare({"obs": obs})["obs"]
    assert prepared.shape == (3, 30) and float(prepared.max()) == pytest.approx(1.0)


def test_a_board_of_planes_is_encoded_as_a_small_image():
    """PettingZoo's boards (0/1 planes, channels last) get the small-image encoder, not an MLP."""
    from asyncrl.encoders import SmallCNN
    from asyncrl.models import ActorCritic
    from asyncrl.spaces import channel_last, is_board
    connect_four = gym.spaces.Box(0, 1, (6, 7, 2), np.int8)
    chess = gym.spaces.Box(0, 1, (8, 8, 111), bool)
    planes_first = gym.spaces.Box(0, 1, (2, 6, 7), np.int8)
    assert is_board(connect_four) and is_board(chess) and is_board(planes_first)
    assert channel_last(connect_four) and channel_last(chess) and not channel_last(planes_first)
    assert not is_board(gym.spaces.Box(0, 2, (6, 7, 2), np.int8))  # counts, not planes
    assert not is_board(gym.spaces.Box(0.0, 1.0, (6, 7, 2), np.float32))
    model = ActorCritic.from_spaces(connect_four, gym.spaces.Discrete(7))
    assert isinstance(model.encoders[0], SmallCNN) and model.encoders[0].convs[0].in_channels == 2
    params, values = model(torch.as_tensor(np.stack([connect_four.sample() for _ in range(3)])))
    assert params.shape == (3, 7) and values.shape == (3,)
