"""Population-based training (Jaderberg et al., 2017) of APPO models, on one machine or on Ray.

    python -m asyncrl.pbt --env CartPole-v1 --members 4 --generations 10 --steps 20000
    python -m asyncrl.pbt ... --backend ray [--address auto]   # members as Ray actors

Every generation each member trains for ``steps`` env steps and is evaluated (mean greedy return,
whole episodes); the bottom ``exploit_fraction`` copy the weights, Adam state and
hyper-parameters of a random top member (exploit), then perturb the hyper-parameters (explore).
Each generation is checkpointed under ``out_dir`` (members' models + ``pbt.json``); at the end a
markdown summary and, with matplotlib, a PNG of returns and hyper-parameters are written.

Local backend: members train one after another, each with its own worker processes (paused while
the others train), so the machine's cores go to one member at a time instead of N x the default
worker count at once. Ray backend: each member is a Ray actor placed wherever the cluster has
``ray_num_cpus`` free; members train at the same time, weights go from actor to actor through
Ray's object store, and this process only ranks and decides.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

from .appo import APPO
from .fileio import atomic_open

# name -> (low, high, log scale): where hyper-parameters are drawn and perturbed within
DEFAULT_SEARCH: Dict[str, Tuple[float, float, bool]] = {
    "learning_rate": (1e-4, 3e-3, True),
    "ent_coef": (1e-4, 0.03, True),
    "clip_coef": (0.05, 0.3, False),
    "gamma": (0.95, 0.995, False),
}


class Member:
    """One population member: an APPO model and its evaluation. Used in this process by the
    local backend and as a Ray actor class by the Ray backend (every method returns plain data)."""

    def __init__(self, member_idx: int, env: Any, hparams: dict, appo_kwargs: dict):
        self.member_idx = member_idx
        self.model = APPO(env, **{**appo_kwargs, **hparams,
                                  "seed": appo_kwargs.get("seed", 0) * 1000 + member_idx})

    def train(self, steps: int) -> dict:
        t0 = time.perf_counter()
        self.model.train(steps)
        return dict(num_timesteps=self.model.num_timesteps, seconds=time.perf_counter() - t0,
                    ep_rew_mean=self.model.logger.ep_rew_mean)

    def evaluate(self, n_episodes: int) -> float:
        return self.model.evaluate(n_episodes, deterministic=True)[0]

    def get_parameters(self) -> dict:
        return self.model.get_parameters()

    def exploit(self, params: dict, hparams: dict) -> None:
        self.model.set_parameters(params)
        self.set_hparams(hparams)

    def set_hparams(self, hparams: dict) -> None:
        for name, value in hparams.items():
            setattr(self.model, name, value)

    def save(self, path: str) -> None:
        self.model.save(path)

    def close(self) -> None:
        """Stops the workers and removes the model's scratch directory (a Ray actor is killed
        after this, so no finalizer would run)."""
        self.model.__exit__(None, None, None)


class LocalBackend:
    """Members in this process, trained one after another."""

    def __init__(self, members_args: List[tuple]):
        self.members = [Member(*args) for args in members_args]

    def map(self, method: str, args: List[tuple]) -> list:
        return [getattr(m, method)(*a) for m, a in zip(self.members, args)]

    def copy(self, src: int, dst: int, hparams: dict) -> None:
        self.members[dst].exploit(self.members[src].get_parameters(), hparams)

    def close(self) -> None:
        for m in self.members:
            m.close()


class RayBackend:
    """Members as Ray actors; calls run on all of them at once."""

    def __init__(self, members_args: List[tuple], address: Optional[str] = None,
                 num_cpus: Optional[float] = None):
        try:
            import ray
        except ImportError as e:
            raise ImportError("the Ray backend needs Ray: pip install 'asyncrl[ray]'") from e
        self.ray, self.members = ray, []
        self.started_ray = not ray.is_initialized()
        if self.started_ray:
            # Ray runs its workers at nice 15 by default; members are the job, not background work
            os.environ.setdefault("RAY_worker_niceness", "0")
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        total = ray.available_resources().get("CPU", 0.0)  # what can be placed now
        n = len(members_args)
        if num_cpus is None:  # every member placed at once, on whatever CPUs the cluster has
            num_cpus = min(1.0, total / n)
        if n * num_cpus > total:
            self.close()
            raise ValueError(
                f"{n} members x ray_num_cpus={num_cpus} = {n * num_cpus} CPUs, but the Ray cluster "
                f"has {total:g} available: the members would wait to be placed. Lower ray_num_cpus "
                f"(fractions are fine, e.g. {total / n:g}) or add nodes")
        actor = ray.remote(num_cpus=num_cpus)(Member)
        self.members = [actor.remote(*args) for args in members_args]

    def map(self, method: str, args: List[tuple]) -> list:
        return self.ray.get([getattr(m, method).remote(*a) for m, a in zip(self.members, args)])

    def copy(self, src: int, dst: int, hparams: dict) -> None:
        # The ObjectRef goes to the destination actor: the weights never pass through here.
        params_ref = self.members[src].get_parameters.remote()
        self.ray.get(self.members[dst].exploit.remote(params_ref, hparams))

    def close(self) -> None:
        try:
            self.ray.get([m.close.remote() for m in self.members], timeout=60)
        finally:
            for m in self.members:
                self.ray.kill(m)
            if self.started_ray:
                self.ray.shutdown()


class PBT:
    """Population-based training of APPO models.

    :param env: a Gymnasium id or a picklable env factory (as for :class:`APPO`).
    :param num_members: population size.
    :param search: ``{name: (low, high, log_scale)}`` of the hyper-parameters to tune (any of
        ``asyncrl.config.MUTABLE_HPARAMS``); initial values are drawn in these bounds.
    :param steps_per_generation: env steps each member trains per generation.
    :param exploit_fraction: the bottom (and top) fraction of the population ranked each time.
    :param perturb_factors: explore multiplies a value by one of these (then clips it to the
        search bounds).
    :param resample_prob: chance that explore draws a value afresh instead.
    :param backend: "local" or "ray"; ``ray_address`` and ``ray_num_cpus`` (CPUs Ray reserves per
        member; default: 1, or the cluster's CPUs / members when fewer) for Ray.
    :param appo_kwargs: Config fields given to every member (e.g. ``num_workers``).
    """

    def __init__(self, env: Any = "CartPole-v1", num_members: int = 4,
                 search: Optional[Dict[str, Tuple[float, float, bool]]] = None,
                 steps_per_generation: int = 20_000, eval_episodes: int = 10,
                 exploit_fraction: float = 0.25, perturb_factors: Tuple[float, ...] = (0.8, 1.25),
                 resample_prob: float = 0.25, out_dir: str = "pbt_run", seed: int = 0,
                 backend: str = "local", ray_address: Optional[str] = None,
                 ray_num_cpus: Optional[float] = None, **appo_kwargs):
        from .config import MUTABLE_HPARAMS, ConfigError
        self.search = dict(DEFAULT_SEARCH if search is None else search)
        errors = [f"search: {n!r} is not tunable; choose among {MUTABLE_HPARAMS}"
                  for n in self.search if n not in MUTABLE_HPARAMS]
        errors += [f"search[{n!r}]={b!r}: expected (low, high, log_scale) with 0 < low < high"
                   for n, b in self.search.items() if not (len(b) == 3 and 0 < b[0] < b[1])]
        if not (isinstance(num_members, int) and num_members >= 2):
            errors.append(f"num_members={num_members!r}: must be an integer >= 2")
        if not 0 < exploit_fraction <= 0.5:
            errors.append(f"exploit_fraction={exploit_fraction!r}: must be in (0, 0.5]")
        if backend not in ("local", "ray"):
            errors.append(f"backend={backend!r}: must be 'local' or 'ray'")
        if errors:
            raise ConfigError("invalid PBT settings:\n  - " + "\n  - ".join(errors))
        self.num_members, self.steps = num_members, steps_per_generation
        self.eval_episodes, self.exploit_fraction = eval_episodes, exploit_fraction
        self.perturb_factors, self.resample_prob = perturb_factors, resample_prob
        self.out_dir, self.rng = out_dir, random.Random(seed)
        appo_kwargs.setdefault("verbose", 0)
        appo_kwargs["seed"] = seed
        with APPO(env, **appo_kwargs):  # a bad config or env: one clear error here, not N later
            pass
        self.hparams = [{n: self._draw(n) for n in self.search} for _ in range(num_members)]
        members_args = [(i, env, self.hparams[i], appo_kwargs) for i in range(num_members)]
        self.backend = (RayBackend(members_args, ray_address, ray_num_cpus) if backend == "ray"
                        else LocalBackend(members_args))
        self.history: List[dict] = []  # one row per member per generation

    def _draw(self, name: str) -> float:
        low, high, log = self.search[name]
        if log:
            return math.exp(self.rng.uniform(math.log(low), math.log(high)))
        return self.rng.uniform(low, high)

    def _explore(self, hparams: dict) -> dict:
        out = {}
        for name, value in hparams.items():
            low, high, log = self.search[name]
            if self.rng.random() < self.resample_prob:
                out[name] = self._draw(name)
                continue
            out[name] = min(high, max(low, value * self.rng.choice(self.perturb_factors)))
        return out

    def run(self, generations: int = 10, target: Optional[float] = None) -> List[dict]:
        """Train ``generations`` generations (fewer if a member's evaluation reaches
        ``target``); returns the history rows. The backend is closed at the end."""
        os.makedirs(self.out_dir, exist_ok=True)
        try:
            for gen in range(generations):
                t0 = time.perf_counter()
                trained = self.backend.map("train", [(self.steps,)] * self.num_members)
                scores = self.backend.map("evaluate", [(self.eval_episodes,)] * self.num_members)
                for i, (t, score) in enumerate(zip(trained, scores)):
                    self.history.append(dict(generation=gen, member=i, score=score,
                                             num_timesteps=t["num_timesteps"],
                                             train_seconds=t["seconds"], **self.hparams[i]))
                copies = self._exploit_and_explore(scores)
                self._checkpoint(gen, copies, time.perf_counter() - t0)
                if target is not None and max(scores) >= target:
                    break
        except BaseException:
            try:  # the original error matters more than one from shutting down
                self.backend.close()
            except Exception as e:
                warnings.warn(f"closing the PBT backend failed too: {e!r}")
            raise
        self.backend.close()
        self.write_summary()
        return self.history

    def _exploit_and_explore(self, scores: List[float]) -> List[Tuple[int, int]]:
        ranked = sorted(range(self.num_members), key=lambda i: scores[i])
        k = max(1, int(self.num_members * self.exploit_fraction))
        copies = []
        for dst in ranked[:k]:
            src = self.rng.choice(ranked[-k:])
            self.hparams[dst] = self._explore(self.hparams[src])
            self.backend.copy(src, dst, self.hparams[dst])
            copies.append((src, dst))
        return copies

    def _checkpoint(self, gen: int, copies: List[Tuple[int, int]], seconds: float) -> None:
        gen_dir = os.path.join(self.out_dir, f"gen_{gen:03d}")
        os.makedirs(gen_dir, exist_ok=True)
        self.backend.map("save", [(os.path.abspath(os.path.join(gen_dir, f"member_{i}.pt")),)
                                  for i in range(self.num_members)])
        state = dict(generation=gen, hparams=self.hparams, history=self.history,
                     copies=copies, generation_seconds=seconds)
        with atomic_open(os.path.join(self.out_dir, "pbt.json")) as f:
            json.dump(state, f, indent=1)

    def summary(self) -> str:
        """A markdown table: per generation, the best and mean score and the best member's
        hyper-parameters."""
        names = list(self.search)
        rows = ["| generation | best score | mean score | best member | " + " | ".join(names) + " |",
                "|---" * (4 + len(names)) + "|"]
        for gen in sorted({r["generation"] for r in self.history}):
            gen_rows = [r for r in self.history if r["generation"] == gen]
            best = max(gen_rows, key=lambda r: r["score"])
            mean = sum(r["score"] for r in gen_rows) / len(gen_rows)
            rows.append(f"| {gen} | {best['score']:.1f} | {mean:.1f} | {best['member']} | "
                        + " | ".join(f"{best[n]:.4g}" for n in names) + " |")
        return "\n".join(rows)

    def write_summary(self) -> None:
        with open(os.path.join(self.out_dir, "summary.md"), "w") as f:
            f.write(self.summary() + "\n")
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        panels = ["score", *self.search]
        fig, axes = plt.subplots(len(panels), 1, figsize=(7, 2.2 * len(panels)), sharex=True)
        for ax, key in zip(axes, panels):
            for i in range(self.num_members):
                rows = [r for r in self.history if r["member"] == i]
                ax.plot([r["generation"] for r in rows], [r[key] for r in rows], marker="o",
                        label=f"member {i}")
            ax.set_ylabel(key)
            if key != "score" and self.search[key][2]:
                ax.set_yscale("log")
        axes[0].legend(fontsize="small", ncol=min(4, self.num_members))
        axes[-1].set_xlabel("generation")
        fig.tight_layout()
        fig.savefig(os.path.join(self.out_dir, "pbt.png"))
        plt.close(fig)


def main(argv: Optional[List[str]] = None) -> None:
    from .flags import add_config_flags
    ap = argparse.ArgumentParser(prog="python -m asyncrl.pbt", allow_abbrev=False, description=__doc__.split("\n")[0])
    pbt_flags = ("env", "members", "generations", "steps", "eval_episodes", "target", "backend",
                 "address", "ray_num_cpus", "out")
    ap.add_argument("--env", default="CartPole-v1")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--generations", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20_000, help="env steps per member per generation")
    ap.add_argument("--eval_episodes", type=int, default=10)
    ap.add_argument("--target", type=float, default=None, help="stop once a member scores this")
    ap.add_argument("--backend", choices=("local", "ray"), default="local")
    ap.add_argument("--address", default=None, help="Ray cluster address (e.g. auto)")
    ap.add_argument("--ray_num_cpus", type=float, default=None,
                    help="CPUs Ray reserves per member (default: 1, or cluster CPUs / members)")
    ap.add_argument("--out", default="pbt_run", help="output directory")
    add_config_flags(ap)  # Config fields given to every member; --seed seeds the whole population
    args = vars(ap.parse_args(argv))
    a = {k: args.pop(k) for k in pbt_flags}
    pbt = PBT(a["env"], a["members"], steps_per_generation=a["steps"],
              eval_episodes=a["eval_episodes"], out_dir=a["out"], seed=args.pop("seed", 0),
              backend=a["backend"], ray_address=a["address"], ray_num_cpus=a["ray_num_cpus"],
              **args)
    t0 = time.perf_counter()
    pbt.run(a["generations"], target=a["target"])
    print(pbt.summary())
    print(f"{time.perf_counter() - t0:.0f} s; wrote {a['out']}/summary.md, pbt.json, gen_*/"
          + (", pbt.png" if os.path.exists(os.path.join(a["out"], "pbt.png")) else ""))


if __name__ == "__main__":
    main()
