"""What ``APPO.learn`` runs in the main process while training: Stable-Baselines3 callbacks and
the progress bar. Both are driven from ``train(callback=...)``'s periodic hook."""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

SB3_TICK = 0.25  # seconds between hook calls when an SB3 callback or a progress bar is attached


class SB3CallbackDriver:
    """Runs an SB3 ``BaseCallback`` (or a list of them, or SB3's ``fn(locals, globals)``) from the
    training hook. ``on_step`` is called once per vectorised step of all envs trained on, so
    ``n_calls`` advances as in SB3 and ``EvalCallback(eval_freq=...)``-style counters mean the
    same; ``on_rollout_end``/``on_rollout_start`` bracket each learner update seen.
    ``self.locals`` holds ``self``, ``total_timesteps`` and ``callback`` (no per-step ``infos``:
    the env steps happen in other processes)."""

    def __init__(self, callback: Any, model, total_timesteps: int, num_envs: int):
        from stable_baselines3.common.callbacks import BaseCallback, CallbackList, ConvertCallback
        if isinstance(callback, list):
            callback = CallbackList(callback)
        elif not isinstance(callback, BaseCallback):
            if not callable(callback):
                raise TypeError(f"callback={callback!r}: expected an SB3 BaseCallback, a list of "
                                "them, or a function(locals, globals) -> bool")
            callback = ConvertCallback(callback)
        self.callback, self.model, self.num_envs = callback, model, num_envs
        self.locals = {"self": model, "total_timesteps": total_timesteps, "callback": callback}
        self.steps_seen, self.version_seen = model.num_timesteps, model.policy_version
        self.stopped = False
        callback.init_callback(model)
        callback.on_training_start(self.locals, globals())
        callback.on_rollout_start()

    def __call__(self, model) -> bool:
        if self.stopped:
            return False
        if model.policy_version != self.version_seen:
            self.version_seen = model.policy_version
            self.callback.on_rollout_end()
            self.callback.on_rollout_start()
        self.callback.update_locals(self.locals)
        while model.num_timesteps - self.steps_seen >= self.num_envs:
            self.steps_seen += self.num_envs
            if self.callback.on_step() is False:
                self.stopped = True
                return False
        return True

    def close(self) -> None:
        self.callback.on_rollout_end()
        self.callback.on_training_end()


class ProgressBar:
    """A tqdm bar of env steps (``model.num_timesteps - offset`` of ``total``), with the recent
    mean return; ``write`` prints a line above it."""

    def __init__(self, total: int, offset: int = 0, initial: int = 0):
        try:
            from tqdm.auto import tqdm
        except ImportError as e:
            raise ImportError("the progress bar needs tqdm: pip install tqdm") from e
        self.offset = offset
        self.bar = tqdm(total=total, initial=initial, unit="step", unit_scale=True,
                        dynamic_ncols=True, file=sys.stderr, desc="asyncrl")

    def __call__(self, model) -> None:
        self.bar.n = model.num_timesteps - self.offset
        rew = model.logger.ep_rew_mean
        self.bar.set_postfix_str(f"ep_rew_mean {rew:.1f}" if rew == rew else "", refresh=False)
        self.bar.refresh()

    def write(self, line: str) -> None:
        self.bar.write(line, file=sys.stdout)

    def close(self) -> None:
        self.bar.close()


def chain(*hooks: Optional[Callable]) -> Optional[Callable]:
    """One training hook calling each given hook in turn; False from any stops training."""
    hooks = [h for h in hooks if h is not None]
    if not hooks:
        return None

    def hook(model):
        return False if any([h(model) is False for h in hooks]) else None
    return hook
