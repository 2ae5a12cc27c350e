"""VizDoom envs with Sample Factory's preprocessing, from vizdoom's bundled engine and scenarios
(``pip install 'asyncrl[doom]'``; headless, no download).

Any ``Vizdoom*`` id registered by ``vizdoom.gymnasium_wrapper`` (``VizdoomBasic-v1``,
``VizdoomHealthGatheringSupreme-v1``, ``VizdoomDefendCenter-v1``, ...), each configurable:
- ``frame_skip``: each action repeated this many tics by the engine (4);
- ``resolution``: the engine renders ``"160x120"`` (any ``RES_WxH`` vizdoom knows);
- ``width`` x ``height``: the frame resized to 128 x 72 RGB (nearest pixel, as Sample Factory's
  ``ResizeWrapper``; with ``width=None`` the rendered frame is kept);
- the observation is a Dict: ``"screen"``, uint8 ``[height, width, 3]``, and, where the scenario
  declares game variables (HEALTH, AMMO2, ...), ``"gamevariables"``, float32 (Sample Factory's
  "measurements"; the model normalises it by running statistics under the Doom defaults).
Rewards are the scenario's own, unshaped (Sample Factory adds +1 per health pick-up to its
gathering scenarios and logs the unshaped sum as ``true_objective``). Episode time-outs are
truncations. ``make_env`` registers the ids inside every spawned worker, as it does ALE's.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from typing import Iterable, Optional

import gymnasium as gym
import numpy as np

SCREEN, VARIABLES = "screen", "gamevariables"
# The engine saves its settings (ZDoom's _vizdoom.ini) where it is told, by default in the
# working directory: one shared file in the temp directory instead of one in every folder a
# script runs from.
DOOM_CONFIG_PATH = os.path.join(tempfile.gettempdir(), "asyncrl_vizdoom.ini")
# Where that file does not exist yet (a machine's first game), the engine also makes an empty
# ./_vizdoom folder (its default place for wads and screenshots) when it starts, at the first
# reset: DoomObservation removes it.
ENGINE_DIR = "_vizdoom"


# Each game's controller and engine talk through files in /dev/shm named after the game's
# instance id (ViZDoomSM<id>, ViZDoomMQCtr<id>, ViZDoomMQDoom<id>), removed when the game closes:
# an engine killed with its worker (SIGKILL) leaves them behind.
SHM_DIR = "/dev/shm"
SHM_FILE = re.compile(r"^ViZDoom(?:SM|MQCtr|MQDoom)(\w+)$")
ENGINE_ID = re.compile(rb"\+viz_instance_id\x00(\w+)")


def remove_orphaned_shm_files(min_age: float = 60.0, among: Optional[Iterable[str]] = None) -> list:
    """Remove the /dev/shm files of VizDoom games whose engine process is gone (no running
    process has their instance id on its command line), older than ``min_age`` seconds (a game
    starting now may have written its files before its engine runs); only names in ``among``
    when given (e.g. those a killed run of another program created). Returns the removed paths."""
    try:
        names = [n for n in os.listdir(SHM_DIR) if SHM_FILE.match(n)]
    except OSError:
        return []
    if among is not None:
        among = set(among)
        names = [n for n in names if n in among]
    if not names:
        return []
    live = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                live.update(m.decode() for m in ENGINE_ID.findall(f.read()))
        except OSError:  # gone, or not ours to read
            continue
    removed, now = [], time.time()
    for name in names:
        path = os.path.join(SHM_DIR, name)
        try:
            if SHM_FILE.match(name).group(1) not in live and now - os.stat(path).st_mtime >= min_age:
                os.unlink(path)
                removed.append(path)
        except OSError:  # removed meanwhile
            continue
    return removed


def is_doom_id(env_id: str) -> bool:
    return env_id.startswith("Vizdoom")


def register() -> bool:
    """Register vizdoom's Gymnasium ids in this process. False when vizdoom is not installed."""
    try:
        import vizdoom.gymnasium_wrapper  # noqa: F401  (registers the ids on import)
    except ImportError:
        return False
    return True


class DoomObservation(gym.ObservationWrapper):
    """The screen resized to ``width`` x ``height`` (nearest pixel) and, when the scenario has
    game variables, those beside it; every other buffer (depth, labels, automap, audio) dropped."""

    def __init__(self, env: gym.Env, width: int, height: int):
        super().__init__(env)
        import cv2
        self._resize = cv2.resize
        self._inter = cv2.INTER_NEAREST
        screen = env.observation_space[SCREEN]
        self.size = None if width is None else (width, height)
        shape = screen.shape if width is None else (height, width, screen.shape[2])
        spaces = {SCREEN: gym.spaces.Box(0, 255, shape, np.uint8)}
        if VARIABLES in env.observation_space.spaces:
            spaces[VARIABLES] = env.observation_space[VARIABLES]
        self.observation_space = gym.spaces.Dict(spaces)

    def reset(self, **kwargs):
        if self.env.unwrapped.game.is_running():
            return super().reset(**kwargs)
        had_engine_dir = os.path.isdir(ENGINE_DIR)  # the engine starts now
        try:
            return super().reset(**kwargs)
        finally:
            if not had_engine_dir:
                try:
                    os.rmdir(ENGINE_DIR)
                except OSError:  # not made (its settings file exists), or not empty
                    pass

    def observation(self, obs: dict) -> dict:
        screen = obs[SCREEN]
        if self.size is not None and screen.shape[1::-1] != self.size:
            screen = self._resize(screen, self.size, interpolation=self._inter)
        out = {SCREEN: screen}
        if VARIABLES in self.observation_space.spaces:
            out[VARIABLES] = obs[VARIABLES]
        return out


def make_doom(env_id: str, *, frame_skip: int = 4, resolution: str = "160x120",
              width: int = 128, height: int = 72, **make_kwargs) -> gym.Env:
    """A VizDoom env with Sample Factory's preprocessing; ``make_kwargs`` go to ``gym.make`` (and
    from there to the DoomGame's config, e.g. ``doom_skill=3``)."""
    if not register():
        raise ImportError(f"{env_id!r} needs vizdoom: pip install 'asyncrl[doom]'")
    remove_orphaned_shm_files()
    env = gym.make(env_id, frame_skip=frame_skip, **{
        "screen_resolution": f"RES_{resolution.upper()}", "doom_config_path": DOOM_CONFIG_PATH,
        **make_kwargs})
    return DoomObservation(env, width, height)
