"""Main-process bookkeeping of reports: console summary, TensorBoard scalars under SB3's names."""
from __future__ import annotations

import csv
import functools
import math
import os
import time
from collections import defaultdict, deque
from typing import Dict, Optional

from .fileio import atomic_open
from .messages import Report, ReportKind
from .timing import summarize

FPS_WINDOWS = (10, 60, 300)
HISTORY_ROWS = 4096  # summaries kept for model.plot() (~1 MiB); thinned beyond


def next_run_dir(root: str, prefix: str = "APPO") -> str:
    """SB3's layout: root/APPO_1, root/APPO_2, ..."""
    os.makedirs(root, exist_ok=True)
    taken = [int(d.rsplit("_", 1)[1]) for d in os.listdir(root)
             if d.startswith(prefix + "_") and d.rsplit("_", 1)[1].isdigit()]
    return os.path.join(root, f"{prefix}_{max(taken, default=0) + 1}")


class TrainLogger:
    """Collects reports from every component; prints and writes them every ``log_interval``."""

    def __init__(self, verbose: int, log_interval: float, stats_window: int,
                 tensorboard_dir: Optional[str] = None):
        self.verbose, self.log_interval = verbose, log_interval
        self.ep_returns = deque(maxlen=stats_window)
        self.ep_lengths = deque(maxlen=stats_window)
        self.stats_window = stats_window
        # the other (frozen, rule-based) policies of a multi-agent env: id -> recent (return, length)
        self.other_episodes: Dict[str, deque] = {}
        self.num_episodes = 0
        # learner process name -> prefix of its train/ scalars: "" for the first trained
        # policy's, "<id>/" for each other's (set by the Runner)
        self.learner_prefix: Dict[str, str] = {}
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
        self.fps_samples = deque()  # (time, trained env steps)
        self.other_fps_samples: Dict[str, deque] = defaultdict(deque)  # other trained policies'
        self.collected_env_steps = 0
        self.last_log = time.perf_counter()

    def on_report(self, report: Report) -> None:
        self.last_seen[report.component] = time.monotonic()
        if report.kind is ReportKind.EPISODES:
            returns, lengths, steps, restarts, others = report.payload
            for pid, (other_returns, other_lengths) in others.items():
                window = self.other_episodes.setdefault(pid, deque(maxlen=self.stats_window))
                window.extend(zip(other_returns, other_lengths))
            self.env_restarts += restarts
            self.ep_returns.extend(returns)
            self.ep_lengths.extend(lengths)
            self.num_episodes += len(returns)
            self.collected_env_steps += steps
        elif report.kind is ReportKind.TRAIN:
            prefix = self.learner_prefix.get(report.component, "")
            for k, v in report.payload.items():
                self.train_sums[prefix + k] += v
            self.num_updates[prefix] += 1
            self.last_train_by[prefix] = report.payload
        elif report.kind is ReportKind.TIMING:
            self.timings[report.component] = report.payload

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
        self.maybe_log(step, force=True)

    def fps(self, window: float, samples: Optional[deque] = None) -> float:
        samples = self.fps_samples if samples is None else samples
        if len(samples) < 2:
            return 0.0
        t_end, s_end = samples[-1]
        for t, s in samples:  # oldest sample inside the window
            if t_end - t <= window:
                return (s_end - s) / max(t_end - t, 1e-9)
        return 0.0

    @property
    def last_train(self) -> dict:
        """The first trained policy's last update's stats."""
        return self.last_train_by.get("", {})

    @property
    def ep_rew_mean(self) -> float:
        return sum(self.ep_returns) / len(self.ep_returns) if self.ep_returns else math.nan

    def maybe_log(self, trained_env_steps: int, force: bool = False,
                  others: Optional[Dict[str, int]] = None) -> None:
        """``trained_env_steps``: the first trained policy's; ``others``: {id: trained env
        steps} of the other trained policies."""
        now = time.perf_counter()
        if not self.fps_samples or now - self.fps_samples[-1][0] >= 0.5 or force:
            for samples, steps in [(self.fps_samples, trained_env_steps),
                                   *((self.other_fps_samples[p], n) for p, n in (others or {}).items())]:
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
        for pid, window in self.other_episodes.items():  # frozen and rule-based policies
            if window:
                out[f"rollout/{pid}/ep_rew_mean"] = sum(r for r, _ in window) / len(window)
                out[f"rollout/{pid}/ep_len_mean"] = sum(n for _, n in window) / len(window)
        for pid, samples in self.other_fps_samples.items():  # other trained policies
            out[f"time/{pid}/fps"] = self.fps(FPS_WINDOWS[0], samples)
        for k, v in self.train_sums.items():  # "loss" or "<id>/loss": means since the last line
            prefix = k.rpartition("/")[0] + "/" if "/" in k else ""
            if k != prefix + "policy_lag_max":
                out[f"train/{k}"] = v / max(self.num_updates[prefix], 1)
        for prefix, stats in self.last_train_by.items():
            if "policy_lag_max" in stats:
                out[f"train/{prefix}policy_lag_max"] = stats["policy_lag_max"]
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
        for pid in self.other_episodes:
            if f"rollout/{pid}/ep_rew_mean" in scalars:
                line += f" | {pid} ep_rew_mean {scalars[f'rollout/{pid}/ep_rew_mean']:.1f}"
        for prefix in ["", *(p for p in self.learner_prefix.values() if p)]:  # trained policies
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
