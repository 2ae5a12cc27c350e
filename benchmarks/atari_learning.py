"""Pong learning curve: mean episode return against frames, to check +18 within 10M frames.

    python benchmarks/atari_learning.py [--env ALE/Pong-v5] [--frames 10000000] [--device auto]
        [--out pong_learning] [--checkpoint_every 600] [--resume]
        [any Config field as --field value]
    python benchmarks/atari_learning.py --plot RUN.csv [RUN.csv ...] --out FIGURE [--env E]

Writes OUT.csv (seconds, frames, env steps, mean return of the last 100 games, the last update's
mean policy lag) every 30 s, the final model to OUT.pt with its greedy return over --eval_episodes
games, and, with matplotlib (pip install -e ".[bench]"), OUT.png (--plot: several runs' curves in
one figure, no training). Frames = env steps x 4. Stops once the mean reaches --target. The learning
rate stays constant by default (--anneal_lr: linearly to 0 over --frames). A run longer than a
sitting: SIGTERM (or Ctrl-C) stops it with a checkpoint (OUT.ckpt.pt, the model; OUT.ckpt.json, the
curve so far and the last games' returns; also written every --checkpoint_every seconds), and the
same command with --resume goes on from it (the curve's seconds count the time before; the games in
progress at the stop are lost, the envs start new ones). On a 2-core CPU (where the Atari defaults
train synchronously) one run of the defaults reached +18 at 6.7M frames in 41 minutes (~680 env
steps/s), a second +17.2 at 10M frames in 51 (~815 env steps/s; +17 at 6.2M); annealed, +17.1 at 10M
frames in 64.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import time

from asyncrl import APPO
from asyncrl.cli import Terminated, raise_terminated  # SIGTERM unwinds train() as Ctrl-C does
from asyncrl.flags import parse_value
from asyncrl.config import ATARI_DEFAULTS
from _common import pyplot  # benchmarks/, the script's own folder

FRAME_SKIP = 4


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="ALE/Pong-v5")
    ap.add_argument("--frames", type=int, default=10_000_000)
    ap.add_argument("--target", type=float, default=18.0, help="stop once the mean return reaches it")
    ap.add_argument("--out", default="pong_learning")
    ap.add_argument("--eval_episodes", type=int, default=10, help="greedy games at the end")
    ap.add_argument("--anneal_lr", action="store_true",
                    help="anneal the learning rate linearly to 0 over --frames (CleanRL's "
                         "ppo_atari anneals over 40M frames; over 10M it decays too early: on "
                         "Pong here +17.1 at 10M frames against +18 at 6.7M constant)")
    ap.add_argument("--checkpoint_every", type=float, default=600.0,
                    help="seconds between checkpoints (OUT.ckpt.pt and OUT.ckpt.json)")
    ap.add_argument("--resume", action="store_true",
                    help="go on from OUT.ckpt.pt and OUT.ckpt.json (written every "
                         "--checkpoint_every seconds and on SIGTERM or Ctrl-C)")
    ap.add_argument("--plot", nargs="+", metavar="CSV",
                    help="no training: draw these runs' curves (OUT.csv files) together into "
                         "--out's PNG, e.g. the seeds of one setting")
    args, extra = ap.parse_known_args()
    if args.plot:
        if extra:
            ap.error(f"--plot draws stored curves; it takes no Config fields ({' '.join(extra)})")
        if missing := [path for path in args.plot if not os.path.isfile(path)]:
            ap.error(f"--plot: no such curve {', '.join(missing)} (a run's OUT.csv)")
        if pyplot() is None:
            ap.error("--plot needs matplotlib")
        plot({path: read_rows(path) for path in args.plot}, args.target, args.env,
             args.out + ".png")
        print(f"wrote {args.out}.png")
        return
    overrides = {k.lstrip("-"): parse_value(v) for k, v in zip(extra[::2], extra[1::2])}
    overrides.setdefault("device", "auto")
    if args.anneal_lr:
        lr = overrides.get("learning_rate", ATARI_DEFAULTS["learning_rate"])
        overrides["learning_rate"] = lambda progress_remaining: lr * max(progress_remaining, 1e-3)
    ckpt, state_path = args.out + ".ckpt.pt", args.out + ".ckpt.json"
    if args.resume:
        if args.anneal_lr:
            ap.error("--resume with --anneal_lr: the schedule's progress would restart at the "
                     "resumed call; resume a constant learning rate only")
        if not (os.path.exists(ckpt) and os.path.exists(state_path)):
            ap.error(f"--resume: no checkpoint {ckpt} and {state_path}; run without --resume "
                     "(or with the --out of the run to resume)")
        with open(state_path) as f:
            saved = json.load(f)
        model = APPO.load(ckpt, device=overrides.pop("device"), **overrides)
        model.logger.ep_returns.extend(saved["ep_returns"])
        rows, t0 = [tuple(r) for r in saved["rows"]], time.perf_counter() - saved["seconds"]
        print(f"resumed {ckpt} at {model.num_timesteps * FRAME_SKIP:,} frames, "
              f"{saved['seconds']:.0f} s", flush=True)
    else:
        model = APPO(args.env, **overrides)
        rows, t0 = [], time.perf_counter()
    last_checkpoint = [time.perf_counter()]

    def checkpoint(model: APPO):
        model.save(ckpt)
        with open(state_path + ".tmp", "w") as f:
            json.dump({"seconds": round(time.perf_counter() - t0, 1), "rows": rows,
                       "ep_returns": list(model.logger.ep_returns)}, f)
        os.replace(state_path + ".tmp", state_path)
        last_checkpoint[0] = time.perf_counter()

    def record(model: APPO):
        ret = model.logger.ep_rew_mean
        lag = model.logger.last_train.get("policy_lag_mean", float("nan"))
        rows.append((round(time.perf_counter() - t0, 1), model.num_timesteps * FRAME_SKIP,
                     model.num_timesteps, ret, round(lag, 2)))
        print(f"{rows[-1][0]:>8.0f} s  {rows[-1][1]:>12,} frames  mean return {ret:.2f}", flush=True)
        with open(args.out + ".csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["seconds", "frames", "env_steps", "ep_rew_mean", "policy_lag_mean"])
            w.writerows(rows)
        if time.perf_counter() - last_checkpoint[0] >= args.checkpoint_every:
            checkpoint(model)
        return False if ret == ret and ret >= args.target else None

    with model:
        cfg = model.config
        print(f"{cfg.num_workers} workers x {cfg.num_envs_per_worker} envs, {cfg.algo}, batch "
              f"{cfg.batch_size}, device {cfg.device}", flush=True)
        previous = signal.signal(signal.SIGTERM, raise_terminated)
        try:
            if model.num_timesteps < args.frames // FRAME_SKIP:
                model.train(args.frames // FRAME_SKIP - model.num_timesteps, callback=record,
                            callback_interval=30.0)  # train() counts on from a loaded model
        except (KeyboardInterrupt, Terminated):
            signal.signal(signal.SIGTERM, previous)  # a second SIGTERM: the previous file stays
            checkpoint(model)
            print(f"stopped at {model.num_timesteps * FRAME_SKIP:,} frames; saved {ckpt}: the same "
                  "command with --resume goes on", flush=True)
            raise SystemExit(143)
        finally:
            signal.signal(signal.SIGTERM, previous)
        if not rows or rows[-1][2] != model.num_timesteps:  # the target's callback recorded it
            record(model)
        model.save(args.out + ".pt")
        for path in (ckpt, state_path):  # finished: the checkpoint is the final model now
            if os.path.exists(path):
                os.remove(path)
        # The training mean spans the last stats_window games (late in Pong, ~2M frames): the
        # greedy return of the final weights says where the policy is now.
        mean, std = model.evaluate(args.eval_episodes, deterministic=True)
        print(f"final weights ({args.out}.pt): greedy return over {args.eval_episodes} games "
              f"{mean:.1f} +/- {std:.1f}")
    wrote = plot({args.out + ".csv": rows}, args.target, args.env, args.out + ".png")
    print(f"wrote {args.out}.csv" + (f" and {args.out}.png" if wrote else ""))


def read_rows(path: str) -> list:
    """A curve written by a run (OUT.csv) as the rows it holds: (seconds, frames, env steps,
    mean return, lag)."""
    with open(path) as f:
        return [tuple(float(x) for x in r) for r in list(csv.reader(f))[1:]]


def plot(curves: dict, target: float, env: str, png: str) -> bool:
    """The mean return against frames of each run in ``curves`` (label: rows), the target
    dashed, into ``png``; False (no file) without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, rows in curves.items():
        ax.plot([r[1] for r in rows], [r[3] for r in rows], label=os.path.basename(label))
    ax.axhline(target, linestyle="--", color="gray")
    ax.set_xlabel("frames")
    ax.set_ylabel("mean return (last 100 games)")
    ax.set_title(f"asyncrl on {env}")
    if len(curves) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
    return True


if __name__ == "__main__":
    main()
