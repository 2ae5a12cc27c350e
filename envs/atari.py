"""Atari (ALE) envs with the DeepMind preprocessing, from ale-py's bundled ROMs (no download).

Each step, as documented by Machado et al. (2018) and the Nature DQN paper, and configurable:
- ``noop_max``: up to this many no-op actions after reset (random start states);
- ``frame_skip``: each action repeated this many frames, the observation the max of the last two
  (removes flicker);
- ``screen_size``: frames converted to grayscale and resized to ``screen_size`` x ``screen_size``;
- ``frame_stack``: the last this-many frames stacked channel-first, uint8 ``[frame_stack, 84, 84]``,
  the first frame repeated after a reset (``FrameStack``, shifted in place; gymnasium's
  FrameStackObservation concatenates its deque into a stack and deep-copies that, each step);
- sticky actions: the ``ALE/...-v5`` ids repeat the previous action with probability 0.25 (v5's
  definition); the ``...NoFrameskip-v4`` ids have none. ``repeat_action_probability=`` overrides;
- ``episodic_life``: a life loss ends the episode for learning, and the game goes on from there
  (DeepMind's setting; gymnasium's ``terminal_on_life_loss`` would restart the game instead);
  ``info["game_over"]`` tells the rollout worker when the game really ended, so the logged
  return stays the whole game's score (off by default);
- ``fire_reset``: press FIRE after reset, for games that wait for it (off by default).
Rewards are left raw here: clipping belongs in the learner, so logged returns are game scores.
The ALE env under the preprocessing renders grayscale (``render()`` still gives RGB), and the
preprocessing steps the emulator directly (``Preprocessing``): together 0.333 -> 0.254 ms per
Pong step, with the same observations as gymnasium's wrappers.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space


def is_atari_id(env_id: str) -> bool:
    return env_id.startswith("ALE/") or "NoFrameskip" in env_id


def register() -> bool:
    """Register the ALE ids in this process (every spawned worker calls it through make_env).
    Returns False when ale-py is not installed."""
    try:
        import ale_py
    except ImportError:
        return False
    gym.register_envs(ale_py)
    return True


class EpisodicLife(gym.Wrapper):
    """A lost life ends the episode for learning (``terminated``, ``info["game_over"]`` False);
    the next ``reset`` continues the same game with one no-op step instead of restarting it."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives, self.game_over = 0, True

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        info["game_over"] = self.game_over
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs):
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        self.game_over = False
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE once after each reset (games such as Breakout wait for it)."""

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(1)
        if terminated or truncated:
            obs, info = self.env.reset(**kwargs)
        return obs, info


class FrameStack(gym.Wrapper):
    """The last ``k`` observations, oldest first, as one array ``[k, *obs_shape]``; after a reset
    the first observation fills the stack. Each step shifts the stack by one in place and
    returns a copy (the caller may keep it)."""

    def __init__(self, env: gym.Env, k: int):
        super().__init__(env)
        self.observation_space = batch_space(env.observation_space, k)
        self.frames = np.zeros(self.observation_space.shape, self.observation_space.dtype)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = obs
        return self.frames.copy(), reward, terminated, truncated, info

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.frames[:] = obs
        return self.frames.copy(), info


class Preprocessing(gym.wrappers.AtariPreprocessing):
    """gymnasium's AtariPreprocessing (no-op reset; frame skip, max-pooling the last two frames;
    grayscale; resize), stepping the emulator directly. Through the ALE env's own step, every
    emulated frame went through three Python layers and produced an observation nobody reads:
    15% of a Pong step. Observations, rewards, ends and infos equal gymnasium's step for step
    (tested). Where the env below is not a plain discrete ale-py ``AtariEnv`` without frame
    skip, or lacks what this relies on, gymnasium's step runs."""

    def __init__(self, env: gym.Env, **kwargs):
        super().__init__(env, **kwargs)
        base = env.unwrapped
        self.direct = (self.grayscale_obs and not self.terminal_on_life_loss
                       and getattr(base, "_frameskip", None) == 1
                       and getattr(base, "continuous", True) is False
                       and hasattr(base, "_action_set") and hasattr(base, "_get_info"))

    def step(self, action):
        if not self.direct:
            return super().step(action)
        base, ale = self.env.unwrapped, self.ale
        action_id = base._action_set[action]
        total_reward, terminated, truncated = 0.0, False, False
        for t in range(self.frame_skip):
            total_reward += ale.act(action_id, 1.0)
            terminated = ale.game_over(with_truncation=False)
            truncated = ale.game_truncated()
            self.game_over = terminated
            if terminated or truncated:
                break
            if t == self.frame_skip - 2:
                ale.getScreenGrayscale(self.obs_buffer[1])
            elif t == self.frame_skip - 1:
                ale.getScreenGrayscale(self.obs_buffer[0])
        return self._get_obs(), total_reward, terminated, truncated, base._get_info()


def make_atari(env_id: str, *, frame_skip: int = 4, noop_max: int = 30, screen_size: int = 84,
               frame_stack: int = 4, episodic_life: bool = False, fire_reset: bool = False,
               **make_kwargs) -> gym.Env:
    """An ALE env with the DeepMind preprocessing; ``make_kwargs`` go to ``gym.make``."""
    if not register():
        raise ImportError(f"{env_id!r} needs ale-py: pip install 'asyncrl[atari]'")
    # frame skipping is done below, with max-pooling; the preprocessing reads grayscale screens
    env = gym.make(env_id, frameskip=1, **{"obs_type": "grayscale", **make_kwargs})
    env = Preprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size)
    if episodic_life:
        env = EpisodicLife(env)
    if fire_reset:
        env = FireReset(env)
    return FrameStack(env, frame_stack)
