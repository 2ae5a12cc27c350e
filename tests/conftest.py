"""Shared test set-up: the tests folder is importable (``import custom_envs``) in this process and
in every worker process spawned from it (spawn passes ``sys.path`` on to the child)."""
import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import glob  # noqa: E402
import re  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import psutil  # noqa: E402
import pytest  # noqa: E402


def _orphaned_scratch_dirs() -> set:
    """Scratch directories (asyncrl.fileio.make_scratch_dir) of processes that no longer run."""
    found = set()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "asyncrl-*-*")):
        match = re.fullmatch(r"asyncrl-(\d+)-\w+", os.path.basename(path))
        if match and not psutil.pid_exists(int(match.group(1))):
            found.add(path)
    return found


@pytest.fixture(autouse=True)
def no_scratch_dir_left_by_a_dead_process():
    """Every test: a process it killed (the main process of a script, a Ray actor) leaves no
    scratch directory behind; the workers of a killed process remove it within seconds."""
    before = _orphaned_scratch_dirs()
    yield
    deadline = time.monotonic() + 10
    while (left := _orphaned_scratch_dirs() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"scratch directories of dead processes left behind: {sorted(left)}"
