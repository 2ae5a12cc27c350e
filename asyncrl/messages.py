"""Typed small messages that travel through the queues. Nothing large goes through a queue."""
from __future__ import annotations

import struct
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


# The per-step messages as fixed-size integers, the codecs of their queues (faster-fifo's
# ``dumps``/``loads``): its default, multiprocessing's ForkingPickler, builds a pickler for every
# message (a request's put and get cost ~3x a packed one's, measured here); a rollout worker
# sends one request per group step.
_REQUEST = struct.Struct("<6q")
_INT = struct.Struct("<q")


def dump_request(request: PolicyRequest) -> bytes:
    return _REQUEST.pack(*request)


def load_request(data) -> PolicyRequest:
    return PolicyRequest._make(_REQUEST.unpack(data))


def dump_int(value: int) -> bytes:
    """A slot index (the full and free slot queues)."""
    return _INT.pack(value)


def load_int(data) -> int:
    return _INT.unpack(data)[0]


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
