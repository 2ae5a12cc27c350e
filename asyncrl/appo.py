"""The stable-baselines-style facade: ``APPO(env, ...).train(...)``."""
from __future__ import annotations

import dataclasses
import inspect
import os
import pathlib
import random
import shutil
import warnings
import weakref
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, Type, TypeVar, Union

import numpy as np
import torch

from asyncrl.envs import env_family

from . import pickling
from .callbacks import SB3_TICK, ProgressBar, SB3CallbackDriver, chain
from .acting import as_numpy, play_episode, predict_mask, predict_state, stack_actions
from .config import (DEVICES_HINT, MACHINE_FIELDS, MUTABLE_HPARAMS, Config, ConfigError,
                     ConfigKwargs, Settings, portable, schedule_value, valid_device)
from .env_utils import eval_env_factory, make_env_factory, probe_env
from .fileio import PolicyFiles, atomic_torch_save, make_scratch_dir
from .logger import TrainLogger
from .multiagent import AgentView, play_parallel_episode
from .parameters import PolicyParameters
from .runner import Runner
from .trainee import build_policies, run_defaults
from .spaces import MASK_KEY

try:
    from typing import Unpack  # Python 3.11+
except ImportError:  # 3.9, 3.10: typing_extensions comes with torch
    from typing_extensions import Unpack


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when torch sees a GPU, else "cpu"; an unusable choice raises.
    Only queries the driver: no CUDA context is created in the main process."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} but torch sees no CUDA GPU (torch "
                              f"{torch.__version__}); use device='cpu' or 'auto'")
        idx = int(device.partition(":")[2] or 0)
        if idx >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r} but only {torch.cuda.device_count()} CUDA "
                              "device(s) are visible")
    return device


def _first_trainees(attr: str, settable: bool = True, doc: str = "") -> property:
    """An attribute of the model's first trained policy (``Trainee``), as one of the model's."""
    def get(self):
        return getattr(self.trainees[self.policy_id], attr)

    def set(self, value):
        setattr(self.trainees[self.policy_id], attr, value)
    return property(get, set if settable else None, doc=doc)


Model = TypeVar("Model", bound="APPO")  # APPO.load returns an instance of the class it is called on


class APPO:
    """Asynchronous PPO with V-trace: rollout workers, policy workers and a learner in separate
    processes, trading trajectories through shared memory. The processes start with the first
    ``train()``/``learn()`` call and stay, paused, between calls; :meth:`close` (or the ``with``
    block, garbage collection, interpreter exit) stops them.

    :param env: a Gymnasium id (e.g. ``"CartPole-v1"``) or a zero-argument function returning a
        ``gymnasium.Env`` (pickled with cloudpickle for the workers: by value where they cannot
        import it, as from a notebook, a lambda or a closure).
    :param env_kwargs: keyword arguments for ``gymnasium.make`` when ``env`` is an id.
    :param policy_kwargs: the model, in Stable-Baselines3's spelling: ``net_arch`` (a list, or
        ``dict(pi=[...], vf=[...])``), ``activation_fn``, ``features_extractor_class`` (+
        ``features_extractor_kwargs``), ``share_features_extractor``, ``log_std_init`` (default
        -0.5 in units of each action dimension's half range for up to four dimensions, -1.0 for
        more, where SB3's is 0: see :mod:`asyncrl.distributions`), ``ortho_init`` (see
        :mod:`asyncrl.models`).
    :param policy: a whole custom network class, ``cls(observation_space, action_space,
        param_size, **policy_kwargs)`` whose ``forward(obs)`` returns ``(params [N, param_size],
        values [N])``; None: the built-in actor-critic.
    :param policies: for a multi-agent env (a factory returning a PettingZoo ``ParallelEnv``,
        or an ``AECEnv``: a turn-based game, each agent acting on its turn):
        ``{policy id: None}`` for a trained policy (the defaults; a dict of overrides instead:
        ``policy_kwargs``, ``policy``, config fields, and ``agents_per_env``: the most agents of
        one env that play it at once, with a per-episode mapping), ``{policy id: {"frozen":
        True}}`` for frozen ones (weights set with ``set_parameters``, never trained),
        ``{policy id: fn(obs) -> action}`` for rule-based ones; frozen and rule-based ones run in
        the rollout workers. Several trained policies each get their own learner; one trained
        policy's overrides are the run's settings, several's may set any field but
        ``GRAPH_FIELDS``. None (with no ``policy_mapping``): agents of the same spaces share
        one trained policy, ``"policy"`` where all do; agents whose spaces differ (a speaker
        and a listener, adversaries and good agents) train one policy per pair of spaces, named
        by their agents' names before ``_<n>`` (``"speaker"``, ``"listener"``); ``model.policies``
        and ``model.policy_mapping`` then show what was derived.
    :param policy_mapping: ``fn(agent_id)`` (fixed) or ``fn(agent_id, episode_idx)`` returning
        the policy id an agent plays, called when the agent first appears in an episode;
        lambdas and closures are fine (cloudpickle).
    :param kwargs: any field of :class:`asyncrl.Config` (``num_workers``, ``learning_rate``, ...).
        The fields in ``MUTABLE_HPARAMS`` (``learning_rate``, ``gamma``, ``ent_coef``,
        ``clip_coef``, ``vf_coef``, ``max_grad_norm``, ``vtrace_lambda``) may also be schedules,
        functions of SB3's ``progress_remaining`` (1 at the start of a call, 0 at its end).

    The same fields are attributes (``model.learning_rate = 1e-4``; ``clip_range`` and
    ``lr_schedule`` are SB3's names for ``clip_coef`` and ``learning_rate``): a new value is
    checked at once (``model.config`` shows it; a bad one raises ConfigError and is not kept) and
    reaches the running learner at the next ``train()`` call, without a restart.
    """

    def __init__(self, env: Any = "CartPole-v1", *, env_kwargs: Optional[dict] = None,
                 policy_kwargs: Optional[dict] = None, policy: Optional[type] = None,
                 policies: Optional[dict] = None, policy_mapping: Optional[Callable] = None,
                 **kwargs: Unpack[ConfigKwargs]):
        probed = probe_env(make_env_factory(env, env_kwargs), policies, policy_mapping)
        self.env_factory = probed.factory
        # the caller's policies and mapping, or those the agents' spaces imply (policies_by_space)
        self.agents, self.policies = probed.agents, probed.policies
        self.policy_mapping = probed.policy_mapping
        trained = dict(probed.trained)  # id -> (spec, overrides); the first is the model's policy
        self.policy_id = next(iter(trained))
        env_spec, first_overrides = trained[self.policy_id]
        if len(trained) == 1:  # one trained policy: its overrides are the run's settings
            own = dict(first_overrides)
            policy_kwargs = own.pop("policy_kwargs", policy_kwargs)
            policy = own.pop("policy", policy)
            kwargs.update(own)
        set_by_caller = set(kwargs)
        lanes = {pid: 1 if self.agents is None else self.agents.lanes[pid] for pid in trained}
        if kwargs.setdefault("lanes_per_env", lanes[self.policy_id]) != lanes[self.policy_id]:
            raise ConfigError(f"lanes_per_env={kwargs['lanes_per_env']!r}: it is set by the engine "
                              f"from the env's agents ({lanes[self.policy_id]} here); leave it out")
        schedules = {k: v for k, v in kwargs.items() if k in MUTABLE_HPARAMS and callable(v)}
        kwargs.update({k: schedule_value(k, v, 1.0) for k, v in schedules.items()})
        device = kwargs.get("device", Config.device)
        cpu_only = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        # an id's family; a loaded model's factory made from an id (GymIdFactory) keeps the id
        family = env_family(getattr(self.env_factory, "env_id", env))
        classes = [c for c in (policy, *(o.get("policy") for _, o in [*trained.values(),
                                                                         *probed.frozen.values()]))
                   if c is not None]  # policy= networks anywhere in the run
        # with one, no centralised critic by default (its value head is the network's own;
        # frozen policies are built with the run's config)
        defaults = run_defaults(family, cpu_only, self.agents is not None, bool(classes))
        self.observation_space, self.action_space = env_spec.observation_space, env_spec.action_space
        cfg = Config.from_kwargs(defaults(kwargs, env_spec))
        if cfg.seed is None:
            cfg = cfg.replace(seed=random.randrange(2 ** 31))
        self.settings = Settings(cfg, schedules, set_by_caller)  # the run's: attributes and config
        self.device = resolve_device(cfg.device)
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise ConfigError(f"policy={cls!r}: expected an nn.Module class (see asyncrl.models)")
        self._tmpdir = make_scratch_dir()  # a folder per trained policy; removed with the model
        self._finalizer = self._removes_scratch()
        files = {pid: PolicyFiles.of(self._tmpdir, k, pid) for k, pid in enumerate(trained)}
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(cfg.seed)
                self.trainees, self.frozen_specs, self.frozen = build_policies(
                    trained, probed.frozen, self.settings, files, lanes, policy, policy_kwargs,
                    {k: v for k, v in kwargs.items() if k != "lanes_per_env"}, defaults)
        except BaseException:
            self._finalizer()  # a model that fails to build leaves no folder behind
            raise
        for model in (*self.models().values(), *self.frozen.values()):
            model.eval()
        self._runner: Optional[Runner] = None  # the process graph, kept between calls
        self._num_graphs = 0     # graphs started so far (a new one after an error)
        self._training = False   # inside train(): callbacks run, the learner owns the weights
        self._eval_vec_envs: Dict[str, Any] = {}  # get_env(), per policy id
        self._params = PolicyParameters(self.trainees, self.frozen,
                                        () if self.agents is None else self.agents.rule_based)
        self._open_scratch()
        self.logger = TrainLogger(cfg.verbose, cfg.log_interval, cfg.stats_window, cfg.tensorboard_log,
                                  self.policy_id)

    # The first trained policy's model, spec and counters (the only one of most models)
    policy = _first_trainees("model", settable=False)
    policy_spec = _first_trainees("spec", settable=False)
    num_timesteps = _first_trainees("num_timesteps", doc="env (agent) steps trained on, all calls")
    policy_version = _first_trainees("version", doc="weight updates its learner has published")

    def models(self) -> Dict[str, torch.nn.Module]:
        """{trained policy id: its model (CPU, the latest weights between train() calls)}."""
        return {pid: t.model for pid, t in self.trainees.items()}

    # SB3's names for two of the mutable hyper-parameters
    clip_range = property(lambda self: self.clip_coef, lambda self, v: setattr(self, "clip_coef", v))
    lr_schedule = property(lambda self: self.learning_rate,
                           lambda self, v: setattr(self, "learning_rate", v))

    @property
    def config(self) -> Config:
        """The run's config, always current: a one-policy model's policy's; with several trained
        policies, the one each one's own settings go over (``trainees[id].config``). Assigning
        a whole new config changes fields that need new processes at the next ``train()``."""
        return self.settings.config

    @config.setter
    def config(self, config: Config) -> None:
        self.settings.replace_config(config)

    # --- training -------------------------------------------------------------------------
    def train(self, train_for_env_steps: int, callback: Optional[Callable[["APPO"], Any]] = None,
              callback_interval: float = 1.0) -> "APPO":
        """Train for ``train_for_env_steps`` more env steps (samples the learner trains on; with
        several trained policies, each trains on at least that many of its agents' steps, and
        one that gets there first goes on training until all have). The first call starts the
        worker processes; later calls resume them. Returns ``self``.

        :param callback: called as ``callback(self)`` in this process every ``callback_interval``
            seconds while training, with ``self.policy`` holding the latest published weights
            (so ``predict``/``evaluate`` work); returning ``False`` stops training early.
        """
        if not isinstance(train_for_env_steps, (int, np.integer)) or train_for_env_steps < 1:
            raise ConfigError(f"train_for_env_steps={train_for_env_steps!r}: must be an integer >= 1")
        for t in self.trainees.values():
            t.hparams_at(1.0)  # bad values raise here, before anything starts
        runner = self._graph()
        self._training = True
        try:
            runner.run([t.job(int(train_for_env_steps)) for t in self.trainees.values()],
                       callback=None if callback is None else self._progress_hook(callback),
                       callback_interval=callback_interval)
        finally:  # also after an error or Ctrl-C: the counters that match the kept weights
            self._training = False
            self._counters([(part.version, part.trained_env_steps) for part in runner.parts])
            if not runner.alive:
                self._runner = None
        return self

    def _counters(self, counters: list) -> None:
        """(version, trained env steps) per trained policy, as the graph reports them."""
        for t, (version, steps) in zip(self.trainees.values(), counters):
            if version is not None:
                t.version, t.num_timesteps = version, steps

    def _graph(self) -> Runner:
        """The running process graph, or a new one if there is none or the config changed in a
        field that needs one (anything but MUTABLE_HPARAMS)."""
        structural = lambda cfg: dataclasses.replace(cfg, **{n: 0 for n in MUTABLE_HPARAMS})  # noqa: E731
        configs = [t.config for t in self.trainees.values()]
        if self._runner is not None and [structural(c) for c in self._runner.base_cfgs] != [
                structural(c) for c in [self.config, *configs]]:
            self._runner.close()
            self._runner = None
        if self._runner is None:
            self._open_scratch()  # again, if a with block has removed it
            self._runner = Runner(self.config, self.env_factory,
                                  [t.trained_policy() for t in self.trainees.values()],
                                  self.device, self.logger, self._tmpdir, self._num_graphs, self.agents,
                                  {pid: (self.frozen_specs[pid], m) for pid, m in self.frozen.items()})
            self._num_graphs += 1
        return self._runner

    def _open_scratch(self) -> None:
        """The scratch directory and its folder per trained policy (made again after a with
        block removed them: the model stays usable), removed with the model."""
        for t in self.trainees.values():
            os.makedirs(t.files.folder, exist_ok=True)
        if not self._finalizer.alive:
            self._finalizer = self._removes_scratch()

    def _removes_scratch(self) -> weakref.finalize:
        """Removes the scratch directory when the model is closed by a with block, collected, or
        at interpreter exit."""
        return weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)

    def _progress_hook(self, callback: Callable[["APPO"], Any]) -> Callable[[list], Any]:
        def hook(counters: list):
            self._counters(counters)
            return callback(self)
        return hook

    def learn(self, total_timesteps: int, callback: Any = None, log_interval: int = 1,
              tb_log_name: str = "APPO", reset_num_timesteps: bool = True,
              progress_bar: bool = False) -> "APPO":
        """Stable-Baselines3's ``learn``: train for ``total_timesteps`` env steps; returns self.

        :param callback: an SB3 ``BaseCallback``, a list of them, or ``fn(locals, globals)``;
            run in this process (see :class:`asyncrl.callbacks.SB3CallbackDriver`).
        :param reset_num_timesteps: as in SB3, restart ``num_timesteps`` at 0 (the TensorBoard
            step axis too); False continues counting.
        :param progress_bar: show a tqdm bar with env steps, FPS and the recent mean return.
        ``log_interval`` and ``tb_log_name`` are accepted for compatibility; the console and
        TensorBoard intervals come from the config (``log_interval`` seconds).
        """
        if reset_num_timesteps:
            for t in self.trainees.values():
                t.num_timesteps = 0
        driver = bar = None
        try:
            if callback is not None:
                driver = SB3CallbackDriver(callback, self, total_timesteps,
                                           self.config.num_workers * self.config.num_envs_per_worker)
            if progress_bar:
                bar = ProgressBar(total_timesteps, self.num_timesteps)
            self.train(total_timesteps, callback=chain(driver, bar), callback_interval=SB3_TICK)
            if bar is not None:
                bar(self)
            if driver is not None:
                driver(self)
        finally:
            for part in (driver, bar):
                if part is not None:
                    part.close()
        return self

    # --- acting ---------------------------------------------------------------------------
    def predict(self, observation, state=None, episode_start=None, deterministic: bool = False,
                action_masks=None, policy_id: Optional[str] = None) -> Tuple[Any, Any]:
        """Actions for one observation or a batch (``[N, *shape]``; ``Dict`` observations batched
        per key), in the env's own format (NumPy, as SB3 returns them), and the next recurrent
        state. ``action_masks``: ``[mask_size]`` or ``[N, mask_size]``, True where legal
        (MaskablePPO's convention); with an env whose observations carry the mask, it is taken
        from them.

        A recurrent model (``use_rnn``) is played as sb3-contrib's ``RecurrentPPO``: ``state``
        is what the previous call returned (None at the start: zeros), ``episode_start`` ``[N]``
        is True where an episode starts (that env's state is zeroed first), and the returned
        state is an ``(h, c)`` tuple of ``[1, N, rnn_size]`` arrays for an LSTM, one such array
        for a GRU. A feed-forward model returns ``state`` as given.

        ``policy_id`` (a multi-agent env): a trained policy's id (default: the first), a frozen
        one's, or a rule-based one's, whose function is applied to the one observation given."""
        pid = self._policy_id(policy_id)
        if self.agents is not None and pid in self.agents.rule_based:
            return self.agents.act_rule_based(pid, "(predict)", observation), state
        model, spec = self._model_and_spec(pid)
        arrays, n, single = spec.env.batch_obs(observation)
        obs = {k: torch.as_tensor(v) for k, v in arrays.items()}
        mask = predict_mask(model, spec, observation, action_masks, n)
        core = model.core
        state_in = None if core is None else predict_state(core, state, episode_start, n)
        actions, _, _, state_out = model.act(obs, mask, deterministic=deterministic, state=state_in)
        env_actions = model.dist.to_env(actions.numpy())
        if core is not None:
            parts = tuple(p.numpy()[None] for p in state_out.split(core.out_size, -1))
            state = parts if core.lstm else parts[0]
        return (as_numpy(env_actions[0]) if single else stack_actions(env_actions)), state

    def evaluate(self, n_episodes: int = 10, deterministic: bool = True,
                 seed: Optional[int] = None, policy_id: Optional[str] = None) -> Tuple[float, float]:
        """Mean and std of the raw episode return (whole games: no reward clipping, no episodic
        life) over ``n_episodes``, played in this process. A multi-agent env: the return of the
        agents that play ``policy_id`` (default: the trained policy), averaged over them per
        episode, each agent playing the policy the mapping gives it."""
        env = eval_env_factory(self.env_factory)()
        try:
            pid = self._policy_id(policy_id)
            if self.agents is not None:
                returns = [self.play_agents(env, deterministic, None if seed is None else seed + ep,
                                            ep).get(pid, np.nan) for ep in range(n_episodes)]
                returns = [r for r in returns if r == r] or [np.nan]  # episodes it played
            else:
                returns = [play_episode(self, env, deterministic, None if seed is None else seed + ep)[0]
                           for ep in range(n_episodes)]
        finally:
            env.close()
        return float(np.mean(returns)), float(np.std(returns))

    def play_agents(self, env: Any, deterministic: bool = True, seed: Optional[int] = None,
                    episode_idx: int = 0) -> Dict[str, float]:
        """One episode of a multi-agent ``env`` (one this model's factory made) played in this
        process, each agent playing the policy the mapping gives it in episode ``episode_idx``:
        {policy id: the mean return of its agents}."""
        if self.agents is None:
            raise ValueError("play_agents plays multi-agent envs; use evaluate() for this env")
        return play_parallel_episode(self.agents, env, self._agent_actor(deterministic), seed,
                                     episode_idx)

    def plot(self):
        """A matplotlib Figure of this model's learning curves so far (mean episode return and
        env steps/s against env steps, one point per console summary, all ``train()`` calls);
        shown inline as a notebook cell's value, or ``model.plot().savefig("curves.png")``."""
        from .plotting import curves_figure
        return curves_figure({self.policy_id: self.logger.history})

    def export(self, path, format: Optional[str] = None, policy_id: Optional[str] = None) -> str:
        """Write the deterministic policy for deployment: ONNX (``.onnx``; run it with
        onnxruntime, ``pip install 'asyncrl[export]'``) or TorchScript (``.pt``; ``torch.jit.load``
        runs it without asyncrl), or as ``format`` says ("onnx", "torchscript"). It maps the
        observation (one input per leaf, named after it: ``obs`` for a single array), an
        ``action_mask`` where the env masks and a recurrent ``state`` (zeros at an episode's
        start) to the action ``predict(deterministic=True)`` gives, then the ``next_state``;
        the observation normaliser is inside. See ``asyncrl.export`` for the names and dtypes.
        ``policy_id``: a trained or frozen policy of a multi-agent model (default: the first
        trained). Returns the format written."""
        from .export import export_policy  # torch.onnx's import costs a second; only when used
        pid = self._policy_id(policy_id)
        if self.agents is not None and pid in self.agents.rule_based:
            raise ValueError(f"policy {pid!r} is rule-based (a Python function): nothing to export")
        model, spec = self._model_and_spec(pid)
        return export_policy(model, spec, path, format)

    def _model_and_spec(self, pid: str) -> tuple:
        """The model and spec of a trained or frozen policy."""
        if pid in self.trainees:
            return self.trainees[pid].model, self.trainees[pid].spec
        return self.frozen[pid], self.frozen_specs[pid]

    def _policy_id(self, policy_id: Optional[str]) -> str:
        """``policy_id``, or the first trained policy's for None; an unknown one raises KeyError."""
        ids = [self.policy_id] if self.agents is None else self.agents.policy_ids
        if policy_id is not None and policy_id not in ids:
            raise KeyError(f"policy_id={policy_id!r}: this model's policies are {ids}")
        return policy_id or self.policy_id

    def _agent_actor(self, deterministic: bool) -> Callable:
        """act(policy id, obs, info, start, state) -> (action, state) with a trained or frozen
        policy."""
        def act(pid, obs, info, start, state):
            spec = self._model_and_spec(pid)[1]
            masks = info.get(MASK_KEY) if spec.env.mask_source == "info" else None
            return self.predict(obs, state=state, episode_start=np.array([start]),
                                deterministic=deterministic, action_masks=masks, policy_id=pid)
        return act

    def get_env(self, policy_id: Optional[str] = None):
        """A Stable-Baselines3 ``VecEnv`` of one evaluation env (Monitor-wrapped, whole games),
        for SB3 tools such as ``evaluate_policy(model, model.get_env())``. Needs SB3 installed.
        A multi-agent env: one agent's view (:class:`asyncrl.multiagent.AgentView`), the first
        agent that plays ``policy_id`` (default: the trained policy) in each episode, the others
        playing theirs."""
        pid = self._policy_id(policy_id)
        if pid not in self._eval_vec_envs:
            try:
                from stable_baselines3.common.monitor import Monitor
                from stable_baselines3.common.vec_env import DummyVecEnv
            except ImportError as e:
                raise ImportError("get_env() returns a Stable-Baselines3 VecEnv: pip install "
                                  "stable-baselines3 (or use model.evaluate())") from e
            factory = eval_env_factory(self.env_factory)
            if self.agents is not None:
                act, layout = self._agent_actor(deterministic=True), self.agents
                make = lambda: AgentView(factory(), layout, pid, act)  # noqa: E731
            else:
                make = factory
            self._eval_vec_envs[pid] = DummyVecEnv([lambda: Monitor(make())])
        return self._eval_vec_envs[pid]

    def get_vec_normalize_env(self) -> None:
        """SB3 API: no ``VecNormalize`` wrapper is used."""
        return None

    # --- parameters and persistence ------------------------------------------------------
    def get_parameters(self) -> Dict[str, dict]:
        """SB3's layout, keyed by policy id: ``{"policy": state_dict, "policy.optimizer": Adam
        state}`` (copies, CPU); a multi-agent model's trained policies under their own ids
        (``"hero"``, ``"hero.optimizer"``, ...), each frozen one's weights under its id.
        Rule-based policies have none."""
        return self._params.get()

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
        rollout workers at the next ``train()``; the trained policies' samples stay valid. They
        need only fit its actor: a frozen policy never computes a value, so a value side that
        does not fit (a model's of the other ``centralized_critic`` setting) or is absent is
        left out and its own stays.

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
        self._open_scratch()  # Adam's state goes to the scratch files, also after a with block
        self._params.set(load_path_or_dict, exact_match)

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write weights, optimizer state, counters, config and the learner's RNG state to
        ``path`` (atomically), for every trained policy. Called while training (from a
        callback), it asks each learner for its state between two updates, so its weights,
        Adam moments and counters are of one moment. Schedules are saved as their values at
        the start of a call."""
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.settings.at(1.0)
        runner = self._runner
        snapshot = runner.snapshot if self._training and runner is not None and runner.started else None
        try:
            trained = self._params.saved(snapshot)
        except FloatingPointError as e:
            raise FloatingPointError(f"{e}: not saved to {path}") from None
        blob = {**trained[self.policy_id], "trained": trained, "config": self.config.__dict__.copy(),
                "set_by_caller": sorted(self.settings.set_by_caller),
                # the user's code by value where needed: a file saved from a notebook loads elsewhere
                "env_factory": pickling.saved(self.env_factory), "num_graphs": self._num_graphs,
                "policy_class": pickling.saved(self.policy_spec.policy),
                "policy_kwargs": pickling.saved(self.policy_spec.policy_kwargs),
                "policies": pickling.saved(self.policies), "policy_mapping": pickling.saved(self.policy_mapping),
                "frozen": {pid: m.state_dict() for pid, m in self.frozen.items()}}
        atomic_torch_save(blob, path)

    @classmethod
    def load(cls: Type[Model], path: Union[str, os.PathLike], env: Any = None, device: str = "auto",
             **overrides) -> Model:
        """Rebuild a model (of this class) from :meth:`save`; ``overrides`` replace config
        fields. The fields the machine implied (``config.MACHINE_FIELDS``: the layout, the
        batch it implies, a CPU learner's preset), unless the model's caller set them, are
        derived for this machine and ``device`` again, as a new model's are; where that clashes
        with a field the caller set (a batch size that this machine's layout cannot make), the
        saved values are kept, with a warning naming them."""
        try:
            blob = torch.load(path, map_location="cpu", weights_only=False)
            factory = env if env is not None else pickling.restored(blob["env_factory"])
        except (AttributeError, ModuleNotFoundError) as e:
            raise RuntimeError(f"could not unpickle the env factory saved in {path} ({e}); its "
                               "module cannot be imported here: pass env=... to load()") from e
        set_by_caller = blob.get("set_by_caller")
        saved_policies = overrides.pop("policies", None)
        args = dict(policy=overrides.pop("policy", pickling.restored(blob.get("policy_class"))),
                    policy_kwargs=overrides.pop("policy_kwargs",
                                                pickling.restored(blob.get("policy_kwargs"))),
                    policy_mapping=overrides.pop("policy_mapping",
                                                 pickling.restored(blob.get("policy_mapping"))))

        def build(mine: Optional[Iterable[str]]) -> Model:
            """The model, the saved MACHINE_FIELDS kept only where in ``mine`` (None: all)."""
            policies = saved_policies
            if policies is None:  # as saved, each trained policy's settings as they were then
                policies = pickling.restored(blob.get("policies"))
                for pid, entry in (blob.get("trained") or {}).items():
                    if entry.get("fields"):  # several trained: their own values and what they
                        # implied (the machine's derived again: the caller's are the run's or in
                        # the policy's own overrides)
                        own = portable(entry["fields"], None if mine is None else ())
                        policies[pid] = {**own, **(policies[pid] or {})}
            # a file saved before small_images existed encoded small images with convolutions
            saved = {"small_images": "conv", **portable(blob["config"], mine)}
            return cls(factory, policies=policies, **args, **{**saved, "device": device, **overrides})

        try:
            model = build(set_by_caller)
        except ConfigError as e:
            if set_by_caller is None:
                raise
            model = build(None)  # as before: every saved field kept
            pinned = {k: model.config.__dict__[k] for k in sorted(MACHINE_FIELDS)
                      if k not in set_by_caller and k not in overrides}
            warnings.warn(f"{path}: what this machine implies clashes with the fields the model's "
                          f"caller set ({e}); loaded with the values it was saved with "
                          f"({', '.join(f'{k}={v!r}' for k, v in pinned.items())}): pass "
                          "load() the ones you want instead", stacklevel=2)
        if set_by_caller is not None:  # the saved fields passed above are the caller's only as before
            model.settings.set_by_caller = frozenset(set_by_caller) | set(overrides)
        model._params.restore(blob)
        # graphs started before the save used their seeds: a resumed run draws new env resets
        model._num_graphs = blob.get("num_graphs", 0) + 1
        return model

    def close(self) -> None:
        """Stop the worker processes and release everything; the model stays usable for
        ``predict``/``evaluate``/``save``, and a later ``train()`` starts new processes."""
        if self._runner is not None:
            self._runner.close()
            self._runner = None
        for vec_env in self._eval_vec_envs.values():
            vec_env.close()
        self._eval_vec_envs.clear()
        self.logger.close()

    def __enter__(self) -> "APPO":
        return self

    def __exit__(self, *exc) -> None:
        """``close()``, and the scratch directory (the optimizer state file) is removed."""
        self.close()
        self._finalizer()



def _hparam_attribute(name: str) -> property:
    """A mutable hyper-parameter of APPO, a view onto the run's settings: reads what was set
    (number or schedule); a new value is checked into ``config`` before it is kept."""
    def get(self):
        return self.settings.hparams[name]

    def set_(self, value):
        self.settings.set(name, value)
    return property(get, set_, doc=f"``{name}``: a number or a schedule (see the class docstring)")


def _config_signature(init: Callable) -> inspect.Signature:
    """``init``'s own parameters, then every key of ConfigKwargs keyword-only with its Config
    default and type, as ``help()``, ``inspect.signature`` and notebooks show ``APPO(...)``."""
    sig = inspect.signature(init)
    own = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    hints = {k: getattr(v, "__forward_arg__", v) for k, v in ConfigKwargs.__annotations__.items()}
    return sig.replace(parameters=own + [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                          annotation=hints[f.name])
        for f in dataclasses.fields(Config) if f.name in hints])


def _config_params_doc() -> str:
    """One ``:param name:`` line per key of ConfigKwargs: its Config documentation and default."""
    hints = ConfigKwargs.__annotations__
    return "\n".join(f":param {f.name}: {f.metadata['doc']} Default ``{f.default!r}``."
                      for f in dataclasses.fields(Config) if f.name in hints)


APPO.__init__.__signature__ = _config_signature(APPO.__init__)
APPO.__init__.__doc__ = (
    "Build the model; nothing starts until ``train()``. Besides the arguments in the class "
    "docstring, the keyword-only fields of :class:`asyncrl.Config` (the defaults shown are "
    "Config's; where one is not passed, what the env implies applies: continuous or factored actions, "
    "Atari and VizDoom ids, see docs/configuration.md):\n\n" + _config_params_doc())


# The MUTABLE_HPARAMS: what was set (a number or a schedule), its value checked into ``config``
# at once, so that ``model.config`` is always current and a bad value raises where it is set.
for _name in MUTABLE_HPARAMS:
    setattr(APPO, _name, _hparam_attribute(_name))

