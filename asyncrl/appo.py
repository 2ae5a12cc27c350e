"""The stable-baselines-style facade: ``APPO(env, ...).train(...)``."""
from __future__ import annotations

import os
import pathlib
import random
import shutil
import tempfile
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, Union

import numpy as np
import torch

from asyncrl.envs import is_atari_id

from .config import Config, ConfigError, with_defaults
from .env_utils import make_env_factory, probe_env, storage_dtype
from .logger import TrainLogger
from .models import ActorCritic
from .runner import Runner

POLICY_ID = 0  # one policy per model for now; parameters are keyed by policy id


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; an unusable choice raises.
    Only queries the driver: no CUDA context is created in the main process."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but torch sees no CUDA GPU (torch "
                              f"{torch.__version__}); use device='cpu' or 'auto'")
        idx = int(device.partition(":")[2] or 0)
        if idx >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r} but only {torch.cuda.device_count()} CUDA "
                              "device(s) are visible")
    return device


class APPO:
    """Asynchronous PPO with V-trace: rollout workers, policy workers and a learner in separate
    processes, trading trajectories through shared memory.

    :param env: a Gymnasium id (e.g. ``"CartPole-v1"``) or a picklable zero-argument function
        returning a ``gymnasium.Env``.
    :param env_kwargs: keyword arguments for ``gymnasium.make`` when ``env`` is an id.
    :param kwargs: any field of :class:`asyncrl.Config` (``num_workers``, ``learning_rate``, ...).
    """

    def __init__(self, env: Any = "CartPole-v1", *, env_kwargs: Optional[dict] = None, **kwargs):
        atari = isinstance(env, str) and is_atari_id(env)
        self.config = Config.from_kwargs(with_defaults(kwargs, atari=atari))
        if self.config.seed is None:
            self.config = self.config.replace(seed=random.randrange(2 ** 31))
        self.device = resolve_device(self.config.device)
        self.env_factory = make_env_factory(env, env_kwargs)
        self.observation_space, self.action_space = probe_env(self.env_factory)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            self.policy = ActorCritic(self.observation_space, self.action_space, self.config)
        self.policy.eval()
        self.num_timesteps = 0   # env steps trained on, over all train() calls
        self.policy_version = 0  # weight updates published by the learner
        self._num_runs = 0       # train() calls so far (moves the seeds of each call)
        self._tmpdir = tempfile.mkdtemp(prefix="asyncrl-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)
        cfg = self.config
        self.logger = TrainLogger(cfg.verbose, cfg.log_interval, cfg.stats_window, cfg.tensorboard_log)

    # --- training -------------------------------------------------------------------------
    def train(self, train_for_env_steps: int, callback: Optional[Callable[["APPO"], Any]] = None,
              callback_interval: float = 1.0) -> "APPO":
        """Train for ``train_for_env_steps`` more env steps (samples the learner trains on).
        Starts the worker processes, and joins them before returning. Returns ``self``.

        :param callback: called as ``callback(self)`` in this process every ``callback_interval``
            seconds while training, with ``self.policy`` holding the latest published weights
            (so ``predict``/``evaluate`` work); returning ``False`` stops training early.
        """
        if not isinstance(train_for_env_steps, (int, np.integer)) or train_for_env_steps < 1:
            raise ConfigError(f"train_for_env_steps={train_for_env_steps!r}: must be an integer >= 1")
        runner = Runner(self.config, self.env_factory, self.observation_space, self.action_space,
                        self.device, os.path.join(self._tmpdir, "optimizer.pt"), self.logger, self._num_runs)
        self._num_runs += 1
        try:
            runner.run(self.policy, self.policy_version, self.num_timesteps,
                       self.num_timesteps + int(train_for_env_steps),
                       callback=None if callback is None else self._progress_hook(callback),
                       callback_interval=callback_interval)
        finally:  # also after an error or Ctrl-C: the counters that match the kept weights
            self.policy_version, self.num_timesteps = runner.version, runner.trained_env_steps
        return self

    def _progress_hook(self, callback: Callable[["APPO"], Any]) -> Callable[[int, int], Any]:
        def hook(version: int, trained_env_steps: int):
            self.policy_version, self.num_timesteps = version, trained_env_steps
            return callback(self)
        return hook

    def learn(self, total_timesteps: int, callback=None, progress_bar: bool = False) -> "APPO":
        """SB3's name for :meth:`train`."""
        if callback is not None:
            raise NotImplementedError("SB3 callback objects are not supported yet; use "
                                      "train(total_timesteps, callback=fn) with fn(model) -> bool")
        if progress_bar:
            raise NotImplementedError("progress_bar=True is not supported yet; the console "
                                      "summary (verbose=1) reports progress")
        return self.train(total_timesteps)

    # --- acting ---------------------------------------------------------------------------
    def predict(self, observation, state=None, episode_start=None,
                deterministic: bool = False) -> Tuple[np.ndarray, None]:
        """Actions for one observation or a batch ``[N, *obs_shape]``; ``state`` is returned as
        given (no recurrent policies yet)."""
        obs = np.asarray(observation)
        shape = self.observation_space.shape
        single = obs.shape == shape
        if not single and obs.shape[1:] != shape:
            raise ValueError(f"observation of shape {obs.shape} matches neither the env's "
                             f"observation shape {shape} nor a batch [N, *{shape}]")
        batch = torch.as_tensor(obs.reshape(-1, *shape).astype(storage_dtype(self.observation_space),
                                                                  copy=False))
        actions, _, _ = self.policy.act(batch, deterministic=deterministic)
        actions = actions.numpy()
        return (actions[0] if single else actions), state

    def evaluate(self, n_episodes: int = 10, deterministic: bool = True,
                 seed: Optional[int] = None) -> Tuple[float, float]:
        """Mean and std of the episode return over ``n_episodes``, played in this process."""
        env = self.env_factory()
        returns = []
        try:
            for ep in range(n_episodes):
                obs, _ = env.reset(seed=None if seed is None else seed + ep)
                done, total = False, 0.0
                while not done:
                    action, _ = self.predict(obs, deterministic=deterministic)
                    obs, reward, terminated, truncated, _ = env.step(int(action))
                    total += float(reward)
                    done = terminated or truncated
                returns.append(total)
        finally:
            env.close()
        return float(np.mean(returns)), float(np.std(returns))

    # --- parameters -----------------------------------------------------------------------
    def get_parameters(self) -> Dict[int, Dict[str, torch.Tensor]]:
        """``{policy_id: state_dict}`` (copies, on the CPU)."""
        return {POLICY_ID: {k: v.detach().clone() for k, v in self.policy.state_dict().items()}}

    def set_parameters(self, params: Dict[int, Union[dict, str, os.PathLike]],
                       exact_match: bool = True) -> None:
        """Load ``{policy_id: state_dict or path}`` (a path to a file of :meth:`save` or a
        ``torch.save``-d state dict). Mismatched keys or shapes raise, naming them."""
        if isinstance(params, (str, os.PathLike)) or (
                isinstance(params, dict) and params and all(isinstance(k, str) for k in params)):
            params = {POLICY_ID: params}  # SB3 style: one path or one state dict
        if not isinstance(params, dict):
            raise TypeError(f"params must be a dict {{policy_id: state_dict or path}}, got {type(params).__name__}")
        unknown = [k for k in params if k != POLICY_ID]
        if unknown:
            raise KeyError(f"unknown policy id(s) {unknown}; this model has policy id {POLICY_ID}")
        for policy_id, value in params.items():
            state = self._state_dict_from(value)
            self._check_state_dict(state, exact_match)
            self.policy.load_state_dict(state, strict=exact_match)
        self.policy_version += 1  # new weights: samples made before are from another policy

    @staticmethod
    def _state_dict_from(value) -> dict:
        if isinstance(value, (str, os.PathLike)):
            loaded = torch.load(value, map_location="cpu", weights_only=False)
            return loaded.get("state_dict", loaded) if isinstance(loaded, dict) else loaded
        if isinstance(value, dict):
            return value
        raise TypeError(f"expected a state_dict or a checkpoint path, got {type(value).__name__}")

    def _check_state_dict(self, state: dict, exact_match: bool) -> None:
        own = self.policy.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        wrong = [f"{k}: expected {tuple(own[k].shape)}, got {tuple(state[k].shape)}"
                 for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
        problems = []
        if exact_match and missing:
            problems.append(f"missing keys {missing}")
        if exact_match and unexpected:
            problems.append(f"unexpected keys {unexpected}")
        if wrong:
            problems.append("shape mismatch: " + "; ".join(wrong))
        if problems:
            raise ValueError("parameters do not fit this model (" + ", ".join(problems) + "); "
                             "they must come from a model with the same env spaces and hidden_sizes")

    # --- persistence ----------------------------------------------------------------------
    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write weights, optimizer state, counters and config to ``path`` (atomically)."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        opt_path = os.path.join(self._tmpdir, "optimizer.pt")
        blob = {"state_dict": self.policy.state_dict(), "config": self.config.__dict__.copy(),
                "env_factory": self.env_factory, "num_timesteps": self.num_timesteps,
                "policy_version": self.policy_version,
                "optimizer": torch.load(opt_path, map_location="cpu") if os.path.exists(opt_path) else None}
        tmp = path.with_name(path.name + ".tmp")
        torch.save(blob, tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Union[str, os.PathLike], env: Any = None, **overrides) -> "APPO":
        """Rebuild a model from :meth:`save`; ``overrides`` replace config fields."""
        try:
            blob = torch.load(path, map_location="cpu", weights_only=False)
        except (AttributeError, ModuleNotFoundError) as e:
            raise RuntimeError(f"could not unpickle the env factory saved in {path} ({e}); it was "
                               "probably defined in a script's __main__: pass env=... to load()") from e
        model = cls(env if env is not None else blob["env_factory"], **{**blob["config"], **overrides})
        model.policy.load_state_dict(blob["state_dict"])
        model.num_timesteps, model.policy_version = blob["num_timesteps"], blob["policy_version"]
        if blob["optimizer"] is not None:
            torch.save(blob["optimizer"], os.path.join(model._tmpdir, "optimizer.pt"))
        return model

    def close(self) -> None:
        self.logger.close()
        self._finalizer()

    def __enter__(self) -> "APPO":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
