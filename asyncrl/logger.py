"""Main-process bookkeeping of reports: console summary, TensorBoard scalars under SB3's names."""
from __future__ import annotations

import csv
import functools
import math
import os
import time
import warnings
from collections import defaultdict, deque
from typing import Dict, Optional

from .fileio import atomic_open
from .messages import Report, ReportKind
from .timing import summarize

FPS_WINDOWS = (10, 60, 300)
HISTORY_ROWS = 4096  # summaries kept for model.plot() (~1 MiB); thinned beyond
# Env steps (all envs together, over every train() call) after which a model none of whose
# episodes has ended warns once: an env without a time limit may never end.
NO_EPISODE_WARN_STEPS = 200_000


def next_run_dir(root: str, prefix: str = "APPO") -> str:
    """SB3's layout: root/APPO_1, root/APPO_2, ..."""
    os.makedirs(root, exist_ok=True)
    taken = [int(d.rsplit("_", 1)[1]) for d in os.listdir(root)
             if d.startswith(prefix + "_") and d.rsplit("_", 1)[1].isdigit()]
    return os.path.join(root, f"{prefix}_{max(taken, default=0) + 1}")


class TrainLogger:
    """Collects reports from every component; prints and writes them every ``log_interval``.
    ``policy_id``: the model's policy (its first trained one), whose episodes and trained env
    steps give SB3's ``rollout/ep_rew_mean``, ``time/fps`` and the step axis. Every policy of a
    multi-agent env also has its own ``rollout/<id>/...``, and with several trained policies
    each one's ``train/<id>/...`` and ``time/<id>/fps``."""

    def __init__(self, verbose: int, log_interval: float, stats_window: int,
                 tensorboard_dir: Optional[str] = None, policy_id: str = "policy"):
        self.verbose, self.log_interval, self.policy_id = verbose, log_interval, policy_id
        self.ep_returns = deque(maxlen=stats_window)
        self.ep_lengths = deque(maxlen=stats_window)
        self.stats_window = stats_window
        # every policy of a multi-agent env (trained, frozen, rule-based): id -> recent (return, length)
        self.policy_episodes: Dict[str, deque] = {}
        self.num_episodes = 0
        self.any_episode_ended = False  # any policy's, over every train() call
        self.env_steps_seen = 0         # collected, over every train() call
        self.warned_no_episodes = False
        self.trained({})
        self.env_restarts = 0  # envs recreated after raising (on_env_error="restart")
        self.worker_restarts = 0  # component processes (any kind) replaced after dying
        self.recorded = {}  # scalars from record() (SB3 callbacks), written with the next line
        self.write = functools.partial(print, flush=True)  # a progress bar swaps in its own
        self.csv_path, self.csv_rows, self.csv_columns = None, [], []
        self.history: list = []  # summaries' rows (as progress.csv's), for model.plot()
        self.start_time = time.time()
        self.writer = None
        if tensorboard_dir is not None:
            from tensorboardX import SummaryWriter
            self.writer = SummaryWriter(logdir=next_run_dir(tensorboard_dir))
        self.reset_run()

    def reset_run(self) -> None:
        """Called at the start of each train(): rates restart, episode statistics carry over."""
        self.timings = {}          # component -> latest cumulative snapshot
        self.timings_logged = {}   # component -> snapshot at the previous log line
        self.last_seen = {}        # component -> time of its latest report
        self.train_sums, self.num_updates = defaultdict(float), defaultdict(int)
        self.last_train_by: Dict[str, dict] = {}  # each trained policy's last update's stats
        self.fps_samples: Dict[str, deque] = defaultdict(deque)  # id -> (time, trained env steps)
        self.collected_env_steps = 0
        self.last_log = time.perf_counter()

    def trained(self, learners: Dict[str, str]) -> None:
        """The graph's trained policies, learner process name -> policy id: the prefix of their
        ``train/`` scalars is "" for one, "<id>/" for each of several."""
        several = len(learners) > 1
        self.learner_prefix = {name: f"{pid}/" if several else "" for name, pid in learners.items()}
        self.prefix = f"{self.policy_id}/" if several else ""  # the model's policy's

    def on_report(self, report: Report) -> None:
        self.last_seen[report.component] = time.monotonic()
        if report.kind is ReportKind.EPISODES:
            by_policy, steps, restarts = report.payload
            for pid, (returns, lengths) in by_policy.items():
                self.any_episode_ended |= bool(returns)
                if pid is not None:  # a multi-agent env's policy
                    window = self.policy_episodes.setdefault(pid, deque(maxlen=self.stats_window))
                    window.extend(zip(returns, lengths))
                if pid is None or pid == self.policy_id:
                    self.ep_returns.extend(returns)
                    self.ep_lengths.extend(lengths)
                    self.num_episodes += len(returns)
            self.env_restarts += restarts
            self.collected_env_steps += steps
            self.env_steps_seen += steps
            self.warn_if_no_episode_ends()
        elif report.kind is ReportKind.TRAIN:
            prefix = self.learner_prefix.get(report.component, "")
            for k, v in report.payload.items():
                if k == "policy_lag_max":  # the largest since the last line, beside its mean
                    self.train_sums[prefix + k] = max(self.train_sums.get(prefix + k, v), v)
                else:
                    self.train_sums[prefix + k] += v
            self.num_updates[prefix] += 1
            self.last_train_by[prefix] = report.payload
        elif report.kind is ReportKind.TIMING:
            self.timings[report.component] = report.payload

    def warn_if_no_episode_ends(self) -> None:
        """Once per model: ``NO_EPISODE_WARN_STEPS`` env steps and not one episode ended. Training
        goes on (the value bootstraps across rollouts), but ``ep_rew_mean`` stays nan and a
        policy that learns to wait is never stopped: CliffWalking-v1, for one, has no time
        limit, and its agent learns to stand still beside the cliff."""
        if (self.warned_no_episodes or self.any_episode_ended
                or self.env_steps_seen < NO_EPISODE_WARN_STEPS):
            return
        self.warned_no_episodes = True
        warnings.warn(
            f"no episode has ended in {self.env_steps_seen:,} env steps (every env together): "
            "rollout/ep_rew_mean stays nan, and an env without a time limit may never end "
            "(gymnasium's CliffWalking-v1 has none). If yours has none, give it one: "
            "gymnasium.make(env_id, max_episode_steps=N) or "
            "gymnasium.wrappers.TimeLimit(env, max_episode_steps=N) in the env factory.",
            RuntimeWarning, stacklevel=2)

    def log_to_csv(self, path: str) -> None:
        """Also append every summary's scalars to the CSV file ``path`` (rows already in it are
        kept: a resumed run goes on in the same file)."""
        self.csv_path = path
        if os.path.exists(path):
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                self.csv_rows, self.csv_columns = list(reader), list(reader.fieldnames or [])

    def _write_csv(self, row: dict) -> None:
        """One row more; the file is rewritten when new columns appear (as SB3's CSV logger)."""
        self.csv_rows.append(row)
        new_columns = [k for k in row if k not in self.csv_columns]
        if new_columns:
            self.csv_columns += new_columns
            with atomic_open(self.csv_path, newline="", durable=False) as f:
                w = csv.DictWriter(f, fieldnames=self.csv_columns, restval="")
                w.writeheader()
                w.writerows(self.csv_rows)
            return
        with open(self.csv_path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.csv_columns, restval="").writerow(row)

    def record(self, key: str, value, exclude=None) -> None:
        """SB3's ``logger.record``: a scalar written with the next summary (non-numbers are
        ignored)."""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.recorded[key] = float(value)

    def dump(self, step: int = 0) -> None:
        """SB3's ``logger.dump``: write now."""
        self.maybe_log({self.policy_id: step}, force=True)

    def fps(self, window: float, policy_id: Optional[str] = None) -> float:
        """Trained env steps per second of ``policy_id`` (default: the model's) over the last
        ``window`` seconds."""
        samples = self.fps_samples[policy_id or self.policy_id]
        if len(samples) < 2:
            return 0.0
        t_end, s_end = samples[-1]
        for t, s in samples:  # oldest sample inside the window
            if t_end - t <= window:
                return (s_end - s) / max(t_end - t, 1e-9)
        return 0.0

    @property
    def last_train(self) -> dict:
        """The model's policy's last update's stats."""
        return self.last_train_by.get(self.prefix, {})

    @property
    def ep_rew_mean(self) -> float:
        return sum(self.ep_returns) / len(self.ep_returns) if self.ep_returns else math.nan

    def maybe_log(self, trained: Dict[str, int], force: bool = False) -> None:
        """``trained``: {id: trained env steps} of every trained policy (the model's gives the
        step axis)."""
        now = time.perf_counter()
        trained_env_steps = trained[self.policy_id]
        own = self.fps_samples[self.policy_id]
        if not own or now - own[-1][0] >= 0.5 or force:
            for pid, steps in trained.items():
                samples = self.fps_samples[pid]
                samples.append((now, steps))
                while now - samples[0][0] > max(FPS_WINDOWS) + 1:
                    samples.popleft()
        if not force and now - self.last_log < self.log_interval:
            return
        self.last_log = now
        scalars = self.scalars()
        if self.verbose >= 1:
            self.write(self.summary_line(trained_env_steps, scalars))
        if self.writer is not None:
            for k, v in scalars.items():
                if not math.isnan(v):
                    self.writer.add_scalar(k, v, trained_env_steps)
            self.writer.flush()
        row = {"time/total_timesteps": trained_env_steps,
               "time/time_elapsed": round(time.time() - self.start_time, 2),
               **{k: v for k, v in scalars.items() if not math.isnan(v)}}
        self.history.append(row)
        if len(self.history) > HISTORY_ROWS:  # a long run: the whole span at half the resolution
            self.history = self.history[::2]
        if self.csv_path is not None:
            self._write_csv(row)
        self.train_sums, self.num_updates = defaultdict(float), defaultdict(int)
        self.timings_logged = dict(self.timings)
        self.recorded = {}

    def silence(self) -> str:
        """'rollout-1 62 s, policy-0 0 s': how long since each component last reported."""
        now = time.monotonic()
        ages = sorted(((now - t, c) for c, t in self.last_seen.items()), reverse=True)
        return ", ".join(f"{c} {age:.0f} s" for age, c in ages)

    def recent_timings(self) -> dict:
        """Each component's stage times since the previous log line (all of them at first)."""
        out = {}
        for component, snap in self.timings.items():
            prev = self.timings_logged.get(component, {})
            if prev.get("_wall", -1.0) < snap["_wall"]:
                out[component] = {k: v - prev.get(k, 0.0) for k, v in snap.items()}
            else:
                out[component] = snap
        return out

    def scalars(self) -> dict:
        out = {"time/fps": self.fps(FPS_WINDOWS[0]), "rollout/ep_rew_mean": self.ep_rew_mean,
               "rollout/ep_len_mean": (sum(self.ep_lengths) / len(self.ep_lengths)
                                       if self.ep_lengths else math.nan),
               "time/episodes": float(self.num_episodes),
               "rollout/env_restarts": float(self.env_restarts),
               "rollout/worker_restarts": float(self.worker_restarts),
               "time/collected_env_steps": float(self.collected_env_steps)}  # this train() call
        for pid, window in self.policy_episodes.items():
            if window:
                out[f"rollout/{pid}/ep_rew_mean"] = sum(r for r, _ in window) / len(window)
                out[f"rollout/{pid}/ep_len_mean"] = sum(n for _, n in window) / len(window)
        if len(self.fps_samples) > 1:  # several trained policies
            for pid in self.fps_samples:
                out[f"time/{pid}/fps"] = self.fps(FPS_WINDOWS[0], pid)
        for k, v in self.train_sums.items():  # "loss" or "<id>/loss": means since the last line
            prefix = k.rpartition("/")[0] + "/" if "/" in k else ""
            out[f"train/{k}"] = v if k == prefix + "policy_lag_max" else v / max(self.num_updates[prefix], 1)
        for prefix, stats in self.last_train_by.items():  # no update since the last line: the last's
            if "policy_lag_max" in stats:
                out.setdefault(f"train/{prefix}policy_lag_max", stats["policy_lag_max"])
        for component, snap in self.recent_timings().items():
            wall = snap.get("_wall") or 1.0
            for stage, secs in snap.items():
                if not stage.startswith("_"):
                    out[f"time/{component}/{stage}"] = secs / wall
        out.update(self.recorded)
        return out

    def summary_line(self, steps: int, scalars: dict) -> str:
        fps = " ".join(f"{self.fps(w):,.0f} ({w}s)" for w in FPS_WINDOWS)
        line = (f"[asyncrl] steps {steps:,} | fps {fps} | ep_rew_mean {self.ep_rew_mean:.1f} "
                f"(episodes {self.num_episodes:,})")
        for pid in self.policy_episodes:
            if pid != self.policy_id and f"rollout/{pid}/ep_rew_mean" in scalars:
                line += f" | {pid} ep_rew_mean {scalars[f'rollout/{pid}/ep_rew_mean']:.1f}"
        for prefix in dict.fromkeys(self.learner_prefix.values()):  # trained policies
            if f"train/{prefix}policy_lag_mean" in scalars:
                line += (f" | {prefix.rstrip('/') + ' ' if prefix else ''}lag mean "
                         f"{scalars[f'train/{prefix}policy_lag_mean']:.1f} "
                         f"max {scalars.get(f'train/{prefix}policy_lag_max', 0):.0f}")
        stages = " | ".join(f"{c}: {summarize(s)}" for c, s in sorted(self.recent_timings().items()))
        return line + ("\n          " + stages if stages and self.verbose >= 1 else "")

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
