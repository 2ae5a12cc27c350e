"""CartPole-v1 throughput and time-to-450, side by side with the raw simulation rate.

    python benchmarks/cartpole_throughput.py [--repeats 3] [--steps 400000] [--json out.json]

Reports, per repeat and as medians: (1) raw env rate, random actions, one process per core, no
learning; (2) asyncrl steady training FPS (env steps trained on per second after warm-up) with
2 workers x 8 envs on CPU, and the CPU seconds each process spent per second; (3) wall time from
the APPO(...) call to a greedy mean return >= 450 over 10 episodes, checked after each chunk.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import raw_env_rate, steady_fps

from asyncrl import APPO

LAYOUT = dict(num_workers=2, num_envs_per_worker=8, device="cpu")


def cartpole_fps(steps: int) -> dict:
    return steady_fps("CartPole-v1", warmup=6.0, steps=steps, seed=0, **LAYOUT)


def time_to_450(max_steps: int = 600_000) -> dict:
    """Seconds from the APPO(...) call until a greedy evaluation (10 episodes, run in the main
    process once a second while training goes on, its cost included) reaches 450."""
    t0 = time.perf_counter()
    model = APPO("CartPole-v1", seed=int(time.time()) % 10_000, verbose=0, **LAYOUT)
    hit = {}

    def check(m: APPO):
        mean, _ = m.evaluate(10)
        if mean >= 450:
            hit.update(seconds=time.perf_counter() - t0, steps=m.num_timesteps, ret=mean)
            return False
        return None

    model.train(max_steps, callback=check, callback_interval=1.0)
    return hit or {"seconds": float("nan"), "steps": model.num_timesteps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400_000, help="env steps of each FPS run")
    ap.add_argument("--skip-time-to-450", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = {"raw": [], "fps": [], "t450": []}
    for r in range(args.repeats):
        results["raw"].append(raw_env_rate("CartPole-v1", processes=2))
        results["fps"].append(cartpole_fps(args.steps))
        if not args.skip_time_to_450:
            results["t450"].append(time_to_450())
        print(f"repeat {r}: raw {results['raw'][-1]:,.0f} steps/s, asyncrl {results['fps'][-1]['fps']:,.0f} "
              f"steps/s, cpu {results['fps'][-1]['cpu_per_process']}, peak PSS {results['fps'][-1]['peak_pss_gib']:.2f} GiB"
              + (f", t450 {results['t450'][-1]}" if results["t450"] else ""), flush=True)
    raw = statistics.median(results["raw"])
    fps = statistics.median(f["fps"] for f in results["fps"])
    print("\n| figure | median |\n|---|---|")
    print(f"| raw CartPole-v1, 2 processes, random actions | {raw:,.0f} steps/s |")
    print(f"| asyncrl steady training FPS (2 workers x 8 envs) | {fps:,.0f} steps/s |")
    print(f"| asyncrl / raw | {fps / raw:.2f} |")
    if results["t450"]:
        secs = statistics.median(t["seconds"] for t in results["t450"])
        steps = statistics.median(t["steps"] for t in results["t450"])
        print(f"| wall time to greedy mean 450 (from APPO(...)) | {secs:.1f} s |")
        print(f"| env steps to greedy mean 450 | {steps:,.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
