"""Acting with a model in the calling process (outside the workers): ``predict``'s inputs
(recurrent state, action masks) and outputs (env actions), and playing whole episodes."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np
import torch

from .models import PolicySpec
from .spaces import MASK_KEY, read_mask


def play_episode(model, env, deterministic: bool = True, seed: Optional[int] = None,
                 on_step: Optional[Callable] = None) -> Tuple[float, int]:
    """Play one whole episode of ``env`` with ``model.predict``: (raw return, length). An env
    that ends learning episodes inside a game (``info["game_over"]`` False) plays on to the end
    of the game. ``on_step(env)`` runs after every step (e.g. to grab a rendered frame)."""
    obs, info = env.reset(seed=seed)
    source = model.policy_spec.env.mask_source
    total, length = 0.0, 0
    state, start = None, True  # a recurrent model's state, zeroed where episodes start
    while True:
        masks = read_mask(env, source, obs, info) if source in ("method", "info") else None
        action, state = model.predict(obs, state=state, episode_start=np.array([start]),
                                      deterministic=deterministic, action_masks=masks)
        # a Discrete action as the workers step it (a Python int: NASim refuses a 0-d array)
        obs, reward, terminated, truncated, info = env.step(
            action.item() if isinstance(action, np.ndarray) and action.ndim == 0 else action)
        total, length, start = total + float(reward), length + 1, False
        if on_step is not None:
            on_step(env)
        if terminated or truncated:
            if info.get("game_over", True):
                return total, length
            obs, info = env.reset()  # a lost life: the game goes on, as a new learning episode
            start = True


def predict_state(core, state, episode_start, n: int) -> torch.Tensor:
    """sb3-contrib's recurrent state (see APPO.predict) -> [n, state_size], zeroed where
    ``episode_start``."""
    size = core.out_size
    if state is None:
        out = torch.zeros(n, core.state_size)
    else:
        parts = state if core.lstm else (state,)
        what = "an (h, c) tuple of [1, N, rnn_size] arrays (an LSTM)" if core.lstm else \
            "a [1, N, rnn_size] array (a GRU)"
        if (core.lstm and not (isinstance(state, tuple) and len(state) == 2)) or any(
                np.shape(p) != (1, n, size) for p in parts):
            raise ValueError(f"state: expected {what} with N={n}, rnn_size={size}, as the "
                             "previous predict() returned, or None at the start")
        out = torch.cat([torch.as_tensor(np.asarray(p, np.float32)).reshape(n, size)
                         for p in parts], -1)
    if episode_start is not None:
        starts = np.asarray(episode_start, bool).reshape(-1)
        if starts.size != n:
            raise ValueError(f"episode_start has {starts.size} entries for {n} observation(s)")
        out[torch.as_tensor(starts)] = 0.0
    return out


def predict_mask(model, spec: PolicySpec, observation, action_masks, n: int) -> Optional[torch.Tensor]:
    size = model.dist.mask_size
    if action_masks is None and spec.env.mask_source == "obs":
        action_masks = observation[MASK_KEY]
    if action_masks is None:
        return None
    if not size:
        raise ValueError(f"action_masks given, but the action space {spec.env.action_space} has "
                         "no discrete part to mask")
    m = np.asarray(action_masks)
    if m.dtype != np.bool_ and not np.issubdtype(m.dtype, np.integer):
        raise ValueError(f"action_masks has dtype {m.dtype}: expected bool (True: legal)")
    if m.size != n * size:
        raise ValueError(f"action_masks has shape {m.shape}; expected [{size}] or [N, {size}] "
                         f"for {n} observation(s) and the action space {spec.env.action_space}")
    m = torch.as_tensor(m.reshape(n, size).astype(bool))
    if not bool(m.any(-1).all()):
        raise ValueError("action_masks allows no action for some observation")
    return m


def as_numpy(action: Any) -> Any:
    """One env action as SB3 returns it: an array (0-d for Discrete), tuples/dicts of them."""
    if isinstance(action, tuple):
        return tuple(np.asarray(a) for a in action)
    if isinstance(action, dict):
        return {k: np.asarray(a) for k, a in action.items()}
    return np.asarray(action)


def stack_actions(actions: list) -> Any:
    """Actions of N envs as one batch: an [N, ...] array, or a tuple/dict of them."""
    first = actions[0]
    if isinstance(first, tuple):
        return tuple(np.stack([np.asarray(a[i]) for a in actions]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: np.stack([np.asarray(a[k]) for a in actions]) for k in first}
    return np.stack([np.asarray(a) for a in actions])
