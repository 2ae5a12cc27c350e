"""benchmarks/learning_suite.py's report: the issue's criterion read from stored runs (no training)."""
import os
import pathlib
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
learning_suite = pytest.importorskip("learning_suite")

FULL = learning_suite.RETURN_WINDOW


def run(points, wall):
    """A stored run: (seconds, training return, episodes in its window) readings, 1k env steps apart."""
    return {"curve": [[1000 * (i + 1), s, r, w] for i, (s, r, w) in enumerate(points)], "wall": wall}


def test_time_to_sb3s_final_return_is_over_sb3s_median_wall_time_and_counts_misses():
    # SB3 ends at 1, 2 and 3 (its median: 2) in 100, 300 and 200 s (its median: 200 s)
    sb3 = [run([(50, 0.5, FULL), (100, 1.0, FULL)], 100),
           run([(150, 3.0, FULL), (300, 2.0, FULL)], 300),
           run([(200, 3.0, FULL)], 200)]
    mine = [run([(10, 1.0, FULL), (20, 2.5, FULL)], 30),
            # 2.0 at 30 s over a window not yet full does not count: reached at 40 s
            run([(30, 2.0, FULL // 2), (40, 2.0, FULL)], 50),
            run([(60, 1.9, FULL)], 60)]
    # 20 s, 40 s and never: the median run reached it at 40 s, 0.2 of SB3's 200 s
    assert learning_suite.against_sb3(mine, sb3) == "0.20 (2/3 reach 2)"
    # where most runs never reach SB3's score the median run never does
    assert learning_suite.against_sb3(mine[1:] + [mine[2]], sb3) == "never (1/3 reach 2)"
    # nothing to compare against
    assert learning_suite.against_sb3(mine, []) == "-"


def test_readme_table_rows_per_family_and_budget_with_sb3_beside():
    def stored(label, env, steps, greedy, points, wall):
        return dict(run(points, wall), label=label, env=env, steps=steps, greedy_mean=greedy)

    runs = [stored("asyncrl", "cartpole", 100_000, 500.0, [(5, 480.0, FULL)], 6),
            stored("asyncrl", "cartpole", 100_000, 498.0, [(7, 470.0, FULL), (9, 490.0, FULL)], 10),
            stored("asyncrl", "cartpole", 200_000, 500.0, [(4, 500.0, FULL)], 12),
            stored("sb3", "cartpole", 100_000, 500.0, [(40, 476.0, FULL), (50, 480.0, FULL)], 60),
            stored("asyncrl", "minesweeper", 500_000, 0.2, [(30, 0.1, FULL)], 60),
            stored("asyncrl-x", "hopper", 1_000_000, 3000.0, [(30, 2000.0, FULL)], 60)]
    table = learning_suite.readme_table(runs)
    lines = table.splitlines()
    # one heading per family that has asyncrl runs; a tagged variant's runs are not the defaults'
    assert ("**Classic control**" in lines and "**popgym memory tasks (GRU)**" in lines
            and "**MuJoCo**" not in lines)
    quick = next(line for line in lines if line.startswith("| cartpole (100k) |"))
    # greedy median of 498 and 500; both seeds past 475 (at 1k and 2k env steps, 5 s and 9 s);
    # (median 1.5k, written 2k); SB3's one run past 475 at 1k env steps, 40 s; SB3's final 480
    # reached at 5 s and 9 s: 7 s / 60 s
    assert quick == ("| cartpole (100k) | 475 | 499 (498 to 500) (2 seeds) | 500 (1 seed) | "
                     "2/2: 2k (1k to 2k), 7 s (5 s to 9 s) | 1/1: 1k, 40 s | 0.12 (2/2 reach 480) |")
    # the full budget is a row of its own; no SB3 run there
    assert "| cartpole (200k) | 475 | 500 (1 seed) | not run at this budget | 1/1: 1k, 4 s | - | - |" in lines
    # an env SB3 cannot take as it comes (MineSweeper's Tuple observation) says so
    assert any(line.startswith("| minesweeper (500k) |") and "SB3 cannot run it" in line for line in lines)
    # scores of four digits are written out, not in e-notation
    assert learning_suite.score(4363.2) == "4,363" and learning_suite.score(-0.0634) == "-0.0634"


def test_against_rl_zoo_the_table_holds_the_envs_with_zoo_runs_and_measures_against_them():
    def stored(label, env, steps, points, wall):
        return dict(run(points, wall), label=label, env=env, steps=steps, greedy_mean=100.0)

    runs = [stored("asyncrl", "pendulum", 200_000, [(5, -300.0, FULL), (9, -150.0, FULL)], 10),
            stored("asyncrl", "acrobot", 200_000, [(5, -90.0, FULL)], 10),
            stored("sb3", "pendulum", 200_000, [(40, -400.0, FULL)], 60),
            stored("sb3zoo", "pendulum", 200_000, [(20, -180.0, FULL)], 30)]
    lines = learning_suite.readme_table(runs, reference="sb3zoo").splitlines()
    assert any("SB3 (RL Zoo) greedy" in line for line in lines)
    # acrobot has no zoo run: no row; pendulum's criterion is against the zoo's -180 in 30 s
    assert not any(line.startswith("| acrobot") for line in lines)
    row = next(line for line in lines if line.startswith("| pendulum (200k) |"))
    assert row.endswith("| 0.30 (1/1 reach -180) |")


def test_rl_zoos_entry_is_the_envs_id_of_any_version_and_a_factorys_by_the_id_it_makes():
    cases, key = learning_suite.CASES, learning_suite.zoo_key
    keys = ["HalfCheetah-v4", "HalfCheetahBulletEnv-v0", "MiniGrid-DoorKey-5x5-v0", "atari"]
    assert key(cases["halfcheetah"], keys) == "HalfCheetah-v4"  # the zoo's v4 for the suite's v5
    assert key(cases["breakout"], keys) == "atari"  # the case's own entry
    assert key(cases["hopper"], keys) is None  # no entry
    # a suite_envs factory by the id its env is made from: DoorKey-5x5's, not DoorKey-8x8's
    pytest.importorskip("minigrid")
    assert key(cases["minigrid-doorkey5"], keys) == "MiniGrid-DoorKey-5x5-v0"
    assert key(cases["minigrid-doorkey8"], keys) is None


@pytest.mark.parametrize("page, after", [("README.md", "Rows of earlier code"),
                                         ("docs/benchmarks/learning-suite.md", "What the reruns changed")])
def test_readmes_table_is_the_one_the_stored_runs_make(page, after):
    """README.md's learning table (and its copy on the docs site) is `learning_suite.py --readme`'s
    output from the stored runs: rerunning or promoting runs without regenerating it fails here."""
    text = (pathlib.Path(__file__).parent.parent / page).read_text()
    start, end = text.index("**Classic control**"), text.index("\n\n" + after)
    made = learning_suite.readme_table(learning_suite.load_runs(["asyncrl", "sb3"], any_budget=True))
    assert text[start:end].strip() == made.strip(), (
        f"{page}'s table differs from the stored runs': paste `python benchmarks/learning_suite.py --readme`")


@pytest.mark.timeout(120)
def test_an_asyncrl_run_records_updates_and_policy_lag_beside_its_curve(monkeypatch):
    # a short CartPole run through the suite's own runner: each curve point holds the updates so
    # far and the last update's mean policy lag, the asynchronous dynamics a stored run keeps
    monkeypatch.setitem(learning_suite.CASES, "tiny",
                        learning_suite.Case("CartPole-v1", 8_192, 475, "classic", eval_episodes=1))
    run = learning_suite.run_asyncrl("tiny", 0, {"num_workers": 1, "num_envs_per_worker": 4})
    steps, _, _, _, updates, lag = run["curve"][-1]
    assert steps >= 8_192 and updates >= 1 and isinstance(lag, float) and 0.0 <= lag < 50
    assert all(len(point) == 6 for point in run["curve"])
    assert [p[4] for p in run["curve"]] == sorted(p[4] for p in run["curve"])  # never back


def test_sb3s_shared_policy_plays_every_agent_and_an_episode_scores_its_agents_mean():
    # the greedy score of a multi-agent row is asyncrl's evaluate(): each episode's mean return
    # over its agents, agents that leave early included (Leaving: agent k plays k + 1 steps, 1 a
    # step for repeating its cue, so a perfect policy scores (1 + 2 + 3) / 3 each episode)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ma_envs

    class Perfect:  # SB3's predict on an agent's observation
        def predict(self, obs, deterministic=True):
            return obs.argmax(axis=-1), None

    assert learning_suite.sb3_eval_parallel(Perfect(), ma_envs.leaving(), 3) == [2.0, 2.0, 2.0]
    assert learning_suite.is_multi_agent(ma_envs.leaving)
    assert not learning_suite.is_multi_agent("CartPole-v1")


@pytest.mark.timeout(60)
def test_agents_of_different_spaces_score_the_models_policys_agents_for_both_libraries():
    # Cues: "small" (2 cues) and "big" (4) have spaces of their own, so asyncrl trains a policy
    # each and scores the first, "small"; SB3's shared policy sees both padded to one pair, trains
    # on twice the budget in agent steps, and is scored on "small" too
    pytest.importorskip("supersuit")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ma_envs
    assert learning_suite.agents_scored(ma_envs.cues) == (("small", "big"), ("small",))
    assert learning_suite.sb3_steps_per_policy_step(ma_envs.cues) == 2.0
    assert learning_suite.sb3_steps_per_policy_step(ma_envs.leaving) == 1.0
    case = learning_suite.Case(ma_envs.cues, 1_000, 0, "multiagent")
    padded = learning_suite.sb3_parallel_env(case)
    assert padded.observation_space("small").shape == padded.observation_space("big").shape == (4,)

    class SmallsAnswer:  # right for "small" (its cue among the first two), not for "big"
        def predict(self, obs, deterministic=True):
            return obs[:2].argmax(axis=-1), None

    assert learning_suite.sb3_eval_parallel(SmallsAnswer(), padded, 3,
                                            case_env=ma_envs.cues) == [4.0, 4.0, 4.0]


@pytest.mark.timeout(120)
def test_sb3_trains_a_parallel_env_with_one_policy_shared_by_its_agents(monkeypatch):
    # each agent an env of SuperSuit's vector env (PettingZoo's SB3 tutorial): the budget counts
    # agent steps, as asyncrl's, and the curve holds the agents' episode returns
    pytest.importorskip("supersuit")
    pytest.importorskip("stable_baselines3")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ma_envs
    monkeypatch.setitem(learning_suite.CASES, "tiny-ma",
                        learning_suite.Case(ma_envs.rps, 2_048, 0, "multiagent", eval_episodes=2))
    run = learning_suite.run_sb3("tiny-ma", 0)
    steps, _, ret, window = run["curve"][-1]
    assert steps >= 2_048 and 0 < window <= learning_suite.RETURN_WINDOW
    # rock-paper-scissors is zero-sum: the mean over both players of any episode is 0
    assert ret == 0.0 and run["greedy_mean"] == 0.0 and run["sampled_mean"] == 0.0


@pytest.mark.timeout(60)
def test_reference_scores_are_seeded_and_keeping_still_stays_within_the_bounds(monkeypatch):
    # a held-out target is set against these before any run: the same seed gives the same score
    reference_scores = pytest.importorskip("reference_scores")
    import gymnasium as gym
    import numpy as np
    monkeypatch.setitem(learning_suite.CASES, "cartpole-ref",
                        learning_suite.Case("CartPole-v1", 1_000, 475, "classic"))
    still = [reference_scores.episode("cartpole-ref", reference_scores.keep_still, s) for s in (0, 0, 1)]
    assert still[0] == still[1] and 5 <= min(still) and max(still) <= 15  # pushing left falls soon
    rand = [reference_scores.episode("cartpole-ref", reference_scores.random_play, 3) for _ in range(2)]
    assert rand[0] == rand[1]
    rng = np.random.default_rng(0)
    assert reference_scores.keep_still(None, gym.spaces.Box(0.5, 1.0, (2,)), rng).tolist() == [0.5, 0.5]
    assert reference_scores.keep_still(None, gym.spaces.Discrete(50), rng) == 0
    assert reference_scores.keep_still(None, gym.spaces.Discrete(3, start=-1), rng) == -1
    assert reference_scores.keep_still(None, gym.spaces.MultiDiscrete([4, 2]), rng).tolist() == [0, 0]
