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
import threading
import time

import gymnasium as gym
import multiprocessing as mp
import psutil

from asyncrl import APPO

LAYOUT = dict(num_workers=2, num_envs_per_worker=8, device="cpu")


def _raw_worker(env_id: str, seconds: float, out) -> None:
    env = gym.make(env_id)
    env.reset(seed=0)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 1000
    out.put(steps / seconds)


def raw_env_rate(env_id: str = "CartPole-v1", processes: int = 2, seconds: float = 5.0) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_raw_worker, args=(env_id, seconds, out)) for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


class CpuSampler(threading.Thread):
    """CPU seconds per wall second of each child process, by name, over the sampled window."""

    def __init__(self, start_after: float):
        super().__init__(daemon=True)
        self.start_after, self.stop_event, self.result = start_after, threading.Event(), {}

    def run(self) -> None:
        if self.stop_event.wait(self.start_after):
            return
        me = psutil.Process()
        first, last = {}, {}  # name -> (time, cpu seconds)
        while not self.stop_event.wait(0.5):  # children are gone once train() returns: poll
            now = time.perf_counter()
            for p in [me, *me.children(recursive=True)]:
                try:
                    name = "main" if p is me else open(f"/proc/{p.pid}/comm").read().strip()
                    cpu = sum(p.cpu_times()[:2])
                except (psutil.NoSuchProcess, OSError):
                    continue
                first.setdefault(name, (now, cpu))
                last[name] = (now, cpu)
        for name, (t1, c1) in last.items():
            t0, c0 = first[name]
            if t1 > t0:
                self.result[name] = round((c1 - c0) / (t1 - t0), 2)


def steady_fps(steps: int, warmup: float = 4.0) -> dict:
    model = APPO("CartPole-v1", seed=0, verbose=0, **LAYOUT)
    sampler = CpuSampler(start_after=warmup)
    samples = []
    orig = model.logger.maybe_log

    def record(trained, force=False):  # sample (time, steps) from the main loop
        samples.append((time.perf_counter(), trained))
        orig(trained, force)

    model.logger.maybe_log = record
    t_start = time.perf_counter()
    sampler.start()
    model.train(steps)
    sampler.stop_event.set()
    sampler.join()
    t_w = t_start + warmup + 2.0  # steady state: after start-up and warm-up
    window = [(t, s) for t, s in samples if t >= t_w]
    fps = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0]) if len(window) > 2 else float("nan")
    stats = dict(model.logger.last_train)
    return {"fps": fps, "cpu_per_process": sampler.result,
            "policy_lag_mean": stats.get("policy_lag_mean"), "timings": model.logger.timings}


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
        results["raw"].append(raw_env_rate())
        results["fps"].append(steady_fps(args.steps))
        if not args.skip_time_to_450:
            results["t450"].append(time_to_450())
        print(f"repeat {r}: raw {results['raw'][-1]:,.0f} steps/s, asyncrl {results['fps'][-1]['fps']:,.0f} "
              f"steps/s, cpu {results['fps'][-1]['cpu_per_process']}"
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
