"""The stable-baselines-style facade: ``APPO(env, ...).train(...)``."""
from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import shutil
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, Union

import cloudpickle
import numpy as np
import torch

from asyncrl.envs import env_family

from .callbacks import SB3_TICK, ProgressBar, SB3CallbackDriver, chain
from .acting import as_numpy, play_episode, predict_mask, predict_state, stack_actions
from .config import MUTABLE_HPARAMS, Config, ConfigError
from .distributions import make_distribution
from .env_utils import eval_env_factory, make_env_factory, probe_env
from .fileio import atomic_torch_save, make_scratch_dir
from .learner import rng_path
from .logger import TrainLogger
from .models import PolicySpec, build_checked
from .multiagent import AgentView, play_parallel_episode
from .runner import Runner
from .trainee import Trainee, build_trainee, hparams_of, run_defaults
from .spaces import MASK_KEY

OPTIMIZER_SUFFIX = ".optimizer"  # get_parameters(): {id: weights, id + ".optimizer": Adam's state}


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


class APPO:
    """Asynchronous PPO with V-trace: rollout workers, policy workers and a learner in separate
    processes, trading trajectories through shared memory. The processes start with the first
    ``train()``/``learn()`` call and stay, paused, between calls; :meth:`close` (or the ``with``
    block, garbage collection, interpreter exit) stops them.

    :param env: a Gymnasium id (e.g. ``"CartPole-v1"``) or a picklable zero-argument function
        returning a ``gymnasium.Env``.
    :param env_kwargs: keyword arguments for ``gymnasium.make`` when ``env`` is an id.
    :param policy_kwargs: the model, in Stable-Baselines3's spelling: ``net_arch`` (a list, or
        ``dict(pi=[...], vf=[...])``), ``activation_fn``, ``features_extractor_class`` (+
        ``features_extractor_kwargs``), ``share_features_extractor``, ``log_std_init``,
        ``ortho_init`` (see :mod:`asyncrl.models`).
    :param policy: a whole custom network class, ``cls(observation_space, action_space,
        param_size, **policy_kwargs)`` whose ``forward(obs)`` returns ``(params [N, param_size],
        values [N])``; None: the built-in actor-critic.
    :param policies: for a multi-agent env (a factory returning a PettingZoo ``ParallelEnv``):
        ``{policy id: None}`` for a trained policy (the defaults; a dict of overrides instead:
        ``policy_kwargs``, ``policy``, config fields, and ``agents_per_env``: the most agents of
        one env that play it at once, with a per-episode mapping), ``{policy id: {"frozen":
        True}}`` for frozen ones (weights set with ``set_parameters``, never trained),
        ``{policy id: fn(obs) -> action}`` for rule-based ones; frozen and rule-based ones run in
        the rollout workers. Several trained policies each get their own learner; one trained
        policy's overrides are the run's settings, several's may set any field but
        ``GRAPH_FIELDS``. None: every agent plays one shared policy, ``"policy"``.
    :param policy_mapping: ``fn(agent_id)`` (fixed) or ``fn(agent_id, episode_idx)`` returning
        the policy id an agent plays, called when the agent first appears in an episode;
        lambdas and closures are fine (cloudpickle).
    :param kwargs: any field of :class:`asyncrl.Config` (``num_workers``, ``learning_rate``, ...).
        The fields in ``MUTABLE_HPARAMS`` (``learning_rate``, ``gamma``, ``ent_coef``,
        ``clip_coef``, ``vf_coef``, ``max_grad_norm``, ``vtrace_lambda``) may also be schedules,
        functions of SB3's ``progress_remaining`` (1 at the start of a call, 0 at its end).

    The same fields are plain attributes (``model.learning_rate = 1e-4``; ``clip_range`` and
    ``lr_schedule`` are SB3's names for ``clip_coef`` and ``learning_rate``): a new value reaches
    the running learner at the next ``train()`` call, without a restart.
    """

    def __init__(self, env: Any = "CartPole-v1", *, env_kwargs: Optional[dict] = None,
                 policy_kwargs: Optional[dict] = None, policy: Optional[type] = None,
                 policies: Optional[dict] = None, policy_mapping: Optional[Callable] = None,
                 **kwargs):
        self.env_factory = make_env_factory(env, env_kwargs)
        probed = probe_env(self.env_factory, policies, policy_mapping)
        self.agents, self.policies, self.policy_mapping = probed.agents, policies, policy_mapping
        trained = dict(probed.trained)  # id -> (spec, overrides), the first logged unprefixed
        self.policy_id = next(iter(trained))
        env_spec, first_overrides = trained[self.policy_id]
        if len(trained) == 1:  # one trained policy: its overrides are the run's settings
            own = dict(first_overrides)
            policy_kwargs = own.pop("policy_kwargs", policy_kwargs)
            policy = own.pop("policy", policy)
            kwargs.update(own)
        lanes = {pid: 1 if self.agents is None else self.agents.lanes[pid] for pid in trained}
        if kwargs.setdefault("lanes_per_env", lanes[self.policy_id]) != lanes[self.policy_id]:
            raise ConfigError(f"lanes_per_env={kwargs['lanes_per_env']!r}: it is set by the engine "
                              f"from the env's agents ({lanes[self.policy_id]} here); leave it out")
        schedules = {k: v for k, v in kwargs.items() if k in MUTABLE_HPARAMS and callable(v)}
        kwargs.update({k: _schedule_value(k, v, 1.0) for k, v in schedules.items()})
        device = kwargs.get("device", Config.device)
        cpu_only = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        defaults = run_defaults(env_family(env), cpu_only, multi_agent=self.agents is not None)
        self.observation_space, self.action_space = env_spec.observation_space, env_spec.action_space
        self.config = Config.from_kwargs(defaults(kwargs, not make_distribution(self.action_space).discrete))
        if self.config.seed is None:
            self.config = self.config.replace(seed=random.randrange(2 ** 31))
        for name in MUTABLE_HPARAMS:
            setattr(self, name, schedules.get(name, getattr(self.config, name)))
        self.device = resolve_device(self.config.device)
        for cls in (policy, *(o.get("policy") for _, o in [*trained.values(), *probed.frozen.values()])):
            if cls is not None and not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
                raise ConfigError(f"policy={cls!r}: expected an nn.Module class (see asyncrl.models)")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)
            if len(trained) == 1:
                spec = PolicySpec(env_spec, policy, dict(policy_kwargs or {}))
                self.trainees: Dict[str, Trainee] = {
                    self.policy_id: Trainee(self.policy_id, spec, build_checked(spec, self.config), {}, {})}
            else:  # each with its own settings over the run's
                run_kwargs = {k: v for k, v in kwargs.items() if k != "lanes_per_env"}
                self.trainees = {pid: build_trainee(pid, spec, own, run_kwargs, self.config, lanes[pid],
                                                    policy, policy_kwargs, defaults)
                                 for pid, (spec, own) in trained.items()}
            # frozen policies: the first trained one's policy/policy_kwargs unless they name their own
            first = self.trainees[self.policy_id].spec
            self.frozen_specs = {pid: PolicySpec(spec, own.get("policy", first.policy),
                                                 dict(own.get("policy_kwargs", first.policy_kwargs) or {}))
                                 for pid, (spec, own) in probed.frozen.items()}
            # (built with the run's config, as the rollout workers build them)
            self.frozen = {pid: build_checked(spec, self.config) for pid, spec in self.frozen_specs.items()}
        for model in (*self.models().values(), *self.frozen.values()):
            model.eval()
        self._runner: Optional[Runner] = None  # the process graph, kept between calls
        self._num_graphs = 0     # graphs started so far (a new one after an error)
        self._training = False   # inside train(): callbacks run, the learner owns the weights
        self._eval_vec_envs: Dict[str, Any] = {}  # get_env(), per policy id
        self._tmpdir = make_scratch_dir()
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)
        for k, t in enumerate(self.trainees.values()):
            t.optimizer_path = os.path.join(self._tmpdir, "optimizer.pt" if k == 0 else f"optimizer-{k}.pt")
        cfg = self.config
        self.logger = TrainLogger(cfg.verbose, cfg.log_interval, cfg.stats_window, cfg.tensorboard_log)

    # The first trained policy's model, spec and counters (the only one of most models)
    policy = property(lambda self: self.trainees[self.policy_id].model)
    policy_spec = property(lambda self: self.trainees[self.policy_id].spec)

    @property
    def num_timesteps(self) -> int:
        """Env (agent) steps the first trained policy has trained on, over all train() calls."""
        return self.trainees[self.policy_id].num_timesteps

    @num_timesteps.setter
    def num_timesteps(self, value: int) -> None:
        self.trainees[self.policy_id].num_timesteps = value

    @property
    def policy_version(self) -> int:
        """Weight updates the first trained policy's learner has published."""
        return self.trainees[self.policy_id].version

    @policy_version.setter
    def policy_version(self, value: int) -> None:
        self.trainees[self.policy_id].version = value

    def models(self) -> Dict[str, torch.nn.Module]:
        """{trained policy id: its model (CPU, the latest weights between train() calls)}."""
        return {pid: t.model for pid, t in self.trainees.items()}

    # SB3's names for two of the mutable hyper-parameters
    clip_range = property(lambda self: self.clip_coef, lambda self, v: setattr(self, "clip_coef", v))
    lr_schedule = property(lambda self: self.learning_rate,
                           lambda self, v: setattr(self, "learning_rate", v))

    def _hparams(self, progress_remaining: float) -> dict:
        """The MUTABLE_HPARAMS values now (schedules evaluated), validated into ``self.config``."""
        values = {n: _schedule_value(n, getattr(self, n), progress_remaining) for n in MUTABLE_HPARAMS}
        if any(getattr(self.config, n) != v for n, v in values.items()):
            self.config = self.config.replace(**values)  # raises ConfigError naming the field
        return values

    def _trainee_hparams(self, trainee: Trainee) -> Callable[[float], dict]:
        """progress_remaining -> a trained policy's MUTABLE_HPARAMS values (its own, else the
        model's attributes), validated."""
        def values(progress_remaining: float) -> dict:
            if not trainee.own:
                return self._hparams(progress_remaining)
            now = {n: _schedule_value(n, v, progress_remaining)
                   for n, v in hparams_of(trainee, vars(self)).items()}
            trainee.config(self.config, now)  # raises ConfigError naming the field
            return now
        return values

    def _trainee_config(self, trainee: Trainee) -> Config:
        return trainee.config(self.config, self._trainee_hparams(trainee)(1.0))

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
        hparams = {pid: self._trainee_hparams(t) for pid, t in self.trainees.items()}
        for values in hparams.values():
            values(1.0)  # bad values raise here, before anything starts
        runner = self._graph()
        self._training = True
        try:
            runner.run([t.job(int(train_for_env_steps), hparams[pid]) for pid, t in self.trainees.items()],
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
        configs = [self._trainee_config(t) for t in self.trainees.values()]
        if self._runner is not None and [structural(c) for c in self._runner.base_cfgs] != [
                structural(c) for c in [self.config, *configs]]:
            self._runner.close()
            self._runner = None
        if self._runner is None:
            if not self._finalizer.alive:  # trained again after the with block
                os.makedirs(self._tmpdir, exist_ok=True)
                self._finalizer = weakref.finalize(self, shutil.rmtree, self._tmpdir, ignore_errors=True)
            self._runner = Runner(self.config, self.env_factory,
                                  [t.trained_policy(cfg) for t, cfg in zip(self.trainees.values(), configs)],
                                  self.device, self.logger, self._num_graphs, self.agents,
                                  {pid: (self.frozen_specs[pid], m) for pid, m in self.frozen.items()})
            self._num_graphs += 1
        return self._runner

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
                returns = [play_parallel_episode(self.agents, env, self._agent_actor(deterministic),
                                                 None if seed is None else seed + ep, ep).get(pid, np.nan)
                           for ep in range(n_episodes)]
                returns = [r for r in returns if r == r] or [np.nan]  # episodes it played
            else:
                returns = [play_episode(self, env, deterministic, None if seed is None else seed + ep)[0]
                           for ep in range(n_episodes)]
        finally:
            env.close()
        return float(np.mean(returns)), float(np.std(returns))

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
        rollout workers at the next ``train()``; the trained policies' samples stay valid."""
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
                "env_factory": self.env_factory, "num_graphs": self._num_graphs,
                "policy_class": self.policy_spec.policy, "policy_kwargs": self.policy_spec.policy_kwargs,
                "policies": _cloudpickled(self.policies), "policy_mapping": _cloudpickled(self.policy_mapping),
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
    def load(cls, path: Union[str, os.PathLike], env: Any = None, device: str = "auto",
             **overrides) -> "APPO":
        """Rebuild a model from :meth:`save`; ``overrides`` replace config fields."""
        try:
            blob = torch.load(path, map_location="cpu", weights_only=False)
        except (AttributeError, ModuleNotFoundError) as e:
            raise RuntimeError(f"could not unpickle the env factory saved in {path} ({e}); it was "
                               "probably defined in a script's __main__: pass env=... to load()") from e
        policies = overrides.pop("policies", None)
        if policies is None:  # as saved, each trained policy's settings as they were then
            policies = _uncloudpickled(blob.get("policies"))
            for pid, entry in (blob.get("trained") or {}).items():
                if entry.get("fields"):  # several trained: their own values (and what they implied)
                    policies[pid] = {**entry["fields"], **(policies[pid] or {})}
        model = cls(env if env is not None else blob["env_factory"],
                    policy=overrides.pop("policy", blob.get("policy_class")),
                    policy_kwargs=overrides.pop("policy_kwargs", blob.get("policy_kwargs")),
                    policies=policies,
                    policy_mapping=overrides.pop("policy_mapping",
                                                 _uncloudpickled(blob.get("policy_mapping"))),
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




def _cloudpickled(value: Any) -> Optional[bytes]:
    return None if value is None else cloudpickle.dumps(value)


def _uncloudpickled(blob: Optional[bytes]) -> Any:
    return None if blob is None else cloudpickle.loads(blob)




def _schedule_value(name: str, value: Any, progress_remaining: float) -> Any:
    """A hyper-parameter's value now: ``value`` itself, or ``value(progress_remaining)``."""
    if not callable(value):
        return value
    try:
        return value(progress_remaining)
    except Exception as e:
        raise ConfigError(f"{name}: the schedule {value!r} failed at progress_remaining="
                          f"{progress_remaining:.3f} ({type(e).__name__}: {e})") from e
