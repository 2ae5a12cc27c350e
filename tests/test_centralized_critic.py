"""A centralised critic (``centralized_critic=True``): the value head reads the env's global state
(its state() where declared, else every agent's observation side by side, absent agents zeroed)
beside the actor's features, the actor its own observation; one more buffer-spec entry, filled by
the rollout workers. The default for several agents acting at once with discrete actions and a
vector state."""
import gymnasium as gym
import numpy as np
import pytest
import torch

import ma_envs
from asyncrl import APPO, ConfigError
from asyncrl.config import SEVERAL_AGENTS_CRITIC_DEFAULTS, with_defaults
from asyncrl.multiagent import global_state, global_state_space
from asyncrl.spaces import CRITIC_STATE_MAX, GLOBAL_STATE, EnvSpec
from asyncrl.turns import TurnBasedEnv
from test_multiagent import FAST, _always, batches, hero_vs_opp  # noqa: F401 (a fixture)


class Net(torch.nn.Module):
    """A whole custom network (policy=) for Leaving's Box(2) observations."""

    def __init__(self, observation_space, action_space, param_size):
        super().__init__()
        self.pi, self.v = torch.nn.Linear(2, param_size), torch.nn.Linear(2, 1)

    def forward(self, obs):
        return self.pi(obs), self.v(obs).squeeze(-1)


class WithState(ma_envs.Cues):
    """Cues with a declared global state: both cues as integers."""
    state_space = gym.spaces.MultiDiscrete([2, 4])

    def state(self):
        return np.array([self.cues["small"], self.cues["big"]])


def with_state():
    return WithState()


def test_the_global_state_is_the_envs_state_where_declared_else_every_observation():
    env = WithState()
    obs, _ = env.reset(seed=0)
    assert global_state_space(env).shape == (6,)  # MultiDiscrete flattened: one-hot per part
    expected = np.concatenate([np.eye(2)[env.cues["small"]], np.eye(4)[env.cues["big"]]])
    assert np.array_equal(global_state(env, obs), expected)
    env = ma_envs.Leaving(3)
    obs, _ = env.reset(seed=0)
    assert global_state_space(env).shape == (6,)
    full = global_state(env, obs)
    assert np.array_equal(full, np.concatenate([obs["a0"], obs["a1"], obs["a2"]]))
    obs, *_ = env.step({a: 0 for a in env.agents})  # a0 has left: its part is zeros
    assert np.array_equal(global_state(env, obs), np.concatenate([np.zeros(2), obs["a1"], obs["a2"]]))
    game = TurnBasedEnv(ma_envs.Signal())  # a turn-based game: every agent observes every step
    obs, _ = game.reset()
    assert global_state(game, obs).shape == global_state_space(game).shape == (14,)


@pytest.mark.timeout(60)
def test_the_critic_reads_the_global_state_of_every_lane_and_the_actor_does_not(batches):
    with APPO(ma_envs.leaving, centralized_critic=True, serial_mode=True, **FAST) as model:
        # the state (6) beside the agent's own features (2: whose value it is)
        assert model.policy.vf_net[0].in_features == 8 and model.policy.pi_net[0].in_features == 2
        model.train(2_000)
        obs = np.array([1.0, 0.0], np.float32)
        assert model.predict(obs, deterministic=True)[0] in (0, 1)  # no global state needed
    checked = 0
    for b in batches:
        state = b.obs[GLOBAL_STATE].view(b.obs[GLOBAL_STATE].shape[0], -1, 3, 6)  # [T+1, envs, lanes, 6]
        assert bool((state == state[:, :, :1]).all())  # one state per env, in each of its lanes
        own = b.obs["obs"].view(*state.shape[:3], 2)
        live = b.policy_versions.view(state.shape[0] - 1, -1, 3) >= 0
        for lane in range(3):  # an agent in play sees its own part of the state
            part = state[:-1, :, lane, 2 * lane:2 * lane + 2]
            assert torch.equal(part[live[..., lane]], own[:-1, :, lane][live[..., lane]])
        # agents gone (a0 after step 1, a1 after 2): their parts are zeros while a2 plays on
        gone = ~live[..., 0] & live[..., 2]
        assert bool((state[:-1, :, 0, 0:2][gone] == 0).all())
        checked += int(gone.sum())
    assert checked > 100


@pytest.mark.timeout(60)
def test_a_policy_with_a_centralised_critic_beside_one_without_learns():
    with APPO(with_state, policies={"small": None, "big": {"centralized_critic": False}},
              policy_mapping=lambda agent: agent, serial_mode=True, **FAST) as model:
        assert model.trainees["small"].config.centralized_critic  # the default (discrete actions)
        assert model.trainees["small"].model.vf_net[0].in_features == 6 + 2
        assert model.trainees["big"].model.vf_net[0].in_features == 4
        model.train(8_000)
        assert model.evaluate(10, seed=0, policy_id="small")[0] > 3.5


@pytest.mark.timeout(60)
def test_with_a_recurrent_core_masks_and_turns_and_across_save_and_load(tmp_path):
    with APPO(ma_envs.signal, centralized_critic=True, use_rnn=True, serial_mode=True,
              **dict(FAST, rollout=8)) as model:
        model.train(1_000)
        model.save(tmp_path / "cc.zip")
    loaded = APPO.load(tmp_path / "cc.zip")
    try:
        # the state (14) beside the recurrent core's output, the actor's features
        assert loaded.config.centralized_critic and loaded.policy.vf_net[0].in_features == 14 + 128
        loaded.train(500)
    finally:
        loaded.close()


@pytest.mark.timeout(30)
def test_a_centralised_critic_without_agents_or_with_a_custom_network_is_a_clear_error():
    with pytest.raises(ConfigError, match="centralized_critic=True applies to multi-agent envs"):
        APPO("CartPole-v1", centralized_critic=True, serial_mode=True)
    with pytest.raises(ConfigError, match="needs the built-in network"):
        APPO(ma_envs.leaving, policy=Net, centralized_critic=True, serial_mode=True, **FAST)
    # every agent's observation as the state: a text leaf would be its characters' indices
    with pytest.raises(ConfigError, match="does not flatten \\(or holds text\\)"):
        APPO(ma_envs.text_cues, centralized_critic=True, serial_mode=True, **FAST)
    with APPO(ma_envs.text_cues, serial_mode=True, **FAST) as model:  # independent critics
        assert not model.config.centralized_critic


def test_a_global_state_the_critic_reads_by_default_follows_from_the_spaces():
    def spec(obs=gym.spaces.Box(0.0, 1.0, (2,), np.float32), **kw):
        return EnvSpec(obs, gym.spaces.Discrete(2), **kw)

    assert spec(global_state_size=6).critic_state
    assert not spec().critic_state  # one agent: no global state
    assert not spec(global_state_size=6, turn_based=True).critic_state
    assert spec(global_state_size=CRITIC_STATE_MAX).critic_state
    assert not spec(global_state_size=CRITIC_STATE_MAX + 1).critic_state
    assert not spec(gym.spaces.Box(0, 255, (7, 7, 3), np.uint8), global_state_size=294).critic_state
    critic = SEVERAL_AGENTS_CRITIC_DEFAULTS
    assert with_defaults({}, critic_state=True) == critic == {"centralized_critic": True}
    # the caller wins; a recurrent core, continuous actions and a family's preset go without
    assert with_defaults({"centralized_critic": False}, critic_state=True) == {
        "centralized_critic": False}
    assert "centralized_critic" not in with_defaults({"use_rnn": True}, critic_state=True)
    for kind in ("continuous", "continuous_many", "factored"):
        assert "centralized_critic" not in with_defaults({}, actions=kind, critic_state=True)
    assert "centralized_critic" not in with_defaults({}, family="doom", critic_state=True)


@pytest.mark.timeout(60)
def test_several_agents_with_discrete_actions_get_the_critic_unless_a_custom_network_or_turns(tmp_path):
    with APPO(ma_envs.leaving, serial_mode=True, **FAST) as model:
        assert model.config.centralized_critic and model.policy.vf_net[0].in_features == 8
    with APPO(ma_envs.leaving, policy=Net, serial_mode=True, **FAST) as model:
        assert not model.config.centralized_critic  # the network's own value head
    with APPO(ma_envs.leaving, centralized_critic=False, serial_mode=True, **FAST) as model:
        assert model.policy.vf_net[0].in_features == 2
        model.save(tmp_path / "independent.zip")
        independent = model.get_parameters()
    with APPO(ma_envs.leaving, serial_mode=True, **FAST) as model:  # says which setting to give
        with pytest.raises(ValueError, match="centralized_critic= as that model had it"):
            model.set_parameters(independent)
    loaded = APPO.load(tmp_path / "independent.zip")  # a saved choice stays
    try:
        assert not loaded.config.centralized_critic and loaded.policy.vf_net[0].in_features == 2
    finally:
        loaded.close()
    with APPO(ma_envs.signal, serial_mode=True, **FAST) as model:  # turns: not measured
        assert not model.config.centralized_critic
    with APPO(ma_envs.mixed, policies={"disc": None, "cont": None}, policy_mapping=lambda a: a,
              serial_mode=True, **FAST) as model:  # per trained policy, from its actions
        assert model.trainees["disc"].config.centralized_critic
        assert not model.trainees["cont"].config.centralized_critic


@pytest.mark.timeout(90)
def test_a_frozen_policy_plays_weights_of_either_critic_setting():
    """A frozen policy acts and never computes a value: weights from a model with the other
    centralized_critic setting (an older independent snapshot in a run whose hero has the
    critic, or the reverse) set into it, their value side left out, and play in the workers."""
    frozen = dict(policies={"hero": None, "opp": {"frozen": True}}, policy_mapping=hero_vs_opp,
                  serial_mode=True, **FAST)
    with APPO(ma_envs.rps, centralized_critic=False, **frozen) as model:
        independent = model.get_parameters()["hero"]
    with APPO(ma_envs.rps, **frozen) as model:
        assert model.trainees["hero"].config.centralized_critic
        params = model.get_parameters()
        critic, own = params["hero"], params["opp"]
        assert critic["vf_net.0.weight"].shape != independent["vf_net.0.weight"].shape
        rock = _always(independent, ma_envs.ROCK)
        model.set_parameters({"opp": rock})
        after = model.get_parameters()["opp"]
        acting = [k for k in rock if not k.startswith(model.policy.VALUE_SIDE)]
        assert acting and all(torch.equal(after[k], rock[k]) for k in acting)
        assert all(torch.equal(after[k], own[k]) for k in own if k not in acting)
        model.train(500)  # the rollout worker plays the rock it was given
        played = model._runner.components[0].frozen["opp"].model.state_dict()
        assert all(torch.equal(played[k], rock[k]) for k in acting)
        with pytest.raises(ValueError, match="centralized_critic= as that model had it"):
            model.set_parameters({"hero": independent})  # a trained policy's value side counts
    with APPO(ma_envs.rps, centralized_critic=False, **frozen) as model:  # the reverse
        model.set_parameters({"opp": critic})
        after = model.get_parameters()["opp"]
        assert all(torch.equal(after[k], critic[k]) for k in acting)
