"""What the core derives from an env's spaces, in one place.

An observation space becomes a flat dict of *leaves* (``"obs"`` for a bare space; ``"image"``,
``"pos.x"``, ``"0"`` for the keys and indices of nested ``Dict``/``Tuple`` spaces), each stored in
its own dtype (uint8 images stay uint8). An ``"action_mask"`` key of a ``Dict`` observation, an
env method ``action_masks()`` or ``info["action_mask"]`` becomes the action mask. ``EnvSpec``
holds all of it, is checked once in the main process and is pickled to every worker; with the
action distribution it yields the one buffer spec that the trajectory slots, the policy worker's
staging and the learner's gatherer iterate.
"""
from __future__ import annotations

import functools
import re
import warnings
import zlib
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import gymnasium as gym
import numpy as np
import torch

from .config import CRITIC_STATE_MAX, ConfigError

MASK_KEY = "action_mask"
UNSUPPORTED_HINTS = {
    gym.spaces.Sequence: "pad it to a fixed-length Box with a mask (an ObservationWrapper)",
    gym.spaces.Graph: "encode the graph as fixed-size Box node/edge arrays (an ObservationWrapper)",
}


class UnsupportedSpace(ConfigError):
    """An observation leaf of a kind the buffers cannot hold."""


OBS_PREFIX = "obs/"  # buffer-spec names of observation leaves: "obs/<key>"
GLOBAL_STATE = "_global_state"  # the model input of a centralised critic (an "obs/" entry)


def split_obs_names(tensors: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """({leaf key: x} of the "obs/<key>" entries, {name: x} of the others)."""
    obs = {n[len(OBS_PREFIX):]: x for n, x in tensors.items() if n.startswith(OBS_PREFIX)}
    return obs, {n: x for n, x in tensors.items() if not n.startswith(OBS_PREFIX)}


class Entry(NamedTuple):
    """One named tensor of a trajectory slot: ``[rows, E, *shape]`` of ``dtype``, where rows is
    T+1 for what is observed (the last row is the state after the slot's last step) and T for
    what is done."""
    shape: Tuple[int, ...]
    dtype: torch.dtype
    observed: bool


def torch_dtype(np_dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, np_dtype)).dtype


def is_image(space: gym.Space) -> bool:
    """A 3-D uint8 Box: an image, [C, H, W] or [H, W, C]."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8


def is_board(space: gym.Space) -> bool:
    """A 3-D Box of 0/1 integer or bool planes: a board game's grid (PettingZoo's connect four
    [6, 7, 2], chess [8, 8, 111], go [19, 19, 17]), encoded as a small image is."""
    return (isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype != np.uint8
            and (np.issubdtype(space.dtype, np.integer) or space.dtype == np.bool_)
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 1)))


def is_grid(space: gym.Space) -> bool:
    """An image or a board: the model encodes it with convolutions."""
    return is_image(space) or is_board(space)


def channel_last(space: gym.spaces.Box) -> bool:
    """[H, W, C] (MiniGrid, most renderers) rather than [C, H, W] (Atari's frame stacks): the last
    dimension looks like colour channels and the first does not. A board's planes are last
    unless the first dimension alone is the smallest."""
    h, w, c = space.shape
    if is_board(space):
        return not (h < min(w, c))
    return c in (1, 3, 4) and h not in (1, 3, 4)


def scaled_uint8(space: gym.Space) -> bool:
    """uint8 with the full 0..255 range: scaled to [0, 1] by the model (images and any other)."""
    return (isinstance(space, gym.spaces.Box) and space.dtype == np.uint8
            and bool(np.all(space.low == 0)) and bool(np.all(space.high == 255)))


# A text leaf (a space of strings: gymnasium's Text, MiniGrid's and BabyAI's MissionSpace) is
# stored as the ids of its first TEXT_TOKENS words and punctuation marks (0 pads; BabyAI's
# longest missions have 37), each hashed into TEXT_BUCKETS ids (1..TEXT_BUCKETS), so that no
# vocabulary has to be known in advance: BabyAI's MissionSpace samples "" and cannot list its
# missions. The 33 words and marks of BabyAI's grammar get 33 ids (tested); a word never seen
# gets an id as any other (two share one with a chance of 1 in TEXT_BUCKETS).
TEXT_TOKENS = 48
TEXT_BUCKETS = 4096
_WORD = re.compile(r"\w+|[^\w\s]")


def is_text(space: gym.Space) -> bool:
    """A space of strings (its dtype is str): gymnasium's Text, MiniGrid's MissionSpace."""
    dtype = getattr(space, "dtype", None)  # None for Dict and Tuple
    return isinstance(dtype, np.dtype) and dtype.kind == "U"


def text_tokens(space: gym.Space) -> int:
    """Token ids stored of a text leaf: TEXT_TOKENS, fewer where a Text space's ``max_length``
    cannot hold as many words and marks."""
    max_length = getattr(space, "max_length", None)
    return min(TEXT_TOKENS, max_length) if isinstance(max_length, int) else TEXT_TOKENS


def token_id(word: str) -> int:
    """A word's id, 1..TEXT_BUCKETS (crc32: the same in every process and run)."""
    return 1 + zlib.crc32(word.encode("utf-8")) % TEXT_BUCKETS


@functools.lru_cache(maxsize=4096)
def _encode(text: str, tokens: int) -> np.ndarray:
    ids = np.zeros(tokens, np.int64)
    words = _WORD.findall(text.lower())
    if len(words) > tokens:  # once per process (a warning's default filter) and text (the cache)
        warnings.warn(f"a text observation has more than {tokens} words and punctuation marks, "
                      f"the most a text leaf stores (TEXT_TOKENS, or a Text space's smaller "
                      f"max_length): the rest is cut; shorten the text in a wrapper where the "
                      f"rest matters", stacklevel=3)
        words = words[:tokens]
    ids[:len(words)] = [token_id(w) for w in words]
    ids.flags.writeable = False  # cached: shared by every call with the same text
    return ids


def encode_text(text: Any, tokens: int = TEXT_TOKENS) -> np.ndarray:
    """A string -> int64 [tokens]: the ids of its words and punctuation marks, lower-cased, in
    order, zero-padded; past ``tokens`` the rest is cut, with a warning. An array of strings [N]
    -> [N, tokens].
    What a text leaf is stored as, and what an exported policy takes in its place."""
    if isinstance(text, str):
        return _encode(text, tokens)
    arr = np.asarray(text)
    if arr.dtype.kind != "U":
        raise ValueError(f"expected a string or an array of strings, got {arr.dtype} {arr.shape}")
    return np.stack([_encode(str(t), tokens) for t in arr.reshape(-1)]).reshape(
        *arr.shape, tokens) if arr.size else np.zeros((*arr.shape, tokens), np.int64)


def leaf_storage(space: gym.Space) -> Tuple[Tuple[int, ...], np.dtype]:
    """How one observation leaf is stored per env: (shape, numpy dtype). Discrete and
    MultiDiscrete values are stored from 0 (their ``start`` subtracted); MultiBinary as uint8;
    uint8 Boxes as they are; any other Box as float32; text as its words' ids (encode_text)."""
    if is_text(space):
        return (text_tokens(space),), np.dtype(np.int64)
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.shape), np.dtype(np.int64)
    if isinstance(space, gym.spaces.MultiBinary):
        return tuple(np.atleast_1d(space.n)), np.dtype(np.uint8)
    return tuple(space.shape), np.dtype(np.uint8) if space.dtype == np.uint8 else np.dtype(np.float32)


def flatten_space(space: gym.Space, prefix: str = "") -> Dict[str, Tuple[tuple, gym.Space]]:
    """{leaf key: (path into an observation, leaf space)}, in the space's own order; nested Dict
    and Tuple spaces flatten to dotted keys. Unsupported leaves raise, naming the key."""
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        items = space.spaces.items() if isinstance(space, gym.spaces.Dict) else enumerate(space.spaces)
        out = {}
        for k, sub in items:
            try:
                leaves = flatten_space(sub, f"{prefix}{k}.")
            except UnsupportedSpace as e:
                # only a top-level Dict key of its own is FilterObservation's to drop
                top_leaf = not prefix and isinstance(space, gym.spaces.Dict) and not isinstance(
                    sub, (gym.spaces.Dict, gym.spaces.Tuple))
                keep = [other for other in space.spaces if other != k] if top_leaf else []
                if not keep:  # a Sequence with other keys beside it
                    raise
                raise UnsupportedSpace(
                    f"{e}; or drop the key if the policy can do without it: "
                    f"gymnasium.wrappers.FilterObservation(env, {keep})") from None
            for key, (path, leaf) in leaves.items():
                if key in out:
                    raise ConfigError(f"observation keys {'.'.join(map(str, out[key][0]))!r} and "
                                      f"{'.'.join(map(str, (k, *path)))!r} both flatten to {key!r}; "
                                      "rename one (a Dict key with a dot clashes with a nested Dict)")
                out[key] = ((k, *path), leaf)
        if not out:
            raise ConfigError(f"observation key {prefix[:-1] or 'obs'!r}: an empty {type(space).__name__} space")
        return out
    key = prefix[:-1] or "obs"
    for kind, hint in UNSUPPORTED_HINTS.items():
        if isinstance(space, kind):
            raise UnsupportedSpace(f"observation key {key!r} is a {kind.__name__} space, which "
                                   f"asyncrl cannot store in fixed-size buffers: {hint}")
    if is_text(space):
        return {key: ((), space)}
    if not isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                              gym.spaces.MultiBinary)):
        raise UnsupportedSpace(f"observation key {key!r}: space {space} is not supported; use "
                               "Box, Discrete, MultiDiscrete, MultiBinary, Text, or Dict/Tuple of "
                               "them")
    if isinstance(space, gym.spaces.Box) and not (np.issubdtype(space.dtype, np.number)
                                                  or space.dtype == np.bool_):
        raise ConfigError(f"observation key {key!r}: Box dtype {space.dtype} is not numeric")
    return {key: ((), space)}


def get_path(obs: Any, path: tuple) -> Any:
    for p in path:
        obs = obs[p]
    return obs


class EnvSpec:
    """The env's spaces as the engine uses them. ``leaves``: {key: (path, space)} of the model's
    inputs; ``mask_source``: None, "obs", "method" or "info"; ``mask_size``: entries of a mask;
    ``turn_based``: the agents take turns (see turns), so a step may hold no move of an agent;
    ``global_state_size``: floats of a multi-agent env's global state (see
    multiagent.global_state; 0: a single-agent env), the input of a centralised critic."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space,
                 mask_source: Optional[str] = None, mask_size: int = 0, turn_based: bool = False,
                 global_state_size: int = 0):
        self.observation_space, self.action_space = observation_space, action_space
        self.turn_based, self.global_state_size = turn_based, global_state_size
        leaves = flatten_space(observation_space)
        self.mask_source, self.mask_size = mask_source, mask_size
        if mask_source == "obs":
            leaves.pop(MASK_KEY)
        if not leaves:
            raise ConfigError(f"observation space {observation_space} has no key besides "
                              f"{MASK_KEY!r}: the model would see nothing")
        if GLOBAL_STATE in leaves:
            raise ConfigError(f"observation key {GLOBAL_STATE!r} is the engine's name for a "
                              "centralised critic's input; rename that key of the observation")
        self.leaves = leaves
        self.bare = list(leaves) == ["obs"] and not isinstance(
            observation_space, (gym.spaces.Dict, gym.spaces.Tuple))

    @property
    def critic_state(self) -> bool:
        """A centralised critic fits by default: several agents acting at once (not turn-based)
        whose global state is a vector of at most CRITIC_STATE_MAX floats, and no image among
        the observations (config.SEVERAL_AGENTS_CRITIC_DEFAULTS)."""
        return (not self.turn_based and 0 < self.global_state_size <= CRITIC_STATE_MAX
                and not any(is_grid(space) for _, space in self.leaves.values()))

    def obs_entries(self, global_state: bool = False) -> Dict[str, Entry]:
        """The observed part of the buffer spec: one entry per leaf, the mask, and the global
        state where a centralised critic reads it."""
        out = {}
        if global_state:
            out[OBS_PREFIX + GLOBAL_STATE] = Entry((self.global_state_size,), torch.float32, True)
        for key, (_, space) in self.leaves.items():
            shape, dtype = leaf_storage(space)
            out[OBS_PREFIX + key] = Entry(shape, torch_dtype(dtype), True)
        if self.mask_source is not None:
            out[MASK_KEY] = Entry((self.mask_size,), torch.bool, True)
        return out

    def leaf_offset(self, key: str) -> Any:
        """What is subtracted from a stored Discrete/MultiDiscrete leaf (its start), else None."""
        space = self.leaves[key][1]
        if isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
            start = np.asarray(space.start)
            return start if np.any(start != 0) else None
        return None

    def leaf_converter(self, key: str) -> Optional[Callable[[Any], np.ndarray]]:
        """How an env's value of a leaf becomes the stored one: a text encoded (encode_text), a
        Discrete/MultiDiscrete start subtracted; None where it is stored as it is."""
        space = self.leaves[key][1]
        if is_text(space):
            return functools.partial(encode_text, tokens=text_tokens(space))
        offset = self.leaf_offset(key)
        return None if offset is None else lambda x: np.asarray(x) - offset

    def batch_obs(self, observation: Any) -> Tuple[Dict[str, np.ndarray], int, bool]:
        """One observation or a batch (Dict observations batched per key) -> ({key: [N, ...]
        stored arrays}, N, single). Raises ValueError naming the key whose shape fits neither."""
        arrays, n, single = {}, None, None
        for key, (path, space) in self.leaves.items():
            shape, dtype = leaf_storage(space)
            try:
                x = np.asarray(get_path(observation, path))
            except (KeyError, IndexError, TypeError) as e:
                raise ValueError(f"observation has no key {key!r} of the observation space "
                                 f"{self.observation_space} ({type(e).__name__}: {e})") from e
            if is_text(space):
                if x.dtype.kind != "U":
                    raise ValueError(f"observation key {key!r} is text: expected a string (or an "
                                     f"array of strings), got {x.dtype} of shape {x.shape}")
                x = encode_text(x, shape[0])
            is_single = x.shape == shape
            if not is_single and x.shape[1:] != shape:
                raise ValueError(f"observation key {key!r} of shape {x.shape} matches neither the "
                                 f"env's shape {shape} nor a batch [N, *{shape}]")
            x = x.reshape(-1, *shape)
            if n is not None and (len(x) != n or is_single != single):
                raise ValueError(f"observation key {key!r} has a batch of {len(x)}, others {n}")
            offset = self.leaf_offset(key)
            arrays[key] = (x if offset is None else x - offset).astype(dtype, copy=False)
            n, single = len(x), is_single
        return arrays, n, single


def stack_observations(space: gym.Space, observations: list) -> Any:
    """A list of observations of ``space`` as one batch: arrays [N, ...], in Dict/Tuple
    observations per key (the layout ``EnvSpec.batch_obs`` takes)."""
    if isinstance(space, gym.spaces.Dict):
        return {k: stack_observations(sub, [o[k] for o in observations]) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(stack_observations(sub, [o[i] for o in observations])
                     for i, sub in enumerate(space.spaces))
    return np.stack([np.asarray(o) for o in observations])


class ObsWriter:
    """Writes an env's observation into the observed buffer rows of one env: each leaf (and a
    mask carried in the observation) to its own array. The bare-Box case is one assignment."""

    def __init__(self, spec: EnvSpec):
        self.items: List[Tuple[str, tuple, Any]] = [
            (OBS_PREFIX + key, path, spec.leaf_converter(key))
            for key, (path, _) in spec.leaves.items()]
        if spec.mask_source == "obs":
            self.items.append((MASK_KEY, (MASK_KEY,), None))
        self.bare = spec.bare and self.items[0][2] is None  # stored as it comes

    def __call__(self, views: Dict[str, np.ndarray], i: int, obs: Any) -> None:
        if self.bare:
            views[OBS_PREFIX + "obs"][i] = obs
            return
        for name, path, convert in self.items:
            x = get_path(obs, path)
            views[name][i] = x if convert is None else convert(x)


def read_mask(env: gym.Env, source: str, obs: Any, info: dict) -> Any:
    """The action mask that goes with ``obs``, from where ``source`` says masks come from."""
    if source == "obs":
        return obs[MASK_KEY]
    if source == "info":
        if MASK_KEY not in info:
            raise ValueError(f"the env's info has no {MASK_KEY!r} (it had one at reset): every "
                             "reset and step must return the mask of the actions legal next")
        return info[MASK_KEY]
    return env.get_wrapper_attr("action_masks")()


def detect_mask_source(env: gym.Env, obs: Any, info: dict) -> Optional[str]:
    """The mask convention an env follows: a Dict observation with an "action_mask" key
    (PettingZoo's classic games), an ``action_masks()`` method (sb3-contrib's MaskablePPO), or
    ``info["action_mask"]`` (Gymnasium's Taxi); None if none."""
    if isinstance(env.observation_space, gym.spaces.Dict) and MASK_KEY in env.observation_space.spaces:
        return "obs"
    try:
        if callable(env.get_wrapper_attr("action_masks")):
            return "method"
    except AttributeError:
        pass
    if isinstance(info, dict) and MASK_KEY in info:
        return "info"
    return None


def check_mask(mask: Any, mask_size: int, source: str, action_space: gym.Space) -> np.ndarray:
    """A mask as stored (bool [mask_size]); a wrong size or dtype raises, saying what is expected."""
    where = {"obs": f'the observation\'s "{MASK_KEY}"', "method": "action_masks()",
             "info": f'info["{MASK_KEY}"]'}[source]
    arr = np.asarray(mask)
    if arr.dtype != np.bool_ and not (np.issubdtype(arr.dtype, np.integer)
                                      and np.isin(arr, (0, 1)).all()):
        raise ConfigError(f"{where} has dtype {arr.dtype}: an action mask must be bool (or "
                          "integers 0/1), True where the action is legal")
    if arr.size != mask_size:
        raise ConfigError(f"{where} has shape {arr.shape}, but the action space {action_space} "
                          f"needs {mask_size} entries (MaskablePPO's convention: one per action, "
                          "the per-dimension masks concatenated for MultiDiscrete, two per bit "
                          "for MultiBinary)")
    return arr.reshape(-1).astype(bool)
