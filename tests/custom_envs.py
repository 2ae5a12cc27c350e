"""Module-level env factories for the tests: picklable, so spawned workers can build them."""
from __future__ import annotations

import multiprocessing
import os
import time

import gymnasium as gym
import numpy as np

FAIL_AFTER_STEPS = 150
FAIL_MESSAGE = "custom env exploded on purpose"


def cartpole():
    """A plain factory (not a registered id): what a user passes for their own env."""
    return gym.make("CartPole-v1")


class FailingEnv(gym.Env):
    """CartPole-like spaces; step() raises after FAIL_AFTER_STEPS steps of this env."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.num_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.num_steps += 1
        if self.num_steps > FAIL_AFTER_STEPS:
            raise RuntimeError(f"{FAIL_MESSAGE} at step {self.num_steps}")
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        return obs, 1.0, self.num_steps % 20 == 0, False, {}


def failing_env():
    return FailingEnv()


class BoxActionEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, True, False, {}


def box_action_env():
    return BoxActionEnv()


class DictObsEnv(gym.Env):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pos": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return {"pos": np.zeros(2, np.float32)}, 0.0, True, False, {}


def dict_obs_env():
    return DictObsEnv()


class OutOfSpaceEnv(gym.Env):
    """Declares observations in [0, 1] but reset() returns 5.0 everywhere."""

    observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.full(4, 5.0, np.float32), {}

    def step(self, action):
        return np.full(4, 0.5, np.float32), 0.0, True, False, {}


def out_of_space_env():
    return OutOfSpaceEnv()


class TinyImageEnv(gym.Env):
    """uint8 [C, H, W] frames (the Nature CNN path); reward 1 for action 1, episodes of 20 steps."""

    observation_space = gym.spaces.Box(0, 255, (2, 44, 44), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def _frame(self):
        return self.np_random.integers(0, 256, (2, 44, 44), dtype=np.uint8)

    def step(self, action):
        self.t += 1
        return self._frame(), float(action == 1), False, self.t >= 20, {}


def tiny_image_env():
    return TinyImageEnv()


def returns_none():
    """A factory with a forgotten `return`."""
    gym.make("CartPole-v1")


class ChannelLastImageEnv(gym.Env):
    """[H, W, C] frames, as most renderers give them."""
    observation_space = gym.spaces.Box(0, 255, (64, 64, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def channel_last_image_env():
    return ChannelLastImageEnv()


class SequenceObsEnv(gym.Env):
    observation_space = gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                         "seen": gym.spaces.Sequence(gym.spaces.Discrete(3))})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return {"pos": np.zeros(2, np.float32), "seen": (1, 2)}, {}

    def step(self, action):
        return {"pos": np.zeros(2, np.float32), "seen": (1, 2)}, 0.0, True, False, {}


def sequence_obs_env():
    return SequenceObsEnv()


class ThreeLivesEnv(gym.Env):
    """Reward 1 a step; a 'life' ends every 10 steps (terminated, game_over False), the game
    after 3 lives (game_over True): a logged episode must be the whole game, return 30."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self.lives, self.t = 3, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.lives == 0:
            self.lives = 3
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t < 10:
            return np.zeros(2, np.float32), 1.0, False, False, {}
        self.lives -= 1
        return np.zeros(2, np.float32), 1.0, True, False, {"game_over": self.lives == 0}


def three_lives_env():
    return ThreeLivesEnv()


class StampedCartPole(gym.Wrapper):
    """CartPole that records, in a small memory-mapped file of its own under ``stamp_dir``,
    [time of its latest step, time of the first step after a pause of 0.3 s or more]."""

    def __init__(self, stamp_dir: str):
        super().__init__(gym.make("CartPole-v1"))
        path = os.path.join(stamp_dir, f"{os.getpid()}_{id(self)}.stamp")
        self.stamps = np.memmap(path, dtype=np.float64, mode="w+", shape=(2,))

    def step(self, action):
        now = time.time()
        if now - self.stamps[0] > 0.3:
            self.stamps[1] = now
        self.stamps[0] = now
        return self.env.step(action)


def read_stamps(stamp_dir: str) -> np.ndarray:
    """[num_envs, 2] of every StampedCartPole's stamps."""
    return np.array([np.fromfile(os.path.join(stamp_dir, f), dtype=np.float64)
                     for f in os.listdir(stamp_dir) if f.endswith(".stamp")])


class NaNRewardCartPole(gym.Wrapper):
    """CartPole whose 50th step returns a NaN reward."""

    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        return obs, float("nan") if self.steps == 50 else reward, terminated, truncated, info


def nan_reward_env():
    return NaNRewardCartPole()


class CrashingCartPole(gym.Wrapper):
    """CartPole that raises in step() with probability ``p_step`` and in reset() with
    ``p_reset`` (RLlib's CartPoleCrashing, in spirit)."""

    def __init__(self, p_step: float = 1 / 1000, p_reset: float = 1 / 50):
        super().__init__(gym.make("CartPole-v1"))
        self.p_step, self.p_reset = p_step, p_reset
        self.rng = np.random.default_rng()
        # In the workers only: the main process's probe of the env is not what is tested.
        self.in_worker = multiprocessing.parent_process() is not None

    def reset(self, **kwargs):
        if self.in_worker and self.rng.random() < self.p_reset:
            raise RuntimeError("CrashingCartPole: crashed in reset on purpose")
        return self.env.reset(**kwargs)

    def step(self, action):
        if self.in_worker and self.rng.random() < self.p_step:
            raise RuntimeError("CrashingCartPole: crashed in step on purpose")
        return self.env.step(action)


def crashing_cartpole():
    return CrashingCartPole()


_first_reset_done = False


class FirstResetFails(gym.Wrapper):
    """CartPole whose first reset in each worker process raises: an env that fails at start-up."""

    def reset(self, **kwargs):
        global _first_reset_done
        if multiprocessing.parent_process() is not None and not _first_reset_done:
            _first_reset_done = True
            raise RuntimeError(FAIL_MESSAGE + " in the first reset")
        return self.env.reset(**kwargs)


def first_reset_fails():
    return FirstResetFails(gym.make("CartPole-v1"))


def always_failing_env():
    env = FailingEnv()
    env.num_steps = FAIL_AFTER_STEPS  # raises at its first step: a crash loop
    return env


def lock_and_die(q, ipc) -> None:
    """Fault injection: take ``q``'s lock and SIGKILL this process, as a kill inside
    ``put``/``get`` would."""
    import ctypes
    q = getattr(q, "fifo", q)  # a BelledQueue's queue
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.pthread_mutex_lock(ctypes.c_void_p(ipc._mutex_addr(q)))
    os.kill(os.getpid(), 9)


class DieHoldingQueueLock(gym.Wrapper):
    """CartPole whose rollout worker, at the env's 50th step, takes the lock of one of its queues
    and SIGKILLs itself, as a kill inside faster-fifo's put/get would leave it. Once per
    ``marker`` file: the replacement worker runs a plain CartPole."""

    def __init__(self, queue_attr: str, marker: str):
        super().__init__(gym.make("CartPole-v1"))
        self.queue_attr, self.marker, self.num_steps = queue_attr, marker, 0

    def step(self, action):
        self.num_steps += 1
        if self.num_steps == 50 and self._first_to_die():
            import gc
            from asyncrl import ipc
            from asyncrl.rollout_worker import RolloutWorker
            worker = next(o for o in gc.get_objects() if type(o) is RolloutWorker)
            owner = worker if hasattr(worker, self.queue_attr) else worker.pools[0]  # slot queues
            lock_and_die(getattr(owner, self.queue_attr), ipc)
        return self.env.step(action)


    def _first_to_die(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            return True
        except FileExistsError:
            return False


def die_holding_queue_lock(queue_attr: str, marker: str):
    return DieHoldingQueueLock(queue_attr, marker)


class SmallImageEnv(ChannelLastImageEnv):
    """uint8 [C, H, W] frames of 12 x 12: below the Nature CNN's 36 x 36."""

    observation_space = gym.spaces.Box(0, 255, (3, 12, 12), np.uint8)
    action_space = gym.spaces.Discrete(2)


def small_image_env():
    return SmallImageEnv()


class RepeatFirstEnv(gym.Env):
    """A memory task: the first observation shows a cue (one of two), the next ``delay`` show
    nothing, the last asks for it: +1 for the cue's action, -1 otherwise (0 on the other steps).
    A feed-forward policy scores 0 on average, a recurrent one can reach 1."""

    observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)  # cue one-hot, query flag
    action_space = gym.spaces.Discrete(2)

    def __init__(self, delay: int = 2, fail_every: int = 0):
        self.delay, self.fail_every, self.steps = delay, fail_every, 0

    def _obs(self):
        obs = np.zeros(3, np.float32)
        if self.t == 0:
            obs[self.cue] = 1.0
        if self.t == self.delay + 1:
            obs[2] = 1.0
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue, self.t = int(self.np_random.integers(2)), 0
        return self._obs(), {}

    def step(self, action):
        self.steps += 1
        if self.fail_every and self.steps % self.fail_every == 0:
            raise RuntimeError("RepeatFirstEnv: injected failure")
        last = self.t == self.delay + 1
        reward = (1.0 if int(action) == self.cue else -1.0) if last else 0.0
        self.t += 1
        return self._obs(), reward, last, False, {}


def repeat_first_env():
    return RepeatFirstEnv()


def repeat_first_failing_env():
    return RepeatFirstEnv(fail_every=37)


class MarksItsEnd(gym.Wrapper):
    """CartPole that writes a file named after its process when it is closed and another from
    an atexit handler registered where it was built (a user's clean-up)."""

    def __init__(self, marks_dir: str):
        super().__init__(gym.make("CartPole-v1"))
        import atexit
        self.marks_dir = marks_dir
        atexit.register(self._mark, "atexit")

    def _mark(self, what: str) -> None:
        if os.path.isdir(self.marks_dir):  # the main process's probe runs its handler at exit
            open(os.path.join(self.marks_dir, f"{what}-{os.getpid()}"), "w").close()

    def close(self):
        self._mark("close")
        super().close()


def marks_its_end(marks_dir: str):
    return lambda: MarksItsEnd(marks_dir)


class NeverEndsEnv(BoxActionEnv):
    """No terminal state and no time limit (as gymnasium's CliffWalking-v1): no episode ever
    ends."""

    def step(self, action):
        return np.zeros(3, np.float32), 0.0, False, False, {}


def never_ends_env():
    return NeverEndsEnv()


class RecordsEpisodeLengths(gym.Env):
    """No terminal state (the time limit ends every episode); writes the lengths of the
    episodes it played, in order, to a file of ``out_dir`` named after its process when closed."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, out_dir: str):
        self.out_dir, self.lengths, self.t = out_dir, [], None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.t is not None:
            self.lengths.append(self.t)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), 1.0, False, False, {}

    def close(self):
        if os.path.isdir(self.out_dir):
            with open(os.path.join(self.out_dir, f"{os.getpid()}-{id(self)}"), "w") as f:
                f.write(" ".join(map(str, self.lengths)))


def records_episode_lengths(out_dir: str, limit: int):
    return lambda: gym.wrappers.TimeLimit(RecordsEpisodeLengths(out_dir), limit)
