"""The ``asyncrl`` command (also ``python -m asyncrl``).

    asyncrl train --env CartPole-v1 --experiment cartpole [--steps 500000] [--config hp.yaml]
                  [--train_dir train_dir] [--field value ...]      # the same again: resumes
    asyncrl train --env mypackage.games:make_env --policies policies.yaml --experiment duel
                                                                   # multi-agent (policy_file)
    asyncrl enjoy --experiment cartpole [--save_video] [--max_episodes 3] [--deterministic]
    asyncrl evaluate --experiment cartpole --episodes 20 [--policy_id ID]
    asyncrl export --experiment cartpole [--out policy.onnx|policy.pt]  # for deployment
    asyncrl plot train_dir/cartpole [train_dir/other ...] [--out curves.png]
    asyncrl benchmark throughput --env ID [--sf] [config flags]   # or another script of benchmarks/
    asyncrl benchmark learn --quick                               # the learning suite (learning_suite.py)

Without a command, ``python -m asyncrl`` trains CartPole-v1 with the defaults and evaluates it.
Every experiment lives in ``TRAIN_DIR/NAME`` (see :class:`RunDir`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from typing import List, Optional

from .config import Config, ConfigError, Settings, portable
from .flags import add_config_flags, config_flags, parse_value
from .fileio import atomic_open

BENCHMARKS = ("learn", "throughput", "cartpole_throughput", "atari_learning", "doom_learning", "memory_tasks",
              "multiagent", "continuous_control", "soak")
SCRIPTS = {"learn": "learning_suite"}  # benchmark names that are not their script's


class RunDir:
    """``TRAIN_DIR/NAME`` of one experiment:

    - ``config.yaml``: env, env_kwargs, total steps and every Config field, as resolved (and a
      multi-agent run's policies file: its path and contents);
    - ``checkpoints/checkpoint_<env steps>.pt``: ``APPO.save`` files, the newest ``keep`` kept;
    - ``progress.csv``: the console summary's scalars (SB3's names), one row per summary;
    - ``tb/APPO_N``: TensorBoard scalars (one N per ``train`` command);
    - ``summary.json``: steps, time, FPS and mean return at the end of the last ``train``;
    - ``evaluation.json``: from ``asyncrl evaluate``; ``videos/``: from ``asyncrl enjoy``.
    """

    def __init__(self, train_dir: str, experiment: str):
        if not experiment or os.sep in experiment:
            raise ConfigError(f"--experiment {experiment!r}: a plain name, no path separators")
        self.path = os.path.join(train_dir, experiment)
        self.config_path = os.path.join(self.path, "config.yaml")
        self.checkpoint_dir = os.path.join(self.path, "checkpoints")
        self.progress_csv = os.path.join(self.path, "progress.csv")

    def checkpoints(self) -> List[str]:
        if not os.path.isdir(self.checkpoint_dir):
            return []
        names = sorted(n for n in os.listdir(self.checkpoint_dir)
                       if n.startswith("checkpoint_") and n.endswith(".pt"))
        return [os.path.join(self.checkpoint_dir, n) for n in names]

    def latest_checkpoint(self) -> Optional[str]:
        found = self.checkpoints()
        return found[-1] if found else None

    def require_checkpoint(self) -> str:
        latest = self.latest_checkpoint()
        if latest is None:
            raise ConfigError(f"no checkpoint in {self.checkpoint_dir}: train the experiment first "
                              "(asyncrl train --experiment NAME ...), or check --train_dir")
        return latest

    def save_checkpoint(self, model, keep: int) -> str:
        path = os.path.join(self.checkpoint_dir, f"checkpoint_{model.num_timesteps:015d}.pt")
        model.save(path)
        for old in self.checkpoints()[:-keep]:
            os.remove(old)
        return path

    def read_config(self) -> Optional[dict]:
        if not os.path.exists(self.config_path):
            return None
        import yaml
        with open(self.config_path) as f:
            return yaml.safe_load(f)

    def write_config(self, env, env_kwargs: dict, steps: int, settings: Settings,
                     policies: Optional[tuple] = None) -> None:
        """The run's config and the fields its caller set (``settings``); ``policies``: (path,
        document) of a multi-agent run's policies file."""
        import yaml
        os.makedirs(self.path, exist_ok=True)
        fields = {k: list(v) if isinstance(v, tuple) else v
                  for k, v in dataclasses.asdict(settings.config).items()}
        doc = {"env": env if isinstance(env, str) else repr(env), "env_kwargs": env_kwargs or {},
               "steps": steps, "config": fields, "set_by_caller": sorted(settings.set_by_caller)}
        if policies is not None:
            doc["policies_file"], doc["policies"] = policies
        with atomic_open(self.config_path) as f:
            yaml.safe_dump(doc, f, sort_keys=False)

    def write_json(self, name: str, data: dict) -> str:
        path = os.path.join(self.path, name)
        with atomic_open(path) as f:
            json.dump(data, f, indent=1)
        return path


def read_hyperparams(path: str, env_id: str) -> dict:
    """An RL Zoo-style YAML file: ``{env id: {field: value}}``, or one flat ``{field: value}``."""
    import yaml
    with open(path) as f:
        doc = yaml.safe_load(f) or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"--config {path}: expected a mapping of Config fields (or env id -> fields)")
    if env_id in doc:
        doc = doc[env_id]
    elif any(isinstance(v, dict) for v in doc.values()):
        raise ConfigError(f"--config {path} has sections {sorted(doc)} but none for {env_id!r}")
    return dict(doc)


def resolve_env(text: str):
    """A Gymnasium id, or ``package.module:function`` naming an env factory."""
    if ":" in text and not text.startswith("ALE/"):
        import importlib
        module, _, name = text.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"--env {text}: could not import {name} from {module} ({e})") from e
    return text


# --- train --------------------------------------------------------------------------------
def cmd_train(args: dict) -> None:
    from .appo import APPO
    from .callbacks import ProgressBar
    run = RunDir(args.pop("train_dir"), args.pop("experiment"))
    saved = run.read_config() or {}
    env_text = args.pop("env") or saved.get("env")
    if env_text is None:
        raise ConfigError(f"{run.path} is a new experiment: give --env (e.g. --env CartPole-v1)")
    if saved and env_text != saved["env"]:
        raise ConfigError(f"experiment {run.path} trains {saved['env']}, not {env_text}; "
                          "choose another --experiment")
    env = resolve_env(env_text)
    env_kwargs = args.pop("env_kwargs")
    if saved and env_kwargs is not None and env_kwargs != (saved.get("env_kwargs") or {}):
        raise ConfigError(f"--env_kwargs cannot change on resume (saved: {saved.get('env_kwargs')}); "
                          "choose another --experiment")
    env_kwargs = env_kwargs or saved.get("env_kwargs") or None
    policy_file = _policy_file(args.pop("policies"), saved)
    steps = args.pop("steps") or saved.get("steps") or 1_000_000
    explicit = {**(read_hyperparams(args.pop("config"), env_text) if args.get("config") else {}),
                **config_flags(args)}
    explicit.setdefault("tensorboard_log", os.path.join(run.path, "tb"))
    checkpoint = run.latest_checkpoint()
    saved_cfg = saved.get("config") or {}
    if checkpoint is None:  # new, or stopped before its first checkpoint: saved config, then flags
        agents = {} if policy_file is None else dict(policies=policy_file.policies,
                                                     policy_mapping=policy_file.mapping)
        # what the machine implied is derived here again (config.portable), as load() does
        mine = portable(saved_cfg, saved.get("set_by_caller"))
        model = APPO(env, env_kwargs=env_kwargs, **agents, **{**mine, **explicit})
        if policy_file is not None and policy_file.frozen_weights:
            model.set_parameters(policy_file.frozen_weights)
    else:  # the saved device unless one is given (load()'s own default is "auto", as SB3's)
        model = APPO.load(checkpoint, **{"device": saved_cfg.get("device", "auto"), **explicit})
        print(f"resuming {run.path} from {os.path.basename(checkpoint)} "
              f"({model.num_timesteps:,} env steps)" + _config_changes(saved.get("config"), model.config))
    run.write_config(env_text, env_kwargs, steps, model.settings,
                     None if policy_file is None else (policy_file.path, policy_file.doc))
    model.logger.log_to_csv(run.progress_csv)
    if model.num_timesteps >= steps:
        print(f"{run.path} has trained {model.num_timesteps:,} of --steps {steps:,}: nothing to do "
              "(raise --steps to train further)")
        return
    bar = ProgressBar(steps, 0, model.num_timesteps) if args["progress_bar"] else None
    if bar is not None:
        model.logger.write = bar.write
    _train_with_checkpoints(model, run, steps, args, bar)


def _policy_file(path: Optional[str], saved: dict):
    """The experiment's policies file (see policy_file): the one given, else the saved one's
    path; on resume it cannot change (the checkpoint holds the policies it trained)."""
    from .policy_file import read_policy_file
    path = path or saved.get("policies_file")
    if path is None:
        return None
    parsed = read_policy_file(path)
    if saved.get("policies") is not None and parsed.doc != saved["policies"]:
        raise ConfigError(f"--policies {path} differs from the policies this experiment trains "
                          "(config.yaml's 'policies'); they cannot change on resume: choose another "
                          "--experiment")
    return parsed


def _config_changes(saved: Optional[dict], cfg: Config) -> str:
    if not saved:
        return ""
    changed = [f"{k} {saved[k]!r} -> {v!r}" for k, v in dataclasses.asdict(cfg).items()
               if k in saved and saved[k] != (list(v) if isinstance(v, tuple) else v)]
    return ("; changed since the saved config: " + ", ".join(changed)) if changed else ""


class Terminated(BaseException):
    """SIGTERM during training: unwinds like Ctrl-C (workers stopped, a checkpoint saved)."""


REPEATED_SIGTERM = 1.0  # seconds: a SIGTERM this soon after the one raised is the same request
_last_terminated = [-REPEATED_SIGTERM]


def raise_terminated(signum, frame):
    """A SIGTERM handler: raises :class:`Terminated` in the main process (also for benchmarks'
    long runs, which checkpoint on it). A repeat within ``REPEATED_SIGTERM`` seconds is
    ignored: ``timeout`` delivers the signal twice at once (to the command, then to its
    process group), and the second, raised again inside the graph's shutdown, left it half
    done (tensorboardX's close then hung, 1 stop in 9). A SIGTERM sent later raises again (a
    deliberate second stop; or the first was swallowed by code that catches everything)."""
    now = time.monotonic()
    if now - _last_terminated[0] < REPEATED_SIGTERM:
        return
    _last_terminated[0] = now
    raise Terminated()


def _train_with_checkpoints(model, run: RunDir, steps: int, args: dict, bar) -> None:
    """Train to ``steps`` in total, checkpointing every ``save_every`` seconds and at the end,
    also after an error or Ctrl-C (the weights kept are the last published ones)."""
    start_steps, t0 = model.num_timesteps, time.perf_counter()
    last_save = [time.perf_counter()]

    def hook(m):
        if bar is not None:
            bar(m)
        if time.perf_counter() - last_save[0] >= args["save_every"]:
            run.save_checkpoint(m, args["keep_checkpoints"])
            last_save[0] = time.perf_counter()

    previous = signal.signal(signal.SIGTERM, raise_terminated)  # SIGTERM: as Ctrl-C
    try:
        model.train(steps - model.num_timesteps, callback=hook, callback_interval=0.5)
    except (KeyboardInterrupt, Terminated) as e:
        signal.signal(signal.SIGTERM, previous)
        path = run.save_checkpoint(model, args["keep_checkpoints"])
        print(f"\n{'terminated' if isinstance(e, Terminated) else 'interrupted'} at "
              f"{model.num_timesteps:,} env steps; saved {path}; run the same command to resume",
              file=sys.stderr)
        raise SystemExit(143 if isinstance(e, Terminated) else 130)
    except Exception:
        run.save_checkpoint(model, args["keep_checkpoints"])
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        if bar is not None:
            bar(model)
            bar.close()
        model.close()
    seconds = time.perf_counter() - t0
    path = run.save_checkpoint(model, args["keep_checkpoints"])
    run.write_json("summary.json", dict(
        env_steps=model.num_timesteps, policy_version=model.policy_version, seconds=round(seconds, 1),
        fps=round((model.num_timesteps - start_steps) / seconds, 1),
        ep_rew_mean=model.logger.ep_rew_mean, checkpoint=os.path.relpath(path, run.path)))
    print(f"trained {run.path} to {model.num_timesteps:,} env steps in {seconds:.1f} s; saved {path}")


# --- enjoy / evaluate -------------------------------------------------------------------------
def _load(run: RunDir, checkpoint: Optional[str]):
    from .appo import APPO
    return APPO.load(checkpoint or run.require_checkpoint(), device="cpu", verbose=0,
                     tensorboard_log=None)


def cmd_enjoy(args: dict) -> None:
    from .appo import play_episode
    from .env_utils import GymIdFactory, eval_env_factory
    run = RunDir(args["train_dir"], args["experiment"])
    model = _load(run, args["checkpoint"])
    if model.agents is not None:
        return _enjoy_agents(model, args)
    factory = eval_env_factory(model.env_factory)
    if args["save_video"] and isinstance(factory, GymIdFactory):
        factory = GymIdFactory(factory.env_id, {**factory.env_kwargs, "render_mode": "rgb_array"})
    if args["save_video"]:
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame renders off-screen
    env = factory()
    if args["save_video"]:  # a missing renderer fails here, before any file is written
        env.reset()
        env.render()
    writer = _video_writer(run, env) if args["save_video"] else None
    try:
        for ep in range(args["max_episodes"]):
            on_step = None if writer is None else (lambda e: writer.append_data(_pad16(e.render())))
            ret, length = play_episode(model, env, args["deterministic"], on_step=on_step)
            print(f"episode {ep}: return {ret:.2f}, length {length}")
    finally:
        env.close()
        if writer is not None:
            writer.close()
            print(f"wrote {writer.path}")


def _enjoy_agents(model, args: dict) -> None:
    """A multi-agent env's episodes: each policy's return (its agents' mean), printed."""
    if args["save_video"]:
        raise ConfigError("--save_video: videos are made of single-agent envs only; render a "
                          "multi-agent env from Python (model.predict per agent)")
    env = model.env_factory()
    try:
        for ep in range(args["max_episodes"]):
            returns = model.play_agents(env, args["deterministic"], episode_idx=ep)
            print(f"episode {ep}: " + ", ".join(f"{pid} {r:.2f}" for pid, r in returns.items()))
    finally:
        env.close()


def _video_writer(run: RunDir, env):
    try:
        import imageio
    except ImportError as e:
        raise ConfigError("--save_video needs imageio and imageio-ffmpeg: "
                          "pip install 'asyncrl[video]'") from e
    if env.render_mode != "rgb_array":
        raise ConfigError(f"--save_video: the env renders with render_mode={env.render_mode!r}; "
                          "its factory must accept/set render_mode='rgb_array'")
    os.makedirs(os.path.join(run.path, "videos"), exist_ok=True)
    path = os.path.join(run.path, "videos", time.strftime("enjoy_%Y%m%d_%H%M%S.mp4"))
    # H.264 in yuv420p plays in browsers; frames are padded (not resized) to multiples of 16
    writer = imageio.get_writer(path, fps=env.metadata.get("render_fps") or 30, codec="libx264",
                                pixelformat="yuv420p", macro_block_size=1)
    writer.path = path
    return writer


def _pad16(frame):
    import numpy as np
    h, w = frame.shape[:2]
    return np.pad(frame, ((0, -h % 16), (0, -w % 16), (0, 0)), mode="edge")


def _checkpoint(args: dict):
    """(run directory, checkpoint file, model loaded from it) of ``--experiment`` and
    ``--checkpoint`` (default: the newest)."""
    run = RunDir(args["train_dir"], args["experiment"])
    checkpoint = args["checkpoint"] or run.require_checkpoint()
    return run, checkpoint, _load(run, checkpoint)


def cmd_evaluate(args: dict) -> None:
    run, checkpoint, model = _checkpoint(args)
    mean, std = model.evaluate(args["episodes"], deterministic=not args["stochastic"],
                               policy_id=args["policy_id"])
    result = dict(mean_return=mean, std_return=std, episodes=args["episodes"],
                  policy_id=args["policy_id"] or model.policy_id,
                  deterministic=not args["stochastic"], env_steps=model.num_timesteps,
                  checkpoint=os.path.relpath(checkpoint, run.path))
    run.write_json("evaluation.json", result)
    print(json.dumps(result))


def cmd_export(args: dict) -> None:
    run, checkpoint, model = _checkpoint(args)
    out = args["out"] or os.path.join(run.path, "policy.onnx")
    fmt = model.export(out, format=args["format"], policy_id=args["policy_id"])
    print(json.dumps(dict(path=out, format=fmt, checkpoint=os.path.relpath(checkpoint, run.path),
                          env_steps=model.num_timesteps)))


# --- plot -----------------------------------------------------------------------------------
def cmd_plot(args: dict) -> None:
    import csv
    from .plotting import curves_figure
    runs = {}
    for run_dir in args["runs"]:
        path = os.path.join(run_dir, "progress.csv") if os.path.isdir(run_dir) else run_dir
        if not os.path.exists(path):
            raise ConfigError(f"{run_dir}: no progress.csv (is it a run directory of asyncrl train?)")
        with open(path, newline="") as f:
            runs[os.path.basename(os.path.normpath(run_dir))] = list(csv.DictReader(f))
    curves_figure(runs).savefig(args["out"])
    print(f"wrote {args['out']}")


# --- benchmark ------------------------------------------------------------------------------
def cmd_benchmark(args: dict) -> None:
    import runpy
    bench_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    script = os.path.join(bench_dir, SCRIPTS.get(args["name"], args["name"]) + ".py")
    if not os.path.exists(script):
        raise ConfigError(f"{script} not found: the benchmarks ship with the source checkout "
                          "(git clone ... && pip install -e .)")
    sys.path.insert(0, bench_dir)
    sys.argv = [script, *args["rest"]]
    runpy.run_path(script, run_name="__main__")


# --- the command line -------------------------------------------------------------------------
def cmd_quick(args: dict) -> None:
    """No command: train (CartPole-v1 by default) in this process's lifetime, then evaluate."""
    from .appo import APPO
    env, steps, episodes, save = (args.pop(k) for k in ("env", "steps", "eval_episodes", "save"))
    t0 = time.perf_counter()
    with APPO(resolve_env(env), **config_flags(args)) as model:
        model.train(steps)
        mean, std = model.evaluate(episodes)
        print(f"trained {model.num_timesteps:,} env steps in {time.perf_counter() - t0:.1f} s; "
              f"greedy return over {episodes} episodes: {mean:.1f} +/- {std:.1f}")
        if save:
            model.save(save)
            print(f"saved to {save}")


# Each command's handler, in --help's order; "quick" is the bare ``python -m asyncrl``
HANDLERS = {"train": cmd_train, "enjoy": cmd_enjoy, "evaluate": cmd_evaluate, "export": cmd_export,
            "plot": cmd_plot, "benchmark": cmd_benchmark, "quick": cmd_quick}
COMMANDS = tuple(name for name in HANDLERS if name != "quick")


def _experiment_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiment", required=True, help="experiment name (its run directory)")
    p.add_argument("--train_dir", default="train_dir", help="where run directories live")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="asyncrl", description=__doc__.split("\n")[0], allow_abbrev=False,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 2)[2])
    sub = ap.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}")
    p = sub.add_parser("train", allow_abbrev=False, help="train an experiment (again: resume it)",
                       description="Train in TRAIN_DIR/EXPERIMENT; the same command again resumes "
                       "from the latest checkpoint. Flags given win over the saved config.")
    _experiment_flags(p)
    p.add_argument("--env", default=None, help="Gymnasium id or module:factory (new experiments)")
    p.add_argument("--env_kwargs", type=parse_value, default=None, help="dict for gymnasium.make")
    p.add_argument("--steps", type=int, default=None,
                   help="total env steps of the experiment (default: the saved value, else 1M)")
    p.add_argument("--config", default=None, help="YAML of Config fields, RL Zoo style "
                   "({env id: {field: value}} or flat); flags win over it")
    p.add_argument("--policies", default=None, help="a multi-agent env's policies and mapping "
                   "(YAML: trained, frozen with weights from files, rule-based module:function; "
                   "see asyncrl.policy_file)")
    p.add_argument("--save_every", type=float, default=300.0, help="seconds between checkpoints")
    p.add_argument("--keep_checkpoints", type=int, default=3, help="newest checkpoints kept")
    p.add_argument("--progress_bar", action=argparse.BooleanOptionalAction,
                   default=sys.stderr.isatty(), help="tqdm bar (default: on in a terminal)")
    add_config_flags(p)
    p = sub.add_parser("enjoy", allow_abbrev=False, help="play the latest checkpoint, optionally to an mp4")
    _experiment_flags(p)
    p.add_argument("--checkpoint", default=None, help="a checkpoint file (default: the latest)")
    p.add_argument("--max_episodes", type=int, default=3)
    p.add_argument("--deterministic", action="store_true", help="greedy actions (default: sampled)")
    p.add_argument("--save_video", action="store_true", help="write RUN_DIR/videos/enjoy_*.mp4")
    p = sub.add_parser("evaluate", allow_abbrev=False, help="mean and std of the raw return, printed as JSON")
    _experiment_flags(p)
    p.add_argument("--checkpoint", default=None, help="a checkpoint file (default: the latest)")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--stochastic", action="store_true", help="sampled actions (default: greedy)")
    p.add_argument("--policy_id", default=None, help="a multi-agent model's policy whose agents' "
                   "return is reported (default: the first trained)")
    p = sub.add_parser("export", allow_abbrev=False,
                       help="write the deterministic policy as ONNX or TorchScript, for deployment")
    _experiment_flags(p)
    p.add_argument("--checkpoint", default=None, help="a checkpoint file (default: the latest)")
    p.add_argument("--out", default=None, help="the file: *.onnx (ONNX) or *.pt (TorchScript); "
                   "default RUN_DIR/policy.onnx")
    p.add_argument("--format", choices=("onnx", "torchscript"), default=None,
                   help="instead of the file's extension")
    p.add_argument("--policy_id", default=None, help="a multi-agent model's policy (default: the "
                   "first trained)")
    p = sub.add_parser("plot", allow_abbrev=False, help="learning curves of run directories to a PNG")
    p.add_argument("runs", nargs="+", help="run directories (or their progress.csv)")
    p.add_argument("--out", default="curves.png")
    p = sub.add_parser("benchmark", allow_abbrev=False, help="run a script of benchmarks/ (source checkout)",
                       description="asyncrl benchmark NAME [its flags]; NAME --help for them")
    p.add_argument("name", choices=BENCHMARKS)
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own flags")
    return ap


def build_quick_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m asyncrl", allow_abbrev=False, description=(
        "Train (CartPole-v1 by default) and evaluate the greedy policy. For experiments with run "
        "directories, resume, videos and plots see: asyncrl {train,enjoy,evaluate,plot,benchmark} --help"))
    ap.add_argument("--env", default="CartPole-v1", help="Gymnasium id or module:factory")
    ap.add_argument("--steps", type=int, default=200_000, help="env steps to train for")
    ap.add_argument("--eval_episodes", type=int, default=10)
    ap.add_argument("--save", default=None, help="write the trained model to this path")
    add_config_flags(ap)
    return ap


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS or argv[:1] in (["-h"], ["--help"]):
        ap = build_parser()
        args = vars(ap.parse_args(argv))
    else:
        ap = build_quick_parser()
        args = dict(vars(ap.parse_args(argv)), command="quick")
    handler = HANDLERS[args.pop("command") or "quick"]
    from gymnasium.error import DependencyNotInstalled
    try:
        handler(args)
    except (ConfigError, FileNotFoundError, DependencyNotInstalled) as e:
        ap.exit(2, f"{ap.prog}: error: {e}\n")
