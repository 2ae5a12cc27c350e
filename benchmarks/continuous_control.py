"""Continuous control (MuJoCo) with the automatic continuous defaults, beside Sample Factory.

    python benchmarks/continuous_control.py learn [--env HalfCheetah-v5] [--steps 1000000] [--sf]

``learn``: trains ``APPO(env)`` (nothing but the env id: the defaults are what is measured) for
``--steps`` env steps, logging the training return (``rollout/ep_rew_mean``) against env steps, then
plays 10 greedy episodes. With ``--sf`` Sample Factory's MuJoCo example (``run.sh``, 2 x 8) runs
afterwards until it has logged as many frames, and its curve is read from its log. Writes
``benchmarks/results/<env>_learning.{csv,json,png}``.

Throughput (any env, Sample Factory beside it): ``benchmarks/throughput.py``.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import time

from _common import pyplot

from asyncrl import APPO

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
SF_RUN = os.path.join(HERE, "..", "..", "shared", "bench", "sample_factory", "run.sh")
SF_WARMUP = 30.0  # seconds Sample Factory needs to start; its rate is read after them
LAYOUT = dict(num_workers=2, num_envs_per_worker=8, device="cpu")


def sf_run(seconds: float, which: str = "halfcheetah") -> list:
    """Runs Sample Factory's example; returns its log's (seconds since start, frames, avg
    training return or None) readings."""
    if not os.path.exists(SF_RUN):
        raise SystemExit(f"Sample Factory's runner is not at {SF_RUN}")
    t0 = time.perf_counter()
    out = subprocess.run(["bash", SF_RUN, str(int(seconds)), which], capture_output=True, text=True)
    log_path = out.stdout.strip().splitlines()[-1].replace("full log: ", "")
    readings, reward = [], None
    with open(log_path) as f:
        for line in f:
            line = re.sub(r"\x1b\[[0-9;]*m", "", line)
            m = re.search(r"Avg episode reward: \[\(0, '([-\d.e+]+)'\)\]", line)
            if m:
                reward = float(m.group(1))
            m = re.search(r"Total num frames: (\d+)", line)
            t = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+)\]", line)
            if m and t:
                stamp = time.mktime(time.strptime(t.group(1), "%Y-%m-%d %H:%M:%S")) + int(t.group(2)) / 1000
                readings.append((stamp, int(m.group(1)), reward))
    if len(readings) < 3:
        raise SystemExit(f"Sample Factory logged too few frame counts ({len(readings)}) in "
                         f"{time.perf_counter() - t0:.0f} s; see {log_path}")
    start = readings[0][0]
    return [(t - start, n, r) for t, n, r in readings]


def sf_steady_rate(readings: list, warmup: float) -> float:
    """Env steps/s between the first and last readings after ``warmup`` seconds, at which the
    (batch-quantised) frame counter had just moved."""
    moved = [(t, n) for i, (t, n, _) in enumerate(readings) if t >= warmup and i and n != readings[i - 1][1]]
    if len(moved) < 2:
        raise SystemExit(f"Sample Factory's frame counter moved {len(moved)} times after the "
                         f"{warmup:.0f} s warm-up: raise --seconds")
    (t0, n0), (t1, n1) = moved[0], moved[-1]
    return (n1 - n0) / (t1 - t0)


def learn(args) -> None:
    curve = []
    t0 = time.perf_counter()

    def log(m: APPO):
        curve.append((m.num_timesteps, round(time.perf_counter() - t0, 1), m.logger.ep_rew_mean))

    with APPO(args.env, seed=args.seed, verbose=0, **LAYOUT) as model:
        model.train(args.steps, callback=log, callback_interval=5.0)
        log(model)
        seconds = time.perf_counter() - t0
        greedy_mean, greedy_std = model.evaluate(10, deterministic=True, seed=1000)
        cfg = {k: getattr(model.config, k) for k in ("algo", "rollout", "batch_size", "minibatch_size",
                                                      "num_epochs", "learning_rate", "normalize_obs",
                                                      "normalize_returns")}
    print(f"asyncrl {args.env}: {model.num_timesteps:,} steps in {seconds:.0f} s "
          f"({model.num_timesteps / seconds:,.0f}/s incl. start-up), training return "
          f"{curve[-1][2]:.0f}, greedy {greedy_mean:.0f} +/- {greedy_std:.0f} over 10 episodes")
    result = {"env": args.env, "steps": model.num_timesteps, "seconds": round(seconds, 1),
              "greedy_mean": greedy_mean, "greedy_std": greedy_std, "config": cfg,
              "curve": curve, "date": time.strftime("%Y-%m-%d")}
    if args.sf:
        sf_seconds = SF_WARMUP + args.steps / args.sf_rate
        readings = sf_run(sf_seconds)
        result["sf_curve"] = [(n, round(t, 1), r) for t, n, r in readings if r is not None]
        print(f"Sample Factory: {readings[-1][1]:,} frames in {readings[-1][0]:.0f} s, last training "
              f"return {result['sf_curve'][-1][2] if result['sf_curve'] else float('nan'):.0f}")
    name = os.path.join(RESULTS, f"{args.env.split('-')[0].lower()}_learning")
    os.makedirs(RESULTS, exist_ok=True)
    with open(name + ".json", "w") as f:
        json.dump(result, f, indent=1)
    with open(name + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "env_steps", "seconds", "ep_rew_mean"])
        w.writerows(("asyncrl", *row) for row in curve)
        w.writerows(("sample_factory", *row) for row in result.get("sf_curve", []))
    plot(result, name + ".png")
    print(f"wrote {name}.json, .csv, .png")


def plot(result: dict, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("curve", "asyncrl (defaults)"), ("sf_curve", "Sample Factory 2.1.1 (its MuJoCo example)")):
        pts = [(n, r) for n, _, r in result.get(key, []) if r is not None and r == r]
        if pts:
            ax.plot(*zip(*pts), label=label)
    ax.axhline(result["greedy_mean"], ls=":", c="C0", label=f"asyncrl greedy at the end ({result['greedy_mean']:.0f})")
    ax.set_xlabel("env steps")
    ax.set_ylabel("training episode return (mean of 100)")
    ax.set_title(f"{result['env']}, 2 workers x 8 envs, 2 CPU cores ({result['date']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("learn")
    lp.add_argument("--env", default="HalfCheetah-v5")
    lp.add_argument("--steps", type=int, default=1_000_000)
    lp.add_argument("--seed", type=int, default=0)
    lp.add_argument("--sf", action="store_true", help="Sample Factory's example for as many steps")
    lp.add_argument("--sf_rate", type=float, default=4_900.0,
                    help="Sample Factory's expected env steps/s, to size its run")
    args = ap.parse_args()
    learn(args)


if __name__ == "__main__":
    main()
