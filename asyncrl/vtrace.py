"""V-trace off-policy targets (Espeholt et al., 2018, "IMPALA", section 4.1), as a pure function."""
from __future__ import annotations

from typing import NamedTuple, Optional, Union

import torch


class VTraceReturns(NamedTuple):
    vs: torch.Tensor             # [T, B] V-trace value targets v_s
    pg_advantages: torch.Tensor  # [T, B] rho_s * (r_s + gamma * v_{s+1} - V(x_s))


@torch.no_grad()
def vtrace(log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, bootstrap_value: torch.Tensor,
           clip_rho_threshold: Optional[float] = 1.0, clip_pg_rho_threshold: Optional[float] = 1.0,
           clip_c_threshold: Optional[float] = 1.0,
           lam: Union[float, torch.Tensor] = 1.0) -> VTraceReturns:
    """V-trace targets for a time-major batch.

    :param log_rhos: [T, B] log(pi(a_s|x_s) / mu(a_s|x_s)), target over behaviour policy.
    :param discounts: [T, B] gamma * (1 - done_s): zero where the episode ended at step s.
    :param rewards: [T, B] r_s.
    :param values: [T, B] V(x_s) under the target policy's value function.
    :param bootstrap_value: [B] V(x_T), the state after the last step.
    :param clip_rho_threshold: rho-bar (None: no clipping).
    :param clip_pg_rho_threshold: clip of rho in the policy-gradient advantage (None: none).
    :param clip_c_threshold: c-bar, clip of the trace coefficients (None: none).
    :param lam: trace-cutting lambda multiplying c_s (1.0 is the paper's V-trace); a scalar, or
        [T, B] per step.
    """
    rhos = torch.exp(log_rhos)
    clipped_rhos = rhos if clip_rho_threshold is None else rhos.clamp(max=clip_rho_threshold)
    cs = lam * (rhos if clip_c_threshold is None else rhos.clamp(max=clip_c_threshold))
    values_next = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    deltas = clipped_rhos * (rewards + discounts * values_next - values)
    decay = discounts * cs

    vs_minus_v = torch.empty_like(values)
    acc = torch.zeros_like(bootstrap_value)
    for t in range(values.shape[0] - 1, -1, -1):
        acc = deltas[t] + decay[t] * acc
        vs_minus_v[t] = acc
    vs = vs_minus_v + values

    vs_next = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
    pg_rhos = rhos if clip_pg_rho_threshold is None else rhos.clamp(max=clip_pg_rho_threshold)
    pg_advantages = pg_rhos * (rewards + discounts * vs_next - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)
