"""Encoders of observation leaves, and the running normaliser: the parts of the built-in model.

Image encoders take uint8 frames, ``[N, C, H, W]`` or ``[N, H, W, C]``, or the output of their
own ``scale`` (the learner scales a batch once, not once per minibatch and epoch).
"""
from __future__ import annotations

import functools
import math
import weakref
from typing import List, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from .spaces import (TEXT_BUCKETS, EnvSpec, channel_last, is_board, is_grid, is_image, is_text,
                     scaled_uint8, text_tokens)

TEXT_EMBEDDING = 16   # a text leaf's features per word (TextEncoder) ...
TEXT_FEATURES = 64    # ... and of the whole text, the GRU's width
NATURE_MIN_SIZE = 36  # the convolution stacks' smallest input; smaller images: Config.small_images
NORM_CLIP = 10.0      # normalised observations are clipped to +-this (CleanRL's continuous PPO)
# Where returns are negative, the value head's untrained output is a value this many stds of the
# value targets above their mean, never above 0 (encoders.ReturnScale)
VALUE_OPTIMISM = 1.0


def init_layer(layer: nn.Module, gain: float = math.sqrt(2), ortho: bool = True) -> nn.Module:
    if ortho:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)
    return layer


def mlp(in_size: int, sizes: List[int], activation: type, ortho: bool = True) -> nn.Sequential:
    layers = []
    for h in sizes:
        layers += [init_layer(nn.Linear(in_size, h), ortho=ortho), activation()]
        in_size = h
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """Running mean and variance (Chan et al.'s parallel update) of ``shape``-d samples, as
    buffers; ``forward`` normalises and clips. Samples with a non-finite value are left out of
    the statistics (a batch the learner skips as non-finite must not poison them for good)."""

    def __init__(self, shape: tuple, clip: Optional[float] = NORM_CLIP):
        super().__init__()
        self.clip = clip
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.zeros(()))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        x = x.reshape(-1, *self.mean.shape).float()
        x = x[torch.isfinite(x).reshape(len(x), -1).all(1)]
        if not len(x):
            return
        n, mean, var = x.shape[0], x.mean(0), x.var(0, unbiased=False)
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * (n / total)
        self.var.copy_((self.var * self.count + var * n + delta ** 2 * self.count * n / total) / total)
        self.count.copy_(total)

    def std(self) -> torch.Tensor:
        return (self.var + 1e-8).sqrt()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x - self.mean) / self.std()
        return y if self.clip is None else y.clamp(-self.clip, self.clip)

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std() + self.mean


class ReturnScale(RunningNorm):
    """The value targets' running statistics, for a value head that learns values in units of
    their std: a value is ``output x std + mean + optimism``. Where the mean is negative,
    ``optimism`` is VALUE_OPTIMISM (1) std, never more than ``-mean`` (a value above 0): the head's
    untrained output, which is what a state the policy rarely visits keeps, means a value one std
    better than the mean return. Where the mean is positive there is none: the values are centred
    on the mean (Sample Factory's normalize_returns).

    Why: centred, a state the policy rarely visits takes the mean return as its value, and in
    CliffWalking early falls make that mean worse than standing still: nothing new looked worth
    trying (0 of 10 seeds found the goal). With no shift where returns are negative (the untrained
    output a value of 0, 2026-12-01) it found the goal in 4-5 seeds of 5, but simple_spread, whose
    returns are all negative too, got worse before it got better (training return -40 to -52 at
    200k agent steps against -23 to -31 centred) and ended 2.4 points behind at 2M: optimism up to
    a value of 0, far above anything reachable there, pays for trying every unseen state. One std
    keeps the optimism to the returns' own spread (docs/benchmarks/learning-suite.md, "Optimism of
    one std").

    ``centred`` is 1 in models saved before 2026-12-01 (their value heads learnt ``(v - mean) /
    std``) and reads them unchanged; 0 in new ones."""

    filled_on_load = {"centred": 1.0}  # a state dict without it: saved by an older version

    def __init__(self):
        super().__init__((), clip=None)
        self.register_buffer("centred", torch.zeros(()))

    def shift(self) -> torch.Tensor:
        optimism = torch.minimum(VALUE_OPTIMISM * self.std(), (-self.mean).clamp(min=0))
        return self.mean + (1 - self.centred) * optimism

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return (values - self.shift()) / self.std()

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std() + self.shift()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name, value in self.filled_on_load.items():
            state_dict.setdefault(prefix + name, torch.tensor(value))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


# --- image encoders: take uint8 [N, C, H, W] or [N, H, W, C], or their ``scale`` output -----
# Convolution stacks, (out channels, kernel, stride) per layer, then a 512-unit layer:
CONVNET_SIMPLE = ((32, 8, 4), (64, 4, 2), (128, 3, 2))  # Sample Factory's convnet_simple
CONV_STACKS = {
    "nature": ((32, 8, 4), (64, 4, 2), (64, 3, 1)),  # Mnih et al. (2015), ReLU
    "doom": CONVNET_SIMPLE,       # as Sample Factory's, ELU
    "doom_relu": CONVNET_SIMPLE,  # with ReLU: the Doom default
}
# ReLU for Doom: a learner minibatch ~11% faster on a CPU in bfloat16 (ELU's elementwise pass is
# slow there) and Sample Factory's return reached sooner in 9 seeds of 9 (docs/guides/vizdoom.md).
# "doom" keeps ELU: a model saved with it loads as it was trained.
CONV_ACTIVATIONS = {"nature": nn.ReLU, "doom": nn.ELU, "doom_relu": nn.ReLU}


@functools.lru_cache(maxsize=None)
def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 in hardware: a CPU with AVX512-BF16 or AMX-BF16 (as
    oneDNN's convolutions use them), a CUDA GPU of compute capability 8 or more (Ampere and later;
    a ROCm GPU as torch says)."""
    if device.type == "cuda":
        if torch.version.hip is not None:
            return torch.cuda.is_bf16_supported()
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return cpu_has_bfloat16()


def cpu_has_bfloat16() -> bool:
    """AVX512-BF16 or AMX-BF16 on this CPU: ``torch.cpu.get_capabilities()`` where torch has it
    (recent versions), else the older private checks of the same flags; False where neither is."""
    get_capabilities = getattr(torch.cpu, "get_capabilities", None)
    if get_capabilities is not None:
        caps = get_capabilities()
        return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))
    checks = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported",
                                                         "_is_amx_tile_supported")]
    return any(check() for check in checks if check is not None)


def computes_bfloat16(precision: str, device: torch.device) -> bool:
    """Whether a part built with ``precision`` (``Config.cnn_precision``) computes in bfloat16 on
    ``device``: "bfloat16" always, "auto" where the device does it in hardware."""
    return precision == "bfloat16" or (precision == "auto" and native_bfloat16(device))


# bfloat16 copies of a module's weights taken for inference (weakly keyed: not pickled or copied
# with the module, gone with it): owner -> (its weights' addresses and version counters, copies)
_SNAPSHOTS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _identity(tensors: List[torch.Tensor]) -> tuple:
    return tuple((t.data_ptr(), t._version) for t in tensors)


def snapshot_bfloat16(owner: nn.Module) -> None:
    """Keep ``owner``'s bfloat16 copies of its weights (``owner.bfloat16_copies()``, of the
    tensors ``owner.bfloat16_tensors()``) for ``bfloat16_weights``: a policy worker takes one per
    weight version (``ActorCritic.fused_forward``). Autocast casts every weight at every call:
    for VizDoom's model (a 512-unit layer of ~1.2M weights, a GRU of 1.6M) that was a fifth of
    a policy worker's forward pass; the copies are also packed for oneDNN where it takes them."""
    _SNAPSHOTS[owner] = (_identity(owner.bfloat16_tensors()), owner.bfloat16_copies())


def bfloat16_weights(owner: nn.Module) -> list:
    """``owner.bfloat16_copies()`` of its weights as they are now, without gradients:
    ``owner``'s snapshot where one was taken of these very tensors (the same addresses and
    version counters), else fresh copies. Only an explicit snapshot is reused: an optimiser's
    fused step (torch's ``_fused_adam_``) changes weights without bumping their version
    counters, so a cache filled by any call could go stale in the learner."""
    snap = _SNAPSHOTS.get(owner)
    if snap is not None and snap[0] == _identity(owner.bfloat16_tensors()):
        return snap[1]
    return owner.bfloat16_copies()


def _onednn_check(build) -> bool:
    """``build()`` -> (oneDNN's result, torch's plain result): whether they are equal, False where
    torch lacks the operators (they are what torch's compiler uses on a CPU, not public API).
    The random inputs leave the caller's random stream as it was."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        with torch.random.fork_rng(devices=[]):
            packed, plain = build()
        return torch.equal(packed, plain)
    except (AttributeError, RuntimeError):
        return False


@functools.lru_cache(maxsize=None)
def _packs_linear() -> bool:
    """Whether oneDNN takes a pre-packed bfloat16 matrix here (``mkldnn._reorder_linear_weight``,
    ``mkldnn._linear_pointwise``), checked once against a plain product."""
    def build():
        w, x = torch.randn(8, 16).bfloat16(), torch.randn(3, 16).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), x @ w.t()
    return _onednn_check(build)


@functools.lru_cache(maxsize=None)
def _packs_conv() -> bool:
    """Whether oneDNN takes a pre-packed bfloat16 kernel here, with a ReLU fused
    (``mkldnn_reorder_conv2d_weight``, ``mkldnn._convolution_pointwise``), checked once against
    a plain convolution."""
    def build():
        conv = nn.Conv2d(3, 4, 3, stride=2).to(memory_format=torch.channels_last)
        x = torch.randn(2, 3, 9, 9).bfloat16().contiguous(memory_format=torch.channels_last)
        packed = Bfloat16Conv(conv, (3, 9, 9), relu=True, pack=True)
        return packed(x), torch.relu(Bfloat16Conv(conv, (3, 9, 9), relu=False, pack=False)(x))
    return _onednn_check(build)


class Bfloat16Linear:
    """A weight [out, in] for products ``x @ weight.t() (+ bias)`` in bfloat16, without
    gradients: ``F.linear``'s numbers in bfloat16. On a CPU where oneDNN takes it, the weight is
    packed once into oneDNN's layout; an unpacked product packs it again at every call, which
    for a few rows is most of the product's cost (VizDoom's GRU and 512-unit layer, 8 rows, one
    thread: 46 and 90 us packed against 101 and 156). For a policy worker's weights (its
    snapshot of each version) and the learner GRU's state-side products (32 a minibatch each
    way)."""

    __slots__ = ("weight", "packed")

    def __init__(self, weight: torch.Tensor):
        self.weight = weight.detach().to(torch.bfloat16).contiguous()
        self.packed = (torch.ops.mkldnn._reorder_linear_weight(self.weight, None)
                       if self.weight.device.type == "cpu" and _packs_linear() else None)

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x [..., in] -> bfloat16 [..., out]; ``bias`` bfloat16 or None."""
        x = x.to(torch.bfloat16)
        if self.packed is None:
            return F.linear(x, self.weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")


class Bfloat16Conv:
    """``conv`` (its weights now) in bfloat16 without gradients, and the ReLU after it if
    ``relu``, for inputs of ``chw``: on a CPU where oneDNN takes it (``pack``: the check's
    verdict by default), the kernel packed once for that input and the ReLU fused into the
    convolution (VizDoom's three layers, 4-16 frames, one thread: 20-30% faster each, the same
    numbers); else ``conv``'s own convolution on bfloat16 copies."""

    __slots__ = ("conv", "relu", "weight", "bias", "packed", "geometry")

    def __init__(self, conv: nn.Conv2d, chw: Tuple[int, int, int], relu: bool,
                 pack: Optional[bool] = None):
        self.conv, self.relu = conv, relu
        self.weight = conv.weight.detach().bfloat16()
        self.bias = None if conv.bias is None else conv.bias.detach().bfloat16()
        if pack is None:
            pack = (self.weight.device.type == "cpu" and isinstance(conv.padding, tuple)
                    and conv.padding_mode == "zeros" and _packs_conv())
        self.packed = self.geometry = None
        if pack:  # padding, stride, dilation, groups: as oneDNN's operators take them
            self.geometry = (list(conv.padding), list(conv.stride), list(conv.dilation),
                             conv.groups)
            self.packed = torch._C._nn.mkldnn_reorder_conv2d_weight(
                self.weight.to_mkldnn(), *self.geometry, [1, *chw])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            y = self.conv._conv_forward(x, self.weight, self.bias)
            return torch.relu(y) if self.relu else y
        return torch.ops.mkldnn._convolution_pointwise(
            x, self.packed, self.bias, *self.geometry, "relu" if self.relu else "none", [], "")


class ConvEncoder(nn.Module):
    """A stack of ``CONV_STACKS[name]`` convolutions and a 512-unit layer, computed in
    ``precision`` (``Config.cnn_precision``, which the built-in model passes; float32 for one
    built by hand; the output is float32 whatever it is)."""

    def __init__(self, chw: Tuple[int, int, int], hwc: bool, ortho: bool = True, name: str = "nature",
                 precision: str = "float32"):
        super().__init__()
        self.hwc, c, act = hwc, chw[0], CONV_ACTIVATIONS[name]
        self.precision, self.chw = precision, tuple(chw)
        layers = []
        for out, kernel, stride in CONV_STACKS[name]:
            layers += [init_layer(nn.Conv2d(c, out, kernel, stride=stride), ortho=ortho), act()]
            c = out
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, *chw)).shape[1]
        self.out_size = 512
        self.fc = nn.Sequential(init_layer(nn.Linear(n_flat, self.out_size), ortho=ortho), act())
        self.to(memory_format=torch.channels_last)  # only the 4-d conv weights change

    def scale(self, obs: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """uint8 frames -> floats in [0, 1], channels-last (oneDNN's fast layout on a CPU; a
        [H, W, C] frame permuted is channels-last already), in bfloat16 where ``forward``
        computes in it: the numbers float32's scaling rounds to (the product is computed in
        float32 either way), without a float32 copy to write, gather per minibatch and cast.
        Two passes, into ``out`` when given (reused across learner batches: fresh large tensors
        page-fault on first touch)."""
        if self.hwc:
            obs = obs.permute(0, 3, 1, 2)
        dtype = torch.bfloat16 if self.bfloat16_on(obs.device) else torch.float32
        if out is None or out.shape != obs.shape or out.dtype != dtype:
            out = torch.empty(obs.shape, dtype=dtype, device=obs.device,
                              memory_format=torch.channels_last)
        return out.copy_(obs).mul_(1.0 / 255.0)

    def bfloat16_on(self, device: torch.device) -> bool:
        """Whether ``forward`` computes in bfloat16 on ``device``."""
        return computes_bfloat16(self.precision, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.bfloat16_on(x.device):
            return self.fc(self.convs(x))
        if not torch.is_grad_enabled():  # inference: the weights of a snapshot, if taken
            y = x.bfloat16()
            for op in bfloat16_weights(self):
                y = op(y)
            return y.float()
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            y = self.fc(self.convs(x))
        return y.float()

    def _layers(self) -> List[nn.Module]:
        return [*self.convs, *self.fc]

    def bfloat16_tensors(self) -> List[torch.Tensor]:
        """The weights inference computes with in bfloat16 (``bfloat16_weights``)."""
        return [t for m in self._layers() if isinstance(m, (nn.Conv2d, nn.Linear))
                for t in (m.weight, m.bias)]

    def bfloat16_copies(self) -> list:
        """Inference's layers in bfloat16, each a callable: convolutions with the ReLU after
        them (``Bfloat16Conv``), the 512-unit layer (``Bfloat16Linear``), the other activations
        and the flattening as they are."""
        ops, layers, chw = [], self._layers(), self.chw
        i = 0
        while i < len(layers):
            layer = layers[i]
            if isinstance(layer, nn.Conv2d):
                relu = i + 1 < len(layers) and isinstance(layers[i + 1], nn.ReLU)
                ops.append(Bfloat16Conv(layer, chw, relu))
                chw = (layer.out_channels, *(
                    (n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, d, k, s in zip(
                        chw[1:], layer.padding, layer.dilation, layer.kernel_size, layer.stride)))
                i += 2 if relu else 1
                continue
            if isinstance(layer, nn.Linear):
                ops.append(functools.partial(Bfloat16Linear(layer.weight),
                                             bias=layer.bias.detach().bfloat16()))
            else:  # an activation, the flattening
                ops.append(layer)
            i += 1
        return ops


class SmallGrid(nn.Module):
    """Base of the encoders of small images (MiniGrid's 7 x 7 views) and boards: the input is
    normalised per channel by running statistics (``update_stats``, once per learner batch), not
    divided by 255: an image this small is more often a grid of symbols than a camera frame
    (MiniGrid's cells hold object, colour and state ids 0..10 in a uint8 Box declared 0..255,
    which /255 would shrink to 0..0.04)."""

    def __init__(self, chw: Tuple[int, int, int], hwc: bool):
        super().__init__()
        self.hwc, c = hwc, chw[0]
        self.norm = RunningNorm((c, 1, 1))  # per channel, broadcast over [N, C, H, W]

    def scale(self, obs: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """uint8 [N, H, W, C] or [N, C, H, W] -> float [N, C, H, W], values kept."""
        if self.hwc:
            obs = obs.permute(0, 3, 1, 2)
        return obs.float().contiguous()

    @torch.no_grad()
    def update_stats(self, x: torch.Tensor) -> None:
        """Fold ``scale``'s output [N, C, H, W] into the per-channel statistics (every pixel a
        sample)."""
        self.norm.update(x.permute(0, 2, 3, 1).reshape(-1, *self.norm.mean.shape))


class SmallFlat(SmallGrid):
    """``small_images="flat"``: the normalised cells, flattened; the model's MLP follows."""

    learns_features = False  # its output is its input: the model must put its MLP after it

    def __init__(self, chw: Tuple[int, int, int], hwc: bool):
        super().__init__(chw, hwc)
        self.out_size = int(np.prod(chw))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x).flatten(1)


class SmallCNN(SmallGrid):
    """Boards, and small images with ``small_images="conv"``: two 3 x 3 same-padding
    convolutions, so any size fits, then a 128-unit layer."""

    def __init__(self, chw: Tuple[int, int, int], hwc: bool, ortho: bool = True):
        super().__init__(chw, hwc)
        c, h, w = chw
        self.convs = nn.Sequential(
            init_layer(nn.Conv2d(c, 16, 3, padding=1), ortho=ortho), nn.ReLU(),
            init_layer(nn.Conv2d(16, 32, 3, padding=1), ortho=ortho), nn.ReLU(), nn.Flatten())
        self.out_size = 128
        self.fc = nn.Sequential(init_layer(nn.Linear(32 * h * w, self.out_size), ortho=ortho), nn.ReLU())

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        """A state_dict saved before the input statistics existed (such encoders divided by 255)
        loads with statistics that divide by 255, counted as many samples, so resumed training
        keeps that scale."""
        if prefix + "convs.0.weight" in state_dict and prefix + "norm.mean" not in state_dict:
            state_dict[prefix + "norm.mean"] = torch.zeros_like(self.norm.mean)
            state_dict[prefix + "norm.var"] = torch.full_like(self.norm.var, 255.0 ** 2)
            state_dict[prefix + "norm.count"] = torch.tensor(1e12)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.convs(self.norm(x)))


class TinyEncoder(nn.Module):
    """Every eighth pixel of each frame and one 32-unit layer: a model whose inference and
    learning cost next to nothing beside an env step, to measure the engine's own overhead. It
    does not learn Atari games well."""

    STRIDE = 8

    def __init__(self, chw: Tuple[int, int, int], hwc: bool, ortho: bool = True):
        super().__init__()
        self.hwc, (c, h, w) = hwc, chw
        n_in = c * -(-h // self.STRIDE) * -(-w // self.STRIDE)
        self.out_size = 32
        self.fc = nn.Sequential(nn.Flatten(), init_layer(nn.Linear(n_in, self.out_size), ortho=ortho),
                                nn.ReLU())

    def scale(self, obs: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.hwc:
            obs = obs.permute(0, 3, 1, 2)
        small = obs[..., ::self.STRIDE, ::self.STRIDE]
        if out is None or out.shape != small.shape:
            out = torch.empty(small.shape, device=obs.device)
        return out.copy_(small).mul_(1.0 / 255.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def image_encoder(space: gym.spaces.Box, cnn: str, ortho: bool, small_images: str,
                  precision: str = "float32") -> nn.Module:
    """The encoder of an image or board leaf (``Config.cnn``, ``Config.small_images``,
    ``Config.cnn_precision``)."""
    hwc = channel_last(space)
    chw = (space.shape[2], space.shape[0], space.shape[1]) if hwc else tuple(space.shape)
    if cnn == "tiny":
        return TinyEncoder(chw, hwc, ortho)
    if min(chw[1:]) < NATURE_MIN_SIZE:
        if is_board(space) or small_images == "conv":
            return SmallCNN(chw, hwc, ortho)
        return SmallFlat(chw, hwc)
    return ConvEncoder(chw, hwc, ortho, cnn, precision)


# texts read by a policy worker's snapshot of a TextEncoder's weights (ActorCritic.fused_forward):
# encoder -> (its weights' addresses and version counters, {a text's ids as bytes: features})
_TEXT_MEMOS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()
TEXT_MEMO_SIZE = 4096  # texts a memo holds before it starts again (a text per step, never twice)


def remember_texts(encoder: "TextEncoder") -> None:
    """Let ``encoder`` keep each text's features, without gradients, while its weights stay as
    they are now: a policy worker takes one memo per weight version (``fused_forward``). A
    mission stays for its episode, so nearly every step's text was read at an earlier step. On
    Fetch-5x5-N2 reading it at every step made a policy worker's forward pass of 8 rows 626 µs
    against 255 µs without the mission; with the memo 256-362 µs."""
    _TEXT_MEMOS[encoder] = (_identity(list(encoder.parameters())), {})


def distinct_texts(ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(the different texts of word ids [N, L] (zeros after each text's last word), cut after the
    longest one's last word; each row's index among them): ``torch.unique(ids, dim=0,
    return_inverse=True)``'s answer (in another order) at a third of its cost on a learner's
    minibatch of 128 rows (a ninth on 1,024): each text is summed to one key by random weights
    (exact in float64), and the rows that share a key are checked to be equal."""
    ids = _trimmed(ids)
    weights = _key_weights(ids.shape[1], ids.device)
    _, which = torch.unique(ids.to(torch.float64) @ weights, return_inverse=True)
    first = torch.zeros(int(which.max()) + 1, dtype=torch.long, device=ids.device)
    first.scatter_(0, which, torch.arange(len(ids), device=ids.device))  # a row of each key
    texts = ids[first]
    if torch.equal(texts[which], ids):
        return texts, which
    return torch.unique(ids, dim=0, return_inverse=True)  # two texts on one key: not seen yet


@functools.lru_cache(maxsize=None)
def _key_weights(length: int, device: torch.device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(length)
    return torch.randint(1, 2 ** 31, (length,), generator=generator).to(device, torch.float64)


def _trimmed(texts: torch.Tensor) -> torch.Tensor:
    """Texts cut after the longest one's last word (the padding does not change what a GRU
    reads)."""
    return texts[:, :max(int((texts > 0).sum(1).max()), 1)]


class TextEncoder(nn.Module):
    """A text leaf's word ids (spaces.encode_text) -> BabyAI's reading of an instruction: a learned
    embedding of each word, a GRU over the words in order, its output after the last word
    ([N, TEXT_FEATURES]; zeros for an empty text). The GRU reads each different text of a batch
    once, up to the longest (the padding after a text does not change its output), and every
    row over every position when traced for export. On MiniGrid's GoToDoor-5x5 and Fetch-5x5-N2
    (500k env steps, greedy medians of 9 and 6 runs): 0.85 and 0.82, one GoToDoor run of nine
    stalled at 0.20, the score without the mission; the embeddings of every position side by
    side into the MLP (3 runs) 0.76 and 0.39, a convolution over three words with each channel's
    largest output (3 runs) 0.80 and 0.68: Fetch's five phrasings move the words that name the
    object, which the GRU reads wherever they stand (docs/benchmarks/learning-suite.md, "Text
    observations")."""
    learns_features = False  # an MLP follows

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(TEXT_BUCKETS + 1, TEXT_EMBEDDING, padding_idx=0)
        self.gru = nn.GRU(TEXT_EMBEDDING, TEXT_FEATURES, batch_first=True)
        self.out_size = TEXT_FEATURES

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ids = ids.long()
        if torch.jit.is_tracing() or torch.compiler.is_compiling() or not ids.shape[0]:
            return self._read(ids)  # every position: an exported graph takes any text
        memo = _TEXT_MEMOS.get(self)
        if memo is None or torch.is_grad_enabled() or memo[0] != _identity(list(self.parameters())):
            # a batch holds few texts (a mission stays for its episode): each read once, up to
            # the longest
            texts, which = distinct_texts(ids)
            return self._read(texts)[which]
        texts = {}  # a policy worker's few rows: each text's bytes -> (its place, a row of it)
        which = [texts.setdefault(row.tobytes(), (len(texts), i))[0]
                 for i, row in enumerate(ids.cpu().numpy())]
        known = memo[1]
        missing = [key for key in texts if key not in known]
        if missing:
            if len(known) + len(missing) > TEXT_MEMO_SIZE:
                known.clear()
            read = self._read(_trimmed(ids[[texts[key][1] for key in missing]]))
            known.update(zip(missing, read))
        return torch.stack([known[key] for key in texts])[torch.tensor(which, device=ids.device)]

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        lengths = (ids > 0).sum(1)
        out, _ = self.gru(self.embedding(ids))
        last = out.gather(1, (lengths - 1).clamp(min=0).view(-1, 1, 1).expand(-1, 1, out.shape[-1]))
        return last.squeeze(1) * (lengths > 0).unsqueeze(-1).to(out.dtype)


def leaf_encoder(space: gym.Space, cfg, ortho: bool) -> nn.Module:
    """The built-in model's encoder of one observation leaf: image_encoder for an image or board,
    a TextEncoder for text, else nn.Flatten (preprocess_leaf's vector as it is)."""
    if is_grid(space):
        return image_encoder(space, cfg.cnn, ortho, cfg.small_images, cfg.cnn_precision)
    return TextEncoder() if is_text(space) else nn.Flatten()


def flat_width(space: gym.Space) -> int:
    """Width of a non-image leaf as ``preprocess_leaf`` makes it: the one-hot size of
    Discrete/MultiDiscrete, else its elements."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    return int(np.prod(space.shape if isinstance(space, gym.spaces.Box) else np.atleast_1d(space.n)))


def preprocess_leaf(space: gym.Space, x: torch.Tensor, sb3: bool) -> torch.Tensor:
    """A stored leaf as a network input (float): Discrete/MultiDiscrete one-hot (the per-dimension
    one-hots concatenated), the rest flattened to [N, -1] except images; uint8 over 0..255
    scaled to [0, 1] (SB3's convention, ``sb3``: images only, [C, H, W]). A text's word ids stay
    int64 (floats for SB3-style code)."""
    n = x.shape[0]
    if is_text(space):  # TextEncoder's input
        return x.float() if sb3 else x
    if isinstance(space, gym.spaces.Discrete):
        return F.one_hot(x.long(), int(space.n)).float()
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        cols = x.long().reshape(n, -1)
        return torch.cat([F.one_hot(cols[:, i], int(k)).float() for i, k in enumerate(nvec)], -1)
    if sb3 and is_image(space):
        x = x.permute(0, 3, 1, 2) if channel_last(space) else x
        return x.float().div_(255.0).contiguous()
    x = x.reshape(n, -1).float()
    return x.div_(255.0) if scaled_uint8(space) and not sb3 else x


def normalized_keys(spec: EnvSpec) -> List[str]:
    """Leaves a running observation normaliser applies to: Boxes other than images and boards."""
    return [k for k, (_, s) in spec.leaves.items()
            if isinstance(s, gym.spaces.Box) and not is_grid(s) and not scaled_uint8(s)]


def sb3_space(space: gym.Space) -> gym.Space:
    """The space as SB3's policies see it: channel-last images transposed (VecTransposeImage),
    text as the Box of its word ids (spaces.encode_text; 0 pads)."""
    if is_text(space):
        return gym.spaces.Box(0, TEXT_BUCKETS, (text_tokens(space),), np.int64)
    if is_image(space) and channel_last(space):
        return gym.spaces.Box(np.transpose(space.low, (2, 0, 1)), np.transpose(space.high, (2, 0, 1)),
                              dtype=space.dtype)
    return space
