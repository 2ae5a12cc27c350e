"""A GRU over whole trajectories for the CPU learner, with a backward pass of its own.

torch's CPU GRU (``torch.gru``) unrolls into per-step operations that autograd differentiates one
by one: each step's backward multiplies two matrices, one of them the outer product that makes a
whole [3H, H] weight gradient, which is then added to the sum. With the learner's short,
narrow trajectories (32 steps of 8 trajectories a minibatch, H = 512) that is 64 weight-sized
products and sums a minibatch: about 40% of VizDoom's learner step here, memory-bound.

``gru_sequence`` computes the same function (PyTorch's gate order and equations: r, z, n;
n = tanh(W_in x + b_in + r * (W_hn h + b_hn)); h' = (1 - z) * n + z * h) with the state zeroed
where an episode starts, and differentiates it by hand: the backward pass walks the steps only
for the state's gradient (one [B, 3H] x [3H, H] product a step) and collects every step's gate
gradients, so that each weight's gradient is one product over all T * B rows at the end. The
input-side products of all steps are likewise one product in each direction; the state-side
products of the steps, 32 small ones each way, take the weight packed once for oneDNN in bfloat16
(``Bfloat16Linear``). CUDA keeps cuDNN's fused GRU (``RecurrentCore``).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.autograd.function import once_differentiable

from .encoders import Bfloat16Linear


def _mm(a: torch.Tensor, b: torch.Tensor, low) -> torch.Tensor:
    """a @ b, in ``low`` precision (a dtype: operands cast, unless they are already, and the
    result back to float32) or as given (None)."""
    return a @ b if low is None else (a.to(low) @ b.to(low)).float()


def _times(w, low) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ w.t() in float32, for the many small products of a sequence: in bfloat16 with w
    packed once (``Bfloat16Linear``), else in ``low`` with w cast once."""
    if low is torch.bfloat16:
        lin = Bfloat16Linear(w)
        return lambda x: lin(x).float()
    w_t = (w if low is None else w.to(low)).t()
    return lambda x: _mm(x, w_t, low)


def _step_times(x: torch.Tensor, w) -> torch.Tensor:
    """x @ w.t() in float32 for ``gru_step``: w a ``Bfloat16Linear`` (a snapshot's) or a tensor,
    the product in its dtype (differentiable)."""
    return w(x).float() if isinstance(w, Bfloat16Linear) else _mm(x, w.t(), w.dtype)


def _cell(gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor):
    """One step from the input-side and state-side pre-activations ``gi``, ``gh`` [N, 3H]
    (biases in) and the state ``h`` [N, H]: (r and z [N, 2H], n [N, H], h' [N, H])."""
    H = h.shape[-1]
    rz = torch.sigmoid(gi[:, :2 * H] + gh[:, :2 * H])
    n = torch.tanh(torch.addcmul(gi[:, 2 * H:], rz[:, :H], gh[:, 2 * H:]))
    return rz, n, torch.addcmul(n, rz[:, H:], h - n)  # (1 - z) n + z h


def gru_step(x: torch.Tensor, h: torch.Tensor, w_ih, w_hh, b_ih: torch.Tensor,
             b_hh: torch.Tensor) -> torch.Tensor:
    """One step of ``gru_sequence``'s function for inference, its products in the weights'
    precision (bfloat16 copies or ``Bfloat16Linear``s: as the learner's ``low`` computes them),
    the biases and the rest float32: h' [N, H]."""
    gi = _step_times(x, w_ih).add_(b_ih)
    gh = _step_times(h, w_hh).add_(b_hh)
    return _cell(gi, gh, h)[2]


class _GRUSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, state, keep, w_ih, w_hh, b_ih, b_hh, low):
        T, B, _ = x.shape
        H = state.shape[-1]
        hh = _times(w_hh, low)
        gi = (_mm(x.reshape(T * B, -1), w_ih.t(), low) + b_ih).view(T, B, 3 * H)
        out = x.new_empty(T, B, H)
        h_in = x.new_empty(T, B, H)  # each step's input state (after the episode-start zeroing)
        gates = x.new_empty(T, B, 3 * H)  # r, z, n after their nonlinearity
        gh_n = x.new_empty(T, B, H)  # W_hn h + b_hn, which r multiplies
        h = state
        for t in range(T):
            h = torch.mul(h, keep[t], out=h_in[t])
            gh = hh(h).add_(b_hh)
            gh_n[t] = gh[:, 2 * H:]
            rz, n, h = _cell(gi[t], gh, h)
            gates[t, :, :2 * H], gates[t, :, 2 * H:], out[t] = rz, n, h
        ctx.low = low
        ctx.save_for_backward(x, keep, w_ih, w_hh, h_in, gates, gh_n)
        return out, h

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_last):
        x, keep, w_ih, w_hh, h_in, gates, gh_n = ctx.saved_tensors
        low = ctx.low
        T, B, H = h_in.shape
        hh_t = _times(w_hh.t(), low)  # the state's gradient: d_gh @ w_hh
        d_gi = x.new_empty(T, B, 3 * H)  # the gradients of the gates' pre-activations, input side
        d_gh = x.new_empty(T, B, 3 * H)  # and state side (they differ only in n's)
        dh = d_last.clone() if d_last is not None else x.new_zeros(B, H)
        for t in reversed(range(T)):
            if d_out is not None:
                dh = dh + d_out[t]
            g = gates[t]
            r, z, n = g[:, :H], g[:, H:2 * H], g[:, 2 * H:]
            da_n = dh * (1 - z) * (1 - n * n)
            d_gi[t, :, 2 * H:] = da_n
            d_gh[t, :, 2 * H:] = da_n * r
            d_gi[t, :, :H] = da_n * gh_n[t] * r * (1 - r)
            d_gi[t, :, H:2 * H] = dh * (h_in[t] - n) * z * (1 - z)
            d_gh[t, :, :2 * H] = d_gi[t, :, :2 * H]
            dh = (hh_t(d_gh[t]) + dh * z) * keep[t]
        d_gi_flat, d_gh_flat = d_gi.view(T * B, 3 * H), d_gh.view(T * B, 3 * H)
        x_flat = x.reshape(T * B, -1)
        d_x = _mm(d_gi_flat, w_ih, low).view(x.shape) if ctx.needs_input_grad[0] else None
        return (d_x, dh, None, _mm(d_gi_flat.t(), x_flat, low),
                _mm(d_gh_flat.t(), h_in.view(T * B, H), low), d_gi_flat.sum(0), d_gh_flat.sum(0),
                None)


def gru_sequence(x: torch.Tensor, state: torch.Tensor, starts: torch.Tensor, w_ih: torch.Tensor,
                 w_hh: torch.Tensor, b_ih: torch.Tensor, b_hh: torch.Tensor,
                 low: Optional[torch.dtype] = None):
    """x [T, B, F] time-major, state [B, H] before the first step, starts [T, B] (True: the state
    is zeroed before that step) -> (outputs [T, B, H], the state after the last step [B, H]).
    ``low`` (torch.bfloat16): the matrix products, forward and backward, take their operands in
    that precision and round their results to it, as autocast's do (they accumulate in float32
    inside the kernel); the state, the gates, the element-wise gradients and the tensors
    returned are float32."""
    keep = (~starts).unsqueeze(-1).to(x.dtype)
    return _GRUSequence.apply(x, state, keep, w_ih, w_hh, b_ih, b_hh, low)
