"""Training throughput of any env against the machine's ceiling and Sample Factory, in one run.

    asyncrl benchmark throughput --env ID|module:factory [--seconds 60] [--warmup 30] [--repeats 3]
        [--variant "field=value,..."]... [--sf] [--sf_flags "--flag=value ..."] [--json F] [--png F]
        [--env_kwargs "{...}"] [any Config field as --field value]

Envs are stepped with random actions (``action_space.sample()``, masks ignored: an env that
raises on a masked action cannot be measured yet). The env is a registered Gymnasium id (Atari and Vizdoom ids with their preprocessing; Gymnasium's
``module:EnvId`` form imports the module first) or ``module:function``, a zero-argument factory
of the user's (multi-agent envs once they land). The Config flags go over the env family's
defaults (what ``APPO(env, **flags)`` would train with); each ``--variant`` is one more asyncrl row,
those fields over the same flags (e.g. ``use_rnn=True,rnn_size=512`` or
``num_workers=2,num_envs_per_worker=8``). In each repeat, for each row:

1. where the time goes: the core-seconds per env step of stepping one env (random actions),
   of inference (one batch of a group's envs, as a policy worker runs it) and of learning (one
   update on a batch of real observations, after a warm-up update), each measured alone on one
   thread as this process's CPU time; the ideal rate they imply, cores / their sum;
2. asyncrl's steady training rate after ``--warmup`` seconds, and the CPU each of its processes
   used per second of it, and the tree's peak memory (PSS);
and once per repeat the raw simulation rate (random actions, one env per core, no learning) and,
with ``--sf``, Sample Factory 2.1.1's own example for this env run through
``../shared/bench/sample_factory/run.sh`` (cartpole, pong, halfcheetah, doom) for the warm-up plus
the same time, its steady rate read off its logged frame counter after the warm-up. A run too
short to read a steady rate (SF logs every 5 s and needs ~30 s to start) is an error that says
what to raise. Medians over repeats; ratios are taken within each repeat (adjacent
measurements: a shared machine's speed drifts between repeats by more than within one) and
given as medians. Prints a table, writes JSON and a PNG.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _common import (end_sf_session, exit_on_sigterm, merged, parse_variant, pyplot,
                     raw_env_rate, steady_fps)

from asyncrl import APPO
from asyncrl.buffers import SharedControl, buffer_spec
from asyncrl.flags import add_config_flags, config_flags, parse_value
from asyncrl.config import ConfigError, available_cores
from asyncrl.envs import env_family
from asyncrl.fileio import PolicyFiles
from asyncrl.learner import Learner, keep_freed_memory, make_batch, make_optimizer
from asyncrl.spaces import MASK_KEY, OBS_PREFIX, ObsWriter

SF_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench",
                      "sample_factory", "run.sh")
# run.sh's examples: env id -> (its name there, frames per env step in its frame counter)
SF_EXAMPLES = {"CartPole-v1": ("cartpole", 1), "ALE/Pong-v5": ("pong", 4),
               "PongNoFrameskip-v4": ("pong", 4), "HalfCheetah-v5": ("halfcheetah", 1),
               "VizdoomHealthGatheringSupreme-v1": ("doom", 4)}
COST_STEPS = 1000  # env steps timed for the env's cost (at least; a learner batch may need more)


class BenchmarkError(Exception):
    """A setting that cannot give a figure; the message says what to change."""


def resolve_env(text: str):
    """``module:function`` -> that function (a factory); anything else -> the text (an id)."""
    module, _, name = text.rpartition(":")
    if module:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise BenchmarkError(f"--env {text}: cannot import {module!r} ({e})") from e
        if callable(getattr(mod, name, None)):
            return getattr(mod, name)
    return text


def frame_skip(env, env_kwargs: dict) -> int:
    """Frames per env step: Atari's and Doom's preprocessing repeat each action 4 frames."""
    return int(env_kwargs.get("frame_skip", 4)) if env_family(env) else 1


def stage_costs(env, env_kwargs: dict, flags: dict) -> dict:
    """Core-seconds per env step of each stage, each alone on one thread, as this process's CPU
    time (wall time would also count whatever else runs meanwhile). The learner's batch holds
    real observations: its columns are consecutive steps of one env, as trajectories are."""
    torch.set_num_threads(1)
    with APPO(env, env_kwargs=env_kwargs, **{**flags, "verbose": 0, "device": "cpu"}) as model:
        cfg, spec, policy = model.config, model.policy_spec.env, model.policy
        T, B = cfg.rollout, cfg.batch_size // cfg.rollout
        entries = buffer_spec(spec, policy.dist, policy.state_size)
        rows = {name: torch.zeros((T + 1 if e.observed else T, B, *e.shape), dtype=e.dtype)
                for name, e in entries.items()}
        if MASK_KEY in rows:
            rows[MASK_KEY].fill_(True)
        write, views = ObsWriter(spec), {name: x.numpy() for name, x in rows.items()}
        env_obj = model.env_factory()
        obs, _ = env_obj.reset(seed=0)
        steps, t0 = max(COST_STEPS, (T + 1) * B), time.process_time()
        for i in range(steps):
            t, b = i % (T + 1), i // (T + 1)
            if b < B:
                write({n: v[t] for n, v in views.items() if n.startswith(OBS_PREFIX)}, b, obs)
            obs, reward, terminated, truncated, _ = env_obj.step(env_obj.action_space.sample())
            if b < B and t < T:
                rows["rewards"][t, b] = float(reward)
                rows["dones"][t, b] = terminated or truncated
                rows["truncated"][t, b] = truncated and not terminated
            if terminated or truncated:
                obs, _ = env_obj.reset()
        env_cost = (time.process_time() - t0) / steps
        env_obj.close()
        batch = make_batch(rows)
        n = cfg.envs_per_group  # a policy worker's batch: at least one group's envs
        group = {k: v[0, :n] for k, v in batch.obs.items()}
        mask = None if batch.action_mask is None else batch.action_mask[0, :n]
        state = None if batch.rnn_state is None else batch.rnn_state[0, :n]
        with torch.inference_mode():
            forward = policy.fused_forward()
            infer = ((lambda: policy.dist.sample(forward(group)[0], mask)) if state is None else
                     (lambda: policy.dist.sample(forward(group, state=state)[0], mask)))
            infer()
            t0 = time.process_time()
            for _ in range(100):
                infer()
            inference_cost = (time.process_time() - t0) / (100 * n)
            # the actions and log-probabilities of the behaviour policy, as a policy worker's
            flat = {k: v[:T].flatten(0, 1) for k, v in batch.obs.items()}
            out = policy(flat, state=batch.rnn_state[0], starts=batch.episode_starts()[:T]) \
                if policy.state_size else policy(flat)
            fmask = None if batch.action_mask is None else batch.action_mask[:T].flatten(0, 1)
            actions, log_probs = policy.dist.sample(out[0], fmask)
            batch.actions.copy_(actions.view(T, B, -1))
            batch.log_probs.copy_(log_probs.view(T, B))
            batch.values.copy_(out[1].view(T, B))
        no_queues = type("Queues", (), {"full_slot": None, "free_slot": None, "report": None,
                                        "ring_all": lambda: None})
        learner = Learner(cfg, None, "cpu", buffers=None, weights=None, optimizer_state=None,
                          shared_hparams=None, ctl=SharedControl(), queues=no_queues,
                          files=PolicyFiles("/nonexistent"), serial=True)
        # Synchronous PPO trains on the current weights' samples (its fast path); asynchronous
        # algorithms on older ones (their log-probabilities and values recomputed; -1, the
        # sentinel of unwritten steps, would mask them all out).
        learner.model, learner.version = policy, 0 if cfg.algo == "ppo" else 1
        learner.optimizer = make_optimizer(policy, cfg)
        keep_freed_memory()  # as the learner's process does
        stats = learner.train_on(batch)  # warm-up: oneDNN builds its kernels, buffers allocated
        if not stats or stats["masked_fraction"] > 0:  # a cost of skipped samples means nothing
            raise BenchmarkError(f"the learner's cost batch was not trained on whole ({stats})")
        t0 = time.process_time()
        learner.train_on(batch)
        learn_cost = (time.process_time() - t0) / cfg.batch_size
    return {"env": env_cost, "inference": inference_cost, "learning": learn_cost}


def sample_factory_fps(example: str, seconds: float, warmup: float, flags: tuple) -> float:
    """Frames per second of SF's ``example`` in steady state, as asyncrl's rows are measured: SF
    runs for warmup + seconds, and the rate is read off its log after the warm-up."""
    if not os.path.exists(SF_RUN):
        raise BenchmarkError(f"--sf: {SF_RUN} not found (the shared bench folder beside the checkout)")
    shm_before = set(os.listdir("/dev/shm"))
    scratch = tempfile.mkdtemp(prefix="sf-run-")  # run.sh's own mktemp folder goes inside
    proc = subprocess.Popen(["bash", SF_RUN, str(int(warmup + seconds)), example, *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True, env={**os.environ, "TMPDIR": scratch})
    try:
        out = proc.communicate()[0]
        log_dir = re.search(r"full log: (\S+)/log", out)
        if not log_dir:
            raise BenchmarkError(f"Sample Factory's run.sh printed no log ({out[-300:]!r}): run "
                                 f"'bash {SF_RUN} 60 {example}' alone to see why")
        with open(os.path.join(log_dir.group(1), "log"), errors="replace") as f:
            log = f.read()
    finally:  # also when stopped early (Ctrl-C, SIGTERM): run.sh and SF's own process group go
        # (run.sh SIGKILLs SF's process group, so its multiprocessing semaphores are never unlinked)
        end_sf_session(proc.pid, shm_before)
        shutil.rmtree(scratch, ignore_errors=True)
    return steady_rate_from_log(log, seconds, warmup)


def steady_rate_from_log(log: str, seconds: float, warmup: float) -> float:
    """Frames per second in a Sample Factory log after ``warmup`` seconds from its first line.
    SF counts frames a whole batch at a time (a synchronous one: 8,192 Pong frames), so the
    window runs from the first reading after the warm-up at which the counter had just moved to
    the last such reading (its log has one every 5 s)."""
    stamp = r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\]"
    to_s = lambda t: datetime.datetime.strptime(t, "%Y-%m-%d %H:%M:%S,%f").timestamp()  # noqa: E731
    start = re.search(stamp, log)
    readings = [(to_s(t), int(n)) for t, n in
                re.findall(stamp + r".*?Fps is .*?Total num frames: (\d+)", log)]
    after = (to_s(start.group(1)) if start else 0) + warmup
    moved = [(t, n) for (t, n), (_, prev) in zip(readings[1:], readings) if n != prev and t >= after]
    if len(moved) < 2:
        errors = re.findall(r".*(?:Error|Exception).*", log)
        raise BenchmarkError(
            f"Sample Factory's frame counter moved {len(moved)} time(s) in the {seconds:.0f} s "
            f"after the {warmup:.0f} s warm-up ({len(readings)} readings in all), too few to read "
            "a steady rate: it logs every 5 s and, training synchronously, counts a whole batch "
            f"at a time. Raise --seconds (now {seconds:.0f}; 60 is enough for run.sh's examples "
            "here), and keep --warmup at 30 or more (it needs ~30 s to start)."
            + (f" Its log said: {errors[-1].strip()}" if errors else ""))
    (t0, n0), (t1, n1) = moved[0], moved[-1]
    return (n1 - n0) / (t1 - t0)


def asyncrl_fps(env, env_kwargs: dict, flags: dict, warmup: float, seconds: float, seed: int) -> dict:
    run = steady_fps(env, warmup=warmup, seconds=warmup + seconds,
                     **{"seed": seed, **flags, "env_kwargs": env_kwargs})
    if not run["fps"] == run["fps"]:  # NaN: fewer than three readings after the warm-up
        raise BenchmarkError(f"asyncrl trained too briefly after the {warmup:.0f} s warm-up to read "
                             f"a steady rate: raise --seconds (now {seconds:.0f})")
    return run


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--env", default="CartPole-v1", help="a Gymnasium id or module:factory")
    ap.add_argument("--env_kwargs", type=parse_value, default={}, help="keywords of the env id")
    ap.add_argument("--seconds", type=float, default=60.0, help="measured time, after the warm-up")
    ap.add_argument("--warmup", type=float, default=30.0, help="start-up and warm-up, not measured")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[],
                    help='one more asyncrl row: "field=value,..." over the other flags (repeatable)')
    ap.add_argument("--sf", action="store_true", help="run Sample Factory's example beside (needs "
                    "../shared/bench/sample_factory/install.sh)")
    ap.add_argument("--sf_flags", default="", help='extra Sample Factory flags, e.g. "--use_rnn=True"')
    ap.add_argument("--json", default="throughput.json")
    ap.add_argument("--png", default="throughput.png")
    add_config_flags(ap)
    args = ap.parse_args(argv)
    exit_on_sigterm()
    flags = config_flags(vars(args))
    env = resolve_env(args.env)
    if args.sf and args.env not in SF_EXAMPLES:
        raise BenchmarkError(f"--sf: run.sh has no Sample Factory example for {args.env!r}; it has "
                             + ", ".join(f"{k} ({v[0]})" for k, v in SF_EXAMPLES.items()))
    if args.seconds < 10 or args.warmup < 5:
        raise BenchmarkError("--seconds under 10 or --warmup under 5 cannot give a steady rate")
    rows = {"asyncrl": flags}
    for text in args.variant:
        try:
            rows[f"asyncrl {text}"] = merged(flags, parse_variant(text))
        except ValueError as e:
            raise BenchmarkError(str(e)) from None
    # Each row's settings as APPO resolves them (family defaults, validation) before anything runs
    configs = {}
    for name, row_flags in rows.items():
        with APPO(env, env_kwargs=args.env_kwargs, **{**row_flags, "verbose": 0}) as probe:
            configs[name] = probe.config
    cores, skip = available_cores(), frame_skip(env, args.env_kwargs)
    res = {"raw": [], "sf": [], "costs": {k: [] for k in rows}, "runs": {k: [] for k in rows}}
    for r in range(args.repeats):
        res["raw"].append(raw_env_rate(env, processes=cores, seconds=10.0, env_kwargs=args.env_kwargs))
        for name, row_flags in rows.items():
            res["costs"][name].append(stage_costs(env, args.env_kwargs, row_flags))
            res["runs"][name].append(asyncrl_fps(env, args.env_kwargs, row_flags, args.warmup,
                                                 args.seconds, seed=r))
        if args.sf:
            example, sf_skip = SF_EXAMPLES[args.env]
            res["sf"].append(sample_factory_fps(example, args.seconds, args.warmup,
                                                tuple(args.sf_flags.split())) / sf_skip)
        print(f"repeat {r}: raw {res['raw'][-1]:,.0f}, " + ", ".join(
            f"{k} {v[-1]['fps']:,.0f}" for k, v in res["runs"].items())
            + (f", Sample Factory {res['sf'][-1]:,.0f}" if res["sf"] else "") + " env steps/s",
            flush=True)
    report(args, env, cores, skip, rows, configs, res)


def report(args, env, cores: int, skip: int, rows: dict, configs: dict, res: dict) -> None:
    med = statistics.median
    ideal_of = lambda c: cores / sum(c.values())  # noqa: E731
    table = [(f"raw simulation, random actions, {cores} processes", med(res["raw"]))]
    ratios, stages = {}, {}
    for name in rows:
        costs, runs = res["costs"][name], res["runs"][name]
        stages[name] = {k: med(c[k] for c in costs) for k in costs[0]}
        table.append((f"{name}: ideal (cores / per-step costs)", med(ideal_of(c) for c in costs)))
        table.append((f"{name}: measured", med(x["fps"] for x in runs)))
        ratios[f"{name} / ideal"] = [x["fps"] / ideal_of(c) for x, c in zip(runs, costs)]
        ratios[f"{name} / raw"] = [x["fps"] / w for x, w in zip(runs, res["raw"])]
        if res["sf"]:
            ratios[f"{name} / Sample Factory"] = [x["fps"] / s for x, s in zip(runs, res["sf"])]
    if res["sf"]:
        table.append((f"Sample Factory 2.1.1, its {SF_EXAMPLES[args.env][0]} example"
                      + (f" {args.sf_flags}" if args.sf_flags else ""), med(res["sf"])))
    print(f"\n| {args.env}, {cores} cores | env steps/s | frames/s (x{skip}) |\n|---|---|---|")
    for name, v in table:
        print(f"| {name} | {v:,.0f} | {v * skip:,.0f} |")
    print("\nwhere the time goes (core-ms per env step, each stage alone; then the CPU each process "
          "used per second of training, median over repeats):")
    for name in rows:
        c = stages[name]
        total = sum(c.values())
        cpu = {}
        for run in res["runs"][name]:
            for proc, v in run["cpu_per_process"].items():
                cpu.setdefault(proc, []).append(v)
        cfg = configs[name]
        print(f"- {name} ({cfg.num_workers} x {cfg.num_envs_per_worker} envs, algo={cfg.algo}"
              f"{', ' + cfg.rnn_type.upper() + ' ' + str(cfg.rnn_size) if cfg.use_rnn else ''}): "
              + ", ".join(f"{k} {v * 1e3:.3f} ({v / total:.0%})" for k, v in c.items())
              + "; processes: " + ", ".join(f"{p} {med(v):.2f}" for p, v in sorted(cpu.items()))
              + f"; peak PSS {med(x['peak_pss_gib'] for x in res['runs'][name]):.2f} GiB")
    print("ratios within each repeat, median [all]: " + "; ".join(
        f"{k} {med(v):.2f} [{', '.join(f'{x:.2f}' for x in v)}]" for k, v in ratios.items()))
    with open(args.json, "w") as f:
        json.dump({"env": args.env, "env_kwargs": args.env_kwargs, "cores": cores, "frame_skip": skip,
                   "argv": sys.argv[1:], "rows": rows, "table": table, "stage_costs": stages,
                   "ratios_per_repeat": ratios, **res}, f, indent=1, default=str)
    plt = pyplot()
    if plt is None:
        print(f"wrote {args.json}")
        return
    names, values = zip(*table)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(table) + 1.2))
    ax.barh(names, [v * skip for v in values])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("frames per second (log scale)")
    ax.set_title(f"{args.env} on {cores} cores")
    fig.tight_layout()
    fig.savefig(args.png)
    print(f"wrote {args.json} and {args.png}")


if __name__ == "__main__":
    try:
        main()
    except (BenchmarkError, ConfigError) as e:
        sys.exit(f"error: {e}")
