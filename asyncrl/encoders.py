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

from .spaces import EnvSpec, channel_last, is_board, is_grid, is_image, scaled_uint8

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
# with the module, gone with it): owner -> (the tensors' addresses and version counters, copies)
_SNAPSHOTS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def _identity(tensors: List[torch.Tensor]) -> tuple:
    return tuple((t.data_ptr(), t._version) for t in tensors)


def snapshot_bfloat16(owner: nn.Module, tensors: List[torch.Tensor]) -> None:
    """Keep bfloat16 copies of ``owner``'s ``tensors`` (its weights) for ``bfloat16_weights``: a
    policy worker takes one per weight version (``ActorCritic.fused_forward``). Autocast casts
    every weight at every call: for VizDoom's model (a 512-unit layer of ~1.2M weights, a GRU of
    1.6M) that was a fifth of a policy worker's forward pass."""
    _SNAPSHOTS[owner] = (_identity(tensors), _bfloat16_copies(tensors))


def bfloat16_weights(owner: nn.Module, tensors: List[torch.Tensor]) -> list:
    """``tensors`` in bfloat16, without gradients (matrices as ``Bfloat16Linear``s, packed for
    products, the rest as tensors): ``owner``'s snapshot where one was taken of
    these very tensors (the same addresses and version counters), else fresh casts. Only an
    explicit snapshot is reused: an optimiser's fused step (torch's ``_fused_adam_``) changes
    weights without bumping their version counters, so a cache filled by any call could go stale
    in the learner."""
    snap = _SNAPSHOTS.get(owner)
    if snap is not None and snap[0] == _identity(tensors):
        return snap[1]
    return _bfloat16_copies(tensors)


def _bfloat16_copies(tensors: List[torch.Tensor]) -> list:
    """Matrices as ``Bfloat16Linear``s, the rest (convolution kernels, biases) as bfloat16
    tensors."""
    return [Bfloat16Linear(t) if t.dim() == 2 else t.detach().bfloat16() for t in tensors]


@functools.lru_cache(maxsize=None)
def _packs_linear() -> bool:
    """Whether torch's oneDNN takes a pre-packed bfloat16 weight here (its
    ``mkldnn._reorder_linear_weight`` and ``mkldnn._linear_pointwise``, what torch's compiler
    uses on a CPU), checked once against a plain product: False where either is missing or
    differs."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        w, x = torch.randn(8, 16).bfloat16(), torch.randn(3, 16).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        return torch.equal(torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""),
                           x @ w.t())
    except (AttributeError, RuntimeError):
        return False


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


class ConvEncoder(nn.Module):
    """A stack of ``CONV_STACKS[name]`` convolutions and a 512-unit layer, computed in
    ``precision`` (``Config.cnn_precision``, which the built-in model passes; float32 for one
    built by hand; the output is float32 whatever it is)."""

    def __init__(self, chw: Tuple[int, int, int], hwc: bool, ortho: bool = True, name: str = "nature",
                 precision: str = "float32"):
        super().__init__()
        self.hwc, c, act = hwc, chw[0], CONV_ACTIVATIONS[name]
        self.precision = precision
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
        """uint8 frames -> float in [0, 1], channels-last (oneDNN's fast layout on a CPU; a
        [H, W, C] frame permuted is channels-last already). Two passes, into ``out`` when given
        (reused across learner batches: fresh large tensors page-fault on first touch)."""
        if self.hwc:
            obs = obs.permute(0, 3, 1, 2)
        if out is None or out.shape != obs.shape:
            out = torch.empty(obs.shape, device=obs.device, memory_format=torch.channels_last)
        return out.copy_(obs).mul_(1.0 / 255.0)

    def bfloat16_on(self, device: torch.device) -> bool:
        """Whether ``forward`` computes in bfloat16 on ``device``."""
        return computes_bfloat16(self.precision, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.bfloat16_on(x.device):
            return self.fc(self.convs(x))
        if not torch.is_grad_enabled():  # inference: the weights of a snapshot, if taken
            weights = iter(bfloat16_weights(self, self.bfloat16_tensors()))
            y = x.bfloat16()
            for layer in self._layers():
                if isinstance(layer, nn.Conv2d):
                    y = layer._conv_forward(y, next(weights), next(weights))
                elif isinstance(layer, nn.Linear):
                    y = next(weights)(y, next(weights))
                else:  # an activation, the flattening
                    y = layer(y)
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
    scaled to [0, 1] (SB3's convention, ``sb3``: images only, [C, H, W])."""
    n = x.shape[0]
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
    """The space as SB3's policies see it: channel-last images transposed (VecTransposeImage)."""
    if is_image(space) and channel_last(space):
        return gym.spaces.Box(np.transpose(space.low, (2, 0, 1)), np.transpose(space.high, (2, 0, 1)),
                              dtype=space.dtype)
    return space
