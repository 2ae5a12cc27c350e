"""Swimmer-v5 with asyncrl set up as SB3's PPO defaults, and that set-up less one part at a time:
which of asyncrl's defaults cost Swimmer its score (docs/benchmarks/learning-suite.md, "Swimmer:
SB3's recipe in asyncrl").

Each run trains 1M env steps, then plays 10 greedy episodes (resets seeded 1000-1009) and appends
one JSON line to --out: the greedy mean, the training return (last 100 episodes) every 100k env
steps and the wall time (start-up included). ``--jobs 2`` runs two at once (on 2 cores each
run then gets about one): the scores are what compare, and only the wall times of runs made
alone. Learning runs belong here, not in the test suite:

    python benchmarks/swimmer_recipe.py --configs sb3,sb3-std --seeds 0,1 [--jobs 2]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from _common import exit_on_sigterm

# SB3's PPO defaults in asyncrl's fields: one env's 2,048 steps a batch (2 envs x 1,024: a rollout
# worker steps two groups in turn), every sample from the latest policy, 10 epochs of minibatches
# of 64, no observation or return normalisation, no brake on the update's move, no advantage-std
# floor, the Gaussian's initial std 1 in the env's units. SB3's 64 x 64 tanh networks,
# lr 3e-4, clip 0.2, gamma 0.99, lambda 0.95, no entropy bonus, gradient norm 0.5 are the
# continuous preset's already.
SB3 = dict(num_workers=1, num_envs_per_worker=2, algo="ppo", rollout=1024, batch_size=2048,
           minibatch_size=64, num_epochs=10, normalize_obs=False, normalize_returns=False,
           kl_adaptive_lr=None, advantage_std_floor=0.0, policy_kwargs=dict(log_std_init=0.0))
LAYOUT = {k: SB3[k] for k in ("num_workers", "num_envs_per_worker", "algo", "rollout",
                              "batch_size")}  # SB3's layout alone
CONFIGS = {
    "defaults": {},
    "sb3": SB3,
    # SB3's recipe less one part: the part set back to asyncrl's default
    "sb3-mb256": {**SB3, "minibatch_size": 256},
    "sb3-std": {k: v for k, v in SB3.items() if k != "policy_kwargs"},
    "sb3-norm": {k: v for k, v in SB3.items() if k not in ("normalize_obs", "normalize_returns")},
    "sb3-brake": {k: v for k, v in SB3.items() if k != "kl_adaptive_lr"},
    # SB3's learner settings over the defaults' 16 envs (2 x 8, rollout 128: the same batch)
    "sb3-16envs": {**SB3, "num_workers": 2, "num_envs_per_worker": 8, "rollout": 128},
    # SB3's layout (2 envs, 1,024-step rollouts, synchronous) with asyncrl's learner settings
    "layout": LAYOUT,
}
STEPS = 1_000_000
EPISODES = 10


def run_one(name: str, seed: int, steps: int) -> dict:
    from asyncrl import APPO
    from asyncrl.cli import raise_terminated

    signal.signal(signal.SIGTERM, raise_terminated)  # stopped by the parent: unwind as Ctrl-C
    t0 = time.perf_counter()
    curve = []
    with APPO("Swimmer-v5", seed=seed, device="cpu", verbose=0, **CONFIGS[name]) as model:
        for done in range(0, steps, 100_000):  # the last chunk may be shorter
            model.train(min(100_000, steps - done))
            curve.append(round(model.logger.ep_rew_mean, 1))
        wall = time.perf_counter() - t0
        greedy, _ = model.evaluate(EPISODES, seed=1000)  # resets seeded 1000, 1001, ...
    return dict(config=name, seed=seed, settings=repr(CONFIGS[name]), steps=steps,
                greedy=round(greedy, 2), curve_per_100k=curve, wall=round(wall, 1))


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default="sb3", help=f"comma-separated, of {', '.join(CONFIGS)}")
    p.add_argument("--seeds", default="0")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (one process each)")
    p.add_argument("--steps", type=int, default=STEPS, help="env steps a run (1M: the figures')")
    p.add_argument("--out", default=os.path.join(here, "results", "swimmer_recipe.jsonl"))
    p.add_argument("--one", nargs=2, metavar=("CONFIG", "SEED"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        from asyncrl.cli import Terminated
        try:
            print(json.dumps(run_one(args.one[0], int(args.one[1]), args.steps)), flush=True)
        except Terminated:  # its APPO has stopped its workers on the way out
            sys.exit(128 + signal.SIGTERM)
        return
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        p.error(f"--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2")
    todo = [(c, s) for c in names for s in seeds]
    running: list = []
    exit_on_sigterm()
    try:
        while todo or running:
            while todo and len(running) < max(1, args.jobs):  # one process a run
                c, s = todo.pop(0)
                cmd = [sys.executable, os.path.abspath(__file__), "--one", c, str(s), "--steps",
                       str(args.steps)]
                running.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
            proc = running[0]  # the oldest run: listed until it is done (finally stops it)
            out, _ = proc.communicate()
            running.pop(0)
            if proc.returncode:
                sys.exit(f"a run failed (exit {proc.returncode}): {' '.join(proc.args[-4:-2])}")
            line = out.strip().splitlines()[-1]
            print(line, flush=True)
            with open(args.out, "a") as f:
                f.write(line + "\n")
    finally:  # stopped or failed: the runs still going stop too (SIGTERM unwinds their APPO)
        for proc in running:
            proc.terminate()
        for proc in running:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
