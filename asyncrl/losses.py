"""The APPO / IMPALA loss: one named line per term, diagnostics beside them (CleanRL style)."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch


class LossOut(NamedTuple):
    loss: torch.Tensor
    pg_loss: torch.Tensor
    v_loss: torch.Tensor
    entropy_loss: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor


def masked_mean(x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_loss(new_log_probs: torch.Tensor, ref_log_probs: torch.Tensor,
             advantages: torch.Tensor, new_values: torch.Tensor, old_values: torch.Tensor,
             returns: torch.Tensor, entropy: torch.Tensor, *, clip_coef: Optional[float],
             vf_clip_coef: Optional[float], ent_coef: float, vf_coef: float,
             dual_clip: Optional[float] = None,
             mask: Optional[torch.Tensor] = None, pg_mask: Optional[torch.Tensor] = None) -> LossOut:
    """Clipped-surrogate policy loss, (clipped) value loss and entropy bonus, as means.

    All tensors have one shape ``[N]``. ``clip_coef=None`` gives the unclipped policy gradient
    ``-A * log pi`` of IMPALA. ``mask`` (1 keep, 0 drop) removes samples, e.g. too stale ones.
    ``ref_log_probs``: the ratio's reference policy (the behaviour policy, or in decoupled PPO
    the learner's policy before the update). ``dual_clip`` (dual-clip PPO, Ye et al. 2020)
    bounds a negative-advantage sample's term at ``dual_clip x |A|``: the clipped surrogate
    leaves it unbounded as the ratio grows.
    """
    pg_mask = mask if pg_mask is None else pg_mask
    log_ratio = new_log_probs - ref_log_probs
    ratio = log_ratio.exp()
    if clip_coef is None:
        pg_loss = masked_mean(-advantages * new_log_probs, pg_mask)
        clipfrac = torch.zeros((), device=ratio.device)
    else:
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * ratio.clamp(1.0 - clip_coef, 1.0 + clip_coef)
        pg_terms = torch.max(pg_loss1, pg_loss2)
        if dual_clip is not None:
            pg_terms = torch.where(advantages < 0, torch.min(pg_terms, -dual_clip * advantages),
                                   pg_terms)
        pg_loss = masked_mean(pg_terms, pg_mask)
        clipfrac = masked_mean(((ratio - 1.0).abs() > clip_coef).float(), pg_mask).detach()

    v_loss_unclipped = (new_values - returns) ** 2
    if vf_clip_coef is None:
        v_loss = 0.5 * masked_mean(v_loss_unclipped, mask)
    else:
        v_clipped = old_values + (new_values - old_values).clamp(-vf_clip_coef, vf_clip_coef)
        v_loss = 0.5 * masked_mean(torch.max(v_loss_unclipped, (v_clipped - returns) ** 2), mask)

    entropy_loss = masked_mean(entropy, pg_mask)
    loss = pg_loss - ent_coef * entropy_loss + vf_coef * v_loss
    approx_kl = masked_mean((ratio - 1.0) - log_ratio, pg_mask).detach()  # http://joschu.net/blog/kl-approx.html
    return LossOut(loss, pg_loss.detach(), v_loss.detach(), entropy_loss.detach(), approx_kl, clipfrac)
