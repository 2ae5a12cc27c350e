"""Small PettingZoo envs for the multi-agent tests (fast, no rendering): ParallelEnvs and a turn-based AECEnv."""
import functools

import gymnasium as gym
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

ROCK, PAPER, SCISSORS = 0, 1, 2


class RepeatedRPS(ParallelEnv):
    """Rock-paper-scissors, ``rounds`` rounds an episode: +1 to the winner of a round, -1 to the
    loser. Each player sees the other's last move (one-hot; zeros at the start)."""

    metadata = {"name": "repeated_rps"}
    render_mode = None  # PettingZoo's attribute (SuperSuit's vector env reads it)

    def __init__(self, rounds: int = 5):
        self.rounds = rounds
        self.possible_agents = ["player_0", "player_1"]
        self.agents = []

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (3,), np.float32)

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def _obs(self, last: dict):
        out = {}
        for a, other in zip(self.possible_agents, reversed(self.possible_agents)):
            o = np.zeros(3, np.float32)
            if other in last:
                o[int(last[other])] = 1.0
            out[a] = o
        return out

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs({}), {a: {} for a in self.agents}

    def step(self, actions):
        a0, a1 = int(actions["player_0"]), int(actions["player_1"])
        win = (a0 - a1) % 3  # 1: player_0 wins, 2: player_1 wins
        r0 = 1.0 if win == 1 else -1.0 if win == 2 else 0.0
        self.t += 1
        end = self.t >= self.rounds
        obs = self._obs(actions)
        rewards = {"player_0": r0, "player_1": -r0}
        terms = {a: False for a in self.agents}
        truncs = {a: end for a in self.agents}
        infos = {a: {} for a in self.agents}
        if end:
            self.agents = []
        return obs, rewards, terms, truncs, infos


def rps():
    return RepeatedRPS()


def rock_bot(obs):
    return ROCK


class Leaving(ParallelEnv):
    """Agents ``a0``..``a{n-1}``: agent k is terminated after k + 1 steps (the others play on);
    each step it is in, an agent is rewarded 1 for repeating its cue (0 or 1, in its obs).
    ``fail_every``: every that many steps the env raises (a crash, for restart tests)."""

    metadata = {"name": "leaving"}

    def __init__(self, n: int = 3, fail_every: int = 0):
        self.possible_agents = [f"a{k}" for k in range(n)]
        self.agents = []
        self.fail_every, self.steps = fail_every, 0
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (2,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2)

    def _obs(self):
        self.cues = {a: int(self.rng.integers(2)) for a in self.agents}
        return {a: np.eye(2, dtype=np.float32)[c] for a, c in self.cues.items()}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.steps += 1
        if self.fail_every and self.steps % self.fail_every == 0:
            raise RuntimeError("Leaving: injected failure")
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.t += 1
        rewards = {a: float(int(actions[a]) == self.cues[a]) for a in self.agents}
        terms = {a: self.t >= int(a[1:]) + 1 for a in self.agents}
        truncs = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not terms[a]]
        obs = self._obs()
        for a in terms:  # a leaving agent's last observation
            obs.setdefault(a, np.zeros(2, np.float32))
        return obs, rewards, terms, truncs, infos


def leaving():
    return Leaving()


def leaving_failing():
    return Leaving(fail_every=23)


class TwoShapes(ParallelEnv):
    """Agent "small" sees a Box(3) and picks Discrete(2); "big" sees a Box(5) and picks
    Discrete(4). One step an episode, reward 1 each."""

    metadata = {"name": "two_shapes"}
    possible_agents = ["small", "big"]

    def __init__(self):
        self.agents = []

    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (3 if agent == "small" else 5,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2 if agent == "small" else 4)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        return ({a: np.zeros(self.observation_space(a).shape, np.float32) for a in self.agents},
                {a: {} for a in self.agents})

    def step(self, actions):
        assert actions["small"] in (0, 1) and actions["big"] in range(4)
        obs = {a: np.zeros(self.observation_space(a).shape, np.float32) for a in self.agents}
        done = {a: True for a in self.agents}
        self.agents = []
        return obs, {a: 1.0 for a in done}, done, {a: False for a in done}, {a: {} for a in done}


def two_shapes():
    return TwoShapes()


class Seeded(ParallelEnv):
    """Every possible agent from the start, an rng the reset's seed sets, ``_observe()`` for
    the observations; subclasses count steps in ``t``."""

    def __init__(self):
        self.agents = []
        self.rng = np.random.default_rng()

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}


class Cues(Seeded):
    """Agent "small" sees a one-hot cue among 2 (Box(2)) and picks Discrete(2); "big" a cue among
    4 (Box(4)), Discrete(4). Reward 1 for the cued action; 4 steps an episode. Random play:
    returns 2 and 1; perfect play: 4 each (two policies, different spaces, both must learn)."""

    metadata = {"name": "cues"}
    possible_agents = ["small", "big"]
    SIZES = {"small": 2, "big": 4}

    def observation_space(self, agent):
        return gym.spaces.Box(0.0, 1.0, (self.SIZES[agent],), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(self.SIZES[agent])

    def _observe(self):
        self.cues = {a: int(self.rng.integers(self.SIZES[a])) for a in self.agents}
        return {a: np.eye(self.SIZES[a], dtype=np.float32)[c] for a, c in self.cues.items()}

    def step(self, actions):
        rewards = {a: float(actions[a] == self.cues[a]) for a in self.agents}
        self.t += 1
        truncs = {a: self.t >= 4 for a in self.agents}
        terms = {a: False for a in self.agents}
        done = self.t >= 4
        obs = self._observe()
        if done:
            self.agents = []
        return obs, rewards, terms, truncs, {a: {} for a in rewards}


def cues():
    return Cues()


class TextCues(Cues):
    """Cues of two among 2 for both agents (one shared policy), who also see a note, a Text
    leaf: a global state of every agent's observation would hold text."""

    SIZES = {"small": 2, "big": 2}

    def observation_space(self, agent):
        return gym.spaces.Dict({"cue": super().observation_space(agent),
                                "note": gym.spaces.Text(12)})

    def _observe(self):
        return {a: {"cue": cue, "note": "go"} for a, cue in super()._observe().items()}


def text_cues():
    return TextCues()


class Mixed(Seeded):
    """Agent "disc" answers a cue among 2 (Discrete(2)); agent "cont" steers a Box(1) action
    towards a target it sees (reward -|a - target|). 4 steps an episode. ``cont_size``: the
    size of cont's Box, whose first entry is the one that counts."""

    metadata = {"name": "mixed"}
    possible_agents = ["disc", "cont"]

    def __init__(self, cont_size: int = 1):
        super().__init__()
        self.cont_size = cont_size

    def observation_space(self, agent):
        return gym.spaces.Box(-1.0, 1.0, (2,) if agent == "disc" else (1,), np.float32)

    def action_space(self, agent):
        return gym.spaces.Discrete(2) if agent == "disc" else gym.spaces.Box(
            -1.0, 1.0, (self.cont_size,), np.float32)

    def _observe(self):
        self.cue, self.target = int(self.rng.integers(2)), float(self.rng.uniform(-1, 1))
        return {"disc": np.eye(2, dtype=np.float32)[self.cue],
                "cont": np.array([self.target], np.float32)}

    def step(self, actions):
        assert actions["disc"] in (0, 1) and np.shape(actions["cont"]) == (self.cont_size,)
        rewards = {"disc": float(actions["disc"] == self.cue),
                   "cont": -abs(float(np.clip(actions["cont"][0], -1, 1)) - self.target)}
        self.t += 1
        done = self.t >= 4
        obs = self._observe()
        if done:
            self.agents = []
        return (obs, rewards, {a: False for a in rewards}, {a: done for a in rewards},
                {a: {} for a in rewards})


def mixed():
    return Mixed()


def mixed_many():
    """Mixed with a Box of 6 for "cont": more than four continuous dimensions."""
    return Mixed(cont_size=6)


class TicTacToe(ParallelEnv):
    """Tic-tac-toe as a ParallelEnv: both players act every step, only the mover's action
    counts. Observation: {"observation": the board from the player's side (own marks 1,
    the other's -1) and whose turn it is, "action_mask": the empty cells when it is this
    player's turn, any cell otherwise}. +1 to the winner, -1 to the loser, 0 a draw.
    ``first``: who moves first; alternate it (options={"first": ...}) for fair games."""

    metadata = {"name": "tictactoe_parallel"}
    possible_agents = ["player_0", "player_1"]
    LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]

    def __init__(self):
        self.agents = []
        self.games = 0

    def observation_space(self, agent):
        return gym.spaces.Dict({"observation": gym.spaces.Box(-1.0, 1.0, (10,), np.float32),
                                "action_mask": gym.spaces.MultiBinary(9)})

    def action_space(self, agent):
        return gym.spaces.Discrete(9)

    def _obs(self):
        out = {}
        for k, a in enumerate(self.possible_agents):
            sign = 1.0 if k == 0 else -1.0
            turn = 1.0 if self.mover == k else 0.0
            mask = (self.board == 0) if self.mover == k else np.ones(9, bool)
            out[a] = {"observation": np.append(self.board * sign, turn).astype(np.float32),
                      "action_mask": mask.astype(np.int8)}
        return out

    def reset(self, seed=None, options=None):
        self.board = np.zeros(9, np.float32)
        first = (options or {}).get("first")
        self.mover = self.games % 2 if first is None else first
        self.games += 1
        self.agents = list(self.possible_agents)
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        k = self.mover
        cell = int(actions[self.possible_agents[k]])
        assert self.board[cell] == 0, "an illegal move got through the mask"
        self.board[cell] = 1.0 if k == 0 else -1.0
        won = any(abs(self.board[list(line)].sum()) == 3 for line in self.LINES)
        end = won or not (self.board == 0).any()
        rewards = {a: 0.0 for a in self.agents}
        if won:
            rewards[self.possible_agents[k]], rewards[self.possible_agents[1 - k]] = 1.0, -1.0
        self.mover = 1 - k
        obs = self._obs()
        terms = {a: end for a in self.agents}
        infos = {a: {} for a in self.agents}
        if end:
            self.agents = []
        return obs, rewards, terms, {a: False for a in terms}, infos


def tictactoe():
    return TicTacToe()


class Joining(Leaving):
    """Agents a0 and a1 from the start; a2 joins after the first step. Every agent repeats its
    cue for a reward of 1; the episode ends (truncated) after 3 steps."""

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents, self.t = ["a0", "a1"], 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (sorted(actions), self.agents)
        self.t += 1
        rewards = {a: float(int(actions[a]) == self.cues[a]) for a in self.agents}
        end = self.t >= 3
        truncs = {a: end for a in self.agents}
        terms = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        if end:
            obs = {a: np.zeros(2, np.float32) for a in self.agents}
            self.agents = []
            return obs, rewards, terms, truncs, infos
        if self.t == 1:
            self.agents = ["a0", "a1", "a2"]
        return self._obs(), rewards, terms, truncs, infos


def joining():
    return Joining()


class Signal(AECEnv):
    """A turn-based game (PettingZoo AECEnv, legal moves in the observation's "action_mask"):
    player_0 moves, then player_1, then the game ends. Each sees its seat and the other's move
    (one-hot); moves are 0 and 1, move 2 is never legal (playing it raises). At the end, on
    player_1's move, player_0 gets +1 if it played 1 and player_1 gets +1 if it copied player_0:
    player_0's reward comes on the other agent's move. Best play returns 1 to each, random 0.5."""

    metadata = {"name": "signal"}

    def __init__(self):
        self.possible_agents = ["player_0", "player_1"]

    @functools.lru_cache(maxsize=None)
    def observation_space(self, agent):
        return gym.spaces.Dict({"observation": gym.spaces.Box(0.0, 1.0, (4,), np.float32),
                                "action_mask": gym.spaces.Box(0, 1, (3,), np.int8)})

    @functools.lru_cache(maxsize=None)
    def action_space(self, agent):
        return gym.spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection, self.moves = "player_0", {}

    def observe(self, agent):
        seat = self.possible_agents.index(agent)
        obs = np.zeros(4, np.float32)
        obs[seat] = 1.0
        other = self.possible_agents[1 - seat]
        if other in self.moves:
            obs[2 + self.moves[other]] = 1.0
        to_move = agent == self.agent_selection and not self.terminations.get(agent, True)
        return {"observation": obs, "action_mask": np.array([1, 1, 0] if to_move else [0, 0, 0], np.int8)}

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        if action not in (0, 1):
            raise ValueError(f"{agent} played the illegal move {action!r}")
        self.moves[agent] = int(action)
        self.rewards = {a: 0.0 for a in self.agents}
        if agent == "player_0":
            self.agent_selection = "player_1"
        else:
            self.rewards["player_0"] = float(self.moves["player_0"] == 1)
            self.rewards["player_1"] = float(action == self.moves["player_0"])
            self.terminations = {a: True for a in self.agents}
            self.agent_selection = "player_0"  # the finished agents are stepped out in order
        self._cumulative_rewards[agent] = 0.0
        self._accumulate_rewards()


def signal():
    return Signal()
