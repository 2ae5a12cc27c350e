"""The command line end to end, in subprocesses, on CartPole with tiny budgets: train, resume,
evaluate, enjoy with a video, plot; and its errors."""
import contextlib
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from test_multiprocess import multiprocessing_helper

pytestmark = pytest.mark.timeout(300)
TINY = ["--num_workers", "1", "--num_envs_per_worker", "4", "--rollout", "16",
        "--batch_size", "128", "--minibatch_size", "64", "--device", "cpu", "--log_interval", "0.5"]
# Where the command line, not the process graph, is under test: every component in the one
# process (spawning three that each import torch is most of a tiny run's time).
SERIAL = [*TINY, "--serial_mode", "True"]


def asyncrl(*args, cwd, check=True):
    out = subprocess.run([sys.executable, "-m", "asyncrl", *args], capture_output=True, text=True,
                         timeout=240, cwd=cwd)
    if check:
        assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One experiment trained to 2048 env steps, then resumed to 4096 by the same command."""
    cwd = tmp_path_factory.mktemp("cli")
    first = asyncrl("train", "--env", "CartPole-v1", "--experiment", "cp", "--steps", "2048",
                    "--progress_bar", *SERIAL, cwd=cwd)
    second = asyncrl("train", "--env", "CartPole-v1", "--experiment", "cp", "--steps", "4096",
                     "--progress_bar", "--learning_rate", "2e-4", *SERIAL, cwd=cwd)
    return dict(cwd=cwd, dir=cwd / "train_dir" / "cp", first=first, second=second)


def test_train_writes_the_run_directory(run):
    d = run["dir"]
    assert sorted(os.listdir(d)) == ["checkpoints", "config.yaml", "progress.csv", "summary.json", "tb"]
    summary = json.loads((d / "summary.json").read_text())
    assert summary["env_steps"] == 4096
    import yaml
    config = yaml.safe_load((d / "config.yaml").read_text())
    assert config["env"] == "CartPole-v1" and config["steps"] == 4096
    assert config["config"]["learning_rate"] == 2e-4 and config["config"]["rollout"] == 16
    with open(d / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["time/total_timesteps"]) for r in rows]
    assert steps == sorted(steps) and steps[-1] == 4096  # one file across the resume
    assert {"rollout/ep_rew_mean", "time/fps", "train/policy_loss"} <= set(rows[0])


def test_same_command_resumes_and_explicit_flags_win(run):
    out = run["second"].stdout
    assert "resuming" in out and "(2,048 env steps)" in out
    assert "learning_rate 0.0005 -> 0.0002" in out
    ckpts = sorted(os.listdir(run["dir"] / "checkpoints"))
    assert ckpts[-1] == "checkpoint_000000000004096.pt"
    # the progress bar started at the resumed step and ended at the total
    bar = run["second"].stderr.replace("\r", "\n")
    assert "2.05k/4.10k" in bar and "4.10k/4.10k" in bar
    again = asyncrl("train", "--experiment", "cp", cwd=run["cwd"])  # done: nothing to train
    assert "nothing to do" in again.stdout


def test_evaluate_prints_and_writes_json(run):
    out = asyncrl("evaluate", "--experiment", "cp", "--episodes", "3", cwd=run["cwd"])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 3 and result["env_steps"] == 4096 and result["mean_return"] >= 1
    assert json.loads((run["dir"] / "evaluation.json").read_text()) == result


def test_export_writes_a_policy_that_acts_as_the_checkpoint(run):
    import onnxruntime
    from asyncrl import APPO
    out = asyncrl("export", "--experiment", "cp", cwd=run["cwd"])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["format"] == "onnx" and result["env_steps"] == 4096
    session = onnxruntime.InferenceSession(str(run["cwd"] / result["path"]))
    # (the saved tensorboard_log is relative to where train ran: none written from here)
    model = APPO.load(run["dir"] / result["checkpoint"], device="cpu", tensorboard_log=None)
    obs = np.random.default_rng(0).normal(size=(100, 4)).astype(np.float32)
    want, _ = model.predict(obs, deterministic=True)
    assert (session.run(None, {"obs": obs})[0] == want).all()


def test_enjoy_writes_a_video_that_decodes(run):
    iio = pytest.importorskip("imageio.v3")
    out = asyncrl("enjoy", "--experiment", "cp", "--max_episodes", "2", "--save_video",
                  "--deterministic", cwd=run["cwd"])
    lengths = [int(line.rsplit("length ", 1)[1]) for line in out.stdout.splitlines()
               if line.startswith("episode ")]
    assert len(lengths) == 2
    videos = os.listdir(run["dir"] / "videos")
    assert len(videos) == 1 and videos[0].endswith(".mp4")
    frames = iio.imread(run["dir"] / "videos" / videos[0])
    assert frames.shape[0] == sum(lengths)                    # one frame per step
    assert frames.shape[1] % 16 == 0 and frames.shape[2] % 16 == 0 and frames.shape[3] == 3
    assert frames[0].std() > 1                               # a picture, not a blank frame


def test_plot_draws_curves(run):
    out_png = run["cwd"] / "curves.png"
    asyncrl("plot", str(run["dir"]), "--out", str(out_png), cwd=run["cwd"])
    iio = pytest.importorskip("imageio.v3")
    img = iio.imread(out_png)
    assert img.shape[0] > 100 and np.unique(img.reshape(-1, img.shape[-1]), axis=0).shape[0] > 10


def test_yaml_hyperparameters_per_env(tmp_path):
    (tmp_path / "hp.yaml").write_text("CartPole-v1:\n  learning_rate: 0.002\n  gamma: 0.97\n"
                                      "Acrobot-v1:\n  gamma: 0.5\n")
    asyncrl("train", "--env", "CartPole-v1", "--experiment", "y", "--steps", "128",
            "--config", "hp.yaml", "--gamma", "0.96", *SERIAL, cwd=tmp_path)
    import yaml
    cfg = yaml.safe_load((tmp_path / "train_dir" / "y" / "config.yaml").read_text())["config"]
    assert cfg["learning_rate"] == 0.002 and cfg["gamma"] == 0.96  # the flag wins over the file


@pytest.mark.parametrize("args, message", [
    (["train", "--experiment", "z", "--bogus", "1"], "unrecognized arguments: --bogus"),
    (["train", "--env", "CartPole-v1", "--experiment", "z", "--learning_rate", "-3"],
     "learning_rate=-3: must be a number >= 0"),
    (["train", "--experiment", "z"], "new experiment: give --env"),
    (["evaluate", "--experiment", "nothing"], "no checkpoint in"),
    (["plot", "no/such/dir"], "no progress.csv"),
    (["export", "--experiment", "nothing"], "no checkpoint in"),
    (["--learning_rat", "1e-3"], "unrecognized arguments: --learning_rat"),
])
def test_errors_name_the_flag_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    """Each error through main() in this process (a subprocess each cost ~3 s of the suite); the
    installed entry's exit status and traceback-free stderr are checked once below."""
    from asyncrl.cli import main
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_an_error_from_the_installed_entry_exits_2_without_a_traceback(tmp_path):
    out = asyncrl("train", "--env", "CartPole-v1", "--experiment", "z", "--learning_rate", "-3",
                  cwd=tmp_path, check=False)
    assert out.returncode == 2
    assert "learning_rate=-3: must be a number >= 0" in out.stderr
    assert "Traceback" not in out.stderr


def test_help_at_every_level(tmp_path, capsys):
    """The top level through the installed entry (a subprocess); each command's help through
    the same main() in this process (a subprocess each cost ~2 s of the suite)."""
    from asyncrl.cli import main
    assert "train,enjoy,evaluate,export,plot,benchmark" in asyncrl("--help", cwd=tmp_path).stdout
    for command in ("train", "enjoy", "evaluate", "export", "plot", "benchmark"):
        with pytest.raises(SystemExit) as exit_:
            main([command, "--help"])
        out = capsys.readouterr().out
        assert exit_.value.code == 0 and "usage: asyncrl " + command in out
        if command == "train":
            assert "--learning_rate" in out


@pytest.mark.parametrize("sig, code, group", [("SIGINT", 130, False), ("SIGTERM", 143, False),
                                              ("SIGTERM", 143, True)])
def test_signal_saves_a_checkpoint_that_resumes(tmp_path, sig, code, group):
    """Ctrl-C, a SIGTERM to the main process, and a SIGTERM to the command and then to its whole
    process group (as ``timeout`` sends it) each save a checkpoint, Adam's state in it, that
    resumes. In the group case the fork server dies by the signal while the main
    process saves; its components, in groups of their own, must not take that for the main
    process's death and remove its scratch folder (they did: the checkpoint had no Adam state
    and the exit printed a FileNotFoundError)."""
    import signal
    import time
    import psutil
    import torch
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl", "train", "--env", "CartPole-v1",
                             "--experiment", "c", "--steps", "100000000", *TINY],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=group)
    progress = tmp_path / "train_dir" / "c" / "progress.csv"
    deadline = time.monotonic() + 120
    # The group case ~40k env steps in: stopped at the first trained steps, the code before the
    # fix passed 4 tries of 4 (why was not found); from ~40k it failed 2 tries of 3
    least = 40_000 if group else 1

    def trained():
        lines = progress.read_text().splitlines() if progress.exists() else []
        return len(lines) > 1 and int(lines[-1].split(",")[0] or 0) >= least
    workers = []
    try:  # a failed or hung run must not outlive the test
        while time.monotonic() < deadline and not trained():
            time.sleep(0.2)
        assert trained(), f"not {least:,} env steps within 120 s"
        workers = [w for w in psutil.Process(proc.pid).children(recursive=True)
                   if not multiprocessing_helper(w, proc.pid)]
        assert len(workers) >= 3  # rollout-0, policy-0, learner
        proc.send_signal(getattr(signal, sig))
        if group:  # as timeout sends it: then to the group too (the command again)
            os.killpg(proc.pid, getattr(signal, sig))
        out, err = proc.communicate(timeout=60)
    finally:  # the main process first: a worker gone already must not stop the clean-up
        if proc.poll() is None:
            proc.kill()
            for w in workers:
                with contextlib.suppress(psutil.NoSuchProcess):
                    w.kill()
            proc.communicate()
    assert proc.returncode == code, out + err
    assert "run the same command to resume" in err and "Traceback" not in err, err
    _, alive = psutil.wait_procs(workers, timeout=5)  # they exit with the main process
    assert not alive
    ckpts = os.listdir(tmp_path / "train_dir" / "c" / "checkpoints")
    assert len(ckpts) == 1
    blob = torch.load(tmp_path / "train_dir" / "c" / "checkpoints" / ckpts[0], weights_only=False)
    assert blob["optimizer"] is not None
    steps = int(ckpts[0].split("_")[1].split(".")[0])
    assert steps > 0
    again = asyncrl("train", "--experiment", "c", "--steps", str(steps + 128), "--serial_mode", "True",
                    cwd=tmp_path)
    assert f"({steps:,} env steps)" in again.stdout
    assert f"to {steps + 128:,} env steps" in again.stdout


def test_a_repeated_sigterm_is_the_same_request(monkeypatch):
    """timeout's two SIGTERMs (to the command, then to its group) raise Terminated once; one sent
    a second later raises again (a deliberate second stop, or the first was swallowed)."""
    from asyncrl import cli
    monkeypatch.setattr(cli, "_last_terminated", [-cli.REPEATED_SIGTERM])
    with pytest.raises(cli.Terminated):
        cli.raise_terminated(15, None)
    assert cli.raise_terminated(15, None) is None  # at once: ignored
    cli._last_terminated[0] -= cli.REPEATED_SIGTERM  # as if sent a second later
    with pytest.raises(cli.Terminated):
        cli.raise_terminated(15, None)


def test_model_plot_keeps_the_whole_run_at_bounded_memory():
    """model.plot()'s rows: one per summary, the whole run kept, thinned to half the resolution
    past HISTORY_ROWS (a long run does not grow without bound)."""
    from asyncrl.logger import HISTORY_ROWS, TrainLogger
    from asyncrl.plotting import curves_figure
    logger = TrainLogger(verbose=0, log_interval=0.0, stats_window=10)
    for step in range(HISTORY_ROWS + 1):
        logger.maybe_log({"policy": step}, force=True)
    steps = [row["time/total_timesteps"] for row in logger.history]
    assert len(steps) <= HISTORY_ROWS and steps[0] == 0 and steps[-1] == HISTORY_ROWS
    fig = curves_figure({"run": logger.history})
    assert fig._repr_png_().startswith(b"\x89PNG")


def test_the_log_line_s_policy_lag_max_is_the_largest_since_the_last_line():
    """Each update reports its own lag mean and max; a log line (and its scalars) averages the
    means since the previous line and takes the largest max, not the last update's."""
    from asyncrl.logger import TrainLogger
    from asyncrl.messages import Report, ReportKind
    logger = TrainLogger(verbose=0, log_interval=0.0, stats_window=10)
    logger.trained({"learner-0": "policy"})
    for mean, top in ((1.5, 3.0), (0.5, 1.0)):
        logger.on_report(Report(ReportKind.TRAIN, "learner-0",
                                {"policy_lag_mean": mean, "policy_lag_max": top}))
    scalars = logger.scalars()
    assert scalars["train/policy_lag_mean"] == 1.0 and scalars["train/policy_lag_max"] == 3.0
    assert "lag mean 1.0 max 3" in logger.summary_line(0, scalars)
    logger.maybe_log({"policy": 0}, force=True)  # a new window: no update yet, the last one's
    assert logger.scalars()["train/policy_lag_max"] == 1.0


SETUP = '''
import sys
sys.path.insert(0, {tests!r})
from ma_envs import RepeatedRPS


def make():
    return RepeatedRPS(rounds=5)


def rock(obs):
    return 0


def by_seat(agent):
    return "hero" if agent == "player_0" else "bot"


def hero_vs_rival(agent):
    return "hero" if agent == "player_0" else "rival"
'''


def test_multi_agent_runs_from_a_policies_file(tmp_path):
    """Trained (with overrides), rule-based and frozen policies and the mapping from YAML;
    resume, evaluate and enjoy per policy; frozen weights read from another run's checkpoint."""
    import torch
    import yaml
    (tmp_path / "duel_setup.py").write_text(SETUP.format(tests=os.path.dirname(__file__)))
    (tmp_path / "policies.yaml").write_text(
        "policies:\n  hero: {learning_rate: 0.003}\n  bot: {rule: 'duel_setup:rock'}\n"
        "mapping: duel_setup:by_seat\n")
    train = ["train", "--env", "duel_setup:make", "--experiment", "duel", *SERIAL]
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def cli(*args, check=True):
        out = subprocess.run([sys.executable, "-m", "asyncrl", *args], capture_output=True,
                             text=True, timeout=240, cwd=tmp_path, env=env)
        assert not check or out.returncode == 0, out.stdout + out.stderr
        return out

    cli(*train, "--policies", "policies.yaml", "--steps", "1024")
    saved = yaml.safe_load((tmp_path / "train_dir" / "duel" / "config.yaml").read_text())
    assert saved["policies"]["mapping"] == "duel_setup:by_seat"
    assert "resuming" in cli(*train, "--steps", "2048").stdout  # the saved file is read again
    result = json.loads(cli("evaluate", "--experiment", "duel", "--episodes", "3",
                            "--policy_id", "bot").stdout)
    assert result["policy_id"] == "bot" and -5 <= result["mean_return"] <= 5
    out = cli("enjoy", "--experiment", "duel", "--max_episodes", "2").stdout
    assert "episode 1: hero" in out and "bot" in out
    (tmp_path / "changed.yaml").write_text(
        "policies:\n  hero: null\n  bot: {rule: 'duel_setup:rock'}\nmapping: duel_setup:by_seat\n")
    out = cli(*train, "--policies", "changed.yaml", "--steps", "4096", check=False)
    assert out.returncode == 2 and "cannot change on resume" in out.stderr
    checkpoint = sorted((tmp_path / "train_dir" / "duel" / "checkpoints").iterdir())[-1]
    (tmp_path / "rival.yaml").write_text(
        f"policies:\n  hero: null\n  rival: {{frozen: true, weights: '{checkpoint}', weights_of: hero}}\n"
        "mapping: duel_setup:hero_vs_rival\n")
    cli("train", "--env", "duel_setup:make", "--experiment", "rival", *SERIAL, "--policies",
        "rival.yaml", "--steps", "1024")
    from asyncrl import APPO
    sys.path.insert(0, str(tmp_path))
    try:
        old = APPO.load(checkpoint, tensorboard_log=None)
        new = APPO.load(sorted((tmp_path / "train_dir" / "rival" / "checkpoints").iterdir())[-1],
                        tensorboard_log=None)
        hero, rival = old.get_parameters()["hero"], new.get_parameters()["rival"]
        assert all(torch.equal(hero[k], rival[k]) for k in hero)
        old.close(), new.close()
    finally:
        sys.path.remove(str(tmp_path))
    (tmp_path / "bad.yaml").write_text("policies:\n  hero: null\n  bot: {rule: 'duel_setup:nope'}\n")
    out = cli("train", "--env", "duel_setup:make", "--experiment", "bad", *SERIAL, "--policies",
              "bad.yaml", check=False)
    assert out.returncode == 2 and "policies.bot.rule: could not import nope" in out.stderr
