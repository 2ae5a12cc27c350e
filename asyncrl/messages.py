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


MAX_TRAINED_POLICIES = 127  # an "actions ready" code is one byte, 255 taken (ipc.SLOTS_FREED)


def ready_code(trained_idx: int, group_idx: int) -> int:
    """The byte a policy worker of trained policy ``trained_idx`` sends a rollout worker when
    the actions of its group ``group_idx`` (0 or 1) are written."""
    return 2 * trained_idx + group_idx


def parse_ready(code: int) -> tuple:
    """(trained policy index, group index) of a ``ready_code``."""
    return divmod(code, 2)


class ReportKind(Enum):
    EPISODES = "episodes"  # payload: ({policy id: (returns, lengths)}, env steps collected,
                           #          env restarts); id None: a single-agent env's one policy
    TRAIN = "train"        # payload: dict of learner scalars for one update
    TIMING = "timing"      # payload: dict stage -> cumulative seconds
    ERROR = "error"        # payload: formatted traceback


class Report(NamedTuple):
    """What a component tells the main process through the report queue."""
    kind: ReportKind
    component: str
    payload: Any
