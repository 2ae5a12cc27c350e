"""A trained policy for deployment: ONNX (run with onnxruntime, any language) or TorchScript (run
with torch alone, no asyncrl), mapping observations (and an action mask, and a recurrent state)
to the deterministic action in the env's format, the observation normaliser inside.

Inputs, in this order, each with a batch dimension N:

- the observation: ONNX takes one input per leaf, named after it (``obs`` for a single array;
  ``Dict``/``Tuple`` observations flatten to their keys, nested ones dotted: ``"pos.x"``);
  TorchScript's ``forward`` takes the array itself, or a dict of them keyed the same way. Each
  leaf as the env gives it, in the dtype asyncrl stores: float32 for float Boxes, uint8 for
  uint8 Boxes and MultiBinary, int64 for Discrete and MultiDiscrete (their ``start`` included);
- ``action_mask`` [N, mask_size] bool (True: legal), where the env masks actions (also when the
  observation carries it: pass it here, not among the leaves);
- ``state`` [N, state_size] float32, a recurrent model's (an LSTM's h and c side by side): zeros
  where an episode starts, else the ``next_state`` of the previous step.

Outputs: the action (``action``; a ``Tuple``/``Dict`` action space gives one per part, named
``action.<index or key>``; TorchScript returns them as a tuple or a dict), then ``next_state``
for a recurrent model.
"""
from __future__ import annotations

import copy
import logging
import os
import warnings
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from .config import ConfigError
from .distributions import Composite
from .encoders import ConvEncoder
from .models import ActorCritic, PolicySpec, RecurrentCore
from .spaces import stack_observations

FORMATS = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript"}
MASK_INPUT, STATE_INPUT, STATE_OUTPUT = "action_mask", "state", "next_state"


class DeterministicPolicy(nn.Module):
    """``forward(*leaves, [action_mask], [state])`` -> (action leaves..., [next_state]); a copy
    of the model on the CPU in eval mode, so exporting leaves the trained one untouched. Its
    image encoders and recurrent core compute in float32 (``cnn_precision``'s bfloat16 is a
    training speed-up, and onnxruntime's CPU convolutions take no bfloat16)."""

    def __init__(self, model: ActorCritic, spec: PolicySpec):
        super().__init__()
        self.model = copy.deepcopy(model).cpu().eval().requires_grad_(False)
        for module in self.model.modules():
            if isinstance(module, (ConvEncoder, RecurrentCore)):
                module.precision = "float32"
        self.keys = list(spec.env.leaves)
        self.masked = spec.env.mask_source is not None
        self.recurrent = model.core is not None
        # a Discrete/MultiDiscrete leaf is stored from 0: its start is subtracted here, as
        # predict() does, so that the inputs are the env's own values
        self.offsets = {k: torch.as_tensor(np.asarray(off, dtype=np.int64))
                        for k in self.keys if (off := spec.env.leaf_offset(k)) is not None}

    def forward(self, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        obs = {k: x - self.offsets[k] if k in self.offsets else x
               for k, x in zip(self.keys, inputs)}
        rest = list(inputs[len(self.keys):])
        mask = rest.pop(0) if self.masked else None
        state = rest.pop(0) if self.recurrent else None
        params, _, *next_state = self.model(obs, state=state)
        return (*self.model.dist.mode_env(params, mask), *next_state)


def input_names(policy: DeterministicPolicy) -> List[str]:
    return policy.keys + [MASK_INPUT] * policy.masked + [STATE_INPUT] * policy.recurrent


def output_names(policy: DeterministicPolicy) -> List[str]:
    dist = policy.model.dist
    actions = ([f"action.{n}" for n in dist.leaf_names()] if isinstance(dist, Composite)
               else ["action"])
    return actions + [STATE_OUTPUT] * policy.recurrent


def example_inputs(policy: DeterministicPolicy, spec: PolicySpec, n: int = 2) -> Tuple[torch.Tensor, ...]:
    """Inputs of a batch of ``n`` drawn from the spaces (a mask allowing everything, zero state)."""
    space = spec.env.observation_space
    inputs = observation_inputs(spec, stack_observations(space, [space.sample() for _ in range(n)]))
    out = [torch.as_tensor(inputs[key]) for key in spec.env.leaves]
    if policy.masked:
        out.append(torch.ones(n, policy.model.dist.mask_size, dtype=torch.bool))
    if policy.recurrent:
        out.append(torch.zeros(n, policy.model.core.state_size))
    return tuple(out)


def export_format(path: Union[str, os.PathLike], format: Optional[str]) -> str:
    if format is not None:
        if format not in ("onnx", "torchscript"):
            raise ConfigError(f"format={format!r}: use 'onnx' or 'torchscript'")
        return format
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext not in FORMATS:
        raise ConfigError(f"cannot tell the export format from {os.fspath(path)!r}: name the file "
                         f"*.onnx (ONNX) or *.pt (TorchScript), or pass format='onnx' or "
                         "'torchscript'")
    return FORMATS[ext]


def export_policy(model: ActorCritic, spec: PolicySpec, path: Union[str, os.PathLike],
                  format: Optional[str] = None) -> str:
    """Write the deterministic policy of ``model`` to ``path`` (see the module docstring);
    returns the format written."""
    fmt = export_format(path, format)
    if spec.policy is not None:
        raise ConfigError("a whole custom policy= network cannot be exported yet: its forward is "
                          "the user's code; export it with torch.onnx or torch.jit yourself")
    policy = DeterministicPolicy(model, spec).eval()
    example = example_inputs(policy, spec)
    with torch.no_grad(), warnings.catch_warnings():
        # torch >= 2.10 calls TorchScript deprecated (asked for, it is still written and runs);
        # the tracer warns of the action bounds it keeps as constants, as they are
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        if fmt == "torchscript":
            torch.jit.save(_script_module(policy, spec, example), os.fspath(path))
        else:
            _export_onnx(policy, example, os.fspath(path))
    return fmt


def _export_onnx(policy: DeterministicPolicy, example: tuple, path: str) -> None:
    try:
        import onnx  # noqa: F401  (torch's exporter needs it; a clear error if it is missing)
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"ONNX export needs the onnx and onnxscript packages ({e}): "
                          "pip install 'asyncrl[export]', or export TorchScript (*.pt)") from e
    names = input_names(policy)
    batch = torch.export.Dim("batch", min=1)
    # torch's exporter logs every operator library it skips and its own deprecations
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                policy, example, input_names=names, output_names=output_names(policy),
                dynamic_shapes=(tuple({0: batch} for _ in names),), dynamo=True, verbose=False)
    finally:
        quiet.setLevel(level)
    program.save(path)


class _TorchScriptPolicy(nn.Module):
    """TorchScript's face of the policy: ``forward(obs, [action_mask], [state])``, the observation
    a tensor (a single array) or a dict keyed by leaf; a Tuple/Dict action as a tuple/dict."""

    def __init__(self, policy: DeterministicPolicy, bare: bool):
        super().__init__()
        self.policy, self.bare = policy, bare
        dist = policy.model.dist
        self.action_keys = dist.keys if isinstance(dist, Composite) else None
        self.n_actions = len(output_names(policy)) - policy.recurrent

    def forward(self, obs: Any, *rest: torch.Tensor):
        leaves = (obs,) if self.bare else tuple(obs[k] for k in self.policy.keys)
        out = self.policy(*leaves, *rest)
        actions, next_state = out[:self.n_actions], out[self.n_actions:]
        if self.action_keys is not None:
            action: Any = dict(zip(self.action_keys, actions))
        elif self.n_actions > 1:
            action = tuple(actions)
        else:
            action = actions[0]
        return (action, *next_state) if next_state else action


def _script_module(policy: DeterministicPolicy, spec: PolicySpec, example: tuple) -> torch.jit.ScriptModule:
    bare = spec.env.bare
    n_leaves = len(policy.keys)
    obs: Any = example[0] if bare else dict(zip(policy.keys, example[:n_leaves]))
    module = _TorchScriptPolicy(policy, bare)
    return torch.jit.trace(module, (obs, *example[n_leaves:]), strict=False, check_trace=False)


def observation_inputs(spec: PolicySpec, observation: Any) -> Dict[str, np.ndarray]:
    """An env observation (or a batch) -> the exported policy's named observation inputs."""
    arrays, _, _ = spec.env.batch_obs(observation)  # stored dtypes, Discrete values from 0
    # the exported policy takes the env's own values (it subtracts the starts itself)
    return {k: a if (start := spec.env.leaf_offset(k)) is None else a + start
            for k, a in arrays.items()}


__all__ = ["export_policy", "DeterministicPolicy", "observation_inputs"]
