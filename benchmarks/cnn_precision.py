"""The image encoders' cost in float32 and in bfloat16 (``Config.cnn_precision``), on this machine.

Times one learner minibatch (forward, backward and Adam's step of the whole built-in model: the
encoder, Doom's GRU, the heads) and one policy-worker batch (a forward pass without gradients) of
the "nature" (Atari: 4 x 84 x 84) and "doom" (3 x 72 x 128, GRU 512) models, each precision in
turn, in one process with the learner's threads. Run it alone on the machine:

    python benchmarks/cnn_precision.py [--threads 2] [--repeats 5]

The medians over the repeats are printed as a table, float32's time over bfloat16's beside them
(above 1: bfloat16 is faster). ``native bfloat16`` says whether ``cnn_precision="auto"`` picks
bfloat16 here; where it is False bfloat16 is emulated and the ratio is below 1.
"""
from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from asyncrl import Config
from asyncrl.encoders import native_bfloat16
from asyncrl.models import ActorCritic

MODELS = {  # name -> (observation shape [H, W, C], Config fields)
    "nature": ((84, 84, 4), dict(cnn="nature")),
    "doom": ((72, 128, 3), dict(cnn="doom_relu", use_rnn=True, rnn_type="gru", rnn_size=512)),
}
ROLLOUT = 32  # a recurrent minibatch is whole trajectories of this length


def seconds_per_call(fn, repeats: int, calls: int) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def measure(name: str, precision: str, minibatch: int, inference: int, repeats: int) -> dict:
    shape, fields = MODELS[name]
    torch.manual_seed(0)
    model = ActorCritic.from_spaces(gym.spaces.Box(0, 255, shape, np.uint8), gym.spaces.Discrete(6),
                                    Config(cnn_precision=precision, **fields))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    obs = torch.randint(0, 256, (minibatch, *shape), dtype=torch.uint8)
    recurrent = model.core is not None
    state = torch.zeros(minibatch // ROLLOUT, model.state_size)
    starts = torch.zeros(ROLLOUT, minibatch // ROLLOUT, dtype=torch.bool)
    cache: dict = {}

    def learner_step():
        x = model.prepare({"obs": obs}, cache)
        params, values, *_ = model(x, prepared=True, state=state if recurrent else None,
                                   starts=starts if recurrent else None)
        loss = params.square().mean() + values.square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    one = obs[:inference]
    one_state = torch.zeros(inference, model.state_size)

    @torch.no_grad()
    def policy_step():
        model({"obs": one}, state=one_state if recurrent else None)

    return {"learner_ms": 1e3 * seconds_per_call(learner_step, repeats, 5),
            "inference_ms": 1e3 * seconds_per_call(policy_step, repeats, 20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the learner's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--minibatch", type=int, default=256)
    ap.add_argument("--inference", type=int, default=16, help="observations per policy-worker batch")
    args = ap.parse_args()
    if args.minibatch % ROLLOUT:
        ap.error(f"--minibatch must be a multiple of the rollout, {ROLLOUT} (the Doom model's GRU "
                 "trains on whole trajectories)")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, native bfloat16 (cnn_precision "
          f"'auto' picks it): {native_bfloat16(torch.device('cpu'))}")
    print(f"| model | precision | learner minibatch of {args.minibatch}, ms | inference batch of "
          f"{args.inference}, ms |\n|---|---|---|---|")
    for name in MODELS:
        got = {p: measure(name, p, args.minibatch, args.inference, args.repeats)
               for p in ("float32", "bfloat16")}
        for p, r in got.items():
            print(f"| {name} | {p} | {r['learner_ms']:.1f} | {r['inference_ms']:.2f} |")
        f32, b16 = got["float32"], got["bfloat16"]
        print(f"| {name} | float32 / bfloat16 | {f32['learner_ms'] / b16['learner_ms']:.2f} | "
              f"{f32['inference_ms'] / b16['inference_ms']:.2f} |")


if __name__ == "__main__":
    main()
