"""Actor-critic models: an MLP for vector observations, the Nature CNN for images.

Image observations stay uint8 until they reach the model's device, where they are scaled to [0, 1].
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from .config import Config


def _layer(layer: nn.Module, gain: float = math.sqrt(2)) -> nn.Module:
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def is_image_space(space: gym.spaces.Box) -> bool:
    return len(space.shape) == 3 and space.dtype == np.uint8


def mlp(in_size: int, hidden_sizes: Tuple[int, ...], activation: str) -> nn.Sequential:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers, size = [], in_size
    for h in hidden_sizes:
        layers += [_layer(nn.Linear(size, h)), act()]
        size = h
    return nn.Sequential(*layers)


class NatureCNN(nn.Module):
    """Mnih et al. (2015): 3 convolutions and a 512-unit layer, on [C, H, W] uint8 frames."""

    def __init__(self, obs_shape: Tuple[int, int, int]):
        super().__init__()
        c = obs_shape[0]
        self.convs = nn.Sequential(
            _layer(nn.Conv2d(c, 32, 8, stride=4)), nn.ReLU(),
            _layer(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
            _layer(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            n_flat = self.convs(torch.zeros(1, *obs_shape)).shape[1]
        self.out_size = 512
        self.fc = nn.Sequential(_layer(nn.Linear(n_flat, self.out_size)), nn.ReLU())

    @staticmethod
    def scale(obs: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """uint8 frames -> float in [0, 1], channels-last: about a third less CPU time per
        learner update with oneDNN convolutions (the weights are channels-last too, see
        ActorCritic), measured on Pong batches. Two passes over memory (convert and transpose,
        then scale in place), into ``out`` when given (a float channels-last tensor of obs's
        shape, reused across batches): on a 1040-frame Pong batch 22 ms against 170 ms for
        ``(obs.float() / 255).contiguous(channels_last)``, whose three fresh 117 MB tensors
        page-fault on first touch."""
        if out is None:
            out = torch.empty(obs.shape, device=obs.device, memory_format=torch.channels_last)
        return out.copy_(obs).mul_(1.0 / 255.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """uint8 frames, or frames already through ``scale`` (the learner scales a batch once,
        not once per minibatch and epoch)."""
        x = self.scale(obs) if obs.dtype == torch.uint8 else obs
        return self.fc(self.convs(x))


class TinyEncoder(nn.Module):
    """Every eighth pixel of each frame (84 x 84 -> 11 x 11) and one 32-unit layer: a model whose
    inference and learning cost next to nothing beside an Atari env step (Pong: ~0.2% of the
    Nature CNN's multiply-adds; learning ~0.02 core-ms per sample against ~0.25 for the env
    step, where every 4th pixel and 64 units cost 0.04), to measure the engine's own overhead.
    It does not learn Atari games well."""

    STRIDE = 8

    def __init__(self, obs_shape: Tuple[int, int, int]):
        super().__init__()
        c, h, w = obs_shape
        n_in = c * -(-h // self.STRIDE) * -(-w // self.STRIDE)
        self.out_size = 32
        self.fc = nn.Sequential(nn.Flatten(), _layer(nn.Linear(n_in, self.out_size)), nn.ReLU())

    @classmethod
    def scale(cls, obs: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """uint8 frames -> the subsampled frames as float in [0, 1] (into ``out`` when given)."""
        s = cls.STRIDE
        small = obs[..., ::s, ::s]
        if out is None:
            out = torch.empty(small.shape, device=obs.device)
        return out.copy_(small).mul_(1.0 / 255.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """uint8 frames, or frames already through ``scale``."""
        return self.fc(self.scale(obs) if obs.dtype == torch.uint8 else obs)


class ActorCritic(nn.Module):
    """Categorical policy and state value. Vector observations get separate actor and critic
    MLPs; images share one trunk (the Nature CNN, or ``TinyEncoder`` with cnn="tiny")."""

    def __init__(self, obs_space: gym.spaces.Box, action_space: gym.spaces.Discrete, cfg: Config):
        super().__init__()
        n_actions = int(action_space.n)
        if is_image_space(obs_space):
            self.actor_body = (TinyEncoder if cfg.cnn == "tiny" else NatureCNN)(obs_space.shape)
            self.critic_body = None
            feat = self.actor_body.out_size
        else:
            in_size = int(np.prod(obs_space.shape))
            self.actor_body = mlp(in_size, cfg.hidden_sizes, cfg.activation)
            self.critic_body = mlp(in_size, cfg.hidden_sizes, cfg.activation)
            feat = cfg.hidden_sizes[-1]
        self.policy_head = _layer(nn.Linear(feat, n_actions), gain=0.01)
        self.value_head = _layer(nn.Linear(feat, 1), gain=1.0)
        self.image = self.critic_body is None
        if self.image:
            self.to(memory_format=torch.channels_last)  # only the 4-d conv weights change

    def forward(self, obs: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """obs [N, *obs_shape] -> (logits [N, A], values [N])."""
        if self.image:
            feat = self.actor_body(obs)
            return self.policy_head(feat), self.value_head(feat).squeeze(-1)
        x = obs.reshape(obs.shape[0], -1).float()
        return self.policy_head(self.actor_body(x)), self.value_head(self.critic_body(x)).squeeze(-1)

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False):
        """Returns (actions [N] int64, log_probs [N], values [N])."""
        return sample_actions(*self(obs), deterministic)

    @torch.no_grad()
    def fused_forward(self):
        """An inference-only ``obs -> (logits, values)`` equal to ``forward``, with the actor and
        critic MLPs fused into one block-diagonal MLP (3 matmuls instead of 6, no module calls).
        Rebuild it after the weights change. Image models return ``forward`` itself."""
        if self.image:
            return self.forward
        act = torch.tanh if isinstance(self.actor_body[1], nn.Tanh) else torch.relu
        actor = [m for m in self.actor_body if isinstance(m, nn.Linear)] + [self.policy_head]
        critic = [m for m in self.critic_body if isinstance(m, nn.Linear)] + [self.value_head]
        weights, biases = [], []
        for i, (a, c) in enumerate(zip(actor, critic)):
            w = torch.cat([a.weight, c.weight]) if i == 0 else torch.block_diag(a.weight, c.weight)
            weights.append(w.detach().clone())
            biases.append(torch.cat([a.bias, c.bias]).detach().clone())
        n_actions = self.policy_head.out_features

        def forward(obs: torch.Tensor):
            x = obs.reshape(obs.shape[0], -1).float()
            for w, b in zip(weights[:-1], biases[:-1]):
                x = act(F.linear(x, w, b))
            out = F.linear(x, weights[-1], biases[-1])
            return out[:, :n_actions], out[:, n_actions]
        return forward

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor):
        """Returns (log_probs [N], entropy [N], values [N]) of the given actions, with grad."""
        logits, values = self(obs)
        log_probs_all = F.log_softmax(logits, dim=-1)
        entropy = -(log_probs_all.exp() * log_probs_all).sum(-1)
        return log_probs_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), entropy, values


def sample_actions(logits: torch.Tensor, values: torch.Tensor, deterministic: bool = False):
    """Categorical sampling by the Gumbel-max trick: (actions, log_probs, values)."""
    log_probs_all = F.log_softmax(logits, dim=-1)
    if deterministic:
        actions = logits.argmax(dim=-1)
    else:
        noise = torch.empty_like(logits).exponential_().log_()  # log(Exp(1)) = -Gumbel
        actions = (logits - noise).argmax(dim=-1)
    return actions, log_probs_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1), values
