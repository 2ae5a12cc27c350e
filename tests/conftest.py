"""Shared test set-up: the tests folder is importable (``import custom_envs``) in this process and
in every worker process spawned from it (spawn passes ``sys.path`` on to the child)."""
import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import signal  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from asyncrl.fileio import orphaned_scratch_dirs  # noqa: E402

# The tests that press Ctrl-C (SIGINT to this process, or to a script they start) expect what a
# terminal gives: a KeyboardInterrupt. Started in the background (nohup, `&` in a script, some CI
# runners) this process inherits SIGINT ignored, and so would every process it starts; Python's
# handler, restored here, is reset to the default in each child, which then installs its own.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def no_scratch_dir_left_by_a_dead_process():
    """Every test: a process it killed (the main process of a script, a Ray actor) leaves no
    scratch directory behind; the workers of a killed process remove it within seconds."""
    before = set(orphaned_scratch_dirs())
    yield
    deadline = time.monotonic() + 10
    while (left := set(orphaned_scratch_dirs()) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"scratch directories of dead processes left behind: {sorted(left)}"


@pytest.fixture
def machine(monkeypatch):
    """``machine(gpu, cores)``: what this process sees from then on, torch's CUDA and the CPU
    cores the defaults follow (nothing touches CUDA before a train() call)."""
    import torch
    import asyncrl.config

    def set_machine(gpu: bool, cores: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
        monkeypatch.setattr(asyncrl.config, "available_cores", lambda: cores)
    return set_machine
