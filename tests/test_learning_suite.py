"""benchmarks/learning_suite.py's report: the issue's criterion read from stored runs (no training)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
learning_suite = pytest.importorskip("learning_suite")

FULL = learning_suite.RETURN_WINDOW


def run(points, wall):
    """A stored run: (seconds, training return, episodes in its window) readings, 1k env steps apart."""
    return {"curve": [[1000 * (i + 1), s, r, w] for i, (s, r, w) in enumerate(points)], "wall": wall}


def test_time_to_sb3s_final_return_is_over_sb3s_median_wall_time_and_counts_misses():
    # SB3 ends at 1, 2 and 3 (its median: 2) in 100, 300 and 200 s (its median: 200 s)
    sb3 = [run([(50, 0.5, FULL), (100, 1.0, FULL)], 100),
           run([(150, 3.0, FULL), (300, 2.0, FULL)], 300),
           run([(200, 3.0, FULL)], 200)]
    mine = [run([(10, 1.0, FULL), (20, 2.5, FULL)], 30),
            # 2.0 at 30 s over a window not yet full does not count: reached at 40 s
            run([(30, 2.0, FULL // 2), (40, 2.0, FULL)], 50),
            run([(60, 1.9, FULL)], 60)]
    # 20 s, 40 s and never: the median run reached it at 40 s, 0.2 of SB3's 200 s
    assert learning_suite.against_sb3(mine, sb3) == "0.20 (2/3 reach 2)"
    # where most runs never reach SB3's score the median run never does
    assert learning_suite.against_sb3(mine[1:] + [mine[2]], sb3) == "never (1/3 reach 2)"
    # nothing to compare against
    assert learning_suite.against_sb3(mine, []) == "-"
