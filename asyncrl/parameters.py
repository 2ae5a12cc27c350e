"""The parameters of a model's policies, keyed by policy id: what ``get_parameters`` gives and
``set_parameters`` takes (state dicts or checkpoint paths per trained or frozen policy), and each
trained policy's entry of a ``save`` file (weights, Adam state, learner RNG, counters, own
settings). A collaborator of ``APPO``: it is given the model's trained policies (``Trainee``),
its frozen policies' models and its rule-based policies' ids, and nothing else."""
from __future__ import annotations

import os
from typing import Any, Callable, Collection, Dict, Optional, Union

import torch

from .models import ActorCritic

OPTIMIZER_SUFFIX = ".optimizer"  # get_parameters(): {id: weights, id + ".optimizer": Adam's state}


class PolicyParameters:
    def __init__(self, trainees: Dict[str, Any], frozen: Dict[str, torch.nn.Module],
                 rule_based: Collection[str] = ()):
        """``trainees``: {id: ``trainee.Trainee``} (its model, files, counters and ``config``,
        ``optimizer_state()``, ``replaced()``; not imported: this module needs no more of it)."""
        self.trainees, self.frozen, self.rule_based = trainees, frozen, rule_based
        self.first = next(iter(trainees))  # a bare state_dict's, and a one-policy file's

    def get(self) -> Dict[str, dict]:
        """``{id: state_dict, id + ".optimizer": Adam state}`` per trained policy, ``{id:
        state_dict}`` per frozen one (copies, CPU)."""
        copy = lambda model: {k: v.detach().clone() for k, v in model.state_dict().items()}  # noqa: E731
        out = {}
        for pid, t in self.trainees.items():
            out[pid], out[pid + OPTIMIZER_SUFFIX] = copy(t.model), t.optimizer_state()
        return {**out, **{pid: copy(model) for pid, model in self.frozen.items()}}

    def set(self, load_path_or_dict: Union[dict, str, os.PathLike], exact_match: bool) -> None:
        """Everything checked first (nothing is set if anything is wrong), then set: the
        weights, a trained policy's Adam state into its scratch file (its folder must exist)."""
        trained, frozen = self._checked(self.parse(load_path_or_dict), exact_match)
        for pid, (state, optimizer_state) in trained.items():
            t = self.trainees[pid]
            t.model.load_state_dict(state, strict=exact_match)
            if optimizer_state is not None:
                torch.save(optimizer_state, t.files.optimizer)
                t.optimizer_epoch += 1
            t.replaced()
        for pid, state in frozen.items():
            self.frozen[pid].load_state_dict(state, strict=exact_match)

    def _checked(self, params: dict, exact_match: bool) -> tuple:
        """({trained id: (state_dict, optimizer state or None)}, {frozen id: state_dict}), each
        checked against its model; the first problem raises, naming it."""
        rule_based = [k for k in params if k in self.rule_based]
        if rule_based:
            raise KeyError(f"policy {rule_based[0]!r} is rule-based: it has no parameters")
        expected = [*(k for pid in self.trainees for k in (pid, pid + OPTIMIZER_SUFFIX)), *self.frozen]
        unknown = sorted(map(str, set(params) - set(expected)))
        if unknown:
            raise KeyError(f"unknown parameter group(s) {unknown}; expected {expected} "
                           "(the layout of get_parameters()) or a bare state_dict")
        trained = {}
        for pid, t in self.trainees.items():
            opt_key = pid + OPTIMIZER_SUFFIX
            if pid not in params:
                if opt_key in params:
                    raise KeyError(f"{opt_key!r} given without {pid!r} weights; expected the layout "
                                   "of get_parameters()")
                continue
            own = self.parse(params[pid], pid)  # a state_dict, or a checkpoint's
            state, optimizer_state = own[pid], params.get(opt_key, own.get(opt_key))
            _check_state_dict(t.model, state, exact_match)
            if optimizer_state is not None:
                try:
                    torch.optim.Adam(t.model.parameters()).load_state_dict(optimizer_state)
                except (ValueError, KeyError) as e:
                    raise ValueError(f"{opt_key!r} does not fit this model's Adam ({e})") from e
            trained[pid] = (state, optimizer_state)
        frozen = {pid: _acting(self.frozen[pid], self.parse(params[pid], pid)[pid])
                  for pid in self.frozen if pid in params}
        for pid, state in frozen.items():
            _check_state_dict(self.frozen[pid], state, exact_match)
        return trained, frozen

    def parse(self, value: Any, pid: Optional[str] = None) -> dict:
        """Parameters keyed by id from a dict, a bare state_dict (``pid``'s: default, the one
        trained policy) or a path (a file of ``save``: its policies, or its one entry for
        ``pid``)."""
        if isinstance(value, (str, os.PathLike)):
            loaded = torch.load(value, map_location="cpu", weights_only=False)
            if isinstance(loaded, dict) and "state_dict" in loaded:  # a file of save()
                return self._file_params(loaded, pid)
            value = loaded
        if not isinstance(value, dict):
            raise TypeError(f"expected a dict of parameters, a state_dict or a checkpoint path, "
                            f"got {type(value).__name__}")
        if value and all(torch.is_tensor(v) for v in value.values()):  # a bare state_dict
            if pid is None and len(self.trainees) > 1:
                raise ValueError(f"a bare state_dict, but this model trains {list(self.trainees)}: "
                                 "key it by policy id ({id: state_dict})")
            return {pid or self.first: value}
        return value

    def _file_params(self, blob: dict, pid: Optional[str]) -> dict:
        """A save() file's trained policies as parameters: all those this model trains too (or,
        for ``pid``, that one's entry). A file of one trained policy gives it to any id (or,
        whole, to this model's first); a file of several must hold the ids asked for."""
        entries = saved_entries(blob)
        only = next(iter(entries.values())) if len(entries) == 1 else None
        if pid is not None:
            if pid not in entries and only is None:
                raise KeyError(f"the file holds the trained policies {list(entries)}, not {pid!r}: "
                               "give {id: path} for one of them")
            chosen = {pid: entries.get(pid, only)}
        else:
            chosen = {k: e for k, e in entries.items() if k in self.trainees}
            if not chosen:
                if only is None:
                    raise KeyError(f"the file holds the trained policies {list(entries)}, none of "
                                   f"this model's {list(self.trainees)}")
                chosen = {self.first: only}
        out = {}
        for k, e in chosen.items():
            out[k], out[k + OPTIMIZER_SUFFIX] = e["state_dict"], e.get("optimizer")
        return out

    # --- save files ---------------------------------------------------------------------
    def saved(self, snapshot: Optional[Callable[[int], dict]] = None) -> Dict[str, dict]:
        """Each trained policy's entry of a save file: weights, Adam state, learner RNG and
        counters, of one moment, and where its config differs from the run's (``fields``).
        ``snapshot(k)``: while training, the ``k``-th trained policy's learner's state between
        two updates (else the files its learner wrote at the last pause). Non-finite weights
        raise."""
        entries = {}
        for k, (pid, t) in enumerate(self.trainees.items()):
            fields = {n: v for n, v in t.fields.items() if n != "lanes_per_env"}  # the env sets lanes
            if snapshot is not None:
                snap = snapshot(k)
                entry = {"state_dict": snap["policy"], "optimizer": snap["optimizer"],
                         "learner_rng": snap["learner_rng"], "policy_version": snap["policy_version"],
                         "num_timesteps": snap["num_timesteps"]}
            else:
                entry = {"state_dict": t.model.state_dict(), "optimizer": _load(t.files.optimizer),
                         "learner_rng": _load(t.files.rng), "policy_version": t.version,
                         "num_timesteps": t.num_timesteps}
            bad = [n for n, v in entry["state_dict"].items() if not bool(torch.isfinite(v).all())]
            if bad:
                raise FloatingPointError(f"refusing to save non-finite weights of {pid!r} ({bad})")
            entries[pid] = {**entry, "fields": fields}
        return entries

    def restore(self, blob: dict) -> None:
        """A save file's weights, Adam states, learner RNGs and counters into this model's
        policies (built from the file's settings, so they fit)."""
        for pid, entry in saved_entries(blob, self.first).items():
            t = self.trainees[pid]
            t.model.load_state_dict(entry["state_dict"])
            t.num_timesteps, t.version = entry["num_timesteps"], entry["policy_version"]
            if entry["optimizer"] is not None:
                torch.save(entry["optimizer"], t.files.optimizer)
            if entry.get("learner_rng") is not None:  # the learner's minibatch order goes on
                torch.save(entry["learner_rng"], t.files.rng)
        for pid, state in blob.get("frozen", {}).items():
            self.frozen[pid].load_state_dict(_acting(self.frozen[pid], state))


def saved_entries(blob: dict, first: Optional[str] = None) -> Dict[Optional[str], dict]:
    """A save file's entries per trained policy id (older files: one, top level, given the id
    ``first``)."""
    return blob.get("trained") or {first: blob}


def _load(path: str) -> Any:
    return torch.load(path, map_location="cpu") if os.path.exists(path) else None


def _acting(model: ActorCritic, state: dict) -> dict:
    """A frozen policy's weights from ``state``: it acts and never computes a value, so the
    value side (``ActorCritic.VALUE_SIDE``) is taken from ``state`` only where all of it fits the
    model, else kept as it is. A snapshot of a policy trained with the other
    ``centralized_critic`` setting, a continuous policy's beside a discrete one's run, or a
    policy's weights without a value side then play as they did."""
    own = {k: v for k, v in model.state_dict().items() if k.startswith(ActorCritic.VALUE_SIDE)}
    given = {k: v for k, v in state.items() if k.startswith(ActorCritic.VALUE_SIDE)}
    if set(given) == set(own) and all(v.shape == own[k].shape for k, v in given.items()):
        return state
    return {**{k: v for k, v in state.items() if k not in given}, **own}


def _check_state_dict(model: torch.nn.Module, state: dict, exact_match: bool) -> None:
    own = model.state_dict()
    filled = {f"{name}.{key}" if name else key for name, module in model.named_modules()
              for key in getattr(module, "filled_on_load", ())}  # entries older versions lacked
    missing = sorted(set(own) - set(state) - filled)
    unexpected = sorted(set(state) - set(own))
    wrong = [f"{k}: expected {tuple(own[k].shape)}, got {tuple(state[k].shape)}"
             for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    problems = []
    if exact_match and missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if wrong:
        problems.append("shape mismatch: " + "; ".join(wrong))
    if problems:
        named = [*(missing if exact_match else []), *unexpected, *wrong]
        critic = any(k.startswith(("vf_net.", "state_norm.")) for k in named)
        hint = ("; the value heads differ: parameters of a model with the other "
                "centralized_critic setting (the default for several agents with discrete actions "
                "since 2026-12-07) fit with centralized_critic= as that model had it; a "
                "centralised critic saved before that date read the global state alone and does "
                "not fit") if critic else ""
        raise ValueError("parameters do not fit this model (" + ", ".join(problems) + "); "
                         "they must come from a model with the same env spaces and hidden_sizes"
                         + hint)
