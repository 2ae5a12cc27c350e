"""Soak test: one long training run, FPS and memory of the whole process tree over time.

    python benchmarks/soak.py [--minutes 30] [--warmup 5] [--env CartPole-v1] [--every 10]
        [--json soak.json] [--png soak.png] [--kill-every 0] [--set key=value ...]

Every ``--every`` seconds: env steps trained, FPS over the interval, PSS and RSS summed over the
main process and all its children. After ``--warmup`` minutes, memory must stay flat: the
verdict compares the median PSS of the last five samples with that of the first five after the
warm-up (growth under 5% passes; the exit code is 1 otherwise). ``--kill-every N`` also SIGKILLs
a random rollout worker every N seconds, to soak the restart path (``max_worker_restarts`` is
raised to match).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import signal
import statistics
import time

import psutil
from _common import tree_memory

from asyncrl import APPO

GROWTH_LIMIT = 0.05


def _parse_set(items):
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def kill_a_rollout_worker() -> int:
    victims = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.name().startswith("rollout-"):
                victims.append(c)
        except psutil.Error:  # ended meanwhile
            pass
    if not victims:
        return 0
    victim = random.choice(victims)
    try:
        os.kill(victim.pid, signal.SIGKILL)
    except ProcessLookupError:
        return 0
    return victim.pid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0, help="minutes before memory must be flat")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--kill-every", type=float, default=0.0,
                    help="SIGKILL a random rollout worker every this many seconds (0: never)")
    ap.add_argument("--json", default="soak.json")
    ap.add_argument("--png", default="soak.png")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="APPO keyword arguments, e.g. num_workers=4")
    args = ap.parse_args()
    kwargs = dict(verbose=0, **_parse_set(args.set))
    if args.kill_every:
        kwargs.setdefault("max_worker_restarts", int(args.minutes * 60 / args.kill_every) + 10)

    samples, kills = [], []
    t_start = time.perf_counter()
    last = {"t": t_start, "steps": 0, "kill": t_start}

    def sample(model):
        now = time.perf_counter()
        mem = tree_memory()
        fps = (model.num_timesteps - last["steps"]) / (now - last["t"])
        samples.append({"minutes": (now - t_start) / 60, "env_steps": model.num_timesteps,
                        "fps": fps, "pss_mib": mem["pss"] / 2 ** 20,
                        "rss_mib": mem["rss"] / 2 ** 20, "processes": mem["processes"],
                        "ep_rew_mean": model.logger.ep_rew_mean})
        s = samples[-1]
        print(f"{s['minutes']:6.1f} min  {s['env_steps']:>12,} steps  {fps:8,.0f} fps  "
              f"PSS {s['pss_mib']:8,.1f} MiB  RSS {s['rss_mib']:8,.1f} MiB  "
              f"({s['processes']} processes)", flush=True)
        last.update(t=now, steps=model.num_timesteps)
        if args.kill_every and now - last["kill"] >= args.kill_every:
            kills.append((s["minutes"], kill_a_rollout_worker()))
            last["kill"] = now
        return False if now - t_start >= args.minutes * 60 else None

    with APPO(args.env, **kwargs) as model:
        model.train(10 ** 13, callback=sample, callback_interval=args.every)
        worker_restarts = model.logger.worker_restarts

    after = [s for s in samples if s["minutes"] >= args.warmup]
    if len(after) < 10:
        raise SystemExit(f"only {len(after)} samples after the warm-up: run longer than "
                         f"--warmup {args.warmup} min, or sample more often (--every)")
    first = statistics.median(s["pss_mib"] for s in after[:5])
    final = statistics.median(s["pss_mib"] for s in after[-5:])
    growth = final / first - 1
    steady_fps = statistics.median(s["fps"] for s in after)
    result = {"env": args.env, "kwargs": kwargs, "minutes": args.minutes, "warmup": args.warmup,
              "pss_mib_after_warmup": first, "pss_mib_at_end": final, "growth": growth,
              "peak_pss_mib": max(s["pss_mib"] for s in samples),
              "median_fps_after_warmup": steady_fps, "kills": kills,
              "worker_restarts": worker_restarts, "passed": growth < GROWTH_LIMIT,
              "samples": samples}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nPSS after warm-up {first:,.1f} MiB, at the end {final:,.1f} MiB: growth "
          f"{100 * growth:+.2f}% (limit {100 * GROWTH_LIMIT:.0f}%) -> "
          f"{'flat' if result['passed'] else 'GROWING'}; median FPS after warm-up "
          f"{steady_fps:,.0f}; worker restarts {worker_restarts}. Wrote {args.json}", flush=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
        minutes = [s["minutes"] for s in samples]
        ax1.plot(minutes, [s["fps"] for s in samples])
        ax1.set_ylabel("env steps / s")
        ax2.plot(minutes, [s["pss_mib"] for s in samples], label="PSS (tree)")
        ax2.plot(minutes, [s["rss_mib"] for s in samples], label="RSS (sum)")
        ax2.axvline(args.warmup, color="gray", linestyle=":")
        ax2.set_ylabel("MiB")
        ax2.set_xlabel("minutes")
        ax2.legend()
        fig.suptitle(f"asyncrl soak: {args.env}")
        fig.savefig(args.png, dpi=100)
        print(f"wrote {args.png}")
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[bench]')")
    raise SystemExit(0 if result["passed"] else 1)


if __name__ == "__main__":
    main()
