"""Named stage timers: every component times its stages and its waits, so the bottleneck is read
off the console summary instead of guessed."""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager


class StageTimer:
    def __init__(self):
        self.totals = defaultdict(float)  # stage -> cumulative seconds
        self.start = time.perf_counter()

    @contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.totals[stage] += time.perf_counter() - t0

    def add(self, stage: str, seconds: float) -> None:
        self.totals[stage] += seconds

    def snapshot(self) -> dict:
        out = dict(self.totals)
        out["_wall"] = time.perf_counter() - self.start
        return out


def summarize(snapshot: dict) -> str:
    """'env_step 61% wait_actions 30%' from one component's snapshot."""
    wall = snapshot.get("_wall") or 1.0
    parts = sorted(((v, k) for k, v in snapshot.items() if not k.startswith("_")), reverse=True)
    return " ".join(f"{k} {100.0 * v / wall:.0f}%" for v, k in parts)
