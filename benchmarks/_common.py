"""What the benchmarks share: raw env rate, per-process CPU and memory sampling, steady FPS,
Sample Factory's training runs."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from typing import Dict, List

import psutil

from asyncrl import APPO
from asyncrl.envs.doom import remove_orphaned_shm_files


def _raw_worker(env, env_kwargs: dict, seconds: float, out) -> None:
    from asyncrl.envs import make_env
    env = make_env(env, **env_kwargs) if isinstance(env, str) else env()
    env.reset(seed=0)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(100):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 100
    out.put(steps / seconds)


def raw_env_rate(env, processes: int, seconds: float = 5.0, env_kwargs: dict = None) -> float:
    """Env steps per second with random actions, one env per process, no learning. ``env``: an
    id (made as asyncrl makes it, with ``env_kwargs``) or a picklable zero-argument factory."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_raw_worker, args=(env, env_kwargs or {}, seconds, out))
             for _ in range(processes)]
    for p in procs:
        p.start()
    rates = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


# Sample Factory 2.1.1 in its own venv (../shared/bench/sample_factory/install.sh): it pins
# gymnasium<1.0 and numpy<2.0, so it runs as a subprocess of its own Python.
SF_PYTHON = os.path.join(os.environ.get("SF_VENV", "/tmp/sf-venv"), "bin", "python")
# Its training return is written against its frame counter in TensorBoard summaries, read by this
# snippet under SF's own Python (it has TensorBoard's reader).
SF_READ_TB = """
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0}); acc.Reload()
tag = "policy_stats/avg_true_objective"
print(json.dumps([(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []))
"""


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid`` (Sample Factory's, with its process groups in
    it), again while any is left (one may have forked meanwhile)."""
    for _ in range(20):
        left = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == sid:
                    p.kill()
                    left.append(p)
            except (psutil.Error, OSError):
                pass
        if not left:
            return
        psutil.wait_procs(left, timeout=1.0)


def end_sf_session(sid: int, shm_before: set) -> None:
    """Kill Sample Factory's session ``sid`` and unlink the multiprocessing semaphores that
    appeared in /dev/shm since ``shm_before`` (a killed SF never unlinks its own), and the files
    of its VizDoom games, which its killed engines leave (those of no running engine)."""
    kill_session(sid)
    new = set(os.listdir("/dev/shm")) - shm_before
    for name in new:
        if name.startswith("sem.mp-"):
            try:
                os.remove(os.path.join("/dev/shm", name))
            except FileNotFoundError:
                pass
    remove_orphaned_shm_files(min_age=0.0, among=new)


def _run_session(cmd: List[str], log_path: str, env: Dict[str, str] = None) -> int:
    """Run ``cmd`` in a session of its own, its output to ``log_path``; the whole session ends
    with it (SF's workers outlive their parent), also when this process is interrupted."""
    shm_before = set(os.listdir("/dev/shm"))
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=None if env is None else {**os.environ, **env})
        try:
            return proc.wait()
        finally:
            end_sf_session(proc.pid, shm_before)


def sf_enjoy_returns(log: str) -> List[float]:
    """The episode returns of a Sample Factory ``enjoy`` log, in order. After each episode it logs
    the mean true objective of the episodes so far (over its last 100): the k-th return is k x
    the k-th mean less (k - 1) x the one before, for the first 100."""
    means = [float(m.group(1)) for m in re.finditer(r"avg true_objective: ([-\d.e+]+)", log)][:100]
    return [k * m - (k - 1) * prev for k, (prev, m) in enumerate(zip([0.0] + means, means), 1)]


def sample_factory(module: str, flags: List[str], frames: int, seed: int,
                   eval_episodes: int = 0) -> dict:
    """Train Sample Factory's example ``python -m module`` (with ``flags``: its env, layout, device)
    for ``frames`` of its frame counter (env steps x its frame skip), seed ``seed``, on the CPU
    unless ``flags`` say otherwise. Returns ``curve`` [(frames, seconds since the launch, start-up
    included; its training return ``avg_true_objective``, a mean over its last 100 episodes)],
    ``seconds`` (the whole run) and, with ``eval_episodes``, ``greedy``: the returns of that many
    episodes of its final policy with deterministic actions (``enjoy``'s
    ``--eval_deterministic``; its episodes cannot be seeded as asyncrl's evaluation seeds them)."""
    if eval_episodes > 100:
        raise ValueError(f"eval_episodes={eval_episodes}: Sample Factory's enjoy reports means over "
                         "its last 100 episodes, so at most 100 episodes are read back")
    if not os.path.exists(SF_PYTHON):
        raise SystemExit(f"{SF_PYTHON} not found: run ../shared/bench/sample_factory/install.sh "
                         "(or set SF_VENV)")
    train_dir = tempfile.mkdtemp(prefix="sf-run-")
    try:
        common = ["--experiment=run", f"--train_dir={train_dir}", "--device=cpu", f"--seed={seed}",
                  *flags]
        t0, start = time.perf_counter(), time.time()  # summaries carry epoch times
        code = _run_session([SF_PYTHON, "-m", module, "--restart_behavior=overwrite",
                           f"--train_for_env_steps={frames}", *common], os.path.join(train_dir, "log"))
        seconds = time.perf_counter() - t0
        out = subprocess.run([SF_PYTHON, "-c", SF_READ_TB, os.path.join(train_dir, "run", ".summary", "0")],
                             capture_output=True, text=True)
        points = json.loads(out.stdout or "[]")
        if not points:
            with open(os.path.join(train_dir, "log")) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"Sample Factory logged no training return (exit {code}); its log ends:\n{tail}")
        result = {"curve": [(step, round(wall - start, 1), value) for step, wall, value in points],
                  "seconds": round(seconds, 1)}
        if eval_episodes:
            enjoy = module.replace(".train_", ".enjoy_")
            log_path = os.path.join(train_dir, "enjoy.log")
            _run_session([SF_PYTHON, "-m", enjoy, "--no_render", "--eval_deterministic=True",
                        f"--max_num_episodes={eval_episodes}", *common], log_path,
                       # its checkpoints hold NumPy scalars, which torch >= 2.6 refuses to load
                       # by default; they are the files this run just wrote
                       env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
            with open(log_path) as f:
                text = f.read()
            returns = sf_enjoy_returns(text)
            if len(returns) < eval_episodes:
                raise RuntimeError(f"Sample Factory's enjoy played {len(returns)} of {eval_episodes} "
                                   f"episodes; its log ends:\n{text[-2000:]}")
            result["greedy"] = returns[:eval_episodes]
        return result
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)


def exit_on_sigterm() -> None:
    """In a benchmark's main process: SIGTERM (a plain kill, a scheduler's) exits as sys.exit
    does, so ``finally`` clauses and ``with`` blocks run: a run's APPO closes its workers, whose
    envs close (VizDoom's engines remove their shared memory; killed, they leave it), and Sample
    Factory's session is killed. A repeat within cli.REPEATED_SIGTERM seconds (``timeout``
    signals twice at once) is ignored, as in the CLI, so it cannot cut that clean-up short."""
    from asyncrl.cli import Terminated, raise_terminated

    def exit_once(signum, frame):
        try:
            raise_terminated(signum, frame)  # the CLI's handler: it drops the repeat
        except Terminated:
            sys.exit(128 + signal.SIGTERM)
    signal.signal(signal.SIGTERM, exit_once)


def top_level_parts(text: str) -> list:
    """``text`` split on the commas outside brackets and quotes: "a=(1, 2),b='x,y'" ->
    ["a=(1, 2)", "b='x,y'"]. ValueError where a bracket or quote is left open or closes one
    that was not opened."""
    parts, depth, quote, start = [], [], "", 0
    pairs = {")": "(", "]": "[", "}": "{"}
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth.append(c)
        elif c in pairs:
            if not depth or depth.pop() != pairs[c]:
                raise ValueError(f"{text!r}: {c!r} at {i} closes no bracket")
        elif c == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth or quote:
        raise ValueError(f"{text!r}: {(depth or [quote])[-1]!r} is not closed")
    return parts + [text[start:]]


def parse_variant(text: str) -> dict:
    """A --variant: "field=value,field=value" -> {field: value} (values as Python literals where
    they are; a comma inside brackets or quotes belongs to its value, so
    "hidden_sizes=(256, 256)" is one field). A dotted name sets one key of a dict-valued
    argument: "policy_kwargs.log_std_init=0.0" -> {"policy_kwargs": {"log_std_init": 0.0}}, which
    ``merged`` lays over the run's own policy_kwargs, where "policy_kwargs=dict(...)" would
    replace it (and is not a literal). ValueError naming the part that is not field=value."""
    from asyncrl.flags import parse_value
    out: dict = {}
    try:
        parts = top_level_parts(text or "")
    except ValueError as e:
        raise ValueError(f"--variant {e}") from None
    for part in filter(None, (p.strip() for p in parts)):
        name, eq, value = part.partition("=")
        *path, leaf = name.strip().split(".")
        if not eq or not leaf or not all(path):
            raise ValueError(f"--variant {text!r}: {part!r} is not field=value")
        into = out
        for key in path:
            into = into.setdefault(key, {})
            if not isinstance(into, dict):
                raise ValueError(f"--variant {text!r}: {key} is given whole and by key")
        if isinstance(into.get(leaf), dict):  # "x.k=1,x=2": the whole after a key of it
            raise ValueError(f"--variant {text!r}: {leaf} is given whole and by key")
        into[leaf] = parse_value(value.strip())
    return out


def merged(base: dict, over: dict) -> dict:
    """``over`` laid on ``base``; where both hold a dict under a key, key by key (a --variant's
    policy_kwargs.log_std_init keeps the run's other policy_kwargs)."""
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = merged(out[key], value) if both else value
    return out


def with_schedules(overrides: dict) -> dict:
    """RL Zoo's schedule strings among --variant values as schedules: "lin_X" is X falling linearly
    to 0 over each train() call (a function of SB3's progress_remaining)."""
    out = dict(overrides)
    for name, value in overrides.items():
        if isinstance(value, str) and value.startswith("lin_"):
            try:
                start = float(value[4:])
            except ValueError:
                raise ValueError(f"--variant {name}={value}: lin_ needs a number, e.g. lin_3e-4") from None
            out[name] = lambda progress_remaining, start=start: start * progress_remaining
    return out


def tree_memory() -> dict:
    """Memory of this process and all its descendants, in bytes: PSS (shared pages divided among
    the processes that map them: the sum is what the tree costs) and RSS (each process whole)."""
    me = psutil.Process()
    pss = rss = n = 0
    for p in [me, *me.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        pss, rss, n = pss + info.pss, rss + info.rss, n + 1
    return {"pss": pss, "rss": rss, "processes": n}


class ProcessTreeSampler(threading.Thread):
    """CPU seconds per wall second of each process of this tree (by name) after ``start_after``
    seconds, and the peak proportional set size (PSS) of the whole tree, read every
    ``memory_interval`` seconds: one PSS reading of a 6-process Atari tree costs ~30 ms of CPU
    (the kernel walks every mapping), 6% of a core at 2 Hz, taken from the run it measures."""

    def __init__(self, start_after: float, memory_interval: float = 5.0):
        super().__init__(daemon=True)
        self.start_after, self.memory_interval = start_after, memory_interval
        self.stop_event = threading.Event()
        self.cpu, self.peak_pss = {}, 0  # bytes

    def run(self) -> None:
        me = psutil.Process()
        first, last, names = {}, {}, {}  # pid -> (time, cpu seconds); pid -> name
        t_start = time.perf_counter()
        next_memory = t_start + 2.0
        while not self.stop_event.wait(0.5):  # children are gone once train() returns: poll
            now = time.perf_counter()
            procs = [me, *me.children(recursive=True)]
            if now >= next_memory:
                self.peak_pss = max(self.peak_pss, tree_memory()["pss"])
                next_memory = now + self.memory_interval
            for p in procs:
                try:
                    name = "main" if p is me else open(f"/proc/{p.pid}/comm").read().strip()
                    cpu = sum(p.cpu_times()[:2])
                except (psutil.NoSuchProcess, OSError):
                    continue
                if now - t_start >= self.start_after:
                    first.setdefault(p.pid, (now, cpu))
                    last[p.pid], names[p.pid] = (now, cpu), name
        rates: Dict[str, float] = {}  # processes sharing a name (the fork server and
        for pid, (t1, c1) in last.items():  # multiprocessing's resource tracker) add up
            t0, c0 = first[pid]
            if t1 > t0:
                rates[names[pid]] = rates.get(names[pid], 0.0) + (c1 - c0) / (t1 - t0)
        self.cpu = {name: round(rate, 2) for name, rate in rates.items()}


def steady_fps(env: str, warmup: float, seconds: float = None, steps: int = None,
               **kwargs) -> dict:
    """Train until ``steps`` or ``seconds``; FPS = env steps trained on per second after
    ``warmup`` seconds (start-up included in the warm-up)."""
    samples = []
    t_start = time.perf_counter()

    def sample(model):
        samples.append((time.perf_counter(), model.num_timesteps))
        return False if seconds and time.perf_counter() - t_start > seconds else None

    sampler = ProcessTreeSampler(start_after=warmup)
    sampler.start()
    with APPO(env, **{**kwargs, "verbose": 0}) as model:
        model.train(steps or 10 ** 12, callback=sample, callback_interval=0.5)
        stats = dict(model.logger.last_train)
        timings = model.logger.timings
    sampler.stop_event.set()
    sampler.join()
    window = [(t, s) for t, s in samples if t - t_start >= warmup]
    fps = ((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
           if len(window) > 2 else float("nan"))
    return {"fps": fps, "cpu_per_process": sampler.cpu, "peak_pss_gib": sampler.peak_pss / 2 ** 30,
            "policy_lag_mean": stats.get("policy_lag_mean"), "timings": timings}


def pyplot():
    """matplotlib's pyplot (headless), or None with a hint when it is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no PNG (pip install 'asyncrl[bench]')")
        return None
    return plt


def write_runs(out: str, meta: dict, runs: list, keys: list, columns: list) -> None:
    """``out``.json ({**meta, "runs": runs}) and ``out``.csv: one row per curve point, the run's
    ``keys`` then the point's ``columns``."""
    import csv
    import json
    with open(out + ".json", "w") as f:
        json.dump({**meta, "runs": runs}, f, indent=1)
    with open(out + ".csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*keys, *columns])
        for r in runs:
            w.writerows((*(r[k] for k in keys), *row) for row in r["curve"])


def plot_curves(runs: list, panel: str, title, style, xlabel: str, ylabel: str,
                suptitle: str, path: str, width: float = 5.0) -> None:
    """One panel per value of ``runs[i][panel]`` (titled ``title(value)``), a line per run
    through its curve's (x, _, y) points, ``style(run)`` -> (colour, label)."""
    plt = pyplot()
    if plt is None:
        return
    panels = list(dict.fromkeys(r[panel] for r in runs))
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), 3.8), squeeze=False)
    for ax, value in zip(axes[0], panels):
        for r in (r for r in runs if r[panel] == value):
            pts = [(n, v) for n, _, v in r["curve"] if v == v]
            if pts:
                colour, label = style(r)
                ax.plot(*zip(*pts), c=colour, label=label)
        ax.set_title(title(value))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    # about 10 characters an inch at the title's size: a long title wraps instead of clipping
    fig.suptitle("\n".join(textwrap.wrap(suptitle, int(10 * width * len(panels)))))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
