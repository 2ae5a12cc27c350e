"""``python -m asyncrl``: the ``asyncrl`` command (see asyncrl/cli.py). Without a command it
trains CartPole-v1 (or --env) with the defaults, then evaluates the greedy policy."""
from .cli import main

if __name__ == "__main__":
    main()
