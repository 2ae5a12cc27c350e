"""Turn-based games (PettingZoo AECEnv): connect four by self-play from the defaults.

    python benchmarks/turn_based.py [--steps 2000000] [--chunk 250000] [--seeds 0,1,2]
                                    [--games 100] [--seconds 30] [--kwargs JSON] [--out NAME]

``APPO(make_connect_four)`` with nothing else set: PettingZoo's ``connect_four_v3.env()`` as it
comes (an AECEnv, legal moves in the observation's ``"action_mask"``), both seats playing one
shared policy. After every ``--chunk`` agent steps (moves and waits of both seats: two per game
move), the greedy policy plays ``--games`` games from each seat against

- a random mover (uniform over the legal moves), and
- a one-move lookahead: it wins at once where it can, else blocks the opponent's immediate win,
  else moves at random;

and the win rates (draws count as not won) are written against agent steps and wall time (start-up
included), with the greedy policy's tactics in those games: the share of its moves that took a
win there was to take (``took_win``), and of those that blocked the opponent's immediate win
where it had none of its own (``blocked``), and the share of 400 fixed positions from games of
random moves it plays right (``fixed_win``: a four to make; ``fixed_block``: the opponent's to
stop). Then the throughput: the raw game's rate (random
legal moves, 2 processes) and asyncrl's training rate, both in game moves per second.

Writes ``benchmarks/results/connect_four_selfplay.{csv,json,png}``.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import time

import numpy as np

from asyncrl import APPO

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def make_connect_four():
    from pettingzoo.classic import connect_four_v3
    return connect_four_v3.env()


def _drop_row(board: np.ndarray, col: int) -> int:
    """The row a piece dropped in ``col`` lands in (row 0 is the top), -1 if full."""
    empty = np.flatnonzero(board[:, col, 0] + board[:, col, 1] == 0)
    return int(empty[-1]) if len(empty) else -1


def _wins(plane: np.ndarray, r: int, c: int) -> bool:
    """Four in a row through (r, c) on one player's plane, with (r, c) filled."""
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        run = 1
        for sign in (1, -1):
            rr, cc = r + sign * dr, c + sign * dc
            while 0 <= rr < 6 and 0 <= cc < 7 and plane[rr, cc]:
                run, rr, cc = run + 1, rr + sign * dr, cc + sign * dc
        if run >= 4:
            return True
    return False


def random_mover(obs: dict, rng: np.random.Generator) -> int:
    return int(rng.choice(np.flatnonzero(obs["action_mask"])))


def winning_moves(obs: dict, plane_idx: int) -> list:
    """The legal columns where a piece of plane ``plane_idx``'s player (0: the mover, 1: the
    opponent) would make four in a row now."""
    board, out = obs["observation"], []
    for col in np.flatnonzero(obs["action_mask"]):
        r = _drop_row(board, col)
        plane = board[:, :, plane_idx].copy()
        plane[r, col] = 1
        if _wins(plane, r, col):
            out.append(int(col))
    return out


def lookahead_mover(obs: dict, rng: np.random.Generator) -> int:
    """Wins now if it can, else blocks the opponent's win, else a random legal move (the
    observation's plane 0 is the mover's pieces, plane 1 the opponent's)."""
    for plane_idx in (0, 1):
        cols = winning_moves(obs, plane_idx)
        if cols:
            return cols[0]
    return int(rng.choice(np.flatnonzero(obs["action_mask"])))


def play(model: APPO, opponent, games: int, seat: int, seed: int) -> tuple:
    """The greedy policy's win rate over ``games`` games from ``seat`` (0 moves first), and its
    tactics: (wins taken, chances to win; blocks made, blocks needed) in those games."""
    rng, wins, tactics = np.random.default_rng(seed), 0, np.zeros(4, int)
    env = make_connect_four()
    for g in range(games):
        env.reset(seed=seed + g)
        hero = env.possible_agents[seat]
        for agent in env.agent_iter():
            obs, reward, term, trunc, _ = env.last()
            if term or trunc:
                if agent == hero and reward > 0:
                    wins += 1
                env.step(None)
                continue
            if agent == hero:
                action = int(model.predict(obs, deterministic=True)[0])
                win, block = winning_moves(obs, 0), winning_moves(obs, 1)
                if win:
                    tactics[:2] += (action in win, 1)
                elif block:
                    tactics[2:] += (action in block, 1)
            else:
                action = opponent(obs, rng)
            env.step(action)
    env.close()
    return wins / games, tactics


@functools.lru_cache(maxsize=None)
def tactical_positions(n: int = 400, seed: int = 123) -> dict:
    """Fixed positions from games of random moves (the same every call): ``"win"``, ``n`` where
    the mover can make four at once, and ``"block"``, ``n`` where it cannot but the opponent
    could at one column. Each item: (observation, the columns that do it)."""
    rng, env, sets = np.random.default_rng(seed), make_connect_four(), {"win": [], "block": []}
    game = 0
    while min(len(v) for v in sets.values()) < n:
        env.reset(seed=seed + game)
        game += 1
        for agent in env.agent_iter():
            obs, _, term, trunc, _ = env.last()
            if term or trunc:
                env.step(None)
                continue
            win, block = winning_moves(obs, 0), winning_moves(obs, 1)
            if win and len(sets["win"]) < n:
                sets["win"].append((obs, win))
            elif block and not win and len(block) == 1 and len(sets["block"]) < n:
                sets["block"].append((obs, block))
            env.step(random_mover(obs, rng))
    env.close()
    return sets


def tactics_accuracy(model: APPO, sets: dict) -> dict:
    """The greedy policy's share of ``tactical_positions`` it plays right: a measure of tactics
    that does not depend on games against an opponent (whose win rates move 4-12 points from run
    to run of one seed)."""
    out = {}
    for name, items in sets.items():
        right = [int(model.predict(obs, deterministic=True)[0]) in cols for obs, cols in items]
        out[f"fixed_{name}"] = round(float(np.mean(right)), 3)
    return out


def evaluate(model: APPO, games: int, seed: int) -> dict:
    out, tactics = {}, np.zeros(4, int)
    for name, opponent in (("random", random_mover), ("lookahead", lookahead_mover)):
        rates = []
        for seat in (0, 1):
            rate, seen = play(model, opponent, games, seat, seed + 1000 * seat)
            rates.append(rate)
            tactics += seen
        out[f"win_{name}_first"], out[f"win_{name}_second"] = rates
        out[f"win_{name}"] = float(np.mean(rates))
    out["took_win"] = round(tactics[0] / max(tactics[1], 1), 3)
    out["blocked"] = round(tactics[2] / max(tactics[3], 1), 3)
    out.update(tactics_accuracy(model, tactical_positions()))
    return out


def run_seed(seed: int, steps: int, chunk: int, games: int, kwargs: dict) -> list:
    t0 = time.perf_counter()
    model = APPO(make_connect_four, seed=seed, **kwargs)
    rows, done = [], 0
    try:
        while done < steps:
            model.train(chunk)
            done = model.num_timesteps
            wall = time.perf_counter() - t0  # the evaluation's time is left out of the next
            row = dict(seed=seed, agent_steps=done, wall_s=round(wall, 1), **evaluate(model, games, seed))
            t0 += time.perf_counter() - t0 - wall
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        model.close()
    return rows


def _raw_moves(seconds: float, out) -> None:
    env, rng, n = make_connect_four(), np.random.default_rng(0), 0
    env.reset(seed=0)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for agent in env.agent_iter():
            obs, _, term, trunc, _ = env.last()
            env.step(None if term or trunc else random_mover(obs, rng))
            n += 1
        env.reset()
    out.put(n / seconds)


def throughput(seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_raw_moves, args=(seconds, out)) for _ in range(2)]
    for p in procs:
        p.start()
    raw = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    model = APPO(make_connect_four, seed=0)
    try:
        model.train(100_000)  # warm
        t0, n0 = time.perf_counter(), model.num_timesteps
        model.train(int(seconds * 8_000))
        rate = (model.num_timesteps - n0) / (time.perf_counter() - t0) / 2  # two lanes a move
    finally:
        model.close()
    return {"raw_moves_per_s_2_processes": round(raw), "asyncrl_moves_per_s": round(rate)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--chunk", type=int, default=250_000)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--games", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--kwargs", type=json.loads, default={},
                    help="APPO arguments (JSON) over the defaults")
    ap.add_argument("--out", default="connect_four_selfplay")
    args = ap.parse_args()
    rows = []
    for seed in map(int, args.seeds.split(",")):
        rows += run_seed(seed, args.steps, args.chunk, args.games, args.kwargs)
    tp = throughput(args.seconds) if args.seconds > 0 else {}
    os.makedirs(RESULTS, exist_ok=True)
    base = os.path.join(RESULTS, args.out)
    keys = list(rows[0])
    with open(base + ".csv", "w") as f:
        f.write(",".join(keys) + "\n")
        f.writelines(",".join(str(r[k]) for k in keys) + "\n" for r in rows)
    final = [r for r in rows if r["agent_steps"] == max(q["agent_steps"] for q in rows if q["seed"] == r["seed"])]
    summary = {"args": vars(args), "throughput": tp,
               "final": {k: [r[k] for r in final] for k in ("win_random", "win_lookahead", "took_win",
                                                             "blocked", "fixed_win", "fixed_block")}}
    with open(base + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    _plot(rows, base + ".png", args.kwargs)


def _plot(rows: list, path: str, kwargs: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, x in zip(axes, ("agent_steps", "wall_s")):
        for seed in sorted({r["seed"] for r in rows}):
            mine = [r for r in rows if r["seed"] == seed]
            for key, style in (("win_random", "-"), ("win_lookahead", "--")):
                ax.plot([r[x] for r in mine], [r[key] for r in mine], style,
                        label=f"seed {seed}, vs {key[4:]}")
        ax.set_xlabel(x), ax.set_ylabel("greedy win rate (200 games)"), ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7)
    over = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    fig.suptitle("connect_four_v3, self-play from APPO's defaults" + (f", {over}" if over else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()
