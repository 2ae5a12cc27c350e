"""The learner's targets: time-limit truncation bootstraps, termination does not."""
import gymnasium as gym
import numpy as np
import pytest
import torch

import custom_envs
from asyncrl import APPO, Config, ConfigError
from asyncrl.fileio import PolicyFiles
from asyncrl.learner import Batch, Learner
from asyncrl.models import ActorCritic

T, B = 5, 3


def make_learner(**overrides):
    cfg = Config(seed=0, **overrides)
    env = gym.make("CartPole-v1")
    queues = type("Q", (), {"full_slot": None, "free_slot": None, "report": None,
                            "ring_all": lambda: None})
    learner = Learner(cfg, None, "cpu", buffers=None, optimizer_state=None,
                      weights=None, shared_hparams=None, ctl=None, queues=queues,
                      files=PolicyFiles("/nonexistent"))
    learner.model = ActorCritic.from_spaces(env.observation_space, env.action_space, cfg)
    return learner


def on_policy_batch(learner, done_at, truncated):
    torch.manual_seed(1)
    obs = torch.randn(T + 1, B, 4)
    actions = torch.randint(0, 2, (T, B, 1))
    with torch.no_grad():  # behaviour = current policy: log rho = 0
        log_probs, _, _ = learner.model.evaluate({"obs": obs[:T].flatten(0, 1)}, actions.flatten(0, 1))
    dones = torch.zeros(T, B, dtype=torch.bool)
    dones[done_at] = True
    trunc = torch.zeros(T, B, dtype=torch.bool)
    trunc[done_at] = truncated
    return Batch({"obs": obs}, actions, log_probs.view(T, B), torch.ones(T, B), dones, trunc,
                 torch.zeros(T, B, dtype=torch.int64))


@pytest.mark.parametrize("bootstrap", [True, False])
def test_truncation_bootstraps_from_value(bootstrap):
    learner = make_learner(bootstrap_truncation=bootstrap)
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=True)
    vt, values, _ = learner.targets(batch, {"obs": batch.obs["obs"].flatten(0, 1)}, None)
    gamma = learner.cfg.gamma
    # discount 0 at the end: v_s = r_s (+ gamma * V(x_s) when the end was a time limit)
    expected = 1.0 + (gamma * values[2, 1] if bootstrap else 0.0)
    assert vt.vs[2, 1].item() == pytest.approx(float(expected), abs=1e-5)


def test_termination_never_bootstraps():
    learner = make_learner(bootstrap_truncation=True)
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=False)
    vt, _, _ = learner.targets(batch, {"obs": batch.obs["obs"].flatten(0, 1)}, None)
    assert vt.vs[2, 1].item() == pytest.approx(1.0, abs=1e-5)


def test_samples_from_replaced_weights_are_not_trained_on():
    """After set_parameters (MIN_VERSION moved), older samples are masked; a batch of only such
    samples makes no update at all (Adam's momentum would still move the weights)."""
    from asyncrl.buffers import Ctl, SharedControl
    learner = make_learner(minibatch_size=5, batch_size=15, rollout=5, num_envs_per_worker=6)
    learner.ctl = SharedControl()
    learner.version = 7
    learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in learner.model.parameters()]
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=False)._replace(
        policy_versions=torch.full((T, B), 6, dtype=torch.int64))
    learner.ctl[Ctl.MIN_VERSION] = 7
    assert learner.train_on(batch) == {}
    assert all(torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))
    versions = torch.full((T, B), 6, dtype=torch.int64)
    versions[:, 0] = 7  # one trajectory made by the new weights
    stats = learner.train_on(batch._replace(policy_versions=versions))
    assert stats["masked_fraction"] == pytest.approx(2 / 3)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.model.parameters()))


@pytest.mark.parametrize("decoupled", [True, False])
def test_lagged_samples_keep_their_gradient_with_the_decoupled_clip(decoupled):
    """Samples whose behaviour policy is far from the learner's (e^1 = 2.7 times less likely to
    take the action): PPO's ratio against the behaviour policy starts outside the clip range, so
    every one of them is clipped and gives no policy gradient; the decoupled ratio starts at 1
    (the lag is in V-trace's weight min(1, pi/mu) instead)."""
    from asyncrl.buffers import SharedControl
    learner = make_learner(minibatch_size=15, batch_size=15, rollout=5, num_envs_per_worker=6,
                           num_epochs=1, decoupled_clip=decoupled)
    learner.ctl = SharedControl()
    learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=1e-3)
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=False)
    learner.version = 3  # the samples are 3 versions old
    batch = batch._replace(log_probs=batch.log_probs - 1.0)
    stats = learner.train_on(batch)
    assert stats["clip_fraction"] == (0.0 if decoupled else 1.0)


@pytest.mark.parametrize("cnn, num_convs", [("nature", 3), ("tiny", 0)])
def test_image_env_trains_in_serial_mode_with_uint8_obs(cnn, num_convs):
    with APPO(custom_envs.tiny_image_env, num_workers=1, num_envs_per_worker=2, rollout=8,
              batch_size=16, minibatch_size=8, serial_mode=True, seed=0, verbose=0, cnn=cnn) as model:
        assert not isinstance(model.policy.encoders[0], torch.nn.Flatten)  # a CNN for uint8 [C, H, W]
        convs = [m for m in model.policy.modules() if isinstance(m, torch.nn.Conv2d)]
        assert len(convs) == num_convs
        before = [p.clone() for p in model.policy.parameters()]
        model.train(64)
        assert model.num_timesteps == 64
        assert any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))
        obs = model.observation_space.sample()
        action, _ = model.predict(obs, deterministic=True)
        assert 0 <= int(action) < 3


def test_docs_document_every_config_field():
    import dataclasses
    import pathlib
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "configuration.md").read_text()
    missing = [f.name for f in dataclasses.fields(Config) if f"| `{f.name}` | `{f.default!r}` |" not in doc]
    assert not missing, f"docs/configuration.md's table is out of date for {missing}: paste Config().describe()"


def test_image_model_weights_round_trip_channels_last():
    from asyncrl.buffers import SharedWeights
    env = custom_envs.tiny_image_env()
    cfg = Config()
    torch.manual_seed(0)
    a = ActorCritic.from_spaces(env.observation_space, env.action_space, cfg)
    torch.manual_seed(1)
    b = ActorCritic.from_spaces(env.observation_space, env.action_space, cfg)
    weights = SharedWeights(a, version=3, env_steps=7)
    assert weights.load(b) == (3, 7)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    conv = b.encoders[0].convs[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)  # kept through the copy
    obs = torch.randint(0, 256, (2, *env.observation_space.shape), dtype=torch.uint8)
    torch.testing.assert_close(a(obs)[0], b(obs)[0])


def test_targets_in_minibatch_chunks_equal_one_pass_over_the_batch():
    """targets() evaluates the batch in minibatch-sized chunks (no fresh mapping per update);
    the values and log-probabilities are those of one forward pass over the whole batch."""
    learner = make_learner(minibatch_size=4)  # (T+1)*B = 18 frames: chunks of 4, 4, 4, 4, 2
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=False)
    obs = {"obs": batch.obs["obs"].flatten(0, 1)}
    vt, values, log_probs = learner.targets(batch, obs, None)
    with torch.no_grad():
        all_log_probs, _, all_values = learner.model.evaluate(
            obs, torch.cat([batch.actions.flatten(0, 1), batch.actions[0]]))
    all_values = learner.model.denormalize_values(all_values)  # evaluate's are the head's scale
    torch.testing.assert_close(values, all_values.view(T + 1, B)[:T])
    torch.testing.assert_close(log_probs, all_log_probs.view(T + 1, B)[:T])


def test_frames_scaled_into_a_reused_buffer_equal_a_fresh_scale():
    from asyncrl.encoders import ConvEncoder
    frames = torch.randint(0, 256, (6, 4, 12, 12), dtype=torch.uint8)
    buf = torch.full(frames.shape, float("nan")).contiguous(memory_format=torch.channels_last)
    cnn = ConvEncoder((4, 36, 36), hwc=False)
    out = cnn.scale(frames, out=buf)
    assert out.data_ptr() == buf.data_ptr() and out.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(out, frames.float() / 255.0, rtol=0, atol=1e-7)
    torch.testing.assert_close(cnn.scale(frames), out, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["nature", "doom", "doom_relu"])
def test_a_bfloat16_encoder_trains_float32_weights_as_float32_would(name):
    """cnn_precision="bfloat16": the convolutions compute under autocast, yet the features, the
    gradients and the weights Adam steps stay float32, and they match float32's to bfloat16's
    precision (a feature, a gradient's direction)."""
    from asyncrl.encoders import ConvEncoder
    torch.manual_seed(0)
    f32 = ConvEncoder((3, 72, 96), hwc=False, name=name, precision="float32")
    b16 = ConvEncoder((3, 72, 96), hwc=False, name=name, precision="bfloat16")
    b16.load_state_dict(f32.state_dict())
    x = f32.scale(torch.randint(0, 256, (16, 3, 72, 96), dtype=torch.uint8))
    y32, y16 = f32(x), b16(x)
    assert y16.dtype == torch.float32 and not torch.equal(y16, y32)  # computed in bfloat16
    torch.testing.assert_close(y16, y32, rtol=0.05, atol=0.02 * y32.abs().max().item())
    y32.square().mean().backward()
    y16.square().mean().backward()
    for (n, p32), p16 in zip(f32.named_parameters(), b16.parameters()):
        assert p16.dtype == p16.grad.dtype == torch.float32, n
        cos = torch.nn.functional.cosine_similarity(p16.grad.flatten(), p32.grad.flatten(), dim=0)
        assert cos > 0.98, (n, cos.item())


@pytest.mark.parametrize("cnn", ["doom_relu", "doom"])
def test_packed_bfloat16_layers_compute_what_plain_ones_do(cnn):
    """Inference's packed oneDNN kernels (ReLU fused) and matrices give the plain bfloat16
    layers' numbers for any batch, and every layer of the stack is computed."""
    from asyncrl.encoders import Bfloat16Conv, Bfloat16Linear, ConvEncoder
    torch.manual_seed(0)
    enc = ConvEncoder((3, 72, 96), hwc=True, name=cnn, precision="bfloat16")
    ops = enc.bfloat16_copies()
    convs = [op for op in ops if isinstance(op, Bfloat16Conv)]
    assert len(convs) == 3 and all(op.relu == (cnn == "doom_relu") for op in convs)
    for n in (1, 5, 16):
        x = enc.scale(torch.randint(0, 256, (n, 72, 96, 3), dtype=torch.uint8))
        with torch.no_grad():
            y = x.bfloat16()
            for op in ops:
                y = op(y)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                plain = enc.fc(enc.convs(x))
        assert torch.equal(y, plain), n
    w, h = torch.randn(48, 32), torch.randn(7, 32)
    unpacked = Bfloat16Linear(w)
    unpacked.packed = None
    assert torch.equal(Bfloat16Linear(w)(h), unpacked(h))
    assert torch.equal(unpacked(h), h.bfloat16() @ w.bfloat16().t())


def test_the_packing_checks_leave_the_random_stream_alone():
    """The first snapshot checks oneDNN's packed operators on random inputs; a user's seeded
    stream (a predict() in their script) must not move."""
    from asyncrl import encoders
    encoders._packs_linear.cache_clear()
    encoders._packs_conv.cache_clear()
    torch.manual_seed(3)
    encoders._packs_linear(), encoders._packs_conv()
    after = torch.rand(4)
    torch.manual_seed(3)
    assert torch.equal(after, torch.rand(4))


def test_bfloat16_inference_reuses_only_a_policy_workers_snapshot_of_current_weights():
    """Without gradients a bfloat16 CNN and GRU compute autocast's numbers with the weights as
    they are now: after the learner's fused Adam step (which leaves the weights' version counters
    alone), and after a policy worker's ``fused_forward`` snapshot once the weights were loaded
    anew; until they change, that snapshot is what inference uses."""
    from asyncrl.encoders import bfloat16_weights
    from asyncrl.learner import adam_step, make_optimizer
    cfg = Config(cnn="doom", use_rnn=True, rnn_type="gru", rnn_size=64, cnn_precision="bfloat16")
    torch.manual_seed(0)
    model = ActorCritic.from_spaces(gym.spaces.Box(0, 255, (72, 96, 3), np.uint8),
                                    gym.spaces.Discrete(4), cfg)
    enc, core = model.encoders[0], model.core
    obs = {"obs": torch.randint(0, 256, (8, 72, 96, 3), dtype=torch.uint8)}
    state = torch.randn(8, model.state_size)

    def run(grad: bool):
        with torch.set_grad_enabled(grad):
            return torch.cat([t.detach() for t in model(obs, state=state)[::2]], -1)
    opt = make_optimizer(model, cfg)
    for _ in range(2):  # a learner's steps: the first makes Adam's state, the second is fused
        assert torch.equal(run(False), run(True))
        params, values, _ = model(obs, state=state)
        opt.zero_grad()
        (params.square().mean() + values.square().mean()).backward()
        adam_step(opt)
    assert torch.equal(run(False), run(True))  # not the weights before the step
    forward = model.fused_forward()  # a policy worker's, after a load
    snap = bfloat16_weights(enc)
    assert bfloat16_weights(enc) is snap  # reused
    with torch.no_grad():
        assert torch.equal(forward(obs, state=state)[0], run(True)[:, :4])
        new = {k: v * 1.1 for k, v in model.state_dict().items()}
        model.load_state_dict(new)  # as SharedWeights.load: copy_ into the same tensors
    assert torch.equal(run(False), run(True))  # the stale snapshot is not used
    assert bfloat16_weights(enc) is not snap
    assert core.bfloat16_on(torch.device("cpu"))


def test_cnn_precision_auto_follows_the_hardware(monkeypatch):
    """"auto" computes bfloat16 where the CPU has AVX512-BF16 or AMX-BF16 (torch's capabilities,
    or on an older torch its private checks), "float32" never, "bfloat16" always; an encoder
    built by hand computes float32; a bad value is a ConfigError naming the choices."""
    from asyncrl import encoders
    cpu = torch.device("cpu")

    def auto_on():
        encoders.native_bfloat16.cache_clear()
        return encoders.ConvEncoder((4, 36, 36), hwc=False, precision="auto").bfloat16_on(cpu)

    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)  # oneDNN's build
    try:
        for caps, want in (({"avx512_bf16": True, "amx_bf16": False}, True), ({"amx_bf16": True}, True),
                           ({"avx512_bf16": False, "amx_bf16": False}, False), ({}, False)):
            monkeypatch.setattr(torch.cpu, "get_capabilities", lambda caps=caps: caps, raising=False)
            assert auto_on() is want, caps
        monkeypatch.delattr(torch.cpu, "get_capabilities", raising=False)
        for avx512_bf16, amx in ((True, False), (False, True), (False, False)):
            monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v, raising=False)
            monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda v=amx: v, raising=False)
            assert auto_on() is (avx512_bf16 or amx), (avx512_bf16, amx)
    finally:
        monkeypatch.undo()
        encoders.native_bfloat16.cache_clear()
    for precision, on in (("float32", False), ("bfloat16", True)):
        assert encoders.ConvEncoder((4, 36, 36), hwc=False, precision=precision).bfloat16_on(cpu) is on
    assert encoders.ConvEncoder((4, 36, 36), hwc=False).precision == "float32"
    assert encoders.native_bfloat16(torch.device("meta")) is False
    with pytest.raises(ConfigError, match="cnn_precision.*'float32'"):
        APPO("CartPole-v1", cnn_precision="fp16")


@pytest.mark.parametrize("lagged", [False, True])
def test_targets_reuse_the_policy_workers_values_only_for_samples_of_these_weights(lagged):
    """Samples drawn by the learner's current weights (synchronous PPO): the recorded
    log-probabilities and values are the model's own, so targets() evaluates only the B bootstrap
    observations and gets the targets of a full pass. One sample of an older version (or no
    recorded values) and the whole batch is evaluated again."""
    learner = make_learner()
    learner.version = 0
    batch = on_policy_batch(learner, done_at=(2, 1), truncated=True)
    obs = {"obs": batch.obs["obs"].flatten(0, 1)}
    full = learner.targets(batch, obs, None)
    with torch.no_grad():
        recorded = learner.model({"obs": obs["obs"][:T * B]})[1].view(T, B)
    versions = torch.zeros(T, B, dtype=torch.int64)
    versions[0, 0] = -1 if lagged else 0
    batch = batch._replace(values=recorded, policy_versions=versions)
    seen = []
    # the policy head's rows: every pass through the network (forward, evaluate) goes through it
    hook = learner.model.action_head.register_forward_hook(lambda m, args, out: seen.append(len(args[0])))
    reused = learner.targets(batch, obs, None)
    hook.remove()
    assert sum(seen) == ((T + 1) * B if lagged else B)
    for a, b in zip(full[:3], reused[:3]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("use_rnn, normalize_returns, num_epochs",
                         [(False, False, 1), (True, False, 1), (False, True, 1), (True, True, 2)])
def test_one_step_batches_share_the_targets_forward_pass_and_update_as_two_passes(use_rnn,
                                                                                  normalize_returns,
                                                                                  num_epochs):
    """One minibatch of the whole batch (Sample Factory's Doom settings): the targets' forward
    pass is the first epoch's loss's too (one pass fewer); a second epoch reuses the targets; the
    update equals the one with a targets pass before the epochs."""
    import copy
    rollout, cols = 4, 6
    # normalize_obs off: the one pass normalises the observations with the statistics from
    # before this batch's update of them, the second of two passes with the updated ones
    # (Learner.targets_in_first_epoch), so the two updates are equal only without it
    kw = dict(num_epochs=num_epochs, minibatch_size=rollout * cols, batch_size=rollout * cols,
              rollout=rollout, use_rnn=use_rnn, rnn_size=8, normalize_returns=normalize_returns,
              normalize_obs=False)
    learners = [make_learner(**kw) for _ in range(2)]
    initial = copy.deepcopy(learners[0].model)
    learners[1].model = copy.deepcopy(initial)
    torch.manual_seed(3)
    state = initial.state_size
    batch = Batch({"obs": torch.randn(rollout + 1, cols, 4)}, torch.randint(0, 2, (rollout, cols, 1)),
                  torch.full((rollout, cols), -0.7), torch.randn(rollout, cols),
                  torch.rand(rollout, cols) < 0.2, torch.zeros(rollout, cols, dtype=torch.bool),
                  torch.zeros(rollout, cols, dtype=torch.int64),
                  rnn_state=torch.randn(rollout + 1, cols, state) if use_rnn else None)
    passes = []
    for learner, one_step in zip(learners, (True, False)):
        learner.version = 1  # the samples are one version old: values are recomputed
        learner.ctl = type("Ctl", (), {"stopping": False, "__getitem__": lambda self, k: 0})()
        # plain SGD: Adam's first step is lr * sign(gradient), which float noise flips where a
        # gradient is ~0
        learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=0.1)
        assert learner.targets_in_first_epoch(batch)
        if not one_step:
            learner.targets_in_first_epoch = lambda b: False
        seen = []
        hook = learner.model.action_head.register_forward_hook(lambda m, args, out: seen.append(1))
        assert learner.train_on(batch)
        hook.remove()
        passes.append(len(seen))
    # the targets' pass is chunked by minibatch
    assert passes[0] == num_epochs and passes[1] >= num_epochs + 1
    for a, b, c in zip(learners[0].model.parameters(), learners[1].model.parameters(),
                       initial.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, c) for a, c in zip(learners[0].model.parameters(),
                                                      initial.parameters()))


@pytest.mark.parametrize("normalize_returns", [False, True])
def test_a_recurrent_first_epoch_makes_each_minibatchs_targets_as_its_own_batch_would(normalize_returns):
    """A recurrent model's minibatches are whole trajectories: the first epoch's forward pass of
    each gives its targets too (no pass over the batch before the epochs). The update equals
    training the minibatches' columns one after another as batches of their own (each with a
    targets pass under the weights the ones before it trained)."""
    import copy
    rollout, cols, per_minibatch = 4, 6, 2
    kw = dict(num_epochs=1, minibatch_size=rollout * per_minibatch, batch_size=rollout * cols,
              rollout=rollout, use_rnn=True, rnn_size=8, normalize_returns=normalize_returns,
              normalize_obs=False, target_kl=None)
    fused, reference = make_learner(**kw), make_learner(**kw)
    reference.model = copy.deepcopy(fused.model)
    initial = copy.deepcopy(fused.model)
    torch.manual_seed(4)
    batch = Batch({"obs": torch.randn(rollout + 1, cols, 4)}, torch.randint(0, 2, (rollout, cols, 1)),
                  torch.full((rollout, cols), -0.7), torch.randn(rollout, cols),
                  torch.rand(rollout, cols) < 0.3, torch.rand(rollout, cols) < 0.5,
                  torch.zeros(rollout, cols, dtype=torch.int64),
                  rnn_state=torch.randn(rollout + 1, cols, initial.state_size))
    # time limits among the ends, and one trajectory of a restarted worker (masked out)
    batch = batch._replace(truncated=batch.truncated & batch.dones)
    batch.policy_versions[:, 1] = -1
    assert batch.truncated.any() and (batch.dones & ~batch.truncated).any()
    rng = torch.Generator()
    rng.set_state(fused.rng.get_state())
    order = torch.randperm(cols, generator=rng)  # the columns' order in the fused epoch
    passes = []
    for learner in (fused, reference):
        learner.version = 1  # the samples are one version old: values are recomputed
        learner.ctl = type("Ctl", (), {"stopping": False, "__getitem__": lambda self, k: 0})()
        learner.optimizer = torch.optim.SGD(learner.model.parameters(), lr=0.1)
        seen = []
        learner.model.action_head.register_forward_hook(lambda m, args, out, seen=seen: seen.append(1))
        passes.append(seen)
    assert fused.targets_in_first_epoch(batch)
    assert fused.train_on(batch)
    reference.targets_in_first_epoch = lambda b: False
    for group in order.split(per_minibatch):
        part = Batch(*(None if x is None else
                       {k: v[:, group] for k, v in x.items()} if isinstance(x, dict) else x[:, group]
                       for x in batch))
        assert reference.train_on(part)
    assert len(passes[0]) == cols // per_minibatch and len(passes[1]) == 2 * len(passes[0])
    for a, b, c in zip(fused.model.parameters(), reference.model.parameters(), initial.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, c) for a, c in zip(fused.model.parameters(), initial.parameters()))
    if normalize_returns:
        torch.testing.assert_close(fused.model.value_norm.mean, reference.model.value_norm.mean)
    # where the update's starting policy is needed, and for a feed-forward model's shuffled
    # samples, the targets come before the epochs
    for overrides in (dict(target_kl=0.02), dict(decoupled_clip=True), dict(use_rnn=False)):
        learner = make_learner(**{**kw, **overrides})
        learner.version = 1
        part = batch if learner.cfg.use_rnn else batch._replace(rnn_state=None)
        assert not learner.targets_in_first_epoch(part), overrides


def make_masking_learner(**overrides):
    from asyncrl.buffers import SharedControl
    cfg = Config(seed=0, **overrides)
    env = gym.make("CartPole-v1")
    queues = type("Q", (), {"full_slot": None, "free_slot": None, "report": None,
                            "ring_all": lambda: None})
    learner = Learner(cfg, None, "cpu", buffers=None, weights=None, optimizer_state=None,
                      shared_hparams=None, ctl=SharedControl(), queues=queues,
                      files=PolicyFiles("/nonexistent"))
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
    learner = make_masking_learner(num_epochs=1, batch_size=32, minibatch_size=32, rollout=8,
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


@pytest.mark.parametrize("target_kl", [None, 0.01])
def test_target_kl_ends_the_update_once_the_policy_moved_too_far(target_kl):
    """A step large enough to move the policy by far more than 1.5 x target_kl from where the
    update started ends the update there (SB3's target_kl); without one, every minibatch of
    every epoch steps."""
    from asyncrl.buffers import SharedControl
    learner = make_learner(minibatch_size=5, batch_size=15, rollout=5, num_envs_per_worker=6,
                           num_epochs=4, target_kl=target_kl)
    learner.ctl = SharedControl()
    learner.version = 0
    learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=0.5)
    stats = learner.train_on(on_policy_batch(learner, done_at=(2, 1), truncated=False))
    steps = int(next(iter(learner.optimizer.state.values()))["step"])
    if target_kl is None:
        assert steps == 4 * 3 and stats["stopped_early"] == 0
    else:
        assert steps == 1 and stats["stopped_early"] == 1


@pytest.mark.parametrize("kl_adaptive_lr_max", [30.0, 1.0])
@pytest.mark.parametrize("learning_rate", [1e-7, 0.5])
def test_kl_adaptive_lr_follows_how_far_each_minibatch_finds_the_policy_moved(learning_rate,
                                                                              kl_adaptive_lr_max):
    """kl_adaptive_lr: a rate too small to move the policy rises 1.5x a minibatch step up to
    kl_adaptive_lr_max x learning_rate (at 1 it stays: the rule only brakes); one whose steps move
    it far beyond 2 x the KL falls back, whatever the cap. The optimizer steps with the adapted
    rate, the update's stats report it, and a changed learning_rate (a schedule's next value)
    keeps the factor."""
    from asyncrl.buffers import SharedControl
    from asyncrl.config import KL_ADAPTIVE_LR_MIN
    learner = make_learner(minibatch_size=5, batch_size=15, rollout=5, num_envs_per_worker=6,
                           num_epochs=4, target_kl=None, kl_adaptive_lr=0.01,
                           kl_adaptive_lr_max=kl_adaptive_lr_max, learning_rate=learning_rate)
    learner.ctl = SharedControl()
    learner.version = 0
    learner.optimizer = torch.optim.Adam(learner.model.parameters(), lr=learning_rate)
    stats = learner.train_on(on_policy_batch(learner, done_at=(2, 1), truncated=False))
    lr = learner.optimizer.param_groups[0]["lr"]
    assert lr == stats["learning_rate"] == pytest.approx(learning_rate * learner.lr_scale)
    if learning_rate < 1e-3:  # 12 steps that each find KL ~0: 1.5**12 > 30, capped there
        assert learner.lr_scale == kl_adaptive_lr_max
    else:  # the first step finds KL 0 (x1.5, or held at a cap of 1); its moves bring it down
        assert KL_ADAPTIVE_LR_MIN <= learner.lr_scale < 1
    learner.cfg = learner.cfg.replace(learning_rate=learning_rate / 2)
    learner._set_lr()
    assert learner.optimizer.param_groups[0]["lr"] == pytest.approx(lr / 2)


@pytest.mark.parametrize("max_norm", [1e-3, 1e3])
def test_flat_gradients_zero_and_clip_as_torch_does(max_norm):
    """The learner's gradients live in one flat buffer: backward adds into it, zeroing clears the
    last step's, clipping scales them as nn.utils.clip_grad_norm_ does (clipping or not)."""
    import copy
    from asyncrl.learner import FlatGrads
    model = make_learner().model
    model.extra = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))  # a second dtype group
    reference = copy.deepcopy(model)
    grads = FlatGrads(model)

    def loss(m, seed):
        torch.manual_seed(seed)
        params, values = m({"obs": torch.randn(7, 4)})
        return params.pow(2).sum() + values.sum() + m.extra.pow(3).sum()
    for seed in (0, 1):  # the second step must not keep the first's gradients
        grads.zero()
        loss(model, seed).backward()
        norm = grads.clip(max_norm)
        reference.zero_grad(set_to_none=True)
        loss(reference, seed).backward()
        expected = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
        assert float(norm) == pytest.approx(float(expected), rel=1e-5)
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-8)
    assert all(p.grad.data_ptr() == v.data_ptr() for p, v in zip(grads.params, grads.views))


def train_on_whole_batch(monkeypatch, **overrides):
    """One update on a batch of only valid samples (two minibatches of 16): the stats and, per
    minibatch, the advantages, mask and pg_mask the loss was given."""
    import asyncrl.learner as learner_module
    learner = make_masking_learner(num_epochs=1, batch_size=32, minibatch_size=16, rollout=8,
                                   num_envs_per_worker=8, num_workers=1, **overrides)
    learner.version = 5
    batch = batch_with_restarted_samples()
    batch.policy_versions.fill_(5)
    seen = []
    real_loss = learner_module.ppo_loss

    def spy(*args, **kwargs):
        seen.append((args[2].detach().clone(), kwargs["mask"], kwargs["pg_mask"]))
        return real_loss(*args, **kwargs)
    monkeypatch.setattr(learner_module, "ppo_loss", spy)
    return learner.train_on(batch), seen


def test_whole_batches_train_without_a_mask_and_normalised_advantages(monkeypatch):
    """A batch of only valid samples trains on plain means (no mask), its minibatch's advantages
    normalised to mean 0 and std 1."""
    stats, seen = train_on_whole_batch(monkeypatch)
    assert stats["masked_fraction"] == 0 and len(seen) == 2
    for advantages, mask, pg_mask in seen:
        assert mask is None and pg_mask is None
        assert advantages.mean().abs() < 1e-5 and advantages.std().item() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("normalize_returns", [True, False])
def test_advantage_std_floor_keeps_vanishing_advantages_small(normalize_returns, monkeypatch):
    """Once a task is solved a minibatch's advantages are the value head's noise; divided by
    their own std they become unit-sized steps. advantage_std_floor divides by no less than a
    fraction of the value targets' running std (1 without return normalisation): advantages
    well above it normalise as before, tiny ones stay tiny."""
    learner = make_learner(advantage_std_floor=0.01, normalize_returns=normalize_returns)
    sigma = 1.0
    if normalize_returns:
        learner.model.value_norm.update(torch.tensor([0.0, 40.0, 80.0]))  # std ~33
        sigma = float(learner.model.value_norm.std())
        assert sigma > 10
    assert float(learner._advantage_scale(torch.tensor(1e-4))) == pytest.approx(0.01 * sigma)
    assert float(learner._advantage_scale(torch.tensor(5.0 * sigma))) == pytest.approx(5.0 * sigma)
    assert float(make_learner(advantage_std_floor=0.0)._advantage_scale(torch.tensor(1e-4))) == pytest.approx(1e-4, rel=1e-3)

    _, seen = train_on_whole_batch(monkeypatch, advantage_std_floor=1e9,
                                   normalize_returns=normalize_returns)
    assert len(seen) == 2
    for advantages, _, _ in seen:  # a floor far above any advantage: centred, then scaled far below 1
        assert advantages.mean().abs() < 1e-5 and 0 < advantages.std().item() < 1e-3


def test_flat_gradients_keep_a_channels_last_kernels_layout_for_fused_adam():
    """A convolution's kernel stored channels-last (as the image encoders store theirs) gets its
    gradient in the same layout: fused Adam pairs a parameter's and its gradient's elements in
    memory order, so a contiguous gradient would update the wrong weights."""
    import copy
    from torch import nn
    from asyncrl.learner import FlatGrads, make_optimizer
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 4 * 4, 2)).to(memory_format=torch.channels_last)
    reference = copy.deepcopy(model)
    grads = FlatGrads(model)
    assert all(v.stride() == p.stride() for p, v in zip(grads.params, grads.views))
    optimizer = make_optimizer(model, Config(learning_rate=0.1))
    reference_optimizer = torch.optim.Adam(reference.parameters(), lr=0.1, eps=Config().adam_eps,
                                           foreach=False)
    x = torch.randn(5, 3, 6, 6).to(memory_format=torch.channels_last)
    for _ in range(3):
        grads.zero()
        model(x).pow(2).sum().backward()
        grads.clip(0.5)
        optimizer.step()
        reference_optimizer.zero_grad()
        reference(x).pow(2).sum().backward()
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        reference_optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_adam_step_updates_weights_and_state_as_torchs_own_step():
    """The learner's Adam step (torch's fused kernel without torch.optim's per-call Python) moves
    weights, moments and step counters exactly as ``optimizer.step()``: from the first step
    (which makes the state), after a learning-rate change (PBT) and after a state reload."""
    import copy
    from asyncrl.learner import FlatGrads, adam_step, make_optimizer
    model = make_learner().model
    reference = copy.deepcopy(model)
    cfg = Config(learning_rate=0.05)
    optimizer, reference_optimizer = make_optimizer(model, cfg), make_optimizer(reference, cfg)
    if not optimizer.param_groups[0].get("fused"):
        pytest.skip("this torch has no fused Adam for the CPU")
    grads, reference_grads = FlatGrads(model), FlatGrads(reference)
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(0))
    for i in range(5):
        if i == 2:
            for opt in (optimizer, reference_optimizer):
                opt.param_groups[0]["lr"] = 0.01
        if i == 3:  # a reload replaces every state tensor
            optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
        for m, g in ((model, grads), (reference, reference_grads)):
            g.zero()
            params, values = m({"obs": x})
            (params.pow(2).sum() + values.pow(2).sum()).backward()
        adam_step(optimizer)
        reference_optimizer.step()
        if i == 0:  # the state exists now: later steps must not go through torch.optim's
            optimizer.step = lambda: pytest.fail("adam_step fell back to optimizer.step()")
        for p, q in zip(model.parameters(), reference.parameters()):
            assert torch.equal(p, q)
    for p, q in zip(model.parameters(), reference.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[p][key], reference_optimizer.state[q][key])
    assert float(optimizer.state[next(model.parameters())]["step"]) == 5


def test_each_epoch_trains_every_sample_once_with_its_own_observation(monkeypatch):
    """A feed-forward model's epochs shuffle the per-sample tensors once an epoch and gather the
    observations a minibatch at a time: every minibatch's observations, actions and
    behaviour log-probabilities belong to the same samples, and each epoch covers each sample
    once."""
    import asyncrl.learner as learner_module
    learner = make_masking_learner(num_epochs=3, batch_size=32, minibatch_size=12, rollout=8,
                                   num_envs_per_worker=4, num_workers=1, decoupled_clip=False,
                                   normalize_obs=False, target_kl=None)
    learner.version = 5
    T, B = 8, 4
    ids = torch.arange(T * B, dtype=torch.float32).view(T, B)
    obs = torch.zeros(T + 1, B, 4)
    obs[:T, :, 0] = ids
    batch = Batch({"obs": obs}, (ids.long() % 2).unsqueeze(-1), -1e-3 * ids,
                  torch.zeros(T, B), torch.zeros(T, B, dtype=torch.bool),
                  torch.zeros(T, B, dtype=torch.bool), torch.full((T, B), 5, dtype=torch.int64))
    seen = []
    real_step = learner_module.Learner._minibatch_step

    def spy(self, obs, actions, action_mask, ratio_ref, *rest):
        seen.append((obs["obs"][:, 0].clone(), actions.flatten().clone(), ratio_ref.clone()))
        return real_step(self, obs, actions, action_mask, ratio_ref, *rest)
    monkeypatch.setattr(learner_module.Learner, "_minibatch_step", spy)
    assert learner.train_on(batch)["masked_fraction"] == 0
    assert len(seen) == 3 * 3  # 32 samples in minibatches of 12, 12 and 8, three epochs
    for epoch in range(3):
        rows = seen[3 * epoch: 3 * epoch + 3]
        assert [len(r[0]) for r in rows] == [12, 12, 8]
        sample_ids = torch.cat([r[0] for r in rows])
        assert sorted(sample_ids.long().tolist()) == list(range(T * B))
        for sample, actions, ratio_ref in rows:
            assert torch.equal(actions, sample.long() % 2)
            torch.testing.assert_close(ratio_ref, -1e-3 * sample)
    assert not torch.equal(seen[0][0], seen[3][0])  # a new order each epoch
