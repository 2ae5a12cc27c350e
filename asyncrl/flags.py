"""Config fields as command-line flags: ``--field value`` for each, its documentation as help
(``asyncrl train``, ``asyncrl.pbt``'s command, the benchmark scripts)."""
from __future__ import annotations

import argparse
import ast
import dataclasses

from .config import ENGINE_SET, Config


def parse_value(text: str):
    """A flag value as a Python literal when it is one (3, 2.5e-4, True, None, (64, 64)), else text."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a plain string, e.g. --device cpu


def add_config_flags(ap: argparse.ArgumentParser) -> None:
    """Every Config field as ``--field value``, its documentation as help; unset ones are absent
    from the parsed namespace."""
    group = ap.add_argument_group("config fields (asyncrl.Config)")
    for f in dataclasses.fields(Config):
        if f.name in ENGINE_SET:
            continue
        group.add_argument(f"--{f.name}", type=parse_value, default=argparse.SUPPRESS,
                           help=f"{f.metadata['doc']} (default: {f.default!r})")


def config_flags(args: dict) -> dict:
    """The Config fields among parsed arguments (those given on the command line)."""
    names = {f.name for f in dataclasses.fields(Config)}
    return {k: v for k, v in args.items() if k in names}
