"""SB3's PPO defaults on Swimmer-v5 with N parallel envs, 1M env steps: the check that parallel
sampling, not a setting, is Swimmer's gap (docs/benchmarks/learning-suite.md, "Swimmer: parallel
envs, not a setting"). Prints the training return (last 100 episodes) every 100k env steps.

    python benchmarks/sb3_swimmer_envs.py --n_envs 16 --n_steps 128 --seed 0
"""
import argparse
import json
import time

import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n_envs", type=int, default=16)
    p.add_argument("--n_steps", type=int, default=128, help="steps per env per rollout")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = PPO("MlpPolicy", make_vec_env("Swimmer-v5", args.n_envs, seed=args.seed),
                n_steps=args.n_steps, seed=args.seed, device="cpu", verbose=0)
    curve = []
    for _ in range(10):
        model.learn(100_000, reset_num_timesteps=False)
        curve.append(round(float(np.mean([e["r"] for e in model.ep_info_buffer])), 1))
    print(json.dumps(dict(vars(args), wall=round(time.perf_counter() - t0), curve=curve)))


if __name__ == "__main__":
    main()
