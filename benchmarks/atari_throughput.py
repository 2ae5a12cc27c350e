"""Atari training throughput against the machine's ceiling and Sample Factory, in one run.

    python benchmarks/atari_throughput.py [--env ALE/Pong-v5] [--seconds 90] [--repeats 1]
        [--layouts 2x8,...] [--sweep] [--tiny] [--async] [--nice N] [--sf] [--json atari.json]
        [--png atari.png]

1. Ceiling: (a) raw simulation, random actions, DeepMind preprocessing, one process per core;
   (b) core-seconds per env step of env stepping, batched inference (a group's envs a call) and
   learning (all epochs, one torch thread, after one warm-up update), each measured alone; ideal
   FPS = cores / their sum.
2. asyncrl: steady training FPS with the Atari defaults (on a CPU synchronous; on two cores 1
   worker x 16 envs, on more 2 x 8), after a warm-up; with --layouts W x E layouts beside them
   (--sweep: 2x4, 2x8, 4x4 and 2x16); with --tiny also 2x32 asynchronous with the tiny
   model (cnn="tiny": every 8th pixel and 32 units, whose inference and learning cost next to
   nothing, so the run measures the engine's own overhead; learner_threads=1, the cores belong
   to sampling; groups of 16 envs), against the raw rate and the tiny model's own ideal (its
   costs measured with that configuration); with --async also 2x8
   asynchronous (algo="appo") where the defaults (on a CPU) train synchronously, and with
   --nice N also that with sampler_nice=N. Peak PSS of the process tree.
3. Sample Factory 2.1.1 (--sf; needs ../shared/bench/sample_factory/install.sh): its Atari preset
   through that folder's run.sh for the warm-up plus the same time, its steady rate after the
   warm-up read off its logged frame counter (as asyncrl's rows).
Frames = env steps x frame skip (4). Medians over --repeats. Within a repeat the costs are measured
just before the defaults row and the raw rate just before the tiny row (or the defaults row), and
asyncrl / ideal and tiny / raw are also given as the median of the ratios within each repeat: on
a shared machine the speed drifts between repeats by more than between adjacent measurements.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import time

import torch
from _common import raw_env_rate, steady_fps

from asyncrl import Config
from asyncrl.buffers import SharedControl
from asyncrl.config import available_cores, with_defaults
from asyncrl.envs import make_env
from asyncrl.learner import Batch, Learner, keep_freed_memory, make_optimizer
from asyncrl.models import ActorCritic

FRAME_SKIP = 4
SF_LAYOUT = dict(num_workers=2, num_envs_per_worker=8)  # Sample Factory's Atari preset's
SF_RUN = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "bench", "sample_factory", "run.sh")


def per_step_costs(env_id: str, cfg: Config) -> dict:
    """Core-seconds per env step of each stage, each measured alone on one thread, as this
    process's CPU time: wall time also counted whatever else ran meanwhile (the env cost read
    just after Sample Factory's processes were killed came out 0.69-0.75 ms against 0.46)."""
    torch.set_num_threads(1)
    env = make_env(env_id)
    env.reset(seed=0)
    n, t0 = 1000, time.process_time()
    for _ in range(n):
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        if term or trunc:
            env.reset()
    env_cost = (time.process_time() - t0) / n
    model = ActorCritic.from_spaces(env.observation_space, env.action_space, cfg)
    batch_obs = cfg.envs_per_group  # a policy worker's batch: at least one group's envs
    obs = {"obs": torch.randint(0, 256, (batch_obs, *env.observation_space.shape), dtype=torch.uint8)}
    with torch.inference_mode():
        forward = model.fused_forward()
        model.dist.sample(forward(obs)[0], None)
        t0 = time.process_time()
        for _ in range(100):
            model.dist.sample(forward(obs)[0], None)
    inference_cost = (time.process_time() - t0) / (100 * batch_obs)
    T, B = cfg.rollout, cfg.batch_size // cfg.rollout
    no_queues = type("Queues", (), {"full_slot": None, "free_slot": None, "report": None,
                                    "ring_all": lambda: None})
    ctl = SharedControl()
    learner = Learner(cfg, None, "cpu", buffers=None, weights=None, optimizer_state=None,
                      hparams=None, ctl=ctl, queues=no_queues, optimizer_path="/nonexistent",
                      serial=True)
    learner.model = model
    learner.version = 0
    learner.optimizer = make_optimizer(model, cfg)  # the learner's own (fused Adam)
    batch = Batch({"obs": torch.randint(0, 256, (T + 1, B, *env.observation_space.shape), dtype=torch.uint8)},
                  torch.randint(0, env.action_space.n, (T, B, 1)), torch.full((T, B), -1.8),
                  torch.zeros(T, B), torch.zeros(T, B, dtype=torch.bool),
                  torch.zeros(T, B, dtype=torch.bool), torch.zeros(T, B, dtype=torch.int64),
                  # synchronous PPO: every sample is the current weights', their values recorded
                  torch.zeros(T, B) if cfg.algo == "ppo" else None)
    keep_freed_memory()  # as the learner's process does
    learner.train_on(batch)  # warm-up: oneDNN builds its kernels, buffers are allocated
    t0 = time.process_time()
    learner.train_on(batch)
    learn_cost = (time.process_time() - t0) / cfg.batch_size
    env.close()
    return {"env": env_cost, "inference": inference_cost, "learning": learn_cost}


def sample_factory_fps(seconds: float, warmup: float, extra: tuple = ()) -> float:
    """Frames per second of SF's Atari preset in steady state, as asyncrl's rows are measured:
    SF runs for warmup + seconds, and the rate is taken from its logged frame counter after the
    warm-up. SF trains synchronously and counts frames a whole batch (8,192) at a time, so the
    window runs from the first reading after the warm-up at which the counter had just moved to
    the last such reading (its log has one every 5 s). Its own "60 sec" figure over a 60 s run
    would include its ~30 s start-up (here 430 against 655-690 frames/s in steady state)."""
    shm_before = set(os.listdir("/dev/shm"))
    out = subprocess.run(["bash", SF_RUN, str(int(warmup + seconds)), "pong", *extra],
                         capture_output=True, text=True).stdout
    # run.sh SIGKILLs SF's process group, so its multiprocessing semaphores are never unlinked
    for name in set(os.listdir("/dev/shm")) - shm_before:
        if name.startswith("sem.mp-"):
            os.remove(os.path.join("/dev/shm", name))
    log_dir = re.search(r"full log: (\S+)/log", out)
    if not log_dir:
        return float("nan")
    with open(os.path.join(log_dir.group(1), "log"), errors="replace") as f:
        log = f.read()
    shutil.rmtree(log_dir.group(1), ignore_errors=True)
    stamp = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]"
    to_s = lambda t: datetime.datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # noqa: E731
    start = re.search(stamp, log)
    readings = [(to_s(t), int(n)) for t, n in
                re.findall(stamp + r".*?Fps is .*?Total num frames: (\d+)", log)]
    if not start or not readings:
        return float("nan")
    after = to_s(start.group(1)) + warmup
    moved = [(t, n) for (t, n), (_, prev) in zip(readings[1:], readings) if n != prev and t >= after]
    if len(moved) < 2:
        return float("nan")
    (t0, n0), (t1, n1) = moved[0], moved[-1]
    return (n1 - n0) / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--seconds", type=float, default=90.0, help="per asyncrl or SF measurement")
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--layouts", default="", help="also these workers x envs layouts (2x8,...)")
    ap.add_argument("--sweep", action="store_true", help="also 2x4, 2x8, 4x4 and 2x16 layouts")
    ap.add_argument("--tiny", action="store_true", help="also 2x32 asynchronous with cnn='tiny'")
    ap.add_argument("--async", dest="asynchronous", action="store_true",
                    help="also 2x8 with algo='appo' (asynchronous), if the defaults are not")
    ap.add_argument("--nice", type=int, default=None,
                    help="also 2x8 asynchronous with sampler_nice=N")
    ap.add_argument("--sf", action="store_true", help="run Sample Factory beside (needs its venv)")
    ap.add_argument("--rnn", action="store_true",
                    help="also the defaults with a GRU core of 512 (Sample Factory's rnn_size), and "
                    "with --sf Sample Factory's preset with --use_rnn=True --recurrence=128")
    ap.add_argument("--json", default="atari_throughput.json")
    ap.add_argument("--png", default="atari_throughput.png")
    args = ap.parse_args()
    cores = available_cores()
    cfg = Config.from_kwargs(with_defaults({}, family="atari", cpu_only=True))
    defaults_name = f"{cfg.num_workers}x{cfg.num_envs_per_worker}, Atari defaults (algo={cfg.algo})"
    variants = {defaults_name: {}}  # name: APPO keywords over the Atari defaults
    layouts = [x for x in args.layouts.split(",") if x]
    layouts += ["2x4", "2x8", "4x4", "2x16"] if args.sweep else []
    for layout in dict.fromkeys(layouts):
        w, _, e = layout.partition("x")
        if not (w.isdigit() and e.isdigit()):
            ap.error(f"--layouts: {layout!r} is not WORKERSxENVS, e.g. 2x8")
        if (int(w), int(e)) != (cfg.num_workers, cfg.num_envs_per_worker):
            variants[layout] = dict(num_workers=int(w), num_envs_per_worker=int(e))
    # The tiny model: the rollout workers are the bottleneck, so the cores go to sampling (one
    # learner thread) and 16 envs a group spread each message's cost over more steps.
    tiny_kwargs = dict(cnn="tiny", algo="appo", learner_threads=1, num_workers=2,
                       num_envs_per_worker=32)
    tiny_cfg = Config.from_kwargs(with_defaults(tiny_kwargs, family="atari", cpu_only=True))
    tiny_name = "2x32 tiny model, asynchronous, learner_threads=1"
    if args.tiny:
        variants[tiny_name] = tiny_kwargs
    if args.asynchronous and cfg.algo != "appo":
        variants["2x8 asynchronous (algo=appo)"] = dict(algo="appo", **SF_LAYOUT)
    rnn_name = f"{defaults_name} + GRU 512 (use_rnn=True)"
    if args.rnn:
        variants[rnn_name] = dict(use_rnn=True, rnn_size=512)
    if args.nice is not None:
        variants[f"2x8 asynchronous, sampler_nice={args.nice}"] = dict(
            algo="appo", sampler_nice=args.nice, **SF_LAYOUT)
    res = {"raw": [], "costs": [], "costs_tiny": [], "asyncrl": {k: [] for k in variants}, "sf": [],
           "sf_rnn": []}
    # Each ratio is taken within a repeat, its two figures measured next to each other (the
    # costs just before the defaults row, the raw rate just before the tiny row): a shared
    # machine's speed drifts by 10-20% over minutes, more than between adjacent measurements.
    order = [defaults_name, *([tiny_name] if args.tiny else []),
             *(k for k in variants if k not in (defaults_name, tiny_name))]
    raw_before = tiny_name if args.tiny else defaults_name
    for r in range(args.repeats):
        res["costs"].append(per_step_costs(args.env, cfg))
        for k in order:
            if k == tiny_name:
                res["costs_tiny"].append(per_step_costs(args.env, tiny_cfg))
            if k == raw_before:
                res["raw"].append(raw_env_rate(args.env, processes=cores, seconds=10.0))
            res["asyncrl"][k].append(steady_fps(args.env, warmup=args.warmup, seconds=args.seconds,
                                                device="cpu", seed=r, **variants[k]))
        if args.sf:
            res["sf"].append(sample_factory_fps(args.seconds, args.warmup))
        if args.sf and args.rnn:
            # SF's Atari preset trains with recurrence=1, which it refuses with an RNN: BPTT over
            # its whole rollout (128), as it recommends
            res["sf_rnn"].append(sample_factory_fps(args.seconds, args.warmup,
                                                    ("--use_rnn=True", "--recurrence=128")))
        print(f"repeat {r}: {json.dumps({k: v[-1] if isinstance(v, list) else {kk: vv[-1]['fps'] for kk, vv in v.items()} for k, v in res.items() if v}, default=str)}", flush=True)

    med = statistics.median
    ideal_of = lambda c: cores / sum(c.values())  # noqa: E731
    raw = med(res["raw"])
    costs = {k: med(c[k] for c in res["costs"]) for k in res["costs"][0]}
    ideal = ideal_of(costs)
    fps = {k: med(x["fps"] for x in v) for k, v in res["asyncrl"].items()}
    main_fps = fps[defaults_name]
    per_repeat = {"asyncrl/ideal": [x["fps"] / ideal_of(c) for x, c in
                                    zip(res["asyncrl"][defaults_name], res["costs"])]}
    if args.tiny:
        per_repeat["tiny/raw"] = [x["fps"] / w for x, w in zip(res["asyncrl"][tiny_name], res["raw"])]
    rows = [("raw simulation, random actions, %d processes" % cores, raw),
            ("ideal training (cores / per-step costs)", ideal)]
    rows += [(f"asyncrl {k} (workers x envs)", v) for k, v in fps.items()]
    sf = med(res["sf"]) / FRAME_SKIP if res["sf"] else None
    if sf:
        rows.append(("Sample Factory 2.1.1, Atari preset, 2x8", sf))
    sf_rnn = med(res["sf_rnn"]) / FRAME_SKIP if res["sf_rnn"] else None
    if sf_rnn:
        rows.append(("Sample Factory 2.1.1, Atari preset + GRU 512 (--use_rnn=True), 2x8", sf_rnn))
    if args.rnn:
        per_repeat["GRU/none"] = [x["fps"] / y["fps"] for x, y in
                                  zip(res["asyncrl"][rnn_name], res["asyncrl"][defaults_name])]
        if res["sf_rnn"]:
            per_repeat["asyncrl GRU/SF GRU"] = [x["fps"] * FRAME_SKIP / y for x, y in
                                                zip(res["asyncrl"][rnn_name], res["sf_rnn"])]
    print(f"\n| {args.env} | env steps/s | frames/s (x{FRAME_SKIP}) |\n|---|---|---|")
    for name, v in rows:
        print(f"| {name} | {v:,.0f} | {v * FRAME_SKIP:,.0f} |")
    print("\nper-step costs, core-ms: " + ", ".join(f"{k} {v * 1e3:.2f}" for k, v in costs.items()))
    if args.tiny:
        costs_tiny = {k: med(c[k] for c in res["costs_tiny"]) for k in res["costs_tiny"][0]}
        ideal_tiny = ideal_of(costs_tiny)
        print("tiny model per-step costs, core-ms: "
              + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in costs_tiny.items())
              + f"; its ideal {ideal_tiny:,.0f} env steps/s")
    peak = med(x["peak_pss_gib"] for x in res["asyncrl"][defaults_name])
    sf_layout = fps.get("2x8")  # Sample Factory's workers x envs, where the defaults differ
    print(f"asyncrl / ideal {main_fps / ideal:.2f}; asyncrl / raw {main_fps / raw:.3f}"
          + (f"; asyncrl / Sample Factory {main_fps / sf:.2f}" if sf else "; Sample Factory: not run (--sf)")
          + (f" (asyncrl 2x8, its layout: {sf_layout / sf:.2f})" if sf and sf_layout else "")
          + f"; asyncrl peak PSS {peak:.2f} GiB"
          + (f"; tiny model / raw {fps[tiny_name] / raw:.2f}, / its ideal {fps[tiny_name] / ideal_tiny:.2f}"
             if args.tiny else ""))
    print("ratios within each repeat (adjacent measurements), median [all]: " + "; ".join(
        f"{k} {med(v):.2f} [{', '.join(f'{x:.2f}' for x in v)}]" for k, v in per_repeat.items()))
    with open(args.json, "w") as f:
        json.dump({"cores": cores, "ideal": ideal, "costs": costs, "ratios_per_repeat": per_repeat,
                   **({"ideal_tiny": ideal_tiny} if args.tiny else {}), **res}, f, indent=1, default=str)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no PNG")
        return
    names, values = zip(*rows)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1))
    ax.barh(names, [v * FRAME_SKIP for v in values])
    ax.set_xscale("log")
    ax.set_xlabel("frames per second (log scale)")
    ax.set_title(f"{args.env} on {cores} cores")
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"wrote {args.json} and {args.png}")


if __name__ == "__main__":
    main()
