"""Turn-based games (PettingZoo AECEnv): each agent acts on its turn, its reward is what is
credited to it until its next move, masks come from the observation, rows without a move train
the value and not the policy, and the multi-agent paths (shared policy, rule-based opponents,
evaluate, predict) work as for ParallelEnvs."""
import gymnasium as gym
import numpy as np
import pytest
import torch

import ma_envs
from asyncrl import APPO, ConfigError
from asyncrl.config import TURN_BASED_DEFAULTS, Config
from asyncrl.losses import ppo_loss
from asyncrl.multiagent import AgentView
from asyncrl.turns import TurnBasedEnv
from test_learner import T, B, make_learner, on_policy_batch
from test_multiagent import FAST, batches  # noqa: F401 (a fixture)


def connect_four():
    from pettingzoo.classic import connect_four_v3
    return connect_four_v3.env()


@pytest.mark.timeout(30)
def test_a_game_ending_on_the_other_agents_move_credits_both_and_ends_both():
    env = TurnBasedEnv(connect_four())
    obs, _ = env.reset(seed=0)
    assert env.movers == ["player_0"] and set(obs) == {"player_0", "player_1"}
    assert not obs["player_1"]["action_mask"].any()  # not its turn
    # player_0 fills column 0, player_1 column 1: player_0 wins on its fourth move
    for move in range(7):
        agent = env.movers[0]
        obs, rewards, terms, _, _ = env.step({agent: 0 if agent == "player_0" else 1,
                                              "someone else": 5})  # only the mover's is read
        if move < 6:
            assert env.agents == ["player_0", "player_1"] and not any(rewards.values())
    assert rewards == {"player_0": 1.0, "player_1": -1.0} and all(terms.values())
    assert env.agents == [] and env.movers == [] and obs == {}
    with pytest.raises(ValueError, match="turn of .player_0."):
        env.reset(seed=1)
        env.step({"player_1": 3})


def test_rows_without_a_move_pass_the_return_on_undiscounted():
    """A move at row 0, the agent waits at row 1 (the opponent's move credits it r_1), the
    game ends at row 2: v_1 = r_1 + v_2 (no discount, no trace cut by lambda), and row 0's
    target is V-trace's with lambda."""
    learner = make_learner(gamma=0.9, vtrace_lambda=0.5)
    batch = on_policy_batch(learner, done_at=(2, 0), truncated=False)
    waiting = torch.zeros(T, B, dtype=torch.bool)
    waiting[1, 0] = True
    rewards = torch.zeros(T, B)
    rewards[0, 0], rewards[1, 0], rewards[2, 0] = 1.0, -1.0, 2.0
    batch = batch._replace(rewards=rewards, waiting=waiting,
                           log_probs=batch.log_probs.masked_fill(waiting, -50.0))  # any action
    vt, values, _ = learner.targets(batch, {"obs": batch.obs["obs"].flatten(0, 1)}, None)
    v = values[:, 0]
    assert vt.vs[2, 0].item() == pytest.approx(2.0, abs=1e-5)
    assert vt.vs[1, 0].item() == pytest.approx(-1.0 + 2.0, abs=1e-5)
    expected = 1.0 + 0.9 * v[1] + 0.9 * 0.5 * (1.0 - v[1])
    assert vt.vs[0, 0].item() == pytest.approx(float(expected), abs=1e-5)


def test_the_policy_terms_leave_out_rows_without_a_move():
    torch.manual_seed(0)
    n = 8
    new, old, adv = torch.randn(n), torch.randn(n), torch.randn(n)
    values, returns, entropy = torch.randn(n), torch.randn(n), torch.rand(n)
    moves = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1], dtype=torch.float32)
    kw = dict(clip_coef=0.2, vf_clip_coef=None, ent_coef=0.01, vf_coef=0.5)
    both = ppo_loss(new, old, adv, values, values, returns, entropy, mask=torch.ones(n),
                    pg_mask=moves, **kw)
    only = ppo_loss(new[moves > 0], old[moves > 0], adv[moves > 0], values, values, returns,
                    entropy[moves > 0], **kw)
    every = ppo_loss(new, old, adv, values, values, returns, entropy, **kw)
    assert both.pg_loss == pytest.approx(float(only.pg_loss))
    assert both.entropy_loss == pytest.approx(float(only.entropy_loss))
    assert both.v_loss == pytest.approx(float(every.v_loss))  # the value learns from every row


@pytest.mark.timeout(90)
def test_self_play_of_a_turn_based_game_credits_rewards_across_turns_and_learns(batches):
    """Both seats play the shared policy; player_0's reward comes on player_1's move."""
    with APPO(ma_envs.signal, serial_mode=True, **FAST) as model:
        assert model.config.lanes_per_env == 2
        before = model.evaluate(20, seed=0)[0]
        model.train(12_000)
        after = model.evaluate(20, seed=0)[0]
        hero = model.predict({"observation": np.array([1, 0, 0, 0], np.float32),
                              "action_mask": np.array([1, 1, 0], np.int8)}, deterministic=True)[0]
    assert before < 0.9 and after == pytest.approx(1.0) and int(hero) == 1
    checked = 0
    for b in batches:
        waiting = b.waiting.view(b.waiting.shape[0], -1, 2)  # [T, envs, lanes]
        assert bool((waiting.sum(-1) == 1).all())  # one agent moves each step, the other waits
        acted = b.actions.view(*waiting.shape)[~waiting]
        assert bool((acted < 2).all())  # the illegal move is never played
        rewards = b.rewards.view(*waiting.shape)
        # player_0 (lane 0: it appears first) is paid only while waiting, as the game ends
        assert bool((rewards[..., 0][~waiting[..., 0]] == 0).all())
        assert bool(b.dones.view(*waiting.shape)[..., 0][rewards[..., 0] != 0].all())
        checked += int(waiting.numel())
    assert checked > 1000


@pytest.mark.timeout(60)
def test_a_rule_based_opponent_moves_only_on_its_turn():
    def bot(obs):
        assert obs["action_mask"].any(), "asked to move out of turn"
        return 0

    with APPO(ma_envs.signal, policies={"hero": None, "bot": bot},
              policy_mapping=lambda agent: "hero" if agent == "player_1" else "bot",
              serial_mode=True, **FAST) as model:
        model.train(6_000)
        assert model.evaluate(20, seed=0, policy_id="hero")[0] == pytest.approx(1.0)  # copies 0
        # one agent's view for single-agent tools: the bot moves first, then it is the hero's turn
        view = AgentView(model.env_factory(), model.agents, "hero", model._agent_actor(True))
        obs, _ = view.reset(seed=0)
        assert view.agent == "player_1" and obs["observation"][2] == 1.0  # sees the bot's 0
        _, reward, terminated, _, _ = view.step(0)
        assert reward == 1.0 and terminated


class Uneven(ma_envs.Signal):
    """Signal with a fourth move, never legal, for player_1 (its mask one entry longer)."""

    def observation_space(self, agent):
        space = super().observation_space(agent)
        if agent == "player_0":
            return space
        return gym.spaces.Dict({**space.spaces, "action_mask": gym.spaces.Box(0, 1, (4,), np.int8)})

    def action_space(self, agent):
        return gym.spaces.Discrete(3 if agent == "player_0" else 4)

    def observe(self, agent):
        obs = super().observe(agent)
        if agent == "player_1":
            obs["action_mask"] = np.append(obs["action_mask"], np.int8(0))
        return obs


@pytest.mark.timeout(30)
def test_a_mask_declared_shorter_than_the_action_space_is_a_clear_error_for_every_seat():
    class Short(Uneven):  # player_1's mask of 3 entries for its 4 moves, and it does not move first
        observation_space = ma_envs.Signal.observation_space
        observe = ma_envs.Signal.observe

    with pytest.raises(ConfigError, match='"action_mask" is Box.*needs 4 entries'):
        APPO(Short, serial_mode=True, **FAST)


@pytest.mark.timeout(30)
def test_a_turn_based_game_whose_seats_differ_under_one_policy_is_a_clear_error():
    with pytest.raises(ConfigError, match="'player_0' and 'player_1' both may play policy "
                                          "'policy' but their observation spaces differ"):
        APPO(Uneven, policies={"policy": None}, policy_mapping=lambda agent: "policy",
             serial_mode=True, **FAST)


@pytest.mark.timeout(60)
def test_a_turn_based_game_whose_seats_differ_trains_a_policy_per_seat_by_default():
    with APPO(Uneven, serial_mode=True, **FAST) as model:
        assert list(model.trainees) == ["player_0", "player_1"]
        assert model.get_parameters()["player_1"]["action_head.weight"].shape[0] == 4
        model.train(500)
        assert model.trainees["player_1"].num_timesteps >= 500


@pytest.mark.timeout(60)
def test_a_turn_based_game_implies_the_larger_entropy_bonus_and_a_parallel_game_does_not():
    """Self-play's opponent is the policy itself: a turn-based game keeps more entropy."""
    with APPO(ma_envs.signal, serial_mode=True, seed=0, verbose=0) as turns:
        assert turns.config.ent_coef == TURN_BASED_DEFAULTS["ent_coef"] > Config.ent_coef
    with APPO(ma_envs.signal, serial_mode=True, seed=0, verbose=0, ent_coef=0.0) as own:
        assert own.config.ent_coef == 0.0  # a keyword wins
    with APPO(ma_envs.rps, serial_mode=True, seed=0, verbose=0) as parallel:
        assert parallel.config.ent_coef == Config.ent_coef


@pytest.mark.timeout(120)
def test_connect_four_as_it_comes_trains_in_worker_processes_and_saves(tmp_path):
    with APPO(connect_four, num_workers=2, num_envs_per_worker=4, rollout=16, seed=0,
              verbose=0) as model:
        model.train(4_000)
        model.save(tmp_path / "c4.zip")
    loaded = APPO.load(tmp_path / "c4.zip")
    try:
        env = connect_four()
        env.reset(seed=0)
        obs = env.observe("player_0")
        assert obs["action_mask"][int(loaded.predict(obs, deterministic=True)[0])] == 1
        assert np.isfinite(loaded.evaluate(2, seed=0)[0])
    finally:
        loaded.close()
