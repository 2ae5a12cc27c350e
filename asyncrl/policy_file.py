"""The command line's multi-agent runs: a YAML file of policies (``asyncrl train --policies F``).

    policies:
      speaker: {centralized_critic: true}   # trained: null (the defaults) or its overrides
      listener: null
      bot: {rule: mypackage.bots:greedy}    # rule-based: module:function, obs -> action
      rival: {frozen: true, weights: runs/old/checkpoints/checkpoint_000001000000.pt,
              weights_of: hero}             # frozen: weights from an APPO.save file (its policy
                                            # ``weights_of``, default this id) or a state dict file
    mapping: mypackage.roles:by_role        # fn(agent_id) or fn(agent_id, episode_idx)

What ``APPO(..., policies=, policy_mapping=)`` takes, written as data (paths relative to the
file); errors name the entry and what to change."""
from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Dict, NamedTuple, Optional

from .config import ConfigError

RULE, FROZEN, WEIGHTS, WEIGHTS_OF = "rule", "frozen", "weights", "weights_of"


class PolicyFile(NamedTuple):
    """A parsed policies file: ``policies`` and ``mapping`` for APPO, the frozen policies'
    weights to set, the document as read and its path (kept in the run's config.yaml)."""
    policies: Dict[str, Any]
    mapping: Optional[Callable]
    frozen_weights: Dict[str, dict]
    doc: dict
    path: str


def import_function(text: str, what: str) -> Callable:
    """``package.module:function`` -> the function."""
    module, sep, name = str(text).partition(":")
    if not sep or not module or not name:
        raise ConfigError(f"{what}: {text!r} is not module:function (e.g. mypackage.bots:greedy)")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{what}: could not import {name} from {module} ({e})") from e
    if not callable(fn):
        raise ConfigError(f"{what}: {text} is not callable")
    return fn


def read_policy_file(path: str) -> PolicyFile:
    import yaml
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"--policies {path}: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("policies"), dict) or not doc["policies"]:
        raise ConfigError(f"--policies {path}: expected a mapping with 'policies' ({{id: null, "
                          "overrides, {rule: module:function} or {frozen: true, weights: FILE}}) "
                          "and 'mapping' (module:function)")
    extra = sorted(set(doc) - {"policies", "mapping"})
    if extra:
        raise ConfigError(f"--policies {path}: unknown key(s) {extra}; only 'policies' and 'mapping'")
    policies, weights = {}, {}
    for pid, entry in doc["policies"].items():
        what = f"--policies {path}: policies.{pid}"
        if entry is not None and not isinstance(entry, dict):
            raise ConfigError(f"{what}: expected null, a mapping of overrides, {{rule: "
                              f"module:function}} or {{frozen: true, weights: FILE}}, not {entry!r}")
        entry = dict(entry or {})
        if RULE in entry:
            if len(entry) > 1:
                raise ConfigError(f"{what}: a rule-based policy takes only 'rule', not "
                                  f"{sorted(set(entry) - {RULE})}")
            policies[pid] = import_function(entry[RULE], f"{what}.rule")
            continue
        if entry.get(FROZEN):
            file, of = entry.pop(WEIGHTS, None), entry.pop(WEIGHTS_OF, pid)
            if file is not None:
                weights[pid] = _read_weights(os.path.join(os.path.dirname(path), str(file)), of, what)
        elif WEIGHTS in entry or WEIGHTS_OF in entry:
            raise ConfigError(f"{what}: 'weights' belongs to frozen policies (frozen: true); a "
                              "trained one starts from its own initial weights")
        policies[pid] = entry or None
    mapping = doc.get("mapping")
    mapping = None if mapping is None else import_function(mapping, f"--policies {path}: mapping")
    return PolicyFile(policies, mapping, weights, doc, path)


def _read_weights(path: str, of: str, what: str) -> dict:
    """A state dict from an ``APPO.save`` file (its trained or frozen policy ``of``) or from a
    file holding a state dict (``torch.save(model.get_parameters()[id], FILE)``)."""
    import torch
    try:
        blob = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as e:
        raise ConfigError(f"{what}.weights: could not read {path} ({e})") from e
    if isinstance(blob, dict) and "trained" in blob:  # an APPO.save file
        found = {**{p: e["state_dict"] for p, e in blob["trained"].items()}, **blob.get("frozen", {})}
        if of not in found:
            raise ConfigError(f"{what}.weights: {path} holds the policies {sorted(found)}, not "
                              f"{of!r}; set weights_of to one of them")
        return found[of]
    if isinstance(blob, dict) and all(torch.is_tensor(v) for v in blob.values()):
        return blob
    raise ConfigError(f"{what}.weights: {path} is neither an APPO.save file nor a state dict")
