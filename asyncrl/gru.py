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


def _times(w, low, bias: Optional[torch.Tensor] = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """x -> x @ w.t() (+ ``bias``, float32) in float32, for the many small products of a
    sequence: in bfloat16 with w packed once (``Bfloat16Linear``), else in ``low`` with w cast
    once; in float32 the bias is added by the product itself (one operation a step)."""
    if low is None and bias is not None:
        w_t = w.t()
        return lambda x: torch.addmm(bias, x, w_t)
    if low is torch.bfloat16:
        lin = Bfloat16Linear(w)
        times = lambda x: lin(x).float()  # noqa: E731
    else:
        w_t = (w if low is None else w.to(low)).t()
        times = lambda x: _mm(x, w_t, low)  # noqa: E731
    return times if bias is None else lambda x: times(x).add_(bias)


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
    # Each step is a handful of small operations on a few rows, whose cost is their dispatch
    # (a few microseconds each), not their arithmetic: the steps write into preallocated
    # per-step views (``unbind``), and the backward pass's local derivatives of the gates are
    # computed for all steps at once before it walks them, leaving eight operations a step.
    # The forward loop writes ``_cell``'s equations out on views it takes once: calling
    # ``_cell`` with ``out=`` rows, which slices every step, cost 9-11% at 128 units.
    @staticmethod
    def forward(ctx, x, state, keep, w_ih, w_hh, b_ih, b_hh, low):
        T, B, _ = x.shape
        H = state.shape[-1]
        hh = _times(w_hh, low, b_hh)
        gi = (_mm(x.reshape(T * B, -1), w_ih.t(), low) + b_ih).view(T, B, 3 * H)
        out = x.new_empty(T, B, H)
        h_in = x.new_empty(T, B, H)  # each step's input state (after the episode-start zeroing)
        rz = x.new_empty(T, B, 2 * H)  # r and z after their sigmoid
        n = x.new_empty(T, B, H)  # n after its tanh
        gh_n = []  # each step's W_hn h + b_hn, which r multiplies
        h = state
        for gi_rz, gi_n, keep_t, h_in_t, rz_t, r_t, z_t, n_t, out_t in zip(
                gi[..., :2 * H].unbind(0), gi[..., 2 * H:].unbind(0), keep.unbind(0),
                h_in.unbind(0), rz.unbind(0), rz[..., :H].unbind(0), rz[..., H:].unbind(0),
                n.unbind(0), out.unbind(0)):
            h = torch.mul(h, keep_t, out=h_in_t)
            gh_rz, gh_n_t = hh(h).split([2 * H, H], 1)
            torch.add(gi_rz, gh_rz, out=rz_t).sigmoid_()
            torch.addcmul(gi_n, r_t, gh_n_t, out=n_t).tanh_()
            h = torch.addcmul(n_t, z_t, h - n_t, out=out_t)  # (1 - z) n + z h
            gh_n.append(gh_n_t)
        ctx.low = low
        ctx.save_for_backward(x, keep, w_ih, w_hh, h_in, rz, n, torch.stack(gh_n))
        return out, h

    @staticmethod
    @once_differentiable
    def backward(ctx, d_out, d_last):
        x, keep, w_ih, w_hh, h_in, rz, n, gh_n = ctx.saved_tensors
        low = ctx.low
        T, B, H = h_in.shape
        r, z = rz[..., :H], rz[..., H:]
        # the local derivatives, all steps at once: of h' by n's pre-activation, of that by r's
        # pre-activation, and of h' by z's pre-activation
        by_n = (1 - z) * (1 - n * n)
        by_r = gh_n * r * (1 - r)
        by_z = (h_in - n) * z * (1 - z)
        hh_t = _times(w_hh.t(), low)  # the state's gradient: d_gh @ w_hh
        # the gradients of the gates' pre-activations, state side (r, z, n); the input side's
        # differ only in n's (d_in_n)
        d_gh = x.new_empty(T, B, 3 * H)
        d_in_n = x.new_empty(T, B, H)
        dh = d_last.clone() if d_last is not None else x.new_zeros(B, H)
        d_outs = [None] * T if d_out is None else d_out.unbind(0)
        steps = zip(d_outs, by_n.unbind(0), by_r.unbind(0), by_z.unbind(0), r.unbind(0),
                    z.unbind(0), keep.unbind(0), d_gh.unbind(0), d_gh[..., :H].unbind(0),
                    d_gh[..., H:2 * H].unbind(0), d_gh[..., 2 * H:].unbind(0),
                    d_in_n.unbind(0))
        for d_out_t, by_n_t, by_r_t, by_z_t, r_t, z_t, keep_t, d_gh_t, d_r, d_z, d_hn, d_in_t \
                in reversed(list(steps)):
            if d_out_t is not None:
                dh.add_(d_out_t)
            da_n = torch.mul(dh, by_n_t, out=d_in_t)
            torch.mul(da_n, by_r_t, out=d_r)
            torch.mul(dh, by_z_t, out=d_z)
            torch.mul(da_n, r_t, out=d_hn)
            dh = hh_t(d_gh_t).addcmul_(dh, z_t).mul_(keep_t)
        d_gh_flat = d_gh.view(T * B, 3 * H)
        d_gi_flat = torch.cat([d_gh[..., :2 * H], d_in_n], -1).view(T * B, 3 * H)
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
