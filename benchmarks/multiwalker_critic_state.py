"""Multiwalker's centralised critic without the env's own global state: the learning suite's
``multiwalker`` case (1M agent steps, greedy evaluation as the suite's) with its env's
``state()`` and ``state_space`` hidden, so that ``centralized_critic=True`` reads the three
walkers' observations side by side (93 floats) instead of the env's state (each walker's 24
own readings and the package's absolute position and angle: 75 floats).

    python benchmarks/multiwalker_critic_state.py --seeds 0,2

Writes ``results/learning_suite/asyncrl-ccobs_multiwalker_1000000_<seed>.json`` (the suite's
format; the table reads only the defaults' rows, the suite page cites these)."""
import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from learning_suite import CASES, run_asyncrl, save_run  # noqa: E402


class WithoutState:
    """A PettingZoo ParallelEnv with its ``state``/``state_space`` hidden (all else delegated)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):  # only for names the wrapper itself lacks
        if name in ("_env", "state", "state_space"):  # "_env": not yet set (unpickling)
            raise AttributeError(f"{name} hidden")
        return getattr(self._env, name)


def multiwalker_without_state():
    from pettingzoo.sisl import multiwalker_v9
    return WithoutState(multiwalker_v9.parallel_env())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    CASES["multiwalker"] = dataclasses.replace(CASES["multiwalker"], env=multiwalker_without_state)
    for seed in map(int, args.seeds.split(",")):
        run = dict(run_asyncrl("multiwalker", seed, {"centralized_critic": True}), lib="asyncrl-ccobs",
                   note="env state() hidden: the critic reads the three observations side by side")
        save_run(run)
        print(f"seed {seed}: greedy {run['greedy_mean']:.1f}, training return {run['curve'][-1][2]:.1f}, "
              f"{run['wall']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
