"""model.export: the ONNX file (run with onnxruntime) and the TorchScript file (run in a process
without asyncrl) give predict(deterministic=True)'s actions on 1,000 observations, per space
family: Box, Discrete and MultiDiscrete (with starts), Dict/Tuple observations with an image or a
text (the exported policy takes its word ids), Dict actions, masks from the observation and from
info, GRU and LSTM state."""
import os
import subprocess
import sys

import numpy as np
import onnxruntime
import pytest
import torch
from gymnasium.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, Text, Tuple

import space_envs as se
from asyncrl import APPO, ConfigError
from asyncrl.export import observation_inputs
from asyncrl.spaces import MASK_KEY

N_ENVS, STEPS = 50, 20  # 1,000 observations: 20 steps of 50 envs (the recurrent state carried)

CASES = {
    "box_obs-discrete_start": (se.space_env(Box(-2, 2, (3,), np.float32), Discrete(3, start=1)), {}),
    "discrete_obs-box_action": (se.space_env(Discrete(5, start=2), Box(-1, 1, (2,), np.float32)), {}),
    "dict_obs_with_image-dict_action": (se.space_env(
        Dict(pos=Box(-1, 1, (2,), np.float32), cell=Discrete(4),
             keys=MultiDiscrete([3, 2], start=[1, 0]), bits=MultiBinary(3),
             img=Box(0, 255, (12, 12, 3), np.uint8)),
        Dict(move=Discrete(3), force=Box(-1, 1, (1,), np.float32))), {}),
    "dict_obs_with_text": (se.space_env(
        Dict(mission=Text(12, charset="abc "), pos=Box(-1, 1, (2,), np.float32)), Discrete(3)), {}),
    "masked_in_obs-multidiscrete": (se.masked_env("obs", MultiDiscrete([3, 4])), {}),
    "masked_in_info-gru": (se.masked_env("info", Discrete(5)), dict(use_rnn=True, rnn_type="gru")),
    "tuple_obs-multibinary-lstm": (se.space_env(Tuple((Box(-1, 1, (2,), np.float32), Discrete(3))),
                                                MultiBinary(4)), dict(use_rnn=True, rnn_type="lstm")),
}

# Runs the TorchScript file in a fresh interpreter that never imports asyncrl.
TORCHSCRIPT_RUNNER = """
import sys, numpy as np, torch
policy = torch.jit.load(sys.argv[1])
data = np.load(sys.argv[2])
keys = [k for k in data.files if k.startswith("obs:")]
obs = torch.as_tensor(data["obs:obs"]) if data["bare"] else \\
    {k[4:]: torch.as_tensor(data[k]) for k in keys}
rest = [torch.as_tensor(data[k]) for k in ("mask", "state") if k in data.files]
out = policy(obs, *rest)
action, *state = out if rest and "state" in data.files else (out,)
if isinstance(action, dict):
    parts = {"action." + k: v for k, v in action.items()}
elif isinstance(action, tuple):
    parts = {f"action.{i}": v for i, v in enumerate(action)}
else:
    parts = {"action": action}
assert "asyncrl" not in sys.modules
np.savez(sys.argv[3], **{k: v.numpy() for k, v in parts.items()},
         **({"next_state": state[0].numpy()} if state else {}))
"""


def perturbed(model: APPO) -> APPO:
    """An action head far from its initial 0.01 gain (whose logits would nearly tie) and
    observation normalisers with statistics, so that the export must carry both."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.policy.action_head.parameters():
            p.normal_(0.0, 1.0)
        for norm in model.policy.obs_norm:
            norm.mean.normal_(0.0, 0.5)
            norm.var.uniform_(0.5, 2.0)
    return model


def observations(env, rng):
    """N_ENVS observations of ``env`` (and their masks where the env gives them in info)."""
    obs, masks = [], []
    for i in range(N_ENVS):
        o, info = env.reset(seed=int(rng.integers(1 << 30)))
        obs.append(o)
        masks.append(info.get(MASK_KEY))
    if isinstance(obs[0], dict):
        batch = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
    elif isinstance(obs[0], tuple):
        batch = tuple(np.stack([o[i] for o in obs]) for i in range(len(obs[0])))
    else:
        batch = np.stack(obs)
    return batch, (None if masks[0] is None else np.stack(masks))


def action_parts(action, names):
    if isinstance(action, dict):
        return [np.asarray(action[n.split(".", 1)[1]]) for n in names]
    if isinstance(action, tuple):
        return [np.asarray(a) for a in action]
    return [np.asarray(action)]


def assert_same(got, want, name):
    assert got.shape == want.shape, name
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)  # float sums
    else:
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(CASES))
def test_exported_policy_acts_as_predict(case, tmp_path):
    factory, kw = CASES[case]
    model = perturbed(APPO(factory, device="cpu", seed=0, verbose=0, **kw))
    spec = model.policy_spec
    assert model.export(tmp_path / "p.onnx") == "onnx"
    assert model.export(tmp_path / "p.pt") == "torchscript"
    session = onnxruntime.InferenceSession(str(tmp_path / "p.onnx"))
    names = [o.name for o in session.get_outputs()]
    action_names = [n for n in names if n.startswith("action")]
    recurrent = model.policy.core is not None
    env, rng = factory(), np.random.default_rng(0)
    state, ort_state = None, None
    for step in range(STEPS):
        obs, info_masks = observations(env, rng)
        starts = rng.random(N_ENVS) < 0.2 if step else np.ones(N_ENVS, bool)
        want, state = model.predict(obs, state=state, episode_start=starts, deterministic=True,
                                    action_masks=info_masks)
        feed = observation_inputs(spec, obs)
        if spec.env.mask_source is not None:
            mask = info_masks if info_masks is not None else obs[MASK_KEY]
            feed[MASK_KEY] = np.asarray(mask).astype(bool)
        if recurrent:
            if ort_state is None:
                ort_state = np.zeros((N_ENVS, model.policy.core.state_size), np.float32)
            feed["state"] = np.where(starts[:, None], 0.0, ort_state).astype(np.float32)
        got = dict(zip(names, session.run(None, feed)))
        for name, part in zip(action_names, action_parts(want, action_names)):
            assert_same(got[name], part, f"{case} step {step} {name}")
        if recurrent:
            ort_state = got["next_state"]
            flat = np.concatenate([s[0] for s in state], -1) if isinstance(state, tuple) else state[0]
            np.testing.assert_allclose(ort_state, flat, atol=1e-5)
        if step == STEPS - 1:  # the TorchScript file on the last batch, without asyncrl
            data = {f"obs:{k}": v for k, v in observation_inputs(spec, obs).items()}
            data["bare"] = np.array(spec.env.bare)  # a tensor, else a dict keyed by leaf
            if spec.env.mask_source is not None:
                data["mask"] = feed[MASK_KEY]
            if recurrent:
                data["state"] = feed["state"]
            np.savez(tmp_path / "in.npz", **data)
            subprocess.run([sys.executable, "-c", TORCHSCRIPT_RUNNER, str(tmp_path / "p.pt"),
                            str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                           check=True, timeout=60, cwd=tmp_path,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
            ts = np.load(tmp_path / "out.npz")
            for name, part in zip(action_names, action_parts(want, action_names)):
                assert_same(ts[name], part, f"{case} torchscript {name}")
            if recurrent:
                np.testing.assert_allclose(ts["next_state"], ort_state, atol=1e-5)


def test_export_names_its_inputs_and_outputs(tmp_path):
    model = APPO(se.masked_env("obs", MultiDiscrete([3, 4])), device="cpu", verbose=0,
                 use_rnn=True)
    model.export(tmp_path / "p.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "p.onnx"))
    assert [i.name for i in session.get_inputs()] == ["obs", MASK_KEY, "state"]
    assert [o.name for o in session.get_outputs()] == ["action", "next_state"]
    assert [i.type for i in session.get_inputs()] == ["tensor(float)", "tensor(bool)", "tensor(float)"]


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_an_image_policy_exports_in_float32_and_the_model_keeps_its_precision(tmp_path):
    """A CNN and the GRU behind it trained in bfloat16 (cnn_precision) export float32
    arithmetic, as the ONNX runtime's CPU convolutions need (a bfloat16 trace is a file it
    refuses): both files give the float32 model's continuous actions and next states, which
    bfloat16's differ from; the model keeps bfloat16."""
    model = APPO(se.space_env(Box(0, 255, (36, 36, 3), np.uint8), Box(-1, 1, (2,), np.float32)),
                 device="cpu", verbose=0, seed=0, cnn_precision="bfloat16", use_rnn=True,
                 rnn_type="gru")
    parts = [model.policy.encoders[0], model.policy.core]
    assert [p.precision for p in parts] == ["bfloat16"] * 2
    with torch.no_grad():  # means of order 1, where the precisions' difference shows
        model.policy.action_head.weight.normal_(0.0, 0.3)
    for path, fmt in ((tmp_path / "p.pt", "torchscript"), (tmp_path / "p.onnx", "onnx")):
        assert model.export(path) == fmt
    assert [p.precision for p in parts] == ["bfloat16"] * 2
    obs = np.random.default_rng(0).integers(0, 256, (64, 36, 36, 3), dtype=np.uint8)
    state = np.random.default_rng(1).normal(0, 0.5, (64, model.policy.state_size))
    state, starts = state.astype(np.float32), np.zeros(64, dtype=bool)

    def predict():  # (actions, next states [N, rnn_size]); predict's states are [1, N, rnn_size]
        actions, next_state = model.predict(obs, state=state[None], episode_start=starts,
                                            deterministic=True)
        return actions, next_state[0]

    bfloat16 = predict()
    for part in parts:
        part.precision = "float32"
    float32 = predict()
    for b16, f32 in zip(bfloat16, float32):  # the precisions differ here
        assert np.abs(b16 - f32).max() > 1e-3
    got = onnxruntime.InferenceSession(str(tmp_path / "p.onnx")).run(None, {"obs": obs,
                                                                            "state": state})
    scripted = torch.jit.load(str(tmp_path / "p.pt"))(torch.as_tensor(obs), torch.as_tensor(state))
    for ours, onnx, script in zip(float32, got, scripted):
        np.testing.assert_allclose(onnx, ours, rtol=0, atol=1e-5)
        np.testing.assert_allclose(script.numpy(), ours, rtol=0, atol=1e-5)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_export_format_errors_say_what_to_change(tmp_path):
    model = APPO("CartPole-v1", device="cpu", verbose=0)
    with pytest.raises(ConfigError, match=r"\*\.onnx.*\*\.pt"):
        model.export(tmp_path / "policy.bin")
    with pytest.raises(ConfigError, match="'onnx' or 'torchscript'"):
        model.export(tmp_path / "policy.bin", format="tflite")
    assert model.export(tmp_path / "policy.bin", format="torchscript") == "torchscript"
    assert torch.jit.load(str(tmp_path / "policy.bin"))(torch.zeros(2, 4)).shape == (2,)
