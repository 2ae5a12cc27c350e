"""The model contract and the built-in actor-critic.

What the engine calls on ``ActorCritic(spec, cfg)`` (an nn.Module: ``parameters``,
``state_dict``/``load_state_dict``, ``eval``): ``dist`` (its action distribution), ``prepare(obs)``
(the per-leaf conversion of stored observations, done once per learner batch: uint8 scaling,
one-hot), ``forward(obs, prepared=False, state=None, starts=None) -> (dist params [N, P], values
[N][, next state])``, ``act`` (policy workers, ``predict``), ``evaluate`` (the learner's log-probs,
entropies and values of stored actions, the values in the value head's own scale),
``normalize_values`` / ``denormalize_values`` (returns' scale <-> the head's), ``update_normalizers(obs,
returns, keep)``, ``fused_forward`` (the policy workers' inference), and ``core`` /
``state_size`` (a recurrent model's state). Observations are dicts of leaf keys (see
``spaces``). Between the inputs and the heads sit encoders per key (a CNN per image, one-hot for
Discrete/MultiDiscrete, a GRU over a text's words, the vectors concatenated), then SB3's
``net_arch`` MLPs for policy and value. Running observation and return normalisers are part of
the model: their statistics are module buffers, so they travel with the weights to policy
workers and checkpoints.

``policy_kwargs`` take Stable-Baselines3's spelling: ``net_arch``, ``activation_fn``,
``features_extractor_class`` (+ ``features_extractor_kwargs``: an SB3 ``BaseFeaturesExtractor``
works unchanged, given SB3-preprocessed inputs), ``share_features_extractor``, ``log_std_init``
(a Gaussian's initial log std; default: ``distributions.default_log_std``, -0.5 for up to four
dimensions and -1.0 for more, in units of each dimension's half range, where SB3's is 0),
``ortho_init``. A whole network is ``policy=cls``:
``cls(observation_space, action_space, param_size, **policy_kwargs)`` whose ``forward(obs)``
returns ``(params [N, param_size], values [N])`` from SB3-preprocessed observations; the
distribution and normalisers stay ours.
"""
from __future__ import annotations

import numbers
import pickle
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch
from torch import nn
import torch.nn.functional as F

from . import pickling
from .config import Config, ConfigError
from .distributions import make_distribution
from .encoders import (Bfloat16Linear, ConvEncoder, ReturnScale, RunningNorm, TextEncoder,
                       bfloat16_weights, computes_bfloat16, init_layer, leaf_encoder, mlp,
                       normalized_keys, flat_width, preprocess_leaf, remember_texts, sb3_space,
                       snapshot_bfloat16)
from .gru import gru_sequence, gru_step
from .spaces import GLOBAL_STATE, EnvSpec, is_grid, stack_observations

POLICY_KWARGS = ("net_arch", "activation_fn", "features_extractor_class", "features_extractor_kwargs",
                 "share_features_extractor", "log_std_init", "ortho_init")
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PolicySpec(NamedTuple):
    """Everything a process needs to build the same model (picklable: the user's classes in
    ``policy`` and ``policy_kwargs`` by value where the workers cannot import them, e.g. from a
    notebook)."""
    env: EnvSpec
    policy: Optional[type] = None   # a whole custom network (see the module docstring)
    policy_kwargs: Optional[dict] = None

    def __reduce__(self):
        return (_policy_spec, (self.env, pickling.dumps(self.policy, "policy"),
                               pickling.dumps(self.policy_kwargs, "policy_kwargs")))


def _policy_spec(env: EnvSpec, policy: bytes, policy_kwargs: bytes) -> PolicySpec:
    return PolicySpec(env, pickling.loads(policy), pickling.loads(policy_kwargs))


class ActorCritic(nn.Module):
    # state_dict entries only the value side reads (a policy that acts needs none of them): its
    # own features, MLP and head, the return scale, a centralised critic's state normaliser
    VALUE_SIDE = ("vf_encoders.", "vf_net.", "value_head.", "value_norm.", "state_norm.")

    def __init__(self, spec: PolicySpec, cfg: Config):
        super().__init__()
        kw = check_policy_kwargs(spec.policy_kwargs or {}, spec.policy is not None)
        env = spec.env
        self.keys, self.bare = list(env.leaves), env.bare
        self.spaces = [env.leaves[k][1] for k in self.keys]
        self.dist = make_distribution(env.action_space, kw.get("log_std_init"))
        self.norm_keys = normalized_keys(env) if cfg.normalize_obs else []
        self.obs_norm = nn.ModuleList([RunningNorm((int(np.prod(env.leaves[k][1].shape)),))
                                       for k in self.norm_keys])
        self.value_norm = ReturnScale() if cfg.normalize_returns else None
        custom = spec.policy is not None or "features_extractor_class" in kw
        self.sb3 = custom  # SB3's preprocessing for code written for SB3
        ortho = kw.get("ortho_init", True)
        self.core: Optional[RecurrentCore] = None
        if cfg.use_rnn and (spec.policy is not None or kw.get("share_features_extractor") is False):
            raise ConfigError(
                "use_rnn puts the recurrent core between the shared features and the heads: it "
                "cannot wrap a whole custom policy= network nor separate value features "
                "(share_features_extractor=False); give a features_extractor_class instead")
        self.centralized = cfg.centralized_critic  # the value head reads the global state
        if self.centralized and not env.global_state_size:
            raise ConfigError("centralized_critic=True applies to multi-agent envs (PettingZoo) whose "
                              "global state flattens to a vector (their state() and state_space, "
                              "or every agent's observation: gymnasium.spaces.flatten); this env "
                              "has a single agent, or such a state does not flatten (or holds "
                              "text)")
        if self.centralized and spec.policy is not None:
            raise ConfigError("centralized_critic=True needs the built-in network (its value head "
                              "reads the global state), not policy=")
        self.state_norm = RunningNorm((env.global_state_size,)) if self.centralized and \
            cfg.normalize_obs else None
        if spec.policy is not None:
            self.net = spec.policy(sb3_observation_space(env), env.action_space,
                                   self.dist.param_size, **kw)
            self.encoders = self.vf_encoders = None
            return
        act = kw.get("activation_fn", ACTIVATIONS[cfg.activation])
        self.encoders = self._extractor(env, cfg, kw, ortho)
        separate = not kw.get("share_features_extractor", True) and not self.centralized
        self.vf_encoders = self._extractor(env, cfg, kw, ortho) if separate else None
        features = self._features_dim(self.encoders)
        if cfg.use_rnn:  # behind a CNN, the core computes in the CNN's precision
            convs = [m for m in self.encoders.modules() if isinstance(m, ConvEncoder)]
            self.core = RecurrentCore(cfg.rnn_type, features, cfg.rnn_size,
                                      convs[0].precision if convs else "float32")
            features = self.core.out_size
        # image encoders end in a hidden layer of their own (unless learns_features is False, as
        # SmallFlat's): no MLP after them
        encoded = isinstance(self.encoders, nn.ModuleList) and all(
            is_grid(s) and getattr(e, "learns_features", True)
            for s, e in zip(self.spaces, self.encoders))
        pi_arch, vf_arch = parse_net_arch(kw.get("net_arch", [] if encoded else list(cfg.hidden_sizes)))
        vf_in = env.global_state_size + features if self.centralized else features
        self.pi_net, self.vf_net = mlp(features, pi_arch, act, ortho), mlp(vf_in, vf_arch, act, ortho)
        self.action_head = init_layer(nn.Linear(pi_arch[-1] if pi_arch else features, self.dist.param_size),
                                  cfg.policy_head_gain, ortho)
        self.value_head = init_layer(nn.Linear(vf_arch[-1] if vf_arch else vf_in, 1), 1.0, ortho)
        self.act_fn = act

    @classmethod
    def from_spaces(cls, observation_space: gym.Space, action_space: gym.Space,
                    cfg: Optional[Config] = None, **policy_kwargs) -> "ActorCritic":
        """The model for these spaces (no action masks), outside an APPO: tests, benchmarks."""
        return cls(PolicySpec(EnvSpec(observation_space, action_space), None, policy_kwargs),
                   cfg or Config())

    def _extractor(self, env: EnvSpec, cfg: Config, kw: dict, ortho: bool) -> nn.Module:
        cls = kw.get("features_extractor_class")
        if cls is not None:
            return cls(sb3_observation_space(env), **kw.get("features_extractor_kwargs", {}))
        return nn.ModuleList([leaf_encoder(s, cfg, ortho) for s in self.spaces])

    def _features_dim(self, encoders: nn.Module) -> int:
        if isinstance(encoders, nn.ModuleList):
            return sum(getattr(e, "out_size", None) or flat_width(s) for e, s in zip(encoders, self.spaces))
        dim = getattr(encoders, "features_dim", None)
        if not isinstance(dim, numbers.Integral) or isinstance(dim, bool) or dim < 1:
            raise ConfigError(f"features_extractor_class {type(encoders).__name__} has no positive "
                              "integer features_dim (SB3's BaseFeaturesExtractor sets it)")
        return int(dim)

    # --- the contract ---------------------------------------------------------------------
    def prepare(self, obs: Dict[str, torch.Tensor], cache: Optional[dict] = None) -> Dict[str, torch.Tensor]:
        """Stored leaves -> network inputs; image encoders scale into ``cache``'s reused buffers.
        A centralised critic's global state passes as it is."""
        out = {} if GLOBAL_STATE not in obs else {GLOBAL_STATE: obs[GLOBAL_STATE]}
        for i, (key, space) in enumerate(zip(self.keys, self.spaces)):
            enc = self.encoders[i] if isinstance(self.encoders, nn.ModuleList) else None
            if enc is not None and hasattr(enc, "scale"):
                out[key] = enc.scale(obs[key], None if cache is None else cache.get(key))
                if cache is not None:
                    cache[key] = out[key]
            else:
                out[key] = preprocess_leaf(space, obs[key], self.sb3)
        return out

    @property
    def state_size(self) -> int:
        """Floats of recurrent state per env (0: feed-forward)."""
        return 0 if self.core is None else self.core.state_size

    def forward(self, obs: Dict[str, torch.Tensor], prepared: bool = False,
                state: Optional[torch.Tensor] = None, starts: Optional[torch.Tensor] = None):
        """obs {key: [N, ...]} (or a tensor, for a bare space) -> (dist params [N, P], values [N]).

        A recurrent model takes ``state`` and also returns the next one: one step, ``state``
        [N, state_size] (zeroed by the caller where an episode starts); or with ``starts``
        [T, B] (True where an episode starts: the state is zeroed before that step), whole
        trajectories: obs time-major [T * B, ...] from ``state`` [B, state_size] at their first
        step, returning the state after the last."""
        params, values, *next_state = self._heads(obs, prepared, state, starts)
        return (params, self.denormalize_values(values), *next_state)

    def _heads(self, obs: Dict[str, torch.Tensor], prepared: bool, state: Optional[torch.Tensor],
               starts: Optional[torch.Tensor]):
        """``forward`` with the values in the value head's own (normalised) scale."""
        if torch.is_tensor(obs):
            obs = {"obs": obs}
        x = obs if prepared else self.prepare(obs)
        if self.norm_keys:
            x = dict(x)
            for key, norm in zip(self.norm_keys, self.obs_norm):
                x[key] = norm(x[key])
        if self.encoders is None:
            params, values = self.net(x["obs"] if self.bare else x)
        else:
            pi_feat = self._features(self.encoders, x)
            if self.core is not None:
                if state is None:
                    raise ValueError("a recurrent model needs its state (zeros at an episode's start)")
                pi_feat, state = self.core(pi_feat, state, starts)
            params = self.action_head(self.pi_net(pi_feat))
            values = self._values(pi_feat, x)
        return (params, values) if self.core is None else (params, values, state)

    def _values(self, pi_feat: torch.Tensor, x: Dict[str, torch.Tensor]) -> torch.Tensor:
        """The value head's output [N] (normalised scale) on the actor's features, its own
        encoders' or, for a centralised critic, the global state beside the actor's features
        (which agent's value: agents sharing a policy may be rewarded apart): zeros without the
        state (``predict`` and exported actors, which need no value)."""
        if not self.centralized:
            vf_feat = pi_feat if self.vf_encoders is None else self._features(self.vf_encoders, x)
        elif GLOBAL_STATE not in x:
            return pi_feat.new_zeros(pi_feat.shape[0])
        else:
            state = x[GLOBAL_STATE] if self.state_norm is None else self.state_norm(x[GLOBAL_STATE])
            vf_feat = torch.cat([state, pi_feat], -1)  # whose value: the agent's own features
        return self.value_head(self.vf_net(vf_feat)).squeeze(-1)

    def _features(self, encoders: nn.Module, x: Dict[str, torch.Tensor]) -> torch.Tensor:
        if isinstance(encoders, nn.ModuleList):
            feats = [enc(x[k]) for enc, k in zip(encoders, self.keys)]
            return feats[0] if len(feats) == 1 else torch.cat(feats, -1)
        return encoders(x["obs"] if self.bare else x)

    @torch.no_grad()
    def act(self, obs: Dict[str, torch.Tensor], mask: Optional[torch.Tensor] = None,
            deterministic: bool = False, state: Optional[torch.Tensor] = None):
        """(actions [N, action_size], log_probs [N], values [N], next state [N, state_size] or
        None) for one step."""
        params, values, *next_state = self(obs, state=state)
        actions, log_probs = self.dist.sample(params, mask, deterministic)
        return actions, log_probs, values, (next_state[0] if next_state else None)

    def evaluate(self, obs: Dict[str, torch.Tensor], actions: torch.Tensor,
                 mask: Optional[torch.Tensor] = None, prepared: bool = True,
                 state: Optional[torch.Tensor] = None, starts: Optional[torch.Tensor] = None):
        """(log_probs [N], entropy [N], values [N]) of stored ``actions``, with grad (a recurrent
        model: whole trajectories, see ``forward``). The values are the value head's, in the
        scale it learns in (``normalize_values``): the loss needs no conversion of them (four
        operations and their gradients a minibatch step), ``denormalize_values`` gives returns."""
        params, values, *_ = self._heads(obs, prepared, state, starts)
        log_probs, entropy = self.dist.log_prob_entropy(params, actions, mask)
        return log_probs, entropy, values

    @torch.no_grad()
    def update_normalizers(self, obs: Dict[str, torch.Tensor], returns: torch.Tensor,
                           keep: torch.Tensor) -> None:
        """Fold a batch's prepared observations [N, ...] and value targets [N] into the running
        statistics, the samples where ``keep`` [N] is True (only the normalised keys and the leaves of
        encoders with ``update_stats`` are read)."""
        for key, norm in zip(self.norm_keys, self.obs_norm):
            norm.update(obs[key][keep])
        if self.state_norm is not None:
            self.state_norm.update(obs[GLOBAL_STATE][keep])
        for encoders in (self.encoders, self.vf_encoders):
            if isinstance(encoders, nn.ModuleList):  # one per key (a custom extractor keeps its own)
                for key, enc in zip(self.keys, encoders):
                    if hasattr(enc, "update_stats"):  # its own input statistics (SmallCNN)
                        enc.update_stats(obs[key][keep])
        if self.value_norm is not None:
            self.value_norm.update(returns[keep])

    def normalize_values(self, values: torch.Tensor) -> torch.Tensor:
        """Values in the scale the value head learns in (identity without return normalisation)."""
        return values if self.value_norm is None else self.value_norm(values)

    def denormalize_values(self, values: torch.Tensor) -> torch.Tensor:
        """The value head's outputs in the returns' scale (the inverse of ``normalize_values``)."""
        return values if self.value_norm is None else self.value_norm.denormalize(values)

    @torch.no_grad()
    def fused_forward(self) -> Callable:
        """An inference-only ``forward`` with the policy and value MLPs of a vector-only model
        fused into one block-diagonal MLP (half the matmuls, no module calls), the return
        normaliser's scale folded into the value row and the observation normalisers' division
        into the first layer's columns (each normalised key is centred and clipped to +-clip x
        std: two operations where the normaliser takes five). Rebuild it after the weights or
        statistics change. Other models return ``forward`` itself, their bfloat16 image encoder and
        core with a snapshot of their weights in bfloat16 and their text encoders with a memo of
        the texts read (each reused until the weights change)."""
        device = next(self.parameters()).device
        for module in self.modules():
            if isinstance(module, (ConvEncoder, RecurrentCore)) and module.bfloat16_on(device):
                snapshot_bfloat16(module)
            elif isinstance(module, TextEncoder):
                remember_texts(module)
        fusable = (isinstance(self.encoders, nn.ModuleList) and self.vf_encoders is None
                   and self.core is None and not self.centralized
                   and all(isinstance(e, nn.Flatten) for e in self.encoders)
                   and len(self.pi_net) == len(self.vf_net) and self.act_fn in (nn.Tanh, nn.ReLU))
        if not fusable:
            return self.forward
        act = torch.tanh if self.act_fn is nn.Tanh else torch.relu
        actor = [m for m in self.pi_net if isinstance(m, nn.Linear)] + [self.action_head]
        critic = [m for m in self.vf_net if isinstance(m, nn.Linear)] + [self.value_head]
        weights, biases = [], []
        for i, (a, c) in enumerate(zip(actor, critic)):
            w = torch.cat([a.weight, c.weight]) if i == 0 else torch.block_diag(a.weight, c.weight)
            weights.append(w.detach().clone())
            biases.append(torch.cat([a.bias, c.bias]).detach().clone())
        p = self.dist.param_size
        if self.value_norm is not None:  # values de-normalised by the value row itself
            scale, shift = self.value_norm.std(), self.value_norm.shift()
            weights[-1][p] *= scale
            biases[-1][p] = biases[-1][p] * scale + shift
        norms, centred, col = dict(zip(self.norm_keys, self.obs_norm)), {}, 0
        for key, space in zip(self.keys, self.spaces):
            width, norm = flat_width(space), norms.get(key)
            if norm is not None:  # (x - mean) / std, clipped: clip(x - mean, +-clip x std) / std
                std = norm.std().reshape(-1)
                weights[0][:, col:col + width] /= std
                bound = norm.clip * std  # an observation normaliser always clips
                centred[key] = (norm.mean.reshape(-1).clone(), -bound, bound)
            col += width

        def centre(key: str, v: torch.Tensor) -> torch.Tensor:
            mean, low, high = centred[key]
            return torch.clamp(v - mean, low, high)

        def forward(obs: Dict[str, torch.Tensor]):
            x = self.prepare(obs)
            feats = [centre(k, x[k]) if k in centred else x[k] for k in self.keys]
            x = feats[0] if len(feats) == 1 else torch.cat(feats, -1)
            for w, b in zip(weights[:-1], biases[:-1]):
                x = act(F.linear(x, w, b))
            out = F.linear(x, weights[-1], biases[-1])
            return out[:, :p], out[:, p]
        return forward


class RecurrentCore(nn.Module):
    """A GRU or LSTM cell between the features and the heads. Its state per env is one vector
    (an LSTM's h and c side by side), so that it fits one buffer entry. ``precision``
    (``Config.cnn_precision``, for the core behind an image encoder): a GRU on a CPU computes
    its matrix products in bfloat16 where the precision says so ("auto": a CPU with native
    bfloat16); the state, the gates and the weights stay float32; an LSTM, and a GPU's cuDNN
    kernels, compute float32."""

    def __init__(self, kind: str, in_size: int, size: int, precision: str = "float32"):
        super().__init__()
        self.lstm, self.precision = kind == "lstm", precision
        self.cell = (nn.LSTMCell if self.lstm else nn.GRUCell)(in_size, size)
        self.out_size, self.state_size = size, 2 * size if self.lstm else size
        for name, p in self.cell.named_parameters():  # CleanRL's ppo_atari_lstm init
            if "weight" in name:
                nn.init.orthogonal_(p, 1.0)
            else:
                nn.init.zeros_(p)

    def bfloat16_on(self, device: torch.device) -> bool:
        return not self.lstm and device.type == "cpu" and computes_bfloat16(self.precision, device)

    def bfloat16_tensors(self) -> List[torch.Tensor]:
        """The weights a step computes with in bfloat16 (``bfloat16_weights``)."""
        return [self.cell.weight_ih, self.cell.weight_hh]

    def bfloat16_copies(self) -> list:
        """Those weights for inference's products (``Bfloat16Linear``s)."""
        return [Bfloat16Linear(w) for w in self.bfloat16_tensors()]

    def step(self, x: torch.Tensor, state: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.lstm:
            h, c = self.cell(x, tuple(state.chunk(2, -1)))
            return h, torch.cat([h, c], -1)
        if self.bfloat16_on(x.device):
            w_ih, w_hh = (bfloat16_weights(self)
                          if not torch.is_grad_enabled()
                          else [w.bfloat16() for w in self.bfloat16_tensors()])
            h = gru_step(x, state, w_ih, w_hh, self.cell.bias_ih, self.cell.bias_hh)
        else:
            h = self.cell(x, state)
        return h, h

    def forward(self, x: torch.Tensor, state: torch.Tensor,
                starts: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """One step (``starts`` None: x [N, F]) or trajectories (x [T * B, F] time-major, starts
        [T, B]): (outputs [N, size], state after the last step). Trajectories run as whole
        sequences through the fused RNN kernel (``torch.gru``/``torch.lstm``, nn.GRU's, on the
        cell's own weights), cut only at the rows where some trajectory starts an episode (its
        state zeroed there): one call for most minibatches instead of T cell calls. A GRU on the
        CPU runs ``gru_sequence`` instead (the same function, with a cheaper backward pass)."""
        if starts is None:
            return self.step(x, state)
        T, B = starts.shape
        x = x.view(T, B, -1)
        cell, outs = self.cell, []
        weights = [cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh]
        if not self.lstm and x.device.type == "cpu":
            low = torch.bfloat16 if self.bfloat16_on(x.device) else None
            out, state = gru_sequence(x, state, starts, *weights, low=low)
            return out.flatten(0, 1), state
        keep = (~starts).unsqueeze(-1).to(x.dtype)
        cuts = [0, *(torch.nonzero(starts[1:].any(1)).flatten() + 1).tolist(), T]
        for t0, t1 in zip(cuts[:-1], cuts[1:]):
            state = state * keep[t0]
            if self.lstm:
                h, c = (s.unsqueeze(0).contiguous() for s in state.chunk(2, -1))
                out, h, c = torch.lstm(x[t0:t1], (h, c), weights, True, 1, 0.0, self.training,
                                       False, False)
                state = torch.cat([h[0], c[0]], -1)
            else:
                out, h = torch.gru(x[t0:t1], state.unsqueeze(0).contiguous(), weights, True, 1,
                                   0.0, self.training, False, False)
                state = h[0]
            outs.append(out)
        return torch.cat(outs).flatten(0, 1), state


def sb3_observation_space(env: EnvSpec) -> gym.Space:
    """What a custom network or SB3 extractor is built with: the bare space, or a one-level Dict
    of the leaves (channel-last images transposed, as SB3 does)."""
    if env.bare:
        return sb3_space(env.leaves["obs"][1])
    return gym.spaces.Dict({k: sb3_space(s) for k, (_, s) in env.leaves.items()})


def parse_net_arch(net_arch: Any) -> Tuple[List[int], List[int]]:
    """SB3's ``net_arch``: a list (the same widths for policy and value) or dict(pi=[...], vf=[...])."""
    def widths(v, what):
        if not isinstance(v, (list, tuple)) or not all(isinstance(h, int) and not isinstance(h, bool)
                                                      and h >= 1 for h in v):
            raise ConfigError(f"policy_kwargs net_arch{what}={v!r}: expected a list of positive "
                              "integers, e.g. [64, 64], or dict(pi=[64, 64], vf=[64, 64])")
        return list(v)
    if isinstance(net_arch, dict):
        extra = set(net_arch) - {"pi", "vf"}
        if extra:
            raise ConfigError(f"policy_kwargs net_arch has keys {sorted(extra)}; only 'pi' and "
                              "'vf' (SB3's spelling), e.g. dict(pi=[64, 64], vf=[256, 256])")
        return widths(net_arch.get("pi", []), "['pi']"), widths(net_arch.get("vf", []), "['vf']")
    w = widths(net_arch, "")
    return w, list(w)


def check_policy_kwargs(kw: dict, custom_policy: bool) -> dict:
    if not isinstance(kw, dict):
        raise ConfigError(f"policy_kwargs={kw!r}: expected a dict, e.g. dict(net_arch=[64, 64])")
    unknown = sorted(set(kw) - set(POLICY_KWARGS))
    if unknown and not custom_policy:
        raise ConfigError(f"policy_kwargs: unknown key(s) {unknown}; the built-in policy takes "
                          f"{list(POLICY_KWARGS)} (a custom policy= class receives its own)")
    act = kw.get("activation_fn")
    if act is not None and not (isinstance(act, type) and issubclass(act, nn.Module)):
        raise ConfigError(f"policy_kwargs activation_fn={act!r}: expected an nn.Module class such "
                          "as torch.nn.ReLU (the class, not an instance)")
    fe = kw.get("features_extractor_class")
    if fe is not None and not (isinstance(fe, type) and issubclass(fe, nn.Module)):
        raise ConfigError(f"policy_kwargs features_extractor_class={fe!r}: expected an nn.Module "
                          "class (e.g. a subclass of SB3's BaseFeaturesExtractor)")
    if "net_arch" in kw:
        parse_net_arch(kw["net_arch"])
    return kw


def build_checked(spec: PolicySpec, cfg: Config) -> ActorCritic:
    """Build the model in the main process and run it on two sampled observations, so that a
    custom extractor or network that does not fit (or that the workers could not receive) fails
    here, naming what is wrong."""
    pickle.dumps(spec)  # ConfigError naming policy or policy_kwargs if even cloudpickle fails
    try:
        model = ActorCritic(spec, cfg)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"building the model failed ({type(e).__name__}: {e}); check "
                          "policy_kwargs / policy") from e
    space = spec.env.observation_space
    arrays, n, _ = spec.env.batch_obs(_stack_samples(space, 2))
    obs = {k: torch.as_tensor(v) for k, v in arrays.items()}
    try:
        with torch.no_grad():
            state = torch.zeros(n, model.state_size) if model.core is not None else None
            params, values, *_ = model(obs, state=state)
    except Exception as e:
        what = ("features_extractor_class" if "features_extractor_class" in (spec.policy_kwargs or {})
                else "policy" if spec.policy is not None else "the model")
        raise ConfigError(f"{what} failed on a batch of 2 sampled observations "
                          f"({type(e).__name__}: {e}); if its output width is not features_dim, "
                          "fix features_dim") from e
    if tuple(params.shape) != (n, model.dist.param_size) or tuple(values.shape) != (n,):
        raise ConfigError(f"the policy returned params {tuple(params.shape)} and values "
                          f"{tuple(values.shape)} for 2 observations; expected ({n}, "
                          f"{model.dist.param_size}) and ({n},)")
    return model


def _stack_samples(space: gym.Space, n: int) -> Any:
    """n samples of a space, batched (per key for Dict/Tuple spaces: what predict accepts)."""
    return stack_observations(space, [space.sample() for _ in range(n)])
