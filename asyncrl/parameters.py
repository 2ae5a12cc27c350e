"""Parameters and persistence of a model, keyed by policy id: ``get_parameters``/``set_parameters``
(state dicts or checkpoint paths per trained or frozen policy) and ``save``/``load`` (every
trained policy's weights, Adam state, learner RNG, counters and own settings). A mixin of
``APPO``: it uses the model's trainees, frozen policies, config, process graph and scratch
folders."""
from __future__ import annotations

import os
import pathlib
from typing import TYPE_CHECKING, Any, Dict, Optional, Type, TypeVar, Union

import torch

from . import pickling
from .config import DEVICES_HINT, valid_device
from .fileio import atomic_torch_save
from .learner import rng_path

if TYPE_CHECKING:  # a type hint only: no import at run time
    from .trainee import Trainee

Model = TypeVar("Model", bound="Parameters")  # APPO.load returns an APPO
OPTIMIZER_SUFFIX = ".optimizer"  # get_parameters(): {id: weights, id + ".optimizer": Adam's state}


class Parameters:
    # --- parameters -----------------------------------------------------------------------
    def get_parameters(self) -> Dict[str, dict]:
        """SB3's layout, keyed by policy id: ``{"policy": state_dict, "policy.optimizer": Adam
        state}`` (copies, CPU); a multi-agent model's trained policies under their own ids
        (``"hero"``, ``"hero.optimizer"``, ...), each frozen one's weights under its id.
        Rule-based policies have none."""
        copy = lambda model: {k: v.detach().clone() for k, v in model.state_dict().items()}  # noqa: E731
        out = {}
        for pid, t in self.trainees.items():
            out[pid], out[pid + OPTIMIZER_SUFFIX] = copy(t.model), t.optimizer_state(self.config)
        return {**out, **{pid: copy(model) for pid, model in self.frozen.items()}}

    def set_parameters(self, load_path_or_dict: Union[dict, str, os.PathLike],
                       exact_match: bool = True, device: str = "auto") -> None:
        """Load parameters: a dict in :meth:`get_parameters`' layout (``"<id>.optimizer"`` is
        optional: without it the learner keeps its Adam state; a policy id's value may also be
        a path, as below), a bare ``state_dict`` (for the trained policy, when there is one),
        or a path to a file of :meth:`save` or a ``torch.save``-d state dict. With
        ``exact_match`` every weight must be present; keys this model lacks and shape
        mismatches always raise, naming them, and nothing is set. Samples a trained policy
        collected before are from another policy and are not trained on.

        A frozen policy's weights (``{"opp": state_dict or path}``; no optimizer) reach the
        rollout workers at the next ``train()``; the trained policies' samples stay valid.

        ``device`` is SB3's argument, checked and otherwise without effect: this process holds
        every policy on the CPU, and the learners and policy workers copy the weights to
        ``config.device`` themselves (pass ``device`` to the constructor or ``load`` instead)."""
        if not (isinstance(device, (str, torch.device)) and valid_device(str(device))):
            raise ValueError(f"device={device!r}: must be {DEVICES_HINT} (it has no effect here: "
                             "the weights are held on the CPU and each process moves them)")
        if self._training:
            raise RuntimeError("set_parameters() inside a training callback would be overwritten "
                               "by the learner's next weights: return False from the callback "
                               "and set the parameters between train() calls")
        params = self._params_from(load_path_or_dict)
        rule_based = [k for k in params if self.agents is not None and k in self.agents.rule_based]
        if rule_based:
            raise KeyError(f"policy {rule_based[0]!r} is rule-based: it has no parameters")
        expected = [*(k for pid in self.trainees for k in (pid, pid + OPTIMIZER_SUFFIX)), *self.frozen]
        unknown = sorted(map(str, set(params) - set(expected)))
        if unknown:
            raise KeyError(f"unknown parameter group(s) {unknown}; expected {expected} "
                           "(the layout of get_parameters()) or a bare state_dict")
        trained = {}  # id -> (state_dict, optimizer state or None), all checked before any is set
        for pid, t in self.trainees.items():
            opt_key = pid + OPTIMIZER_SUFFIX
            if pid not in params:
                if opt_key in params:
                    raise KeyError(f"{opt_key!r} given without {pid!r} weights; expected the layout "
                                   "of get_parameters()")
                continue
            own = self._params_from(params[pid], pid)  # a state_dict, or a checkpoint's
            state, optimizer_state = own[pid], params.get(opt_key, own.get(opt_key))
            _check_state_dict(t.model, state, exact_match)
            if optimizer_state is not None:
                try:
                    torch.optim.Adam(t.model.parameters()).load_state_dict(optimizer_state)
                except (ValueError, KeyError) as e:
                    raise ValueError(f"{opt_key!r} does not fit this model's Adam ({e})") from e
            trained[pid] = (state, optimizer_state)
        frozen = {pid: self._params_from(params[pid], pid)[pid] for pid in self.frozen if pid in params}
        for pid, state in frozen.items():
            _check_state_dict(self.frozen[pid], state, exact_match)
        self._open_scratch()  # Adam's state goes to the scratch files, also after a with block
        for pid, (state, optimizer_state) in trained.items():
            t = self.trainees[pid]
            t.model.load_state_dict(state, strict=exact_match)
            if optimizer_state is not None:
                torch.save(optimizer_state, t.optimizer_path)
                t.optimizer_epoch += 1
            t.replaced()
        for pid, state in frozen.items():
            self.frozen[pid].load_state_dict(state, strict=exact_match)

    def _params_from(self, value, pid: Optional[str] = None) -> dict:
        """Parameters keyed by id from a dict, a bare state_dict (``pid``'s: default, the one
        trained policy) or a path (a file of :meth:`save`: its policies, or its one entry for
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
            return {pid or self.policy_id: value}
        return value

    def _file_params(self, blob: dict, pid: Optional[str]) -> dict:
        """A save() file's trained policies as parameters: all those this model trains too (or,
        for ``pid``, that one's entry). A file of one trained policy gives it to any id (or,
        whole, to this model's first); a file of several must hold the ids asked for."""
        entries = blob.get("trained") or {None: blob}  # files of one trained policy: top level
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
                chosen = {self.policy_id: only}
        out = {}
        for k, e in chosen.items():
            out[k], out[k + OPTIMIZER_SUFFIX] = e["state_dict"], e.get("optimizer")
        return out

    # --- persistence ----------------------------------------------------------------------
    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write weights, optimizer state, counters, config and the learner's RNG state to
        ``path`` (atomically), for every trained policy. Called while training (from a
        callback), it asks each learner for its state between two updates, so its weights,
        Adam moments and counters are of one moment. Schedules are saved as their current
        values."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._hparams(1.0)
        trained = {pid: self._saved_state(k, t) for k, (pid, t) in enumerate(self.trainees.items())}
        for pid, entry in trained.items():
            bad = [k for k, v in entry["state_dict"].items() if not bool(torch.isfinite(v).all())]
            if bad:
                raise FloatingPointError(f"refusing to save non-finite weights of {pid!r} ({bad}) "
                                         f"to {path}")
        first = trained[self.policy_id]
        blob = {**first, "trained": trained, "config": self.config.__dict__.copy(),
                # the user's code by value where needed: a file saved from a notebook loads elsewhere
                "env_factory": pickling.saved(self.env_factory), "num_graphs": self._num_graphs,
                "policy_class": pickling.saved(self.policy_spec.policy),
                "policy_kwargs": pickling.saved(self.policy_spec.policy_kwargs),
                "policies": pickling.saved(self.policies), "policy_mapping": pickling.saved(self.policy_mapping),
                "frozen": {pid: m.state_dict() for pid, m in self.frozen.items()}}
        atomic_torch_save(blob, path)

    def _saved_state(self, k: int, t: Trainee) -> dict:
        """A trained policy's weights, Adam state, learner RNG and counters, of one moment, and
        where its config differs from the run's (``fields``)."""
        fields = {n: v for n, v in t.fields.items() if n != "lanes_per_env"}  # the env sets lanes
        if self._training and self._runner is not None and self._runner.started:
            snap = self._runner.snapshot(k)
            return {"state_dict": snap["policy"], "optimizer": snap["optimizer"],
                    "learner_rng": snap["learner_rng"], "policy_version": snap["policy_version"],
                    "num_timesteps": snap["num_timesteps"], "fields": fields}
        return {"state_dict": t.model.state_dict(), "optimizer": self._load_scratch(t.optimizer_path),
                "learner_rng": self._load_scratch(rng_path(t.optimizer_path)),
                "policy_version": t.version, "num_timesteps": t.num_timesteps, "fields": fields}

    @staticmethod
    def _load_scratch(path: str) -> Any:
        return torch.load(path, map_location="cpu") if os.path.exists(path) else None

    @classmethod
    def load(cls: Type[Model], path: Union[str, os.PathLike], env: Any = None, device: str = "auto",
             **overrides) -> Model:
        """Rebuild a model (of this class) from :meth:`save`; ``overrides`` replace config
        fields."""
        try:
            blob = torch.load(path, map_location="cpu", weights_only=False)
            factory = env if env is not None else pickling.restored(blob["env_factory"])
        except (AttributeError, ModuleNotFoundError) as e:
            raise RuntimeError(f"could not unpickle the env factory saved in {path} ({e}); its "
                               "module cannot be imported here: pass env=... to load()") from e
        policies = overrides.pop("policies", None)
        if policies is None:  # as saved, each trained policy's settings as they were then
            policies = pickling.restored(blob.get("policies"))
            for pid, entry in (blob.get("trained") or {}).items():
                if entry.get("fields"):  # several trained: their own values (and what they implied)
                    policies[pid] = {**entry["fields"], **(policies[pid] or {})}
        model = cls(factory,
                    policy=overrides.pop("policy", pickling.restored(blob.get("policy_class"))),
                    policy_kwargs=overrides.pop("policy_kwargs", pickling.restored(blob.get("policy_kwargs"))),
                    policies=policies,
                    policy_mapping=overrides.pop("policy_mapping",
                                                 pickling.restored(blob.get("policy_mapping"))),
                    **{**blob["config"], "device": device, **overrides})
        entries = blob.get("trained") or {model.policy_id: blob}  # older files: one, top level
        for pid, entry in entries.items():
            t = model.trainees[pid]
            t.model.load_state_dict(entry["state_dict"])
            t.num_timesteps, t.version = entry["num_timesteps"], entry["policy_version"]
            if entry["optimizer"] is not None:
                torch.save(entry["optimizer"], t.optimizer_path)
            if entry.get("learner_rng") is not None:  # the learner's minibatch order goes on
                torch.save(entry["learner_rng"], rng_path(t.optimizer_path))
        for pid, state in blob.get("frozen", {}).items():
            model.frozen[pid].load_state_dict(state)
        # graphs started before the save used their seeds: a resumed run draws new env resets
        model._num_graphs = blob.get("num_graphs", 0) + 1
        return model


def _check_state_dict(model: torch.nn.Module, state: dict, exact_match: bool) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
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
        raise ValueError("parameters do not fit this model (" + ", ".join(problems) + "); "
                         "they must come from a model with the same env spaces and hidden_sizes")
