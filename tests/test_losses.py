"""asyncrl.losses.ppo_loss: clipped surrogate, value clipping, mask, entropy bonus, approx_kl."""
import math

import pytest
import torch

from asyncrl.losses import ppo_loss

N = 6


def make_inputs(ratio, advantages, seed=0):
    """Tensors [N] whose new/behaviour log-probs give ``ratio``; new_log_probs requires grad."""
    g = torch.Generator().manual_seed(seed)
    behaviour = -torch.rand(N, generator=g) - 0.1
    new = (behaviour + torch.log(torch.as_tensor(ratio, dtype=torch.float32).expand(N))).clone()
    return dict(
        new_log_probs=new.requires_grad_(True),
        ref_log_probs=behaviour,
        advantages=torch.as_tensor(advantages, dtype=torch.float32).expand(N).clone(),
        new_values=torch.randn(N, generator=g),
        old_values=torch.randn(N, generator=g),
        returns=torch.randn(N, generator=g),
        entropy=torch.rand(N, generator=g),
    )


def loss(inputs, clip_coef=0.2, vf_clip_coef=None, ent_coef=0.0, vf_coef=0.5, mask=None,
         dual_clip=None):
    return ppo_loss(**inputs, clip_coef=clip_coef, vf_clip_coef=vf_clip_coef, ent_coef=ent_coef,
                    vf_coef=vf_coef, mask=mask, dual_clip=dual_clip)


def pg_grad(inputs, **kw):
    out = loss(inputs, vf_coef=0.0, **kw)
    (grad,) = torch.autograd.grad(out.loss, inputs["new_log_probs"])
    return out, grad


def test_ratio_inside_clip_is_plain_surrogate():
    adv = torch.linspace(-2.0, 2.0, N)
    inputs = make_inputs(1.1, adv)
    out, grad = pg_grad(inputs)
    ratio = (inputs["new_log_probs"] - inputs["ref_log_probs"]).exp().detach()
    torch.testing.assert_close(out.pg_loss, (-adv * ratio).mean())
    torch.testing.assert_close(grad, -adv * ratio / N)  # d(-A r)/d log pi = -A r
    assert out.clipfrac == 0.0


@pytest.mark.parametrize("ratio,adv,clipped_ratio", [(1.5, 1.0, 1.2), (0.5, -1.0, 0.8)])
def test_ratio_outside_clip_on_the_clipped_side(ratio, adv, clipped_ratio):
    """Positive advantage with ratio > 1+eps, or negative with ratio < 1-eps: the objective is
    flat, so the loss uses the clipped ratio and no gradient pushes the policy further."""
    out, grad = pg_grad(make_inputs(ratio, adv))
    torch.testing.assert_close(out.pg_loss, torch.tensor(-adv * clipped_ratio))
    assert torch.all(grad == 0.0)
    assert out.clipfrac == 1.0


@pytest.mark.parametrize("ratio,adv", [(1.5, -1.0), (0.5, 1.0)])
def test_ratio_outside_clip_on_the_pessimistic_side_keeps_gradient(ratio, adv):
    """The min of the two surrogates: a worsening move is never clipped away."""
    inputs = make_inputs(ratio, adv)
    out, grad = pg_grad(inputs)
    torch.testing.assert_close(out.pg_loss, torch.tensor(-adv * ratio))
    torch.testing.assert_close(grad, torch.full((N,), -adv * ratio / N))


@pytest.mark.parametrize("ratio,adv,bounded", [(25.0, -1.0, True), (2.5, -1.0, False),
                                               (25.0, 1.0, False), (0.5, 1.0, False)])
def test_dual_clip_bounds_only_a_negative_advantage_far_past_the_clip(ratio, adv, bounded):
    """Dual-clip PPO: a negative-advantage sample whose ratio grew past dual_clip (a rare action
    the policy made likelier since it sampled) adds dual_clip x |A| and no gradient; below it,
    and for positive advantages, the clipped surrogate is unchanged."""
    inputs = make_inputs(ratio, adv)
    plain, plain_grad = pg_grad(inputs)
    out, grad = pg_grad(inputs, dual_clip=3.0)
    if bounded:
        torch.testing.assert_close(out.pg_loss, torch.tensor(3.0 * -adv))
        assert torch.all(grad == 0.0)
        assert plain.pg_loss > out.pg_loss and torch.all(plain_grad != 0.0)
    else:
        torch.testing.assert_close(out.pg_loss, plain.pg_loss)
        torch.testing.assert_close(grad, plain_grad)


def test_no_clip_coef_is_impala_policy_gradient():
    adv = torch.linspace(-1.0, 3.0, N)
    inputs = make_inputs(3.0, adv)  # far outside any clip range
    out, grad = pg_grad(inputs, clip_coef=None)
    torch.testing.assert_close(out.pg_loss, (-adv * inputs["new_log_probs"]).mean().detach())
    torch.testing.assert_close(grad, -adv / N)
    assert out.clipfrac == 0.0


def test_value_loss_unclipped_and_clipped():
    inputs = make_inputs(1.0, 0.0)
    inputs.update(old_values=torch.zeros(N), new_values=torch.ones(N), returns=torch.ones(N))
    # Unclipped: the new values hit the returns exactly.
    assert loss(inputs, vf_clip_coef=None).v_loss == 0.0
    # Clipped to old + 0.2: 0.5 * max(0, (0.2 - 1)^2) = 0.32.
    torch.testing.assert_close(loss(inputs, vf_clip_coef=0.2).v_loss, torch.tensor(0.32))
    # A change within the clip range is not affected by clipping.
    inputs["new_values"] = torch.full((N,), 0.1)
    torch.testing.assert_close(loss(inputs, vf_clip_coef=0.2).v_loss, loss(inputs).v_loss)
    torch.testing.assert_close(loss(inputs).v_loss, torch.tensor(0.5 * 0.9 ** 2))


def test_value_term_weighted_by_vf_coef():
    inputs = make_inputs(1.0, 0.0)
    a, b = loss(inputs, vf_coef=0.0), loss(inputs, vf_coef=2.0)
    torch.testing.assert_close(b.loss - a.loss, 2.0 * a.v_loss)


@pytest.mark.parametrize("clip_coef,vf_clip_coef", [(0.2, None), (None, 0.3)])
def test_masked_sample_changes_nothing(clip_coef, vf_clip_coef):
    adv = torch.linspace(-1.0, 1.0, N)
    inputs = make_inputs(1.3, adv)
    mask = torch.ones(N)
    mask[2] = 0.0
    kw = dict(clip_coef=clip_coef, vf_clip_coef=vf_clip_coef, ent_coef=0.01)
    ref = loss(inputs, mask=mask, **kw)

    wild = {k: v.detach().clone() for k, v in inputs.items()}
    for k in ("ref_log_probs", "advantages", "new_values", "old_values", "returns",
              "entropy"):
        wild[k][2] = 1e3
    wild["new_log_probs"][2] = 5.0
    wild["new_log_probs"].requires_grad_(True)
    out = loss(wild, mask=mask, **kw)
    for a, b in zip(ref, out):
        torch.testing.assert_close(a, b)

    keep = [i for i in range(N) if i != 2]
    dropped = {k: v.detach()[keep] for k, v in inputs.items()}
    for a, b in zip(ref, loss(dropped, **kw)):  # the same as leaving the sample out
        torch.testing.assert_close(a, b)
    (grad,) = torch.autograd.grad(out.loss, wild["new_log_probs"])
    assert grad[2] == 0.0 and grad[keep].abs().sum() > 0


def test_higher_entropy_lowers_loss():
    inputs = make_inputs(1.0, 0.5)
    low = dict(inputs, entropy=torch.full((N,), 0.1))
    high = dict(inputs, entropy=torch.full((N,), 0.6))
    a, b = loss(low, ent_coef=0.01), loss(high, ent_coef=0.01)
    assert b.loss < a.loss
    torch.testing.assert_close(a.loss - b.loss, torch.tensor(0.01 * 0.5))
    torch.testing.assert_close(b.entropy_loss, torch.tensor(0.6))
    # Without the coefficient the entropy does not enter the loss.
    torch.testing.assert_close(loss(low, ent_coef=0.0).loss, loss(high, ent_coef=0.0).loss)


def test_total_is_pg_minus_entropy_plus_value():
    out = loss(make_inputs(1.15, torch.linspace(-1, 1, N)), vf_clip_coef=0.1, ent_coef=0.03,
               vf_coef=0.7)
    torch.testing.assert_close(out.loss.detach(),
                               out.pg_loss - 0.03 * out.entropy_loss + 0.7 * out.v_loss)


def test_approx_kl_zero_on_policy_and_positive_off_policy():
    same = loss(make_inputs(1.0, 1.0))
    assert same.approx_kl == 0.0 and same.clipfrac == 0.0
    off = loss(make_inputs(1.5, 1.0))
    r = 1.5
    torch.testing.assert_close(off.approx_kl, torch.tensor((r - 1) - math.log(r)))
    assert off.approx_kl > 0


def test_diagnostics_carry_no_graph():
    out = loss(make_inputs(1.3, 1.0))
    assert out.loss.requires_grad
    for t in out[1:]:
        assert not t.requires_grad


@pytest.mark.parametrize("clip_coef, vf_clip_coef", [(0.2, None), (0.1, 0.2), (None, None)])
def test_no_mask_is_the_mask_that_keeps_every_sample(clip_coef, vf_clip_coef):
    """The learner passes no mask when every sample counts (plain means, fewer operations): the
    loss, its gradient and every diagnostic are those of an all-ones mask."""
    inputs = make_inputs(ratio=torch.linspace(0.7, 1.3, N), advantages=torch.linspace(-1, 1, N))
    kw = dict(clip_coef=clip_coef, vf_clip_coef=vf_clip_coef, ent_coef=0.01)
    plain, ones = loss(inputs, **kw), loss(inputs, mask=torch.ones(N), **kw)
    for a, b in zip(plain, ones):
        assert a.item() == pytest.approx(b.item(), rel=1e-6, abs=1e-7)
    g_plain, = torch.autograd.grad(plain.loss, inputs["new_log_probs"])
    g_ones, = torch.autograd.grad(ones.loss, inputs["new_log_probs"])
    assert torch.allclose(g_plain, g_ones)
