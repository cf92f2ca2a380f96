"""The comparison GiGPO's paper makes (arXiv 2505.10978, Sec. 5 and its ablations), one command.

Arms (changes to :class:`~orchestrator.jobs.gigpo_train.GiGPOTrainConfig`), all at the same
trajectory budget and over several seeds:

====================  =====================================================================
``gigpo``             A = A^E + omega * A^S, omega = 1, F_norm = std (the paper's defaults)
``omega0``            omega = 0: the episode advantage only
``multi_step_grpo``   the last step's group-relative reward broadcast to every step
                      (Trinity's ``multi_step_grpo``)
``gigpo_norm_none``   omega = 1, F_norm = 1 (no std normalisation, Eq. 3 and 7)
====================  =====================================================================

On FrozenLake only the last step is rewarded, so ``multi_step_grpo`` and ``omega0`` compute
the same advantages up to the invalid-action penalty, which A^E includes and the last-step
reward does not (:func:`algos.gigpo.multi_step_grpo_advantages`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

from orchestrator.jobs.gigpo_train import GiGPOTrainConfig, run_gigpo_training

COMPARE_BUDGET = 2_560
"""Trajectories per arm and seed by default (40 steps of 64): 4 arms x 3 seeds of about a
minute each on 2 idle cores, 13 minutes in all (measured)."""

ARMS: dict[str, dict] = {
    "gigpo": {},
    "omega0": {"gigpo": {"omega": 0.0}},
    "multi_step_grpo": {"advantage": "multi_step_grpo"},
    "gigpo_norm_none": {"gigpo": {"norm": "none"}},
}


def arm_config(arm: str, seed: int, out_dir: Path, budget: int | None = None) -> GiGPOTrainConfig:
    """The configuration of one arm and seed (the demo's defaults plus the arm's changes)."""
    base = GiGPOTrainConfig().model_dump()
    change = ARMS[arm]
    data = {**base, **{k: v for k, v in change.items() if k not in ("gigpo", "trainer")}}
    data["gigpo"] = {**base["gigpo"], **change.get("gigpo", {})}
    data["trainer"] = {**base["trainer"], "seed": seed}
    data.update(seed=seed, out_dir=out_dir / f"{arm}-s{seed}", rollout_budget=COMPARE_BUDGET if budget is None else budget)
    return GiGPOTrainConfig.model_validate(data)


REACH = 0.5
"""The training-map success whose first crossing (trajectories generated) the table reports."""


def _stats(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "min": min(xs), "max": max(xs)}


def run_comparison(out: Path, *, seeds: int = 3, budget: int | None = None, arms: list[str] | None = None,
                   log: Callable[[str], None] | None = None) -> dict:
    """Run every arm x seed; write ``comparison.md``, ``comparison.json`` and ``comparison.png`` in ``out``.

    Returns:
        ``{"rows": [...], "markdown": str}``; each row: arm, per-seed end success on the training
        and held-out maps, their mean/std/min/max, the mean trajectories generated until the
        training-map success first reached :data:`REACH` (over the seeds that reached it), and
        means over seeds of the anchor-group
        fraction, |A_S|, |A_E| and episode length at the last step, trajectories and wall seconds.
    """
    import ray

    from orchestrator.jobs.plots import plot_ablation

    say = log or (lambda msg: None)
    out.mkdir(parents=True, exist_ok=True)
    rows, curves = [], {}
    for arm in arms or list(ARMS):
        runs = []
        for seed in range(seeds):
            cfg = arm_config(arm, seed, out, budget)
            say(f"{arm} seed {seed}: {cfg.rollout_budget} trajectories")
            s = run_gigpo_training(cfg)
            if ray.is_initialized():
                ray.shutdown()  # a fresh Ray per run: nothing carries over between arms
            last = s["steps"][-1]
            reach = [st["trajectories"] for st in s["steps"] if st["success_rate"] >= REACH]
            runs.append({"to_reach": reach[0] if reach else None, "seed": seed, "train": s["end_train_success"], "heldout": s["end_heldout_success"],
                         "start_train": s["start_train_success"], "anchor_fraction": last["anchor_group_fraction"],
                         "abs_step_adv": last["mean_abs_step_advantage"], "abs_episode_adv": last["mean_abs_episode_advantage"],
                         "episode_length": last["episode_length"], "trajectories": s["trajectories"],
                         "wall_seconds": s["wall_seconds"]})
            curves.setdefault(arm, []).append([(st["trajectories"], st["success_rate"]) for st in s["steps"]])
            say(f"{arm} seed {seed}: training-map success {s['start_train_success']:.3f} -> {s['end_train_success']:.3f}, "
                f"held-out {s['start_heldout_success']:.3f} -> {s['end_heldout_success']:.3f} ({s['wall_seconds']} s)")
        reached = [r["to_reach"] for r in runs if r["to_reach"] is not None]
        rows.append({"arm": arm, "runs": runs, "train": _stats([r["train"] for r in runs]),
                     "to_reach": statistics.fmean(reached) if reached else None, "reached": len(reached),
                     "heldout": _stats([r["heldout"] for r in runs]),
                     **{k: statistics.fmean(r[k] for r in runs) for k in
                        ("start_train", "anchor_fraction", "abs_step_adv", "abs_episode_adv", "episode_length", "trajectories",
                         "wall_seconds")}})
    lines = [
        "| arm | training-map success, end (per seed) | mean ± std | held-out success, end (per seed) | mean ± std "
        f"| trajectories to reach {REACH:.0%} training-map success (seeds reaching it) "
        "| steps in anchor groups > 1 | mean abs A_S | mean abs A_E | episode length | trajectories |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        train = ", ".join(f"{x['train']:.3f}" for x in r["runs"])
        held = ", ".join(f"{x['heldout']:.3f}" for x in r["runs"])
        reach = "-" if r["to_reach"] is None else f"{r['to_reach']:.0f}"
        lines.append(
            f"| {r['arm']} | {train} | {r['train']['mean']:.3f} ± {r['train']['std']:.3f} "
            f"| {held} | {r['heldout']['mean']:.3f} ± {r['heldout']['std']:.3f} "
            f"| {reach} ({r['reached']}/{len(r['runs'])}) "
            f"| {r['anchor_fraction']:.2f} | {r['abs_step_adv']:.3f} | {r['abs_episode_adv']:.3f} | {r['episode_length']:.1f} "
            f"| {r['trajectories']:.0f} |")
    markdown = "\n".join(lines) + "\n"
    (out / "comparison.md").write_text(markdown)
    (out / "comparison.json").write_text(json.dumps(rows, indent=1))
    plot_ablation(curves, out / "comparison.png", xlabel="trajectories generated", ylabel="training-map success (step's rollouts)")
    return {"rows": rows, "markdown": markdown}
