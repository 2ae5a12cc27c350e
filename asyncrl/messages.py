"""Typed small messages that travel through the queues. Nothing large goes through a queue."""
from __future__ import annotations

from enum import Enum
from typing import Any, NamedTuple


class PolicyRequest(NamedTuple):
    """A rollout worker asks for actions for one env group: obs are at buffers.obs[slot_idx, t]."""
    worker_idx: int
    group_idx: int
    slot_idx: int
    t: int
    incarnation: int  # of the worker: a replaced (killed) worker's requests are dropped
    policy_incarnation: int  # of the policy worker asked: a replacement drops older requests


class ReportKind(Enum):
    EPISODES = "episodes"  # payload: (returns list, lengths list, env steps collected, env restarts)
    TRAIN = "train"        # payload: dict of learner scalars for one update
    TIMING = "timing"      # payload: dict stage -> cumulative seconds
    ERROR = "error"        # payload: formatted traceback


class Report(NamedTuple):
    """What a component tells the main process through the report queue."""
    kind: ReportKind
    component: str
    payload: Any
