"""Turn-based games (PettingZoo's ``AECEnv``: connect four, chess, poker, Hanabi) seen as a
``ParallelEnv`` that moves one agent per step, so every multi-agent path of the engine steps
them: lanes, masks, shared/frozen/rule-based policies, self-play, ``evaluate``.

Each step of the view applies the action of the agent whose turn it is (``movers``); every live
agent gets its observation (``env.observe``) and the reward the move credited to it. An agent
that did not move in a step is *waiting*: its lane's row holds the reward credited to it (an
opponent's winning move gives it -1 there) but no decision of its own, so the rollout worker marks
the row ``waiting`` and the learner passes through it (see learner.Learner.targets): the return
of a move is the sum credited to its agent until its next move or the game's end, and only moves
are trained on by the policy loss.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional


def is_aec_env(env: Any) -> bool:
    """PettingZoo's AEC API, by duck typing (pettingzoo stays optional; ``agent_selection`` and
    ``rewards`` appear only after reset)."""
    return all(callable(getattr(env, name, None))
               for name in ("observe", "last", "agent_iter", "step", "observation_space"))


def movers(env: Any) -> List[str]:
    """The agents whose actions a step of ``env`` applies: every live agent of a ParallelEnv,
    the one whose turn it is in a turn-based game."""
    return env.movers if isinstance(env, TurnBasedEnv) else list(env.agents)


class TurnBasedEnv:
    """A PettingZoo ``AECEnv`` as a ``ParallelEnv`` that moves one agent per step (see the
    module's docstring). ``step(actions)`` reads only ``actions[agent to move]``; agents whose
    game is over are stepped out (PettingZoo's ``step(None)``) before the step returns, so
    ``agents`` is empty once the game ended. ``state()`` and ``state_space`` are the game's
    (a centralised critic's input), where it has them."""

    def __init__(self, env: Any):
        self.env = env
        self.possible_agents = list(env.possible_agents)

    def observation_space(self, agent: str):
        return self.env.observation_space(agent)

    def action_space(self, agent: str):
        return self.env.action_space(agent)

    @property
    def agents(self) -> List[str]:
        return list(self.env.agents)

    @property
    def movers(self) -> List[str]:
        return [self.env.agent_selection] if self.env.agents else []

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None):
        self.env.reset(seed=seed, options=options)
        self._step_out_finished()
        return self._observations(), self._infos()

    def step(self, actions: Dict[str, Any]):
        agent = self.env.agent_selection
        if agent not in actions:
            raise ValueError(f"it is the turn of {agent!r} in this turn-based game, but the actions "
                             f"are for {sorted(actions)}")
        self.env.step(actions[agent])
        rewards = {a: float(r) for a, r in self.env.rewards.items()}
        terms, truncs = dict(self.env.terminations), dict(self.env.truncations)
        infos = self._infos()
        self._step_out_finished()
        return self._observations(), rewards, terms, truncs, infos

    def _step_out_finished(self) -> None:
        """PettingZoo's AEC API: an agent whose game ended is stepped with None, on its turn,
        until it is removed."""
        env = self.env
        while env.agents and (env.terminations.get(env.agent_selection)
                              or env.truncations.get(env.agent_selection)):
            env.step(None)

    def _observations(self) -> Dict[str, Any]:
        return {a: self.env.observe(a) for a in self.env.agents}

    def _infos(self) -> Dict[str, dict]:
        return {a: dict(info) for a, info in self.env.infos.items()}

    def close(self) -> None:
        self.env.close()

    @property
    def state_space(self):
        return self.env.state_space  # AttributeError where the game declares none

    def state(self):
        return self.env.state()

    def __repr__(self):
        return f"TurnBasedEnv({self.env})"


class TurnBased:
    """A picklable env factory: the user's factory of an ``AECEnv``, its games as
    ``TurnBasedEnv``s."""

    def __init__(self, factory: Callable):
        self.factory = factory

    def __call__(self) -> TurnBasedEnv:
        return TurnBasedEnv(self.factory())

    def __repr__(self):
        return f"TurnBased({self.factory!r})"
