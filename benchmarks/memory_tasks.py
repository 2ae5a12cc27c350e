"""Recurrent against feed-forward policies on memory tasks, same settings, side by side.

    python benchmarks/memory_tasks.py [--tasks repeat,poscartpole,novelcartpole] [--seeds 1]

Tasks (``pip install popgym`` for the first two):
- ``repeat``: popgym's RepeatPreviousEasy (say the card seen 4 steps ago; return in [-1, 1]);
- ``poscartpole``: popgym's PositionOnlyCartPoleEasy (CartPole from positions only, normalised
  return, 1 = balanced to the end);
- ``novelcartpole``: Gymnasium's CartPole-v1 with both velocities zeroed in every observation.

Each task trains ``APPO(env, use_rnn=...)`` with and without the GRU core for the same number of
env steps, logging the training return (mean of the last 100 episodes) against env steps, then
plays 20 greedy episodes. Writes ``benchmarks/results/memory_tasks.{json,csv,png}``.
"""
from __future__ import annotations

import argparse
import os
import time

import gymnasium as gym
import numpy as np

from _common import plot_curves, write_runs

from asyncrl import APPO

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


class HideVelocities(gym.ObservationWrapper):
    """CartPole observations with the cart's and the pole's velocities zeroed."""

    def __init__(self, env):
        super().__init__(env)

    def observation(self, obs):
        obs = np.array(obs, dtype=np.float32)
        obs[[1, 3]] = 0.0
        return obs


def cartpole_without_velocities():
    return HideVelocities(gym.make("CartPole-v1"))


SETTINGS = dict(num_workers=2, num_envs_per_worker=8, rollout=32, batch_size=1024,
                minibatch_size=256, num_epochs=4, learning_rate=1e-3, gamma=0.99, ent_coef=0.01,
                device="cpu", verbose=0)
TASKS = {  # name: (env, env steps, extra settings)
    "repeat": ("popgym:popgym-RepeatPreviousEasy-v0", 2_000_000, {}),
    "poscartpole": ("popgym:popgym-PositionOnlyCartPoleEasy-v0", 1_000_000, {}),
    "novelcartpole": (cartpole_without_velocities, 1_000_000, {}),
}


def run(task: str, use_rnn: bool, seed: int) -> dict:
    env, steps, extra = TASKS[task]
    curve = []
    t0 = time.perf_counter()

    def log(m: APPO):
        curve.append((m.num_timesteps, round(time.perf_counter() - t0, 1), m.logger.ep_rew_mean))

    with APPO(env, use_rnn=use_rnn, seed=seed, **SETTINGS, **extra) as model:
        model.train(steps, callback=log, callback_interval=3.0)
        log(model)
        seconds = time.perf_counter() - t0
        greedy, greedy_std = model.evaluate(20, deterministic=True, seed=1000)
    out = {"task": task, "use_rnn": use_rnn, "seed": seed, "steps": model.num_timesteps,
           "seconds": round(seconds, 1), "greedy_mean": greedy, "greedy_std": greedy_std,
           "curve": curve}
    print(f"{task} {'GRU' if use_rnn else 'feed-forward'} seed {seed}: {model.num_timesteps:,} "
          f"steps in {seconds:.0f} s, training return {curve[-1][2]:.3f}, greedy {greedy:.3f} "
          f"+/- {greedy_std:.3f}", flush=True)
    return out


def plot(runs: list, path: str) -> None:
    plot_curves(runs, "task", str,
                lambda r: ("C1" if r["use_rnn"] else "C0",
                           f"{'GRU 128' if r['use_rnn'] else 'feed-forward'} "
                           f"(greedy {r['greedy_mean']:.2f})"),
                "env steps", "training return (mean of 100)",
                f"asyncrl, recurrent vs feed-forward, 2 CPU cores ({time.strftime('%Y-%m-%d')})", path)


def write(runs: list, out: str) -> None:
    write_runs(out, {"settings": SETTINGS, "date": time.strftime("%Y-%m-%d")}, runs,
               ["task", "use_rnn", "seed"], ["env_steps", "seconds", "ep_rew_mean"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--out", default=os.path.join(RESULTS, "memory_tasks"))
    args = ap.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    for t in tasks:
        if t not in TASKS:
            ap.error(f"--tasks: unknown task {t!r}; choose from {list(TASKS)}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    runs = []
    for t in tasks:
        for seed in range(args.seeds):
            for rnn in (False, True):
                runs.append(run(t, rnn, seed))
                write(runs, args.out)  # after every run: a long sweep keeps what it measured
    plot(runs, args.out + ".png")
    print(f"\n| task | feed-forward greedy | GRU greedy |\n|---|---|---|")
    for t in tasks:
        ff = [r["greedy_mean"] for r in runs if r["task"] == t and not r["use_rnn"]]
        gru = [r["greedy_mean"] for r in runs if r["task"] == t and r["use_rnn"]]
        print(f"| {t} | {np.mean(ff):.3f} | {np.mean(gru):.3f} |")
    print(f"wrote {args.out}.json, .csv, .png")


if __name__ == "__main__":
    main()
