"""Shared test set-up: the tests folder is importable (``import custom_envs``) in this process and
in every worker process spawned from it (spawn passes ``sys.path`` on to the child)."""
import os
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)
