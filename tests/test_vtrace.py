"""asyncrl.vtrace against the slow formula of the IMPALA paper (Espeholt et al., 2018, eq. 1)."""
import numpy as np
import pytest
import torch

from asyncrl import VTraceReturns, vtrace

T, B = 7, 5


def vtrace_reference(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold,
                     clip_pg_rho_threshold, clip_c_threshold, lam):
    """v_s = V(x_s) + sum_{t>=s} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V, written as a double sum,
    with per-step discounts gamma_i, c_i = lam * min(c_bar, rho_i) and
    delta_t V = min(rho_bar, rho_t) (r_t + gamma_t V(x_{t+1}) - V(x_t)). Numpy, float64."""
    log_rhos, discounts, rewards, values, bootstrap_value = (
        np.asarray(x, dtype=np.float64)
        for x in (log_rhos, discounts, rewards, values, bootstrap_value))
    n_steps, n_batch = rewards.shape
    rhos = np.exp(log_rhos)
    clip = lambda x, c: x if c is None else np.minimum(x, c)  # noqa: E731
    rhos_clipped = clip(rhos, clip_rho_threshold)
    cs = lam * clip(rhos, clip_c_threshold)
    pg_rhos = clip(rhos, clip_pg_rho_threshold)
    values_next = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    vs = np.zeros_like(values)
    for b in range(n_batch):
        for s in range(n_steps):
            total = values[s, b]
            for t in range(s, n_steps):
                coef = 1.0
                for i in range(s, t):
                    coef *= discounts[i, b] * cs[i, b]
                delta = rhos_clipped[t, b] * (rewards[t, b] + discounts[t, b] * values_next[t, b]
                                              - values[t, b])
                total += coef * delta
            vs[s, b] = total
    vs_next = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return vs, pg_advantages


def random_inputs(seed, done_prob=0.2, gamma=0.9):
    g = torch.Generator().manual_seed(seed)
    log_rhos = torch.randn(T, B, generator=g, dtype=torch.float64) * 0.8  # rhos on both sides of 1
    dones = torch.rand(T, B, generator=g, dtype=torch.float64) < done_prob
    discounts = gamma * (~dones).double()
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap_value = torch.randn(B, generator=g, dtype=torch.float64)
    return log_rhos, discounts, rewards, values, bootstrap_value


CLIPS = [  # (rho_bar, pg_rho_bar, c_bar)
    (1.0, 1.0, 1.0),
    (None, None, None),
    (0.5, 2.0, 0.8),
    (2.5, None, 1.2),
    (None, 0.9, None),
]


@pytest.mark.parametrize("lam", [1.0, 0.9])
@pytest.mark.parametrize("clips", CLIPS, ids=lambda c: "rho%s-pg%s-c%s" % c)
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_paper_formula(seed, clips, lam):
    rho_bar, pg_rho_bar, c_bar = clips
    inputs = random_inputs(seed)
    rhos = inputs[0].exp()
    for bar in (rho_bar, pg_rho_bar, c_bar):  # the clips must actually bite on these inputs
        if bar is not None:
            assert (rhos > bar).any() and (rhos < bar).any()
    out = vtrace(*inputs, clip_rho_threshold=rho_bar, clip_pg_rho_threshold=pg_rho_bar,
                 clip_c_threshold=c_bar, lam=lam)
    vs_ref, pg_ref = vtrace_reference(*(x.numpy() for x in inputs), rho_bar, pg_rho_bar, c_bar, lam)
    np.testing.assert_allclose(out.vs.numpy(), vs_ref, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg_ref, rtol=1e-10, atol=1e-10)


def test_float32_inputs_match_reference():
    inputs = [x.float() for x in random_inputs(3)]
    out = vtrace(*inputs, lam=0.95)
    vs_ref, pg_ref = vtrace_reference(*(x.numpy() for x in inputs), 1.0, 1.0, 1.0, 0.95)
    assert out.vs.dtype == torch.float32
    np.testing.assert_allclose(out.vs.numpy(), vs_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.pg_advantages.numpy(), pg_ref, rtol=1e-5, atol=1e-5)


def test_on_policy_is_discounted_n_step_return():
    """log_rhos = 0, lam = 1, no dones: v_s = sum_{t=s}^{T-1} g^{t-s} r_t + g^{T-s} V(x_T),
    whatever the values V(x_s)."""
    gamma = 0.9
    _, _, rewards, values, bootstrap_value = random_inputs(4)
    discounts = torch.full((T, B), gamma, dtype=torch.float64)
    log_rhos = torch.zeros(T, B, dtype=torch.float64)
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap_value, lam=1.0)
    expected = torch.empty(T, B, dtype=torch.float64)
    for s in range(T):
        expected[s] = sum(gamma ** (t - s) * rewards[t] for t in range(s, T)) \
            + gamma ** (T - s) * bootstrap_value
    torch.testing.assert_close(out.vs, expected)
    expected_next = torch.cat([expected[1:], bootstrap_value[None]])
    torch.testing.assert_close(out.pg_advantages, rewards + gamma * expected_next - values)


def test_done_cuts_the_trace():
    """With discount 0 at step k, v_s for s <= k ignores every reward, value and the bootstrap
    after k; on-policy v_k = r_k and earlier targets are the discounted rewards up to k."""
    gamma, k = 0.9, 3
    _, _, rewards, values, bootstrap_value = random_inputs(5)
    discounts = torch.full((T, B), gamma, dtype=torch.float64)
    discounts[k] = 0.0
    log_rhos = torch.zeros(T, B, dtype=torch.float64)
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap_value, lam=1.0)

    rewards2, values2 = rewards.clone(), values.clone()
    rewards2[k + 1:] += 100.0
    values2[k + 1:] -= 50.0
    out2 = vtrace(log_rhos, discounts, rewards2, values2, bootstrap_value + 7.0, lam=1.0)
    torch.testing.assert_close(out2.vs[:k + 1], out.vs[:k + 1])
    assert not torch.allclose(out2.vs[k + 1:], out.vs[k + 1:])  # the later part did change

    torch.testing.assert_close(out.vs[k], rewards[k])
    for s in range(k + 1):
        expected = sum(gamma ** (t - s) * rewards[t] for t in range(s, k + 1))
        torch.testing.assert_close(out.vs[s], expected)


def test_pg_advantages_formula():
    """pg_advantages_s = min(pg_rho_bar, rho_s) (r_s + gamma_s v_{s+1} - V(x_s)), v_T = V(x_T)."""
    log_rhos, discounts, rewards, values, bootstrap_value = random_inputs(6)
    out = vtrace(log_rhos, discounts, rewards, values, bootstrap_value, clip_rho_threshold=None,
                 clip_pg_rho_threshold=0.7, clip_c_threshold=None, lam=0.8)
    vs_next = torch.cat([out.vs[1:], bootstrap_value[None]])
    expected = log_rhos.exp().clamp(max=0.7) * (rewards + discounts * vs_next - values)
    torch.testing.assert_close(out.pg_advantages, expected)


def test_returns_named_tuple_with_shapes():
    out = vtrace(*random_inputs(7))
    assert isinstance(out, VTraceReturns) and isinstance(out, tuple)
    assert out._fields == ("vs", "pg_advantages")
    vs, pg_advantages = out
    assert vs is out.vs and pg_advantages is out.pg_advantages
    assert out.vs.shape == (T, B) and out.pg_advantages.shape == (T, B)


def test_no_gradient_flows():
    inputs = [x.clone().requires_grad_(True) for x in random_inputs(8)]
    out = vtrace(*inputs)
    for t in out:
        assert not t.requires_grad and t.grad_fn is None


def test_inputs_are_not_modified():
    inputs = random_inputs(9)
    copies = [x.clone() for x in inputs]
    vtrace(*inputs, lam=0.9)
    for x, c in zip(inputs, copies):
        assert torch.equal(x, c)
