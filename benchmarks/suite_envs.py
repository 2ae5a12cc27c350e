"""Env factories of the learning suite (module-level, so worker processes can import them).

Each env is built as a user would bring it to asyncrl; ``sb3_view`` wraps one for
Stable-Baselines3's ``PPO`` where SB3 cannot take its spaces as they come (a ``Tuple`` or a
``Dict`` holding a 7 x 7 grid that SB3's image check sends to its NatureCNN): flattened, the
same information.
"""
from __future__ import annotations

import gymnasium as gym
import numpy as np


def minigrid(name: str) -> gym.Env:
    """A MiniGrid task with its text mission dropped: ``Dict(image: uint8 7x7x3 grid of object,
    colour and state ids; direction: Discrete(4))``."""
    import minigrid  # noqa: F401  (registers the ids)
    env = gym.make(name)
    return gym.wrappers.FilterObservation(env, ["image", "direction"])


def minigrid_empty8():
    return minigrid("MiniGrid-Empty-8x8-v0")


def minigrid_doorkey5():
    return minigrid("MiniGrid-DoorKey-5x5-v0")


def minigrid_unlock():
    return minigrid("MiniGrid-Unlock-v0")


def minigrid_keycorridor():
    return minigrid("MiniGrid-KeyCorridorS3R1-v0")


def minigrid_lavagap():
    return minigrid("MiniGrid-LavaGapS5-v0")


def minigrid_dynamic_obstacles():
    return minigrid("MiniGrid-Dynamic-Obstacles-5x5-v0")


def minigrid_crossing():
    return minigrid("MiniGrid-SimpleCrossingS9N1-v0")


def minigrid_doorkey8():
    return minigrid("MiniGrid-DoorKey-8x8-v0")


def minigrid_lavacrossing():
    return minigrid("MiniGrid-LavaCrossingS9N1-v0")


def minigrid_redbluedoors6():
    return minigrid("MiniGrid-RedBlueDoors-6x6-v0")


def minigrid_mission(name: str) -> gym.Env:
    """A MiniGrid or BabyAI task as it comes: ``Dict(image, direction, mission)``, the mission
    its text (a MissionSpace), which asyncrl stores as word ids (asyncrl.spaces.encode_text)."""
    import minigrid  # noqa: F401  (registers the ids)
    return gym.make(name)


def minigrid_gotodoor5():
    return minigrid_mission("MiniGrid-GoToDoor-5x5-v0")


def minigrid_gotodoor5_nomission():
    return minigrid("MiniGrid-GoToDoor-5x5-v0")


def minigrid_fetch5():
    return minigrid_mission("MiniGrid-Fetch-5x5-N2-v0")


def minigrid_fetch5_nomission():
    return minigrid("MiniGrid-Fetch-5x5-N2-v0")


def minigrid_gotoobject8():
    return minigrid_mission("MiniGrid-GoToObject-8x8-N2-v0")


def minigrid_gotoobject8_nomission():
    return minigrid("MiniGrid-GoToObject-8x8-N2-v0")


def minigrid_fetch8():
    return minigrid_mission("MiniGrid-Fetch-8x8-N3-v0")


def minigrid_fetch8_nomission():
    return minigrid("MiniGrid-Fetch-8x8-N3-v0")


def babyai_gotolocal():
    return minigrid_mission("BabyAI-GoToLocalS6N2-v0")


def babyai_gotolocal_nomission():
    return minigrid("BabyAI-GoToLocalS6N2-v0")


def cliffwalking():
    """Gymnasium's CliffWalking (``Discrete(48)`` states): it has no time limit of its own (a
    fall sends the agent back to the start), so episodes end at 200 steps here."""
    return gym.wrappers.TimeLimit(gym.make("CliffWalking-v1"), 200)


def nasim(name: str, generated: str = "") -> gym.Env:
    """A NASim scenario, ended at its step limit. Unmasked: nasim 0.12's ``get_action_mask()``
    raises (``'Network' object has no attribute 'host_discovered'``). A ``generated`` scenario
    (NASim's "*Gen" ids) is generated from seed 0: the ids draw a new network at every
    ``gym.make``, so each env of a run (and the evaluation's) would be another network."""
    import nasim as _nasim  # noqa: F401  (registers the ids)
    from nasim.scenarios import make_benchmark_scenario
    env = gym.make(name, **({"scenario": make_benchmark_scenario(generated, 0)} if generated else {}))
    return gym.wrappers.TimeLimit(env, env.unwrapped.scenario.step_limit)


def nasim_tiny_hard():
    return nasim("TinyHard-v0")


def nasim_tiny_hard_md():
    """NASim tiny-hard with ``MultiDiscrete`` actions (its "VA" ids)."""
    return nasim("TinyHardVA-v0")


def nasim_small():
    return nasim("Small-v0")


def nasim_small_md():
    """NASim small with ``MultiDiscrete`` actions (its "VA" ids)."""
    return nasim("SmallVA-v0")


def nasim_medium():
    return nasim("Medium-v0")


def nasim_medium_md():
    return nasim("MediumVA-v0")


def nasim_small_honeypot():
    """NASim small with a honeypot: host (3, 2) is worth -100 once compromised."""
    return nasim("SmallHoneypot-v0")


def nasim_small_linear():
    """NASim small with its subnets in a line: the sensitive hosts (3, 0) and (4, 0) at its end."""
    return nasim("SmallLinear-v0")


def nasim_medium_single_site():
    """NASim's medium-single-site scenario: 16 hosts, sensitive (1, 3) and (1, 8)."""
    return nasim("MediumSingleSite-v0")


def nasim_medium_multi_site():
    """NASim's medium-multi-site scenario: 16 hosts, sensitive (2, 1) and (3, 4)."""
    return nasim("MediumMultiSite-v0")


def nasim_small_po():
    """NASim small, partially observable: each step shows only what the last action revealed
    (the hosts' state is not in the observation), so a policy must remember what it learnt."""
    return nasim("SmallPO-v0")


def nasim_large_gen():
    """NASim's generated large scenario: 23 hosts, 322 flat actions, sensitive (2, 0) and (7, 0),
    5,000 steps; every action costs 1 and every other host is worth 1."""
    return nasim("LargeGen-v0", "large-gen")


def nasim_large_gen_md():
    """NASim's generated large scenario with ``MultiDiscrete`` actions (its "VA" id)."""
    return nasim("LargeGenVA-v0", "large-gen")


def nasim_huge_gen():
    """NASim's generated huge scenario: 38 hosts, 684 flat actions, 1,560 observations, sensitive
    (2, 0) and (10, 0), 10,000 steps; every action costs 1 and every other host is worth 1."""
    return nasim("HugeGen-v0", "huge-gen")


def taxi():
    """Gymnasium's Taxi: ``Discrete(500)`` states, ``info["action_mask"]`` (read by asyncrl)."""
    return gym.make("Taxi-v4")


def frozenlake():
    return gym.make("FrozenLake-v1")


def blackjack():
    """``Tuple(Discrete(32), Discrete(11), Discrete(2))`` observations."""
    return gym.make("Blackjack-v1")


def popgym(name: str) -> gym.Env:
    import popgym as _popgym  # noqa: F401
    return gym.make(f"popgym-{name}-v0")


def repeat_previous():
    return popgym("RepeatPreviousEasy")


def position_only_cartpole():
    return popgym("PositionOnlyCartPoleEasy")


def position_only_pendulum():
    """popgym's PositionOnlyPendulumEasy: Pendulum without its angular velocity (``cos``, ``sin``
    of the angle), a continuous torque; popgym scales the return to [-1, 1] (a step's reward
    ``(1 + r / 8.137) / 200`` of Pendulum's ``r``). Memory and a ``Box`` action together."""
    return popgym("PositionOnlyPendulumEasy")


def repeat_first():
    return popgym("RepeatFirstEasy")


def count_recall():
    """popgym's CountRecallEasy: each step deals a card of two colours and names a colour, a
    ``MultiDiscrete([2, 2])`` observation; the agent answers how many cards of the colour named
    the step before it has seen (``Discrete(27)``), +-1/51 a step over 51 steps."""
    return popgym("CountRecallEasy")


def minesweeper():
    """popgym's MineSweeperEasy: a 4 x 4 board, 2 mines, ``MultiDiscrete([4, 4])`` actions (the
    cell to reveal); the observation is the revealed cell's count with the previous action
    (popgym's ``PreviousAction``: the task is specified with it), a ``Tuple``. Memory and
    factored actions together."""
    from popgym.envs.minesweeper import MineSweeperEasy
    from popgym.wrappers import PreviousAction
    return PreviousAction(MineSweeperEasy())


def _spread(n: int = 3, continuous: bool = False):
    """MPE2's simple_spread with ``n`` agents and landmarks (one-line factories below: the suite's
    cases need a picklable function each)."""
    from mpe2 import simple_spread_v3
    return simple_spread_v3.parallel_env(N=n, continuous_actions=continuous)


def simple_spread():
    return _spread()


def simple_spread6():
    """simple_spread with six agents and six landmarks (MPE2's ``N=6``): twice the lanes an env
    of the three-agent row, 36 observations an agent, the same five discrete moves."""
    return _spread(6)


def simple_spread8():
    """simple_spread with eight agents and eight landmarks (MPE2's ``N=8``): 48 observations an
    agent, a 384-float state (every agent's observation side by side)."""
    return _spread(8)


def simple_spread_continuous():
    """simple_spread with MPE2's continuous actions: each agent's ``Box(0, 1, (5,))``, a force
    for no move and each of the four directions (the discrete form picks one of the five)."""
    return _spread(continuous=True)


def simple_reference():
    """MPE2's simple_reference: two agents sharing one policy, each told the colour of the
    landmark the *other* must reach and able to say one of ten words (``Discrete(50)``: five
    moves times ten words); the reward, half shared, pays each agent's distance from its goal."""
    from mpe2 import simple_reference_v3
    return simple_reference_v3.parallel_env()


def speaker_listener():
    """MPE2's simple_speaker_listener as it comes: a speaker that sees the goal landmark's colour
    and says one of three words (``Box(3)``, ``Discrete(3)``), a listener that hears the word and
    moves (``Box(11)``, ``Discrete(5)``); the reward, shared, is minus the listener's squared
    distance from the goal, 25 steps. Agents of different spaces: asyncrl trains a policy for
    each by default, SB3's shared policy sees them padded to one pair (``sb3_shared_policy_env``)."""
    from mpe2 import simple_speaker_listener_v4
    return simple_speaker_listener_v4.parallel_env()


def collect_treasure():
    """MPE2's collect_treasure as it comes: six collectors (``Box(86)``) pick up treasures of two
    types and carry each to the deposit of its type, two deposits (``Box(84)``; a deposit does
    not see its own type) move to meet them; every agent moves (``Discrete(5)``), 25 steps. The
    reward: +5 to every agent for each pickup and each delivery, each agent's distance shaping
    (a collector's to its next goal, a deposit's to the collectors), -5 a step to a collector
    that overlaps another. Agents of different spaces: asyncrl trains a policy for each kind by
    default (the collectors' scored); SB3's shared policy sees them padded to one pair."""
    from mpe2 import collect_treasure_v1
    return collect_treasure_v1.parallel_env()


def multiwalker():
    """PettingZoo's SISL multiwalker: three bipedal walkers carry a package, each a
    ``Box(-1, 1, (4,))`` of joint torques and 31 observations; the reward, shared, pays the
    package's progress, -10 for a walker's fall, -100 where a fall or the package's ends it."""
    from pettingzoo.sisl import multiwalker_v9
    return multiwalker_v9.parallel_env()


def pursuit():
    """PettingZoo's SISL pursuit: eight pursuers sharing one policy chase 30 randomly moving
    evaders on a 16 x 16 grid (500 steps, or until every evader is caught). Each sees a 7 x 7
    window around it as a ``Box(0, 30, (7, 7, 3))`` of float counts (walls, pursuers, evaders),
    moves one of ``Discrete(5)``; an evader surrounded is removed, paying 5 to each pursuer around
    it, a touch pays 0.01, every step costs 0.1, the reward shared among the pursuers."""
    from pettingzoo.sisl import pursuit_v5
    return pursuit_v5.parallel_env()


class IntAction(gym.ActionWrapper):
    """A ``Discrete`` action as a Python int (SB3 steps envs with numpy integers, which NASim's
    flat action space refuses)."""

    def action(self, action):
        return int(action)


def _large_image(space: gym.Space) -> bool:
    """An image SB3's NatureCNN takes (uint8, 3 dimensions, at least 36 x 36)."""
    return (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
            and sorted(space.shape)[1] >= 36)


def sb3_view(env: gym.Env) -> gym.Env:
    """``env`` as SB3's ``PPO`` can take it: ``Tuple`` observations and ``Dict`` ones without a
    large image (MiniGrid's 7 x 7 grid) flattened to one vector (Discrete parts one-hot), a
    ``Dict`` with one (VizDoom's screen) left to SB3's ``MultiInputPolicy``; a ``MultiDiscrete``
    observation one-hot per dimension, as SB3 encodes it (sb3-contrib's ``RecurrentPPO`` takes no
    ``MultiDiscrete`` observation with torch 2.13: its LSTM's ``input_size`` comes out a numpy
    int64, a TypeError); ``Discrete`` actions as ints; others unchanged."""
    space = env.observation_space
    if isinstance(space, (gym.spaces.Tuple, gym.spaces.MultiDiscrete)) or (
            isinstance(space, gym.spaces.Dict) and not any(map(_large_image, space.values()))):
        env = gym.wrappers.FlattenObservation(env)
    if isinstance(env.action_space, gym.spaces.Discrete):
        env = IntAction(env)
    return env
