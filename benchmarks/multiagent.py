"""Multi-agent envs (PettingZoo ParallelEnv): learning curves and throughput.

    python benchmarks/multiagent.py [--steps 2000000] [--bot_steps 200000] [--bot_seeds 4] [--rounds 8]
                                    [--round_steps 50000] [--seconds 60] [--team_steps 1000000]
                                    [--tasks spread,bot,selfplay,best,teams]

- ``simple_spread``: MPE2's simple_spread_v3 (3 agents, 25 steps, discrete actions), every agent
  playing one shared policy (``APPO(make_simple_spread)``, nothing else set), for ``--steps`` agent
  steps; its training return (``rollout/ep_rew_mean``, per agent) against agent steps, and 100
  greedy episodes after, beside random play's return.
- ``best response``: repeated rock-paper-scissors (5 rounds) against a rule-based bot that opens
  with rock and then plays what beats the hero's previous move. The hero sees only the bot's
  last move, so its moves are coupled across rounds: the best response (+5 an episode) is one
  consistent assignment (paper first; then rock after rock, scissors after scissors, paper after
  paper); other assignments are local optima (+3). The bot runs in the rollout workers.
  ``--bot_seeds`` runs (seeds 0, 1, ...).
- ``best``: repeated rock-paper-scissors against a rule-based bot that draws rock 50%, paper
  30%, scissors 20% whatever it sees: the best response is paper every round (+1.5 an episode
  in expectation); ``--bot_steps / 2`` steps, ``--bot_seeds`` seeds; the greedy return and the
  greedy move at each of the 4 observations. Written to ``multiagent_best_response.*``.
- ``self-play``: tic-tac-toe (a ParallelEnv with action masks; tests/ma_envs.py), the hero
  against a pool of 4 of its past snapshots (``SelfPlay``), a snapshot taken after each round of
  ``--round_steps``; after each round, 200 games (sampled moves, seats alternating) against a
  fixed snapshot of its initial weights: wins, draws, losses.
- ``teams`` (several trained policies, each with its own learner): MPE2's
  simple_speaker_listener_v4 (a speaker that sees the goal's colour and can only talk, a
  listener that moves and hears it; different spaces, one shared reward), both trained at
  once for ``--team_steps`` agent steps each, beside the listener trained with a mute and with
  an oracle rule-based speaker (without and with a language), and random play; and MPE2's
  simple_tag_v3 (3 predators playing one policy, 3 lanes, against 1 prey playing another, 1
  lane, other spaces), trained against each other for ``--team_steps / 2`` prey steps, each
  side's return against random movers before and after. Written to
  ``multiagent_teams.{csv,json,png}``.
- ``critic``: a centralised critic (``centralized_critic=True``: the value head reads the env's
  global state) against independent learners at the same budget, ``--critic_seeds`` seeds:
  speaker-listener with both trained (``--team_steps`` agent steps each; and the listener beside
  a mute or an oracle speaker: ``--critic_variants``), simple_spread's shared policy
  (``--critic_spread_steps``, ``--critic_spread_variants``); ``--critic_envs speaker,spread``;
  seeds ``--critic_first_seed`` onwards. Written (after every run) to
  ``--critic_out`` (``multiagent_critic``)``.{csv,json,png}``.
- throughput: simple_spread's raw rate (random actions, one env per process, 2 processes) and
  asyncrl's rate once warm, both in agent steps per second.

Writes ``benchmarks/results/multiagent_learning.{csv,json,png}``. Needs ``pip install mpe2``.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import sys

import numpy as np
from _common import plot_curves, write_runs

from asyncrl import APPO, SelfPlay

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))  # the tests' small ParallelEnvs
from ma_envs import RepeatedRPS, TicTacToe  # noqa: E402
RESULTS = os.path.join(HERE, "results")


def make_simple_spread():
    from mpe2 import simple_spread_v3
    return simple_spread_v3.parallel_env(max_cycles=25)


def make_speaker_listener():
    from mpe2 import simple_speaker_listener_v4
    return simple_speaker_listener_v4.parallel_env(max_cycles=25)


def by_role(agent: str) -> str:
    return agent.split("_")[0]  # "speaker_0" -> "speaker"


def mute_speaker(obs):
    return 0


def oracle_speaker(obs):
    """A rule-based speaker that names the goal (its observation: the goal's colour)."""
    return int(np.argmax(obs))


def make_simple_tag():
    from mpe2 import simple_tag_v3
    return simple_tag_v3.parallel_env(max_cycles=25)


def by_team(agent: str) -> str:
    return "predators" if agent.startswith("adversary") else "prey"


def versus_random(model: APPO, side: str, episodes: int = 200) -> float:
    """simple_tag: the mean return per agent of team ``side`` (its policy, sampled actions)
    against a team that moves at random."""
    env, rng, total = make_simple_tag(), np.random.default_rng(0), []
    for ep in range(episodes):
        obs, _ = env.reset(seed=20_000 + ep)
        ret = {}
        while env.agents:
            acts = {a: (model.predict(obs[a], policy_id=side)[0] if by_team(a) == side
                        else int(rng.integers(5))) for a in env.agents}
            obs, rewards, _, _, _ = env.step(acts)
            for a, r in rewards.items():
                if by_team(a) == side:
                    ret[a] = ret.get(a, 0.0) + r
        total.append(np.mean(list(ret.values())))
    return float(np.mean(total))


def tag(steps: int) -> list:
    """simple_tag: 3 predators (one policy, 3 lanes) and 1 prey (another, 1 lane, other
    spaces) trained against each other; each side's return against random movers before and
    after, and the training curves."""
    curves = {"predators": [], "prey": []}
    t0 = time.perf_counter()

    def record(model):
        for side in curves:
            window = [r for r, _ in model.logger.policy_episodes.get(side, ())]
            curves[side].append((model.trainees[side].num_timesteps, time.perf_counter() - t0,
                                 float(np.mean(window)) if window else float("nan")))

    with APPO(make_simple_tag, verbose=0, seed=0, policies={"predators": None, "prey": None},
              policy_mapping=by_team) as model:
        before = {side: versus_random(model, side) for side in curves}
        model.train(steps, callback=record, callback_interval=2.0)
        record(model)
        seconds = time.perf_counter() - t0
        after = {side: versus_random(model, side) for side in curves}
        agent_steps = {side: t.num_timesteps for side, t in model.trainees.items()}
    runs = []
    for side in curves:
        print(f"simple_tag {side}: {agent_steps[side]:,} agent steps in {seconds:.0f} s; return per "
              f"agent against random movers {before[side]:.2f} (initial weights) -> {after[side]:.2f}",
              flush=True)
        runs.append(dict(task=f"simple_tag: {side} (trained against the other)", env="simple_tag_v3",
                         curve=curves[side], seconds=seconds, before_vs_random=before[side],
                         after_vs_random=after[side], agent_steps=agent_steps[side],
                         reference=f"vs random movers {before[side]:.1f} -> {after[side]:.1f}"))
    return runs


def teams(steps: int) -> list:
    """Two trained policies: speaker-listener (both trained, against the listener with a mute or
    an oracle rule-based speaker) and simple_tag (predators against prey)."""
    runs = [learn(make_speaker_listener, steps, "speaker-listener: both trained", seed=0,
                  policies={"speaker": None, "listener": None}, policy_mapping=by_role),
            learn(make_speaker_listener, steps, "speaker-listener: listener only (mute speaker)",
                  seed=0, policies={"speaker": mute_speaker, "listener": None}, policy_mapping=by_role),
            learn(make_speaker_listener, steps, "speaker-listener: listener only (oracle speaker)",
                  seed=0, policies={"speaker": oracle_speaker, "listener": None}, policy_mapping=by_role)]
    rand = random_return(make_speaker_listener)
    for r in runs:
        r.update(env="simple_speaker_listener_v4", random=rand, reference=f"random play {rand:.1f}")
    return runs + tag(steps // 2)


# independent critics, as these variants had before the centralised critic became the default for
# discrete actions (2026-12-07)
INDEPENDENT = {"centralized_critic": False}
SPEAKER_VARIANTS = {
    "both trained, centralised critic": {"speaker": {"centralized_critic": True},
                                         "listener": {"centralized_critic": True}},
    "both trained, independent": {"speaker": INDEPENDENT, "listener": INDEPENDENT},
    "mute speaker, listener trained": {"speaker": mute_speaker, "listener": INDEPENDENT},
    "oracle speaker, listener trained": {"speaker": oracle_speaker, "listener": INDEPENDENT}}


SPREAD_VARIANTS = {"centralised critic": {"centralized_critic": True}, "independent": INDEPENDENT}


def critic(steps: int, spread_steps: int, seeds: range, envs: list, variants: list,
           spread_variants: list, out: str) -> list:
    """The centralised critic (``centralized_critic=True``) against independent learners, same
    budget, each seed of ``seeds``: speaker-listener (``variants`` of SPEAKER_VARIANTS) and
    simple_spread's shared policy (``spread_variants`` of SPREAD_VARIANTS). The results are
    written after every run."""
    runs = []

    def add(run: dict) -> None:
        runs.append(run)
        write_runs(out, {}, runs, ["task", "seed"], ["agent_steps", "seconds", "ep_rew_mean"])

    rand = random_return(make_speaker_listener) if "speaker" in envs else None
    for seed in seeds if "speaker" in envs else ():
        for label in variants:
            run = learn(make_speaker_listener, steps, f"speaker-listener: {label}", seed=seed,
                        policies=SPEAKER_VARIANTS[label], policy_mapping=by_role)
            add(dict(run, env="simple_speaker_listener_v4", seed=seed, variant=label,
                     reference=f"{label}, seed {seed}", random=rand))
    rand = random_return(make_simple_spread) if "spread" in envs else None
    for seed in seeds if "spread" in envs else ():
        for label in spread_variants:
            run = learn(make_simple_spread, spread_steps, f"simple_spread: {label}", seed=seed,
                        **SPREAD_VARIANTS[label])
            add(dict(run, env="simple_spread_v3", seed=seed, variant=label,
                     reference=f"{label}, seed {seed}", random=rand))
    return runs


BIAS = (0.5, 0.3, 0.2)  # the biased bot's rock, paper, scissors


def biased_bot(obs):
    """Rock 50%, paper 30%, scissors 20%, whatever it sees: the best response is paper every
    round (+0.3 a round in expectation, +1.5 an episode of 5)."""
    return int(np.random.choice(3, p=BIAS))


def best_response(steps: int, seeds: int) -> list:
    """RPS against the biased bot: the greedy return and how often the greedy move is paper."""
    runs = []
    for seed in range(seeds):
        run = learn(make_rps, steps, "RPS against a biased bot", seed=seed,
                    policies={"hero": None, "bot": biased_bot},
                    policy_mapping=lambda agent: "hero" if agent == "player_0" else "bot")
        run.update(seed=seed, expected_best=5 * (BIAS[0] - BIAS[2]), random=0.0,
                   reference=f"best response +{5 * (BIAS[0] - BIAS[2]):.1f}, seed {seed}")
        print(f"  seed {seed}: greedy move paper in {run['paper_share']:.0%} of the 4 "
              "observations", flush=True)
        runs.append(run)
    return runs


def counter_bot(obs):
    """Rock first, then the move that beats the hero's previous one (the bot's observation: the
    hero's last move as a one-hot, zeros before the first)."""
    return 0 if not obs.any() else (int(np.argmax(obs)) + 1) % 3


def make_rps():
    return RepeatedRPS(rounds=5)


def make_tictactoe():
    return TicTacToe()


def duel(model: APPO, a: str, b: str, games: int = 200) -> tuple:
    """(wins, draws, losses) of policy ``a`` against ``b`` over ``games`` tic-tac-toe games,
    sampled moves, ``a`` moving first in every other game."""
    env, results = TicTacToe(), []
    for g in range(games):
        seats = {"player_0": a, "player_1": b} if g % 2 == 0 else {"player_0": b, "player_1": a}
        obs, _ = env.reset(options={"first": 0})
        total = 0.0
        while env.agents:
            acts = {ag: model.predict(obs[ag], policy_id=seats[ag])[0] for ag in env.agents}
            obs, rewards, _, _, _ = env.step(acts)
            total += sum(r for ag, r in rewards.items() if seats[ag] == a)
        results.append(total)
    results = np.array(results)
    return float((results > 0).mean()), float((results == 0).mean()), float((results < 0).mean())


def self_play(rounds: int, round_steps: int) -> dict:
    pool = SelfPlay(["player_0", "player_1"], pool_size=4)
    curve, t0 = [], time.perf_counter()
    with APPO(make_tictactoe, policies={**pool.policies, "start": {"frozen": True}},
              policy_mapping=pool.policy_mapping, seed=0, verbose=0) as model:
        pool.fill(model)
        model.set_parameters({"start": model.get_parameters()["hero"]})  # never refreshed
        first = duel(model, "hero", "start")
        curve.append((0, 0.0, first[0]))
        for _ in range(rounds):
            model.train(round_steps)
            pool.snapshot(model)
            wins, draws, losses = duel(model, "hero", "start")
            curve.append((model.num_timesteps, time.perf_counter() - t0, wins))
            print(f"self-play: {model.num_timesteps:,} agent steps, against the initial snapshot: "
                  f"{wins:.0%} won, {draws:.0%} drawn, {losses:.0%} lost", flush=True)
    return dict(task="tic-tac-toe self-play (win rate against the initial weights)", curve=curve,
                seconds=time.perf_counter() - t0, final=wins, final_std=0.0, random=first[0],
                reference=f"at the start {first[0]:.2f}")


def random_return(make, episodes: int = 100) -> float:
    env = make()
    total = []
    for ep in range(episodes):
        env.reset(seed=ep)
        ret = {}
        while env.agents:
            acts = {a: env.action_space(a).sample() for a in env.agents}
            _, rewards, _, _, _ = env.step(acts)
            for a, r in rewards.items():
                ret[a] = ret.get(a, 0.0) + r
        total.append(np.mean(list(ret.values())))
    return float(np.mean(total))


def _raw(seconds: float, out) -> None:
    env = make_simple_spread()
    env.reset(seed=0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        if not env.agents:
            env.reset()
        acts = {a: env.action_space(a).sample() for a in env.agents}
        env.step(acts)
        n += len(acts)
    out.put(n / (time.perf_counter() - t0))


def raw_agent_rate(processes: int = 2, seconds: float = 10.0) -> float:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=_raw, args=(seconds, q)) for _ in range(processes)]
    for p in ps:
        p.start()
    rates = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return float(sum(rates))


def learn(make, steps: int, label: str, **kwargs) -> dict:
    curve, t0 = [], time.perf_counter()

    def record(model):
        curve.append((model.num_timesteps, time.perf_counter() - t0, model.logger.ep_rew_mean))

    with APPO(make, verbose=0, **kwargs) as model:
        model.train(steps, callback=record, callback_interval=2.0)
        record(model)
        seconds = time.perf_counter() - t0
        final, final_std = model.evaluate(100, seed=10_000)
        # RPS: the greedy move at each observation (nothing seen yet, or the bot's last move)
        greedy = ([int(model.predict(o, deterministic=True)[0])
                   for o in [np.zeros(3, np.float32), *np.eye(3, dtype=np.float32)]]
                  if make is make_rps else [])
    print(f"{label}: {steps:,} agent steps in {seconds:.0f} s ({steps / seconds:,.0f}/s); greedy "
          f"return {final:.2f} +- {final_std:.2f}", flush=True)
    out = dict(task=label, curve=curve, seconds=seconds, final=final, final_std=final_std)
    if greedy:
        out.update(greedy_moves=greedy, paper_share=greedy.count(1) / len(greedy))
    return out


def throughput(seconds: float) -> dict:
    """asyncrl's rate on simple_spread after a warm-up, beside the raw rate."""
    marks = []

    def mark(model):  # (time, agent steps trained); stops after warm-up + seconds
        marks.append((time.perf_counter(), model.num_timesteps))
        return marks[-1][0] - marks[0][0] < seconds + 10

    with APPO(make_simple_spread, verbose=0) as model:
        model.train(10**9, callback=mark, callback_interval=1.0)
    (t0, n0), (t1, n1) = next(m for m in marks if m[0] - marks[0][0] >= 10), marks[-1]
    rate = (n1 - n0) / (t1 - t0)
    raw = raw_agent_rate()
    print(f"throughput: asyncrl {rate:,.0f} agent steps/s, raw env (2 processes, random actions) "
          f"{raw:,.0f}: {rate / raw:.2f} of raw", flush=True)
    return dict(asyncrl=rate, raw=raw, ratio=rate / raw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2_000_000)
    ap.add_argument("--bot_steps", type=int, default=200_000)
    ap.add_argument("--bot_seeds", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--round_steps", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--team_steps", type=int, default=1_000_000)
    ap.add_argument("--critic_spread_steps", type=int, default=1_000_000)
    ap.add_argument("--critic_seeds", type=int, default=3)
    ap.add_argument("--critic_first_seed", type=int, default=0)
    ap.add_argument("--critic_envs", default="speaker,spread")
    ap.add_argument("--critic_variants", default="both trained, centralised critic;both trained, "
                    "independent;mute speaker, listener trained",
                    help="';'-separated speaker-listener variants: " + "; ".join(SPEAKER_VARIANTS))
    ap.add_argument("--critic_spread_variants", default=";".join(SPREAD_VARIANTS),
                    help="';'-separated simple_spread variants: " + "; ".join(SPREAD_VARIANTS))
    ap.add_argument("--critic_out", default="multiagent_critic")
    ap.add_argument("--tasks", default="spread,bot,selfplay,best,teams,critic",
                    help="which of spread (with the throughput), bot, selfplay, best, teams, critic "
                         "to run")
    args = ap.parse_args()
    tasks = args.tasks.split(",")
    os.makedirs(RESULTS, exist_ok=True)
    if {"spread", "bot", "selfplay"} & set(tasks):
        main_runs(args, tasks)
    if "best" in tasks:
        runs = best_response(args.bot_steps // 2, args.bot_seeds)
        out = os.path.join(RESULTS, "multiagent_best_response")
        write_runs(out, {"bias": BIAS}, runs, ["task", "seed"], ["agent_steps", "seconds", "ep_rew_mean"])
        plot_curves(runs, "task", lambda task: task, lambda r: (f"C{r['seed']}", r["reference"]),
                    "agent steps", "training return", "asyncrl, a trained policy against a rule-based one",
                    out + ".png")
    if "critic" in tasks:
        out = os.path.join(RESULTS, args.critic_out)
        seeds = range(args.critic_first_seed, args.critic_first_seed + args.critic_seeds)
        runs = critic(args.team_steps, args.critic_spread_steps, seeds, args.critic_envs.split(","),
                      args.critic_variants.split(";"), args.critic_spread_variants.split(";"), out)
        plot_curves(runs, "env", lambda env: env,
                    lambda r: ("C0" if "critic" in r["variant"] else "C1" if "independent" in r["variant"]
                               else "C2", r["reference"]), "agent steps", "training return per agent",
                    "asyncrl, centralised critic against independent learners (2 cores)", out + ".png")
    if "teams" in tasks:
        runs = teams(args.team_steps)
        out = os.path.join(RESULTS, "multiagent_teams")
        write_runs(out, {}, runs, ["task"], ["agent_steps", "seconds", "ep_rew_mean"])
        plot_curves(runs, "env", lambda env: env,
                    lambda r: (f"C{runs.index(r)}", f"{r['task']} ({r['reference']})"), "agent steps",
                    "training return per agent", "asyncrl, two trained policies (2 cores)", out + ".png")


def main_runs(args, tasks: list) -> None:
    rate = throughput(args.seconds) if "spread" in tasks else None
    random_spread, random_rps = random_return(make_simple_spread), 0.0
    runs = []
    if "spread" in tasks:
        runs.append(learn(make_simple_spread, args.steps, "simple_spread (shared policy)", seed=0))
        runs[0]["random"] = random_spread
    for seed in range(args.bot_seeds if "bot" in tasks else 0):
        runs.append(learn(make_rps, args.bot_steps, "RPS against a countering bot", seed=seed,
                          policies={"hero": None, "bot": counter_bot},
                          policy_mapping=lambda agent: "hero" if agent == "player_0" else "bot"))
        runs[-1].update(random=random_rps, seed=seed)
    for r in runs:
        r["reference"] = f"random play {r['random']:.1f}" + (f", seed {r['seed']}" if "seed" in r else "")
    if "selfplay" in tasks:
        runs.append(self_play(args.rounds, args.round_steps))
    print(f"random play: simple_spread {random_spread:.2f}, RPS 0 (in expectation)")
    out = os.path.join(RESULTS, "multiagent_learning")
    write_runs(out, {"throughput": rate}, runs, ["task"], ["agent_steps", "seconds", "ep_rew_mean"])
    plot_curves(runs, "task", lambda task: task,
                lambda r: (f"C{r.get('seed', 0)}", f"asyncrl ({r['reference']})"), "agent steps",
                "training return per agent; self-play: win rate", "asyncrl, multi-agent (2 cores)",
                out + ".png")


if __name__ == "__main__":
    main()
