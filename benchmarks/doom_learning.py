"""asyncrl and Sample Factory learning VizDoom scenarios with the same frame budget, side by side.

    python benchmarks/doom_learning.py [--scenarios basic,hgs,defend] [--frames basic=1000000,...]
        [--no-sf] [--append] [--seed 0] [--out benchmarks/results/doom_learning]
        [--variant "field=value,..." --tag T]... [--no-defaults] [--stop_at sf|RETURN]
        [--device cpu|cuda]

Scenarios: ``basic`` (VizdoomBasic-v1 / SF's doom_basic: shoot the monster; the scenario's reward,
up to ~95) and ``hgs`` (VizdoomHealthGatheringSupreme-v1 / SF's doom_health_gathering_supreme:
survive on an acid floor by picking up medkits, 2,100 tics at most) and ``defend``
(VizdoomDefendCenter-v1 / SF's doom_defend_the_center: turn and shoot the monsters closing in,
+1 a kill, -1 at death, 26 rounds of ammunition; both engines train on that reward, Sample
Factory with its turn x attack action space, asyncrl with the env's). SF's copy of the hgs
scenario pays 0.01 per tic alive and nothing at death, vizdoom's 1 per tic and -100 at death:
asyncrl's run gets SF's (``living_reward=0.01, death_penalty=0``, DoomGame settings passed
through ``env_kwargs``), so both curves are 0.01 x tics survived (21: the whole episode).
- asyncrl: ``APPO(id)`` with the Doom defaults (Sample Factory's Doom CNN + GRU 512, rollout 32,
  batch 1024, 2 workers x 8 envs), the training return (mean of the last 100 episodes) logged
  against frames (env steps x 4).
- ``--variant`` (repeatable, each with its ``--tag``): one more asyncrl run over the defaults,
  labelled ``asyncrl-TAG``. ``--stop_at``: asyncrl's runs end once the training return reaches
  RETURN, or ``sf``: what Sample Factory's run of the same scenario and seed ended at (it then
  runs first); the wall time to it is the figure compared.
- Sample Factory 2.1.1 (its venv from ../shared/bench/sample_factory/install.sh): its VizDoom
  example, 2 workers x 8 envs on the CPU, the same seed, until the same frames; its
  ``policy_stats/avg_true_objective`` read from its TensorBoard summaries. That is the scenario's
  own reward: SF trains on it x 0.01 for basic (rescaled back here) and with +1 per health
  pick-up for hgs (its shaping; asyncrl trains on the unshaped reward).
- ``--device cuda``: both learn on the GPU (SF's ``--device=gpu``), asyncrl with its defaults for
  a GPU machine (its layout follows the cores, ``config.gpu_layout``) and Sample Factory with
  the same workers x envs.
Writes ``OUT.json``, ``OUT.csv`` and ``OUT.png``, after every run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Optional

from _common import (SF_PYTHON, exit_on_sigterm, merged, parse_variant, plot_curves,
                     sample_factory, write_runs)

from asyncrl import APPO
from asyncrl.config import Config, available_cores, with_defaults

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
FRAME_SKIP = 4
SCENARIOS = {  # name: (asyncrl id, its env_kwargs, SF env, SF's reward scale to undo, frames)
    "basic": ("VizdoomBasic-v1", {}, "doom_basic", 0.01, 1_000_000),
    "hgs": ("VizdoomHealthGatheringSupreme-v1", dict(living_reward=0.01, death_penalty=0.0),
            "doom_health_gathering_supreme", 1.0, 1_000_000),
    "defend": ("VizdoomDefendCenter-v1", {}, "doom_defend_the_center", 1.0, 1_000_000),
}


def layout(device: str) -> tuple:
    """(workers, envs per worker) of asyncrl's Doom defaults on ``device`` (2 x 8 on the CPU)."""
    kw = with_defaults({}, family="doom", cpu_only=device == "cpu")
    return (kw.get("num_workers", Config.num_workers),
            kw.get("num_envs_per_worker", Config.num_envs_per_worker))


def run_asyncrl(scenario: str, frames: int, seed: int, variant: Optional[dict] = None,
                tag: str = "", stop_at: Optional[float] = None, device: str = "cpu") -> dict:
    """The defaults (with ``variant`` over them), until ``frames`` or a training return of
    ``stop_at``."""
    env_id, env_kwargs = SCENARIOS[scenario][:2]
    curve, t0 = [], time.perf_counter()

    def log(m: APPO):
        curve.append((m.num_timesteps * FRAME_SKIP, round(time.perf_counter() - t0, 1),
                      m.logger.ep_rew_mean))
        return False if stop_at is not None and curve[-1][2] >= stop_at else None

    with APPO(env_id, **merged(dict(env_kwargs=env_kwargs, seed=seed, device=device, verbose=0),
                               variant or {})) as model:
        model.train(frames // FRAME_SKIP, callback=log, callback_interval=5.0)
        log(model)
        ran = [model.config.num_workers, model.config.num_envs_per_worker]  # a variant's too
    return {"scenario": scenario, "engine": "asyncrl" + (f"-{tag}" if tag else ""), "seed": seed,
            "variant": variant or {}, "stop_at": stop_at, "device": device,
            "layout": ran, "cores": available_cores(), "frames": curve[-1][0],
            "seconds": curve[-1][1], "curve": curve}


def run_sample_factory(scenario: str, frames: int, seed: int, device: str = "cpu") -> dict:
    _, _, sf_env, scale, _ = SCENARIOS[scenario]
    workers, envs = layout(device)
    ran = sample_factory("sf_examples.vizdoom.train_vizdoom", [
        f"--env={sf_env}", f"--device={'cpu' if device == 'cpu' else 'gpu'}",
        f"--num_workers={workers}", f"--num_envs_per_worker={envs}"], frames, seed)
    curve = [(step, wall, value / scale) for step, wall, value in ran["curve"]]
    return {"scenario": scenario, "engine": "sample_factory", "seed": seed, "device": device,
            "layout": [workers, envs], "cores": available_cores(), "frames": curve[-1][0],
            "seconds": ran["seconds"], "curve": curve}


def write(runs: list, out: str) -> None:
    write_runs(out, {"date": time.strftime("%Y-%m-%d")}, runs, ["scenario", "engine", "seed"],
               ["frames", "seconds", "return"])


def plot(runs: list, path: str) -> None:
    last = runs[-1]  # runs before --device was recorded: 2 x 8 on 2 CPU cores
    workers, envs = last.get("layout", (2, 8))
    gpu = last.get("device", "cpu") != "cpu"
    where = ("a GPU, " if gpu else "") + f"{last.get('cores', 2)} CPU cores"
    took = lambda s: f"{s:.0f} s" if s < 600 else f"{s / 60:.0f} min"  # noqa: E731
    plot_curves(runs, "scenario", lambda s: SCENARIOS[s][0],
                lambda r: ({"asyncrl": "C0", "sample_factory": "C3"}.get(r["engine"], "C1"),
                           f"{r['engine']} ({took(r['seconds'])})"),
                "frames (env steps x 4)", "training return (scenario's reward)",
                f"VizDoom, {workers} workers x {envs} envs, {where} ({time.strftime('%Y-%m-%d')})",
                path, 5.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--frames", default="", help="per scenario, e.g. basic=1000000,hgs=2000000")
    ap.add_argument("--no-sf", dest="sf", action="store_false", help="asyncrl alone")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--append", action="store_true", help="keep the runs already in OUT.json")
    ap.add_argument("--out", default=os.path.join(RESULTS, "doom_learning"))
    ap.add_argument("--variant", action="append", default=[],
                    help='one more asyncrl run: "field=value,..." over the defaults (with --tag)')
    ap.add_argument("--tag", action="append", default=[], help="a --variant's label, in order")
    ap.add_argument("--no-defaults", dest="no_defaults", action="store_true",
                    help="only the --variant runs of asyncrl")
    ap.add_argument("--stop_at", default=None,
                    help="end asyncrl's runs at this training return, or 'sf': Sample Factory's last")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="where both engines learn (cuda: asyncrl's GPU layout for both)")
    args = ap.parse_args()
    exit_on_sigterm()
    if len(args.tag) != len(args.variant):
        ap.error("give each --variant its --tag (the runs' label: asyncrl-TAG)")
    try:
        variants = ([] if args.no_defaults else [({}, "")]) + [
            (parse_variant(v), t) for v, t in zip(args.variant, args.tag)]
    except ValueError as e:
        ap.error(str(e))
    if args.stop_at not in (None, "sf"):
        try:
            args.stop_at = float(args.stop_at)
        except ValueError:
            ap.error(f"--stop_at {args.stop_at!r}: a training return, or 'sf'")
    if args.stop_at == "sf" and not args.sf:
        ap.error("--stop_at sf needs Sample Factory's run (drop --no-sf, or give a return)")
    frames = {k: v[4] for k, v in SCENARIOS.items()}
    for part in filter(None, args.frames.split(",")):
        name, _, value = part.partition("=")
        if name not in SCENARIOS or not value.isdigit():
            ap.error(f"--frames: {part!r} is not SCENARIO=FRAMES with SCENARIO in {list(SCENARIOS)}")
        frames[name] = int(value)
    scenarios = [s for s in args.scenarios.split(",") if s]
    for s in scenarios:
        if s not in SCENARIOS:
            ap.error(f"--scenarios: unknown {s!r}; choose from {list(SCENARIOS)}")
    if args.sf and not os.path.exists(SF_PYTHON):
        ap.error(f"{SF_PYTHON} not found: run ../shared/bench/sample_factory/install.sh, or --no-sf")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    runs = []
    if args.append and os.path.exists(args.out + ".json"):
        with open(args.out + ".json") as f:
            runs = json.load(f)["runs"]
    def record(r: dict) -> float:
        """Keep and print a finished run; its last training return."""
        runs.append(r)
        write(runs, args.out)  # after every run: a long sweep keeps what it measured
        last = [v for _, _, v in r["curve"] if v == v]
        print(f"{r['scenario']} {r['engine']}: {r['frames']:,} frames in {r['seconds']:.0f} s, "
              f"training return {last[-1] if last else float('nan'):.1f}", flush=True)
        return last[-1] if last else float("nan")

    for s in scenarios:
        stop_at = args.stop_at
        if args.sf and stop_at == "sf":  # first: its return is where asyncrl's runs stop
            stop_at = record(run_sample_factory(s, frames[s], args.seed, args.device))
        for variant, tag in variants:
            record(run_asyncrl(s, frames[s], args.seed, variant, tag, stop_at, args.device))
        if args.sf and args.stop_at != "sf":
            record(run_sample_factory(s, frames[s], args.seed, args.device))
    plot(runs, args.out + ".png")
    print(f"wrote {args.out}.json, .csv, .png")


if __name__ == "__main__":
    main()
