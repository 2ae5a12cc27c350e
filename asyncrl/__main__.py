"""``python -m asyncrl``: train an agent on CartPole-v1 (or --env) with the defaults, then
evaluate the greedy policy. Any config field can be set as ``--field value``."""
from __future__ import annotations

import argparse
import ast
import dataclasses
import time

from . import APPO, Config


def parse_value(text: str):
    """A flag value as a Python literal when it is one (3, 2.5e-4, True, None, (64, 64)), else text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a plain string, e.g. --device cpu


def add_config_flags(ap: argparse.ArgumentParser) -> None:
    """Every Config field as ``--field value``, its documentation as help; unset ones are absent
    from the parsed namespace."""
    for f in dataclasses.fields(Config):
        ap.add_argument(f"--{f.name}", type=parse_value, default=argparse.SUPPRESS,
                        help=f"{f.metadata['doc']} (default: {f.default!r})")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m asyncrl", description=__doc__)
    ap.add_argument("--env", default="CartPole-v1", help="Gymnasium id (default: CartPole-v1)")
    ap.add_argument("--steps", type=int, default=200_000, help="env steps to train for")
    ap.add_argument("--eval_episodes", type=int, default=10)
    ap.add_argument("--save", default=None, help="write the trained model to this path")
    add_config_flags(ap)
    args = vars(ap.parse_args(argv))
    env, steps, episodes, save = (args.pop(k) for k in ("env", "steps", "eval_episodes", "save"))
    t0 = time.perf_counter()
    with APPO(env, **args) as model:
        model.train(steps)
        mean, std = model.evaluate(episodes)
        print(f"trained {model.num_timesteps:,} env steps in {time.perf_counter() - t0:.1f} s; "
              f"greedy return over {episodes} episodes: {mean:.1f} +/- {std:.1f}")
        if save:
            model.save(save)
            print(f"saved to {save}")


if __name__ == "__main__":
    main()
