"""SB3 PPO on Swimmer-v5 with N parallel envs: python benchmarks/sb3_swimmer_envs.py N_ENVS N_STEPS SEED
(the 2026-12-02 check that parallel sampling, not a setting, is Swimmer's gap)."""
import sys, time, json, numpy as np, torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
n_envs, n_steps, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
env = make_vec_env("Swimmer-v5", n_envs, seed=seed)
m = PPO("MlpPolicy", env, n_steps=n_steps, seed=seed, device="cpu", verbose=0)
t0 = time.time(); curve = []
for i in range(10):
    m.learn(100_000, reset_num_timesteps=False)
    curve.append(round(float(np.mean([e["r"] for e in m.ep_info_buffer])), 1))
print(json.dumps(dict(n_envs=n_envs, n_steps=n_steps, seed=seed, wall=round(time.time()-t0), curve=curve)), flush=True)
