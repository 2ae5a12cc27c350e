"""Multi-agent envs (PettingZoo ParallelEnv): a shared policy, a trained policy beside rule-based
ones, the mapping (fixed or per episode), agents that leave mid-episode, different spaces per
policy, parameters keyed by policy id, env crashes and clean shutdown."""
import os
import pickle
import signal
import threading

import numpy as np
import pytest
import torch

import ma_envs
from asyncrl import APPO, Config, ConfigError, SelfPlay
from asyncrl.learner import Learner
from asyncrl.multiagent import policies_by_space
from test_checkpoints import adam_steps
from test_multiprocess import worker_children

FAST = dict(num_workers=2, num_envs_per_worker=4, rollout=8, learning_rate=3e-3, ent_coef=0.01,
            seed=0, verbose=0)


@pytest.fixture
def batches(monkeypatch):
    """Every batch the (serial-mode) learner trains on."""
    seen = []
    original = Learner.train_on

    def train_on(self, batch):
        seen.append(batch)
        return original(self, batch)

    monkeypatch.setattr(Learner, "train_on", train_on)
    return seen


def hero_vs_bot(agent_id):
    return "hero" if agent_id == "player_0" else "bot"


@pytest.mark.timeout(60)
def test_a_shared_policy_plays_every_agent_and_learns():
    """No policies given: every agent has a lane of the one policy, the single-policy keys stay."""
    with APPO(ma_envs.leaving, serial_mode=True, **FAST) as model:
        assert model.config.lanes_per_env == 3
        assert model.config.batch_size % (8 * 2 * 3) == 0
        # sampled: the untrained policy is near uniform (its greedy moves may match the cues)
        before = model.evaluate(20, deterministic=False, seed=0)[0]
        model.train(15_000)
        after = model.evaluate(20, seed=0)[0]
        assert set(model.get_parameters()) == {"policy", "policy.optimizer"}
    # agents stay 1, 2, 3 steps: a perfect policy's mean return is 2, random play's 1
    assert before < 1.5 and after > 1.9


@pytest.mark.timeout(60)
def test_agents_leaving_mid_episode_are_masked_in_their_lanes(batches):
    with APPO(ma_envs.leaving, serial_mode=True, **FAST) as model:
        model.train(2_000)
    checked = 0
    for b in batches:
        # a0 leaves after 1 step, a1 after 2, a2 after 3; an episode lasts 3 steps. Lane k of an
        # env acts at steps 0..k of each episode and idles (version -1, done) after.
        versions = b.policy_versions.view(b.policy_versions.shape[0], -1, 3)  # [T, envs, lanes]
        dones = b.dones.view_as(versions)
        acting = versions >= 0
        assert bool(dones[~acting].all())
        assert bool((~acting[..., 0] | acting[..., 1]).all())  # a1 outlasts a0, a2 outlasts a1
        assert bool((~acting[..., 1] | acting[..., 2]).all())
        in_env = acting.sum(-1)  # agents in each env, step after step: 3, 2, 1, 3, 2, 1, ...
        nxt = {3: 2, 2: 1, 1: 3}
        assert all(nxt[int(a)] == int(b) for a, b in zip(in_env[:-1].flatten(), in_env[1:].flatten()))
        checked += int(acting.sum())
    assert checked > 1000


@pytest.mark.timeout(60)
def test_an_agent_joining_mid_episode_gets_its_lane_from_then_on(batches):
    with APPO(ma_envs.joining, serial_mode=True, **FAST) as model:
        model.train(1_500)
        lengths = set(model.logger.ep_lengths)
    for b in batches:
        acting = (b.policy_versions >= 0).view(b.policy_versions.shape[0], -1, 3)
        assert bool(acting[..., :2].all())  # a0 and a1 act at every step
        in_episode = acting[..., 2].int()   # a2: idle at each episode's first step only: 0, 1, 1
        nxt = {(0, 1), (1, 1), (1, 0)}
        for row in in_episode.transpose(0, 1):  # [envs, T]: never idle twice in a row
            for x, y in zip(row[:-1].tolist(), row[1:].tolist()):
                assert (x, y) in nxt
    assert lengths == {2, 3}  # a2's episodes are 2 steps long, a0's and a1's 3


@pytest.mark.timeout(60)
def test_a_trained_policy_learns_the_best_response_to_a_rule_based_one():
    """The bot always plays rock (a picklable function, run in the rollout workers); the hero
    learns paper: +1 a round. Both policies' returns are logged."""
    with APPO(ma_envs.rps, policies={"hero": None, "bot": ma_envs.rock_bot},
              policy_mapping=hero_vs_bot, serial_mode=True, **FAST) as model:
        assert model.config.lanes_per_env == 1  # a fixed mapping: only the hero's agent has a lane
        model.train(6_000)
        score, _ = model.evaluate(10, seed=0, policy_id="hero")
        bot_score, _ = model.evaluate(10, seed=0, policy_id="bot")
        scalars = model.logger.scalars()
        obs = np.zeros(3, np.float32)
        assert model.predict(obs, policy_id="bot")[0] == ma_envs.ROCK
        assert int(model.predict(obs, policy_id="hero", deterministic=True)[0]) == ma_envs.PAPER
    assert score == 5.0 and bot_score == -5.0
    assert scalars["rollout/ep_rew_mean"] > 3.0 and scalars["rollout/bot/ep_rew_mean"] < -3.0


def seat_by_episode(agent, episode):
    """The hero plays seat 0 in even episodes, seat 1 in odd ones."""
    return "hero" if int(agent[-1]) == episode % 2 else "bot"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("at_once", [None, 1])
def test_a_per_episode_mapping_gives_its_agents_lanes_and_masks_the_idle_ones(batches, at_once):
    """fn(agent_id, episode_idx): the hero plays either seat, one an episode. By default an env
    has a lane per agent (one idle: half the samples masked); with agents_per_env=1, one lane,
    which the hero's seat of the episode takes: none masked."""
    hero = None if at_once is None else {"agents_per_env": at_once}
    with APPO(ma_envs.rps, policies={"hero": hero, "bot": ma_envs.rock_bot},
              policy_mapping=seat_by_episode, serial_mode=True, **FAST) as model:
        assert model.config.lanes_per_env == (2 if at_once is None else 1)
        model.train(12_000)
        seat_scores = [model.evaluate(1, seed=0, policy_id="hero")[0],  # episode 0: seat 0
                       model.evaluate(2, seed=0, policy_id="hero")[0]]  # and 1: seat 1
    acting = torch.cat([(b.policy_versions >= 0).float().flatten() for b in batches])
    if at_once is None:
        assert 0.4 < float(acting.mean()) < 0.6
    else:
        assert float(acting.mean()) == 1.0
    assert seat_scores == [5.0, 5.0]


@pytest.mark.timeout(60)
def test_more_agents_of_the_trained_policy_than_lanes_is_a_clear_error():
    with APPO(ma_envs.rps, policies={"hero": {"agents_per_env": 1}, "bot": ma_envs.rock_bot},
              policy_mapping=lambda agent, episode: "hero", serial_mode=True, **FAST) as model:
        with pytest.raises(ValueError, match="raise the policy's 'agents_per_env'"):
            model.train(1_000)


@pytest.mark.timeout(60)
def test_agents_with_different_spaces_map_to_different_policies():
    with pytest.raises(ConfigError, match="'small' and 'big' both may play policy 'shared' but "
                                          "their observation spaces differ"):
        APPO(ma_envs.two_shapes, policies={"shared": None}, policy_mapping=lambda agent: "shared",
             serial_mode=True, **FAST)
    small_only = lambda agent: "learner" if agent == "small" else "fixed"  # noqa: E731
    with APPO(ma_envs.two_shapes, policies={"learner": {"learning_rate": 1e-3}, "fixed": lambda obs: 3},
              policy_mapping=small_only, serial_mode=True, **FAST) as model:
        assert model.observation_space.shape == (3,) and model.action_space.n == 2
        assert model.config.learning_rate == 1e-3  # the policy's own override
        model.train(500)
        assert model.evaluate(3, policy_id="fixed")[0] == 1.0
    # a frozen policy with its own spaces (and model): a (5,) input, 4 actions
    with APPO(ma_envs.two_shapes, policies={"learner": None, "big": {"frozen": True,
                                                                     "policy_kwargs": {"net_arch": [8]}}},
              policy_mapping=lambda agent: "learner" if agent == "small" else "big",
              serial_mode=True, **FAST) as model:
        big = model.get_parameters()["big"]
        assert big["action_head.weight"].shape == (4, 8)
        assert model.get_parameters()["learner"]["action_head.weight"].shape[0] == 2
        model.train(500)  # the env asserts both actions are in their own spaces
        assert int(model.predict(np.zeros(5, np.float32), policy_id="big")[0]) in range(4)


@pytest.mark.timeout(60)
def test_parameters_are_keyed_by_policy_id_and_round_trip(tmp_path):
    kw = dict(policies={"hero": None, "bot": ma_envs.rock_bot}, policy_mapping=hero_vs_bot,
              serial_mode=True, **FAST)
    with APPO(ma_envs.rps, **kw) as trained, APPO(ma_envs.rps, **{**kw, "seed": 1}) as fresh:
        trained.train(1_000)
        params = trained.get_parameters()
        assert set(params) == {"hero", "hero.optimizer"}
        trained.save(tmp_path / "hero.pt")
        fresh.set_parameters({"hero": str(tmp_path / "hero.pt")})  # a checkpoint path per id
        for k, v in params["hero"].items():
            assert torch.equal(fresh.get_parameters()["hero"][k], v)
        with pytest.raises(KeyError, match="rule-based"):
            fresh.set_parameters({"bot": params["hero"]})
        with pytest.raises(KeyError, match="unknown parameter group"):
            fresh.set_parameters({"villain": params["hero"]})
        fresh.train(500)  # trains on from the weights it was given
        loaded = APPO.load(tmp_path / "hero.pt")  # the mapping and the bot come back
        assert loaded.agents.policy_of("player_1", 0) == "bot"
        obs = np.zeros(3, np.float32)
        assert loaded.predict(obs, policy_id="bot")[0] == ma_envs.ROCK
        for k, v in params["hero"].items():
            assert torch.equal(loaded.policy.state_dict()[k], v)
        loaded.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", ["none_trained", "graph_field", "dotted_id", "unknown_id", "mapping_raises", "unpicklable",
                                  "no_mapping", "single_agent", "lanes", "at_once"])
def test_bad_multi_agent_settings_fail_early_and_say_what_to_change(case):
    lock = threading.Lock()
    env, kw, match = ma_envs.rps, dict(policies={"hero": None, "bot": ma_envs.rock_bot},
                                       policy_mapping=hero_vs_bot), None
    if case == "none_trained":
        kw["policies"], match = {"hero": {"frozen": True}, "bot": ma_envs.rock_bot}, "none of"
    elif case == "graph_field":
        kw["policies"], match = {"hero": None, "bot": {"num_workers": 3}}, "shared by every policy"
        kw["policy_mapping"] = hero_vs_bot
    elif case == "dotted_id":
        kw["policies"], match = {"hero.v2": None, "bot": ma_envs.rock_bot}, "contains '.'"
        kw["policy_mapping"] = lambda agent: "hero.v2" if agent == "player_0" else "bot"
    elif case == "unknown_id":
        kw["policy_mapping"], match = (lambda agent: "nobody"), "not among the policies"
    elif case == "mapping_raises":
        kw["policy_mapping"], match = (lambda agent: {}[agent]), "policy_mapping failed for agent"
    elif case == "unpicklable":
        kw["policies"], match = {"hero": None, "bot": lambda obs, lock=lock: 0}, "cannot be pickled"
    elif case == "at_once":
        kw["policies"], match = {"hero": {"agents_per_env": 3}, "bot": ma_envs.rock_bot}, "from 1 to 1"
    elif case == "no_mapping":
        del kw["policy_mapping"]
        match = "no policy_mapping"
    elif case == "single_agent":
        env, match = "CartPole-v1", "single-agent"
    else:
        kw, match = {"lanes_per_env": 5}, "set by the engine"
    with pytest.raises((ConfigError, RuntimeError, ValueError), match=match):
        APPO(env, serial_mode=True, **FAST, **kw)


@pytest.mark.timeout(90)
def test_in_worker_processes_a_crashing_env_is_restarted_and_nothing_is_left():
    with APPO(ma_envs.leaving_failing, **{**FAST, "max_env_restarts": 3}) as model:
        model.train(6_000)
        assert model.logger.env_restarts > 0
        assert model.num_timesteps >= 6_000
    assert worker_children() == []


def hero_vs_opp(agent_id):
    return "hero" if agent_id == "player_0" else "opp"


def _always(params: dict, move: int) -> dict:
    """A frozen policy's weights that play ``move`` whatever they see."""
    out = {k: v.clone() for k, v in params.items()}
    out["action_head.bias"] = torch.full((3,), -20.0)
    out["action_head.bias"][move] = 20.0
    return out


@pytest.mark.timeout(90)
def test_a_frozen_policy_plays_the_weights_set_in_worker_processes_and_is_not_trained():
    with APPO(ma_envs.rps, policies={"hero": None, "opp": {"frozen": True}},
              policy_mapping=hero_vs_opp, **FAST) as model:
        params = model.get_parameters()
        assert set(params) == {"hero", "hero.optimizer", "opp"}
        rock = _always(params["opp"], ma_envs.ROCK)
        model.set_parameters({"opp": rock})
        model.train(10_000)
        score = model.evaluate(10, seed=0, policy_id="hero")[0]
        after = model.get_parameters()["opp"]
        scalars = model.logger.scalars()
    assert score == 5.0  # paper: the rollout workers played the rock the weights say
    assert all(torch.equal(after[k], rock[k]) for k in rock)
    assert scalars["rollout/opp/ep_rew_mean"] < -3.0
    assert worker_children() == []


@pytest.mark.timeout(60)
def test_self_play_keeps_a_pool_of_snapshots_the_rollout_workers_play():
    """Tic-tac-toe (masks in the observations): the hero plays a seat drawn per episode against a
    snapshot drawn from the pool; snapshot() replaces the oldest one between train() calls."""
    self_play = SelfPlay(["player_0", "player_1"], pool_size=2)
    with APPO(ma_envs.tictactoe, policies=self_play.policies,
              policy_mapping=self_play.policy_mapping, serial_mode=True, **FAST) as model:
        assert model.config.lanes_per_env == 1  # the hero plays one seat an episode, either
        self_play.fill(model)
        initial = model.get_parameters()["hero"]
        model.train(2_000)
        assert self_play.snapshot(model) == "hero_past_0"
        params = model.get_parameters()
        for k, v in params["hero"].items():
            assert torch.equal(params["hero_past_0"][k], v)
            assert torch.equal(params["hero_past_1"][k], initial[k])
        assert not all(torch.equal(params["hero"][k], initial[k]) for k in initial)
        model.train(500)  # the rollout worker reloads the snapshots
        worker = model._runner.components[0]
        for k, v in worker.frozen["hero_past_0"].model.state_dict().items():
            assert torch.equal(v, params["hero_past_0"][k])
        seats = {self_play.policy_mapping("player_0", ep) == "hero" for ep in range(20)}
        opponents = {self_play.policy_mapping(a, ep) for ep in range(20) for a in ("player_0", "player_1")}
    assert seats == {True, False} and opponents == {"hero", "hero_past_0", "hero_past_1"}


@pytest.mark.timeout(60)
def test_one_policys_set_parameters_leaves_the_others_alone():
    with APPO(ma_envs.rps, policies={"hero": None, "opp": {"frozen": True}},
              policy_mapping=hero_vs_opp, serial_mode=True, **FAST) as model:
        before = model.get_parameters()
        rock = _always(before["opp"], ma_envs.ROCK)
        model.set_parameters({"opp": rock})
        after = model.get_parameters()
        assert all(torch.equal(after["hero"][k], v) for k, v in before["hero"].items())
        assert model.policy_version == 0  # the hero's samples stay valid
        scissors = _always(before["opp"], ma_envs.SCISSORS)
        model.set_parameters({"hero": scissors})
        after = model.get_parameters()
        assert all(torch.equal(after["opp"][k], v) for k, v in rock.items())
        assert all(torch.equal(after["hero"][k], v) for k, v in scissors.items())
        with pytest.raises(ValueError, match="shape mismatch"):
            model.set_parameters({"opp": {**rock, "action_head.bias": torch.zeros(4)}})


@pytest.mark.timeout(60)
def test_get_env_gives_one_agents_view_for_stable_baselines3_tools():
    from stable_baselines3.common.evaluation import evaluate_policy
    with APPO(ma_envs.rps, policies={"hero": None, "bot": ma_envs.rock_bot},
              policy_mapping=hero_vs_bot, serial_mode=True, **FAST) as model:
        model.train(6_000)
        mean, _ = evaluate_policy(model, model.get_env(), n_eval_episodes=5)
        bot_view = model.get_env("bot")
        obs = bot_view.reset()
        assert obs.shape == (1, 3)
        with pytest.raises(KeyError, match="policies are"):
            model.get_env("nobody")
    assert mean == 5.0


@pytest.mark.timeout(120)
def test_a_sigkilled_rollout_worker_of_a_multi_agent_run_is_replaced():
    from test_worker_faults import wait_for_child
    killed_at = []

    def kill_then_train_on(model):
        if not model.num_timesteps:
            return None
        if not killed_at:
            os.kill(wait_for_child("rollout-0").pid, signal.SIGKILL)
            killed_at.append(model.num_timesteps)
            return None
        return False if model.num_timesteps >= killed_at[0] + 4_000 else None

    with APPO(ma_envs.leaving, **FAST) as model:
        model.train(10 ** 8, callback=kill_then_train_on, callback_interval=0.1)
        assert killed_at and model.logger.worker_restarts == 1
        assert model.num_timesteps >= killed_at[0] + 4_000
    assert worker_children() == []


@pytest.mark.timeout(60)
def test_recurrent_frozen_snapshots_keep_a_state_per_agent_and_episode():
    """use_rnn: the frozen snapshots run their GRU in the rollout worker, a state per (episode,
    agent), dropped when the episode ends."""
    self_play = SelfPlay(["player_0", "player_1"], pool_size=2)
    with APPO(ma_envs.tictactoe, policies=self_play.policies, policy_mapping=self_play.policy_mapping,
              serial_mode=True, use_rnn=True, rnn_size=16, **{**FAST, "rollout": 8}) as model:
        self_play.fill(model)
        model.train(1_000)
        worker = model._runner.components[0]
        states = [s for p in worker.frozen.values() for s in p.states.values()]
        live = {(g.episode_idx[i], a) for g in worker.groups for i in range(len(g.envs))
                for a in g.policy_of[i]}
        keys = {k for p in worker.frozen.values() for k in p.states}
        obs = ma_envs.TicTacToe().reset()[0]["player_0"]
        _, state = model.predict(obs, policy_id="hero_past_0", state=None)
    assert states and all(s.shape == (16,) and bool(s.abs().sum() > 0) for s in states)
    assert keys <= live  # only the episodes in progress keep states
    assert state.shape == (1, 1, 16)


# --- several trained policies: a slot pool, policy workers and a learner each ------------------
TWO = dict(policies={"small": None, "big": {"learning_rate": 2e-3, "num_epochs": 2,
                                            "policy_kwargs": {"net_arch": [32]}}},
           policy_mapping=lambda agent: agent)


@pytest.mark.timeout(60)
def test_two_trained_policies_with_their_own_spaces_and_settings_learn_at_once():
    """Cues: "small" (2 cues) and "big" (4 cues, its own learning rate, epochs and network)
    each learn to answer their cue; both are trained in the same run, on their own samples."""
    with APPO(ma_envs.cues, serial_mode=True, **{**FAST, **TWO}) as model:
        small, big = model.trainees["small"], model.trainees["big"]
        assert small.config.learning_rate == 3e-3
        assert big.config.learning_rate == 2e-3
        assert big.config.num_epochs == 2
        assert model.get_parameters()["big"]["action_head.weight"].shape == (4, 32)
        before = model.evaluate(40, seed=0, deterministic=False, policy_id="big")[0]
        model.train(6_000)
        after = {pid: model.evaluate(40, seed=0, policy_id=pid)[0] for pid in ("small", "big")}
        assert small.num_timesteps >= 6_000 and big.num_timesteps >= 6_000
        assert model.num_timesteps == small.num_timesteps  # the first trained policy's
        assert set(model.get_parameters()) == {"small", "small.optimizer", "big", "big.optimizer"}
        logged, scalars = model.logger.last_train_by, model.logger.scalars()
        assert model.logger.last_train is logged["small/"]  # the model's policy's
        assert model.logger.ep_rew_mean == scalars["rollout/small/ep_rew_mean"]
    assert before < 2.0 and after["small"] > 3.8 and after["big"] > 3.8  # random: 2 and 1
    # several trained policies: each one's stats under its id, none unprefixed
    assert set(logged) == {"small/", "big/"} and logged["big/"]["learning_rate"] == 2e-3
    assert {"rollout/big/ep_rew_mean", "time/small/fps", "time/big/fps"} <= set(scalars)


@pytest.mark.timeout(90)
def test_agents_of_different_spaces_given_no_policies_train_one_policy_per_pair_of_spaces(tmp_path):
    """No policies=: "small" and "big" (their own spaces) each get a trained policy named after
    them, both learn, and a saved model loads with the same policies and mapping."""
    with APPO(ma_envs.cues, serial_mode=True, **FAST) as model:
        assert model.policies == {"small": None, "big": None} and list(model.trainees) == ["small", "big"]
        assert [model.policy_mapping(a) for a in ("small", "big")] == ["small", "big"]
        assert model.policy_id == "small" and model.action_space.n == 2
        model.train(6_000)
        after = {pid: model.evaluate(40, seed=0, policy_id=pid)[0] for pid in ("small", "big")}
        model.save(tmp_path / "cues.pt")
    assert after["small"] > 3.8 and after["big"] > 3.8  # random play: 2 and 1
    loaded = APPO.load(tmp_path / "cues.pt")
    try:
        assert loaded.policies == {"small": None, "big": None}
        assert loaded.agents.policy_of("big", 0) == "big"
        assert loaded.evaluate(10, seed=0, policy_id="big")[0] > 3.8
    finally:
        loaded.close()


@pytest.mark.timeout(10)
@pytest.mark.parametrize("names, ids", [
    (["speaker_0", "listener_0"], ["speaker", "listener"]),          # MPE2's simple_speaker_listener
    (["adversary_0", "adversary_1", "agent_0"], ["adversary", "agent"]),  # simple_tag's teams
    (["player_0", "player_1"], ["player_0", "player_1"]),            # one stem, two pairs of spaces
    (["a.b", "a/c"], ["a_b", "a_c"]),                                # separators of parameter keys
])
def test_policies_derived_from_spaces_are_named_after_their_agents(names, ids):
    big = {names[-1]}  # the last agent has spaces of its own

    class Named(ma_envs.TwoShapes):
        possible_agents = names

        def observation_space(self, agent):
            return super().observation_space("big" if agent in big else "small")

        def action_space(self, agent):
            return super().action_space("big" if agent in big else "small")

    policies, mapping = policies_by_space(Named())
    assert list(policies) == ids and all(v is None for v in policies.values())
    assert [mapping(a) for a in names] == [ids[0]] * (len(names) - 1) + [ids[-1]]
    assert pickle.loads(pickle.dumps(mapping))(names[-1]) == ids[-1]  # saved models load it
    assert policies_by_space(ma_envs.rps()) == (None, None)  # one pair of spaces: one policy


@pytest.mark.timeout(30)
def test_each_trained_policys_config_is_current_its_own_settings_kept_the_models_followed():
    """The model's attributes are the run's settings: a trained policy follows them where it has
    none of its own ("big" has its own learning rate), at once, schedules included."""
    with APPO(ma_envs.cues, serial_mode=True, **{**FAST, **TWO}) as model:
        small, big = model.trainees["small"], model.trainees["big"]
        model.learning_rate = 1e-4
        model.ent_coef = lambda progress_remaining: 0.02 * progress_remaining
        assert model.config.learning_rate == small.config.learning_rate == 1e-4
        assert big.config.learning_rate == 2e-3
        assert small.config.ent_coef == big.config.ent_coef == 0.02
        assert big.hparams_at(0.5)["ent_coef"] == 0.01 and big.hparams_at(0.5)["learning_rate"] == 2e-3
        with pytest.raises(ConfigError, match="learning_rate"):
            model.learning_rate = -1.0
        assert small.config.learning_rate == 1e-4 and model.learning_rate == 1e-4


@pytest.mark.timeout(60)
def test_one_trained_policys_parameters_leave_the_other_alone_and_round_trip(tmp_path):
    with APPO(ma_envs.cues, serial_mode=True, **{**FAST, **TWO}) as model:
        model.train(1_000)
        before = model.get_parameters()
        zeros = {k: torch.zeros_like(v) for k, v in before["big"].items()}
        model.set_parameters({"big": zeros})
        after = model.get_parameters()
        assert all(torch.equal(after["small"][k], v) for k, v in before["small"].items())
        assert all(torch.equal(after["big"][k], v) for k, v in zeros.items())
        assert model.trainees["big"].min_version == model.trainees["big"].version > 0
        assert model.trainees["small"].min_version == 0  # its samples stay valid
        with pytest.raises(ValueError, match="key it by policy id"):
            model.set_parameters(before["small"])
        with pytest.raises(ValueError, match="do not fit"):  # small's weights for big
            model.set_parameters({"big": before["small"]})
        model.train(500)
        model.save(tmp_path / "two.pt")
        saved = model.get_parameters()
        steps = {pid: t.num_timesteps for pid, t in model.trainees.items()}
    loaded = APPO.load(tmp_path / "two.pt", serial_mode=True)
    try:
        assert {pid: t.num_timesteps for pid, t in loaded.trainees.items()} == steps
        params = loaded.get_parameters()
        for pid in ("small", "big"):
            assert all(torch.equal(params[pid][k], v) for k, v in saved[pid].items())
        loaded.set_parameters({"big": str(tmp_path / "two.pt")})  # that policy's entry of the file
        assert all(torch.equal(loaded.get_parameters()["big"][k], v) for k, v in saved["big"].items())
        loaded.train(500)
    finally:
        loaded.close()


def _trained_entries(path) -> dict:
    return torch.load(path, weights_only=False)["trained"]


def _same(a, b) -> bool:
    """Equal nested dicts/lists of tensors and numbers."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


@pytest.mark.timeout(90)
def test_two_trained_policies_save_load_and_resume_each_ones_own_rng_adam_and_counters(tmp_path):
    """Each trained policy's weights, Adam state, learner RNG and counters round-trip under its
    own id (a loaded model saves the same file's entries), and a loaded model's learners go on
    from them: Adam's step count continues from the saved one, and the RNG each learner saves
    next descends from its own (different per policy: one file for all once made them equal)."""
    # target_kl=None: every minibatch steps, so Adam's step count follows from the updates
    with APPO(ma_envs.cues, serial_mode=True, target_kl=None, **{**FAST, **TWO}) as model:
        model.train(2_000)
        model.save(tmp_path / "a.pt")
    saved = _trained_entries(tmp_path / "a.pt")
    assert set(saved) == {"small", "big"}
    assert not torch.equal(saved["small"]["learner_rng"], saved["big"]["learner_rng"])
    loaded = APPO.load(tmp_path / "a.pt", serial_mode=True)
    try:
        loaded.save(tmp_path / "b.pt")  # nothing trained in between: the same state per id
        again = _trained_entries(tmp_path / "b.pt")
        for pid in ("small", "big"):
            for key in ("state_dict", "optimizer", "learner_rng", "policy_version", "num_timesteps"):
                assert _same(again[pid][key], saved[pid][key]), (pid, key)
        loaded.train(1_000)
        loaded.save(tmp_path / "c.pt")
    finally:
        loaded.close()
    after = _trained_entries(tmp_path / "c.pt")
    for pid in ("small", "big"):
        cfg = loaded.trainees[pid].config
        steps_per_update = cfg.num_epochs * cfg.batch_size // cfg.minibatch_size
        updates = after[pid]["policy_version"] - saved[pid]["policy_version"]
        assert updates > 0
        assert adam_steps(after[pid]["optimizer"]) == adam_steps(saved[pid]["optimizer"]) \
            + updates * steps_per_update  # resumed, not a fresh Adam
        assert after[pid]["num_timesteps"] > saved[pid]["num_timesteps"]
        assert not torch.equal(after[pid]["learner_rng"], saved[pid]["learner_rng"])
    assert not torch.equal(after["small"]["learner_rng"], after["big"]["learner_rng"])


@pytest.mark.timeout(120)
def test_two_trained_policies_in_worker_processes_survive_a_killed_learner_and_leave_nothing(tmp_path):
    """... and each keeps its own files: the killed learner resumes from its own Adam state and
    RNG, and save() stores each learner's RNG under its id (they shared one file before)."""
    from test_worker_faults import wait_for_child
    killed = []

    def kill_big_learner(model):
        if model.num_timesteps and not killed:
            os.kill(wait_for_child("learner-big").pid, signal.SIGKILL)
            killed.append(model.trainees["big"].num_timesteps)
        return None

    with APPO(ma_envs.cues, **{**FAST, **TWO}) as model:
        model.train(12_000, callback=kill_big_learner, callback_interval=0.2)
        names = sorted(p.name for p in model._runner.procs)
        assert names == ["learner-big", "learner-small", "policy-big-0", "policy-small-0",
                         "rollout-0", "rollout-1"]
        assert killed and model.logger.worker_restarts == 1
        assert model.trainees["big"].num_timesteps >= 12_000
        score = model.evaluate(20, seed=0, policy_id="big")[0]
        model.save(tmp_path / "two.pt")
    assert score > 3.0
    assert worker_children() == []
    saved = torch.load(tmp_path / "two.pt", weights_only=False)["trained"]
    rng = {pid: entry["learner_rng"] for pid, entry in saved.items()}
    assert rng["small"] is not None and rng["big"] is not None
    assert not torch.equal(rng["small"], rng["big"])  # same seed, different minibatch draws


@pytest.mark.timeout(60)
def test_trained_policies_with_different_lanes_get_their_own_batch_and_reload(tmp_path):
    """a0 plays "one" (1 lane), a1 and a2 play "two" (2 lanes): each pool's slot, batch and
    minibatch fit its own lanes, and a saved model comes back with the same settings."""
    kw = dict(policies={"one": None, "two": None},
              policy_mapping=lambda agent: "one" if agent == "a0" else "two")
    with APPO(ma_envs.leaving, serial_mode=True, **{**FAST, "rollout": 12}, **kw) as model:
        configs = {pid: t.config for pid, t in model.trainees.items()}
        assert configs["one"].lanes_per_env == 1 and configs["two"].lanes_per_env == 2
        for cfg in configs.values():
            assert cfg.batch_size % cfg.slot_size == 0 and cfg.batch_size % cfg.minibatch_size == 0
        model.train(600)
        model.save(tmp_path / "m.pt")
    loaded = APPO.load(tmp_path / "m.pt")
    try:
        assert {pid: t.config.batch_size for pid, t in loaded.trainees.items()} == {
            pid: cfg.batch_size for pid, cfg in configs.items()}
        loaded.train(600)
    finally:
        loaded.close()


@pytest.mark.timeout(120)
def test_a_synchronous_policy_of_many_actuators_trains_beside_an_asynchronous_discrete_one():
    # on a CPU a policy of more than four continuous dimensions samples synchronously, several
    # agents or one (CONTINUOUS_CPU_DEFAULTS), its batch one rollout of its lanes; a discrete
    # policy beside it keeps its asynchronous batch, and both train in worker processes
    kw = dict(policies={"disc": None, "cont": None}, policy_mapping=lambda agent: agent)
    with APPO(ma_envs.mixed_many, num_workers=1, num_envs_per_worker=2, seed=0, device="cpu",
              verbose=0, **kw) as model:
        disc, cont = (t.config for t in model.trainees.values())
        assert (disc.algo, cont.algo) == ("appo", "ppo")
        assert cont.batch_size == 1 * 2 * cont.rollout  # one rollout of each env's one lane
        model.train(3_000)
        steps = {pid: (t.num_timesteps, t.version) for pid, t in model.trainees.items()}
    assert all(n >= 3_000 and version >= 1 for n, version in steps.values()), steps
    # synchronous: one update per rollout of the envs, so no fewer updates than that
    assert steps["cont"][1] >= 3_000 // cont.batch_size


@pytest.mark.timeout(60)
def test_a_continuous_policy_beside_a_discrete_one_gets_its_own_defaults_not_its_own_rollout(tmp_path):
    """The continuous policy's implied defaults (CONTINUOUS_DEFAULTS) apply to it, except the
    fields the rollout workers share (rollout): one slot length for both pools."""
    from asyncrl.config import CONTINUOUS_DEFAULTS
    kw = dict(policies={"disc": None, "cont": None}, policy_mapping=lambda agent: agent)
    with APPO(ma_envs.mixed, serial_mode=True, num_workers=1, num_envs_per_worker=2, seed=0,
              verbose=0, **kw) as model:
        disc, cont = (t.config for t in model.trainees.values())
        assert disc.rollout == cont.rollout == model.config.rollout
        assert cont.num_epochs == CONTINUOUS_DEFAULTS["num_epochs"]
        assert disc.num_epochs == Config.num_epochs != cont.num_epochs
        implied = model.trainees["cont"].own["ent_coef"]  # implied for it, kept at run time
        assert implied == CONTINUOUS_DEFAULTS["ent_coef"] != Config.ent_coef
        model.train(600)
        assert model.logger.last_train_by["cont/"]["entropy_loss"] == model.logger.last_train_by[
            "cont/"]["entropy_loss"]  # trained (a number, not NaN)
        model.save(tmp_path / "mixed.pt")
    loaded = APPO.load(tmp_path / "mixed.pt", serial_mode=True)
    try:
        assert loaded.trainees["cont"].config == cont.replace(serial_mode=True,
                                                                              device=cont.device)
        loaded.train(300)
        with pytest.raises(KeyError, match="not 'ghost'"):
            loaded._params.parse(str(tmp_path / "mixed.pt"), "ghost")
    finally:
        loaded.close()
