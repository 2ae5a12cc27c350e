"""Reference scores a held-out case's target is set against, before any run: random play,
keeping still and, where one is written below, scripted policies, each over seeded episodes
(resets seeded 0, 1, ...; the suite's measure: an episode's return, a multi-agent episode's mean
return over the agents of asyncrl's model's policy: every agent, or where the agents' spaces
differ those of ``possible_agents[0]``'s).

    python benchmarks/reference_scores.py --envs humanoid-standup,simple-reference [--episodes 10]
"""
import argparse
import os
import sys
from typing import Callable, Dict

import gymnasium as gym
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from learning_suite import CASES, is_multi_agent, scored_return  # noqa: E402

Policy = Callable[[np.ndarray, gym.Space, np.random.Generator], object]


def random_play(obs, space: gym.Space, rng: np.random.Generator):
    space.seed(int(rng.integers(2 ** 31)))
    action = space.sample()  # a Discrete one as a Python int (NASim's flat actions take no other)
    return int(action) if isinstance(space, gym.spaces.Discrete) else action


def keep_still(obs, space: gym.Space, rng: np.random.Generator):
    """A Discrete space's first action (MPE2's no move and, with words, word 0), a
    MultiDiscrete's first in each part; zero force of a Box, clipped into its bounds."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(np.zeros(space.shape, space.dtype), space.low, space.high)
    if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        return np.array(space.start) if space.shape else int(space.start)
    raise ValueError(f"keeping still is not defined for {space}: write a scripted policy instead")


def _move_to(rel: np.ndarray, vel: np.ndarray) -> int:
    """MPE2's discrete move toward a point (relative position), damped by the velocity: 0 none,
    1 / 2 along -x / +x, 3 / 4 along -y / +y."""
    aim = rel - 0.5 * vel
    if np.abs(aim).max() <= 0.05:
        return 0
    if abs(aim[0]) >= abs(aim[1]):
        return 2 if aim[0] > 0 else 1
    return 4 if aim[1] > 0 else 3


# simple_reference's observation: own velocity (2), the three landmarks relative to the agent (6),
# the colour of the partner's goal (3; landmark i's colour is 0.75 in channel i), the partner's
# word (10, one-hot once said); its Discrete(50) action is move + 5 x word
def reference_centre(obs, space, rng) -> int:
    """Goes to the landmarks' centre and says nothing useful (word 0)."""
    return _move_to(obs[2:8].reshape(3, 2).mean(0), obs[:2])


def reference_talk(obs, space, rng) -> int:
    """Names the partner's goal (its landmark index as the word) and goes to the landmark its
    partner names (nowhere before a word arrives)."""
    said, heard = obs[8:11], obs[11:21]
    word = int(np.argmax(said)) if said.max() > 0 else 0
    move = _move_to(obs[2:8].reshape(3, 2)[int(np.argmax(heard))], obs[:2]) \
        if 0 < heard.max() and int(np.argmax(heard)) < 3 else 0
    return move + 5 * word


# simple_speaker_listener: the speaker sees the goal's colour (3; landmark i's is 0.65 in channel
# i) and says one of three words; the listener sees its velocity (2), the three landmarks
# relative to it (6) and the word heard (3, one-hot once said), and moves as simple_reference's
def speaker_listener_mute(obs, space, rng) -> int:
    """The speaker says word 0 whatever the goal; the listener goes to the landmarks' centre."""
    return 0 if obs.shape == (3,) else reference_centre(obs, space, rng)  # the same first 8


def speaker_listener_talk(obs, space, rng) -> int:
    """The speaker names the goal (its landmark index as the word); the listener goes to the
    landmark it hears (to the centre before a word arrives)."""
    if obs.shape == (3,):
        return int(np.argmax(obs))
    heard, landmarks = obs[8:11], obs[2:8].reshape(3, 2)
    goal = landmarks[int(np.argmax(heard))] if heard.max() > 0 else landmarks.mean(0)
    return _move_to(goal, obs[:2])


# simple_spread (N agents and landmarks): own velocity and position (4), the landmarks relative
# to the agent (2N), the other agents relative to it (2N - 2), their words (2N - 2)
def spread_assigned(obs, space, rng) -> int:
    """Goes to its landmark of the assignment of agents to landmarks with the least total
    distance, which every agent computes alike from its own observation (the optimum is unique
    almost surely, whoever computes it)."""
    from scipy.optimize import linear_sum_assignment
    n = len(obs) // 6
    landmarks = obs[4:4 + 2 * n].reshape(n, 2)
    agents = np.vstack([np.zeros(2), obs[4 + 2 * n:4 + 2 * n + 2 * (n - 1)].reshape(n - 1, 2)])
    cost = np.linalg.norm(agents[:, None] - landmarks[None], axis=2)
    _, cols = linear_sum_assignment(cost)  # square: row i is agent i, the agent itself row 0
    return _move_to(landmarks[cols[0]], obs[:2])


# collect_treasure: a collector sees its position and velocity (4), what it holds (2, one-hot),
# the 7 other agents nearest first (relative position, velocity, [deposit of type 0, of type 1,
# holding type 0, type 1]: 8 each) and the 6 treasures nearest first (relative position, type
# one-hot; zeros where just picked up); a deposit the same without what it holds (84)
def _treasure_others(obs):
    k = 6 if obs.shape == (86,) else 4
    return obs[k:k + 56].reshape(7, 8), obs[k + 56:k + 80].reshape(6, 4)


def treasure_script(obs, space, rng) -> int:
    """A collector goes to the nearest treasure, and once holding one to the nearest deposit
    of its type; a deposit (which does not see its own type) goes to the collectors' centre."""
    others, treasures = _treasure_others(obs)
    if obs.shape == (84,):
        collectors = others[others[:, 4:6].sum(1) == 0]
        return _move_to(collectors[:, :2].mean(0), obs[2:4])
    if obs[4:6].max() > 0:
        deposits = others[others[:, 4 + int(np.argmax(obs[4:6]))] > 0]
        return _move_to(deposits[0, :2], obs[2:4])
    alive = treasures[treasures[:, 2:].sum(1) > 0]
    return _move_to(alive[0, :2], obs[2:4]) if len(alive) else 0


# pursuit's observation is (y, x, channel) around the pursuer at (3, 3): walls (and the window's
# outside) in channel 0, pursuers in 1 (itself included), evaders in 2; its moves: 0 x - 1,
# 1 x + 1, 2 y + 1, 3 y - 1, 4 stay
PURSUIT_MOVES = np.array([[0, -1], [0, 1], [1, 0], [-1, 0], [0, 0]])  # (dy, dx) of each move


def _pursuit_step_to(obs, goal, rng) -> int:
    """The move that brings the pursuer nearest ``goal`` (a window cell), ties broken at random,
    into no wall (staying, on its own cell, is always open)."""
    cells = 3 + PURSUIT_MOVES
    d = np.abs(cells - goal).sum(1) + np.where(obs[cells[:, 0], cells[:, 1], 0] > 0, 1 << 20, 0)
    return int(rng.choice(np.flatnonzero(d == d.min())))


def pursuit_chase(obs, space, rng) -> int:
    """Steps toward the nearest evader in view, stays once beside it; at random with none."""
    ys, xs = np.nonzero(obs[:, :, 2])
    if not len(ys):
        return int(rng.integers(4))
    d = np.abs(ys - 3) + np.abs(xs - 3)
    i = np.argmin(d)
    return 4 if d[i] <= 1 else _pursuit_step_to(obs, (ys[i], xs[i]), rng)


SCRIPTED: Dict[str, Dict[str, Policy]] = {
    "simple-reference": {"centre, no word": reference_centre, "names the goal": reference_talk},
    "pursuit": {"chases the nearest evader": pursuit_chase},
    "simple-spread": {"least-distance assignment": spread_assigned},
    "simple-spread6": {"least-distance assignment": spread_assigned},
    "simple-spread8": {"least-distance assignment": spread_assigned},
    "collect-treasure": {"collects and delivers": treasure_script},
    "speaker-listener": {"mute, to the centre": speaker_listener_mute,
                         "names the goal, goes there": speaker_listener_talk},
}


def episode(case_name: str, policy: Policy, seed: int) -> float:
    case, rng = CASES[case_name], np.random.default_rng(seed)
    if is_multi_agent(case.env):
        # asyncrl's own episode loop, each agent its own "policy" so that act knows its space
        from asyncrl.multiagent import AgentLayout, play_parallel_episode
        env = case.env()
        agents = AgentLayout(env.possible_agents, list(env.possible_agents), {}, lambda a: a)
        try:
            returns = play_parallel_episode(
                agents, env, lambda a, obs, info, start, state:
                (policy(obs, env.action_space(a), rng), None), seed, 0)
        finally:
            env.close()
        return scored_return(returns, case.env)
    env = case.env() if callable(case.env) else gym.make(case.env)
    obs, _ = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, r, terminated, truncated, _ = env.step(policy(obs, env.action_space, rng))
        total, done = total + float(r), terminated or truncated
    env.close()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", required=True, help="suite case names, comma separated")
    parser.add_argument("--episodes", type=int, default=10)
    args = parser.parse_args()
    for name in args.envs.split(","):
        if name not in CASES:
            parser.error(f"unknown case {name!r}; the suite's cases: {', '.join(CASES)}")
        policies = {"random play": random_play, "keeping still": keep_still, **SCRIPTED.get(name, {})}
        for label, policy in policies.items():
            scores = [episode(name, policy, s) for s in range(args.episodes)]
            print(f"{name}: {label}: {np.mean(scores):,.2f} (std {np.std(scores):,.2f}, "
                  f"{args.episodes} episodes)")


if __name__ == "__main__":
    main()
