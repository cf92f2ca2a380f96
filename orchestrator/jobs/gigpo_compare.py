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

Two settings (:data:`SETTINGS`), each with its own budget and seeds:

``frozenlake`` (``make compare-gigpo``)
    the training run's defaults: FrozenLake 4x4, 8 maps x 8 runs, at most 12 turns. Only the
    last step is rewarded, so ``multi_step_grpo`` and ``omega0`` compute the same advantages up
    to the invalid-action penalty, which A^E includes and the last-step reward does not
    (:func:`algos.gigpo.multi_step_grpo_advantages`).
``sokoban`` (``make compare-gigpo-long``)
    textarena's 6x6 one-box Sokoban rooms with a 20-turn budget: long trajectories in which
    states recur (the player walks back and forth around the box) and the outcome hangs on a
    few pushes, some of them irreversible (a box against a wall cannot be pulled back). That is
    where step credit from anchor states has something to assign that the episode advantage
    cannot (docs/guide/gigpo.md gives the measurements behind the choice).

One Ray session and one vLLM engine serve every run of a comparison; each run loads its own
starting weights into the engine and checks them on its first rollouts
(:func:`~orchestrator.jobs.gigpo_train.run_gigpo_training`'s ``engine``). Each run has its own
orchestrator actor and anchor index.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.jobs.gigpo_train import GiGPOTrainConfig, prepare_policy, run_gigpo_training, start_policy_engine
from orchestrator.jobs.results import write_json

ARMS: dict[str, dict] = {
    "gigpo": {},
    "omega0": {"gigpo": {"omega": 0.0}},
    "multi_step_grpo": {"advantage": "multi_step_grpo"},
    "gigpo_norm_none": {"gigpo": {"norm": "none"}},
}

SETTINGS: dict[str, dict[str, Any]] = {
    "frozenlake": {"changes": {}, "budget": 2_560, "seeds": 3},
    "sokoban": {
        "changes": {"env": "sokoban", "train_maps": 4, "heldout_maps": 8, "n": 8, "max_turns": 20, "eval_runs": 4,
                    "eval_every": 1_000, "trainer": {"lr": 1e-3}},
        "budget": 256,
        "seeds": 5,
    },
}
"""Per setting: the changes to the training run's defaults shared by every arm, the trajectories
per arm and seed, and the default number of seeds. ``frozenlake``: 40 steps of 64 trajectories,
4 arms x 3 seeds (run time: bench/README.md, "Sizes and run times"). ``sokoban``:
8 steps of 4 rooms x 8 runs (about 600 step samples each), lr 1e-3 (the FrozenLake run's 5e-4
barely moves the policy in 8 updates; its collapse at 1e-3 came after 65), 4 arms x 5 seeds:
what fits in the 30-minute CPU budget (docs/guide/gigpo.md has the measured time)."""

COMPARE_BUDGET = SETTINGS["frozenlake"]["budget"]
"""Trajectories per arm and seed of the FrozenLake comparison."""

REACH = 0.5
"""The training-map success whose first crossing (trajectories generated) the table reports."""

QUARTERS = 4
"""Success, |A_S| and |A_E| are reported per quarter of the budget (mean of the steps in it)."""


def arm_config(arm: str, seed: int, out_dir: Path, budget: int | None = None, setting: str = "frozenlake") -> GiGPOTrainConfig:
    """The configuration of one arm and seed: the training run's defaults, the setting's changes, the arm's."""
    base = GiGPOTrainConfig().model_dump()
    shared = SETTINGS[setting]["changes"]
    change = ARMS[arm]
    data = {**base, **{k: v for k, v in {**shared, **change}.items() if k not in ("gigpo", "trainer")}}
    data["gigpo"] = {**base["gigpo"], **shared.get("gigpo", {}), **change.get("gigpo", {})}
    data["trainer"] = {**base["trainer"], **shared.get("trainer", {}), "seed": seed}
    data.update(seed=seed, out_dir=out_dir / f"{arm}-s{seed}",
                rollout_budget=SETTINGS[setting]["budget"] if budget is None else budget)
    return GiGPOTrainConfig.model_validate(data)


def _stats(xs: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "min": min(xs), "max": max(xs)}


def _quarters(steps: list[dict], key: str, budget: int) -> list[float]:
    """Mean of ``key`` over the steps whose trajectory count falls in each quarter of ``budget`` (NaN when none)."""
    out = []
    for q in range(QUARTERS):
        lo, hi = budget * q / QUARTERS, budget * (q + 1) / QUARTERS
        vals = [s[key] for s in steps if lo < s["trajectories"] <= hi]
        out.append(float(np.mean(vals)) if vals else float("nan"))
    return out


def run_row(seed: int, s: dict, budget: int) -> dict:
    """The measures of one run (one arm and seed) that the comparison reports."""
    first, last = s["steps"][0], s["steps"][-1]
    reach = [st["trajectories"] for st in s["steps"] if st["success_rate"] >= REACH]
    return {
        "seed": seed, "to_reach": reach[0] if reach else None, "train": s["end_train_success"],
        "heldout": s["end_heldout_success"], "start_train": s["start_train_success"],
        "start_anchor_fraction": first["anchor_group_fraction"], "anchor_fraction": last["anchor_group_fraction"],
        "abs_step_adv": last["mean_abs_step_advantage"], "abs_episode_adv": last["mean_abs_episode_advantage"],
        "episode_length": last["episode_length"], "start_episode_length": first["episode_length"],
        "trajectories": s["trajectories"], "wall_seconds": s["wall_seconds"],
        "step_seconds": sum(st["rollout_seconds"] + st["advantage_seconds"] + st["train_seconds"] + st["sync_seconds"]
                            + st["verify_seconds"] for st in s["steps"]),
        "entropy_start": first["entropy"], "entropy_end": last["entropy"], "kl_ref_end": last["kl_ref"],
        "success_q": _quarters(s["steps"], "success_rate", budget),
        "abs_step_adv_q": _quarters(s["steps"], "mean_abs_step_advantage", budget),
        "abs_episode_adv_q": _quarters(s["steps"], "mean_abs_episode_advantage", budget),
    }


def arm_row(arm: str, runs: list[dict]) -> dict:
    """One arm's row: its runs (:func:`run_row`), end success statistics, means over seeds, total wall seconds."""
    reached = [r["to_reach"] for r in runs if r["to_reach"] is not None]
    return {"arm": arm, "runs": runs, "train": _stats([r["train"] for r in runs]),
            "to_reach": statistics.fmean(reached) if reached else None, "reached": len(reached),
            "heldout": _stats([r["heldout"] for r in runs]), "wall_total": sum(r["wall_seconds"] for r in runs),
            **{k: statistics.fmean(r[k] for r in runs) for k in
               ("start_train", "start_anchor_fraction", "anchor_fraction", "abs_step_adv", "abs_episode_adv",
                "episode_length", "start_episode_length", "entropy_start", "entropy_end", "kl_ref_end",
                "trajectories", "wall_seconds", "step_seconds")}}


def separation(rows: list[dict], reference: str = "gigpo") -> list[dict]:
    """For each arm other than ``reference``: the difference of end training success to it.

    ``diff`` = mean(reference) - mean(arm) over seeds; ``paired`` = mean and std over seeds of
    the per-seed difference (same seed: same rooms, same starting policy, same sampling seeds);
    ``spread`` = the larger of the two arms' seed std; ``separated`` = |diff| > spread, with at
    least two seeds in common.
    """
    by_arm = {r["arm"]: r for r in rows}
    if reference not in by_arm:
        return []
    ref = {x["seed"]: x["train"] for x in by_arm[reference]["runs"]}
    out = []
    for r in rows:
        if r["arm"] == reference:
            continue
        pairs = [ref[x["seed"]] - x["train"] for x in r["runs"] if x["seed"] in ref]
        diff = by_arm[reference]["train"]["mean"] - r["train"]["mean"]
        spread = max(by_arm[reference]["train"]["std"], r["train"]["std"])
        out.append({"arm": r["arm"], "diff": diff, "spread": spread, "separated": len(pairs) > 1 and abs(diff) > spread,
                    "paired_mean": statistics.fmean(pairs) if pairs else float("nan"),
                    "paired_std": statistics.stdev(pairs) if len(pairs) > 1 else 0.0})
    return out


def comparison_markdown(rows: list[dict], setting: str, budget: int) -> str:
    def ms(xs: list[float]) -> str:
        xs = [x for x in xs if x == x]
        return "-" if not xs else f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs) if len(xs) > 1 else 0.0:.3f}"

    lines = [
        f"Setting `{setting}`, {budget} trajectories per run. Training-map success: mean of the last steps' own rollouts; "
        "held-out: unseen maps/rooms at temperature 1.",
        "",
        "| arm | training-map success, end (per seed) | mean ± std | held-out success, end (per seed) | mean ± std "
        f"| trajectories to reach {REACH:.0%} training-map success (seeds reaching it) "
        "| steps in anchor groups > 1, first step / last | mean abs A_S | mean abs A_E | episode length, first / last "
        "| action entropy, first / last step (KL to the start, last) | trajectories | wall time per run, mean (arm total) "
        "| of which training steps (rollout, advantages, update, sync) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        train = ", ".join(f"{x['train']:.3f}" for x in r["runs"])
        held = ", ".join(f"{x['heldout']:.3f}" for x in r["runs"])
        reach = "-" if r["to_reach"] is None else f"{r['to_reach']:.0f}"
        lines.append(
            f"| {r['arm']} | {train} | {r['train']['mean']:.3f} ± {r['train']['std']:.3f} "
            f"| {held} | {r['heldout']['mean']:.3f} ± {r['heldout']['std']:.3f} "
            f"| {reach} ({r['reached']}/{len(r['runs'])}) "
            f"| {r['start_anchor_fraction']:.3f} / {r['anchor_fraction']:.3f} | {r['abs_step_adv']:.3f} | {r['abs_episode_adv']:.3f} "
            f"| {r['start_episode_length']:.1f} / {r['episode_length']:.1f} "
            f"| {r['entropy_start']:.3f} / {r['entropy_end']:.3f} ({r['kl_ref_end']:.4f}) "
            f"| {r['trajectories']:.0f} | {r['wall_seconds']:.0f} s ({r['wall_total']:.0f} s) | {r['step_seconds']:.0f} s |")
    seeds = sorted({x["seed"] for r in rows for x in r["runs"]})
    cell = {(r["arm"], x["seed"]): x for r in rows for x in r["runs"]}
    lines += ["", "Per seed: training-map success, start -> end (steps in anchor groups > 1 on the first step; wall time):", "",
              "| seed | " + " | ".join(r["arm"] for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for sd in seeds:
        cells = [(f"{c['start_train']:.3f} -> {c['train']:.3f} ({c['start_anchor_fraction']:.3f}; {c['wall_seconds']:.0f} s)"
                  if (c := cell.get((r["arm"], sd))) else "-") for r in rows]
        lines.append(f"| {sd} | " + " | ".join(cells) + " |")
    head = " | ".join(f"Q{q + 1}" for q in range(QUARTERS))
    sep = "|---" * (QUARTERS + 1) + "|"
    for key, title in (("success_q", "Training-map success per quarter of the budget (mean ± std over seeds)"),
                       ("abs_step_adv_q", "Mean abs A_S per quarter of the budget (mean ± std over seeds)"),
                       ("abs_episode_adv_q", "Mean abs A_E per quarter of the budget (mean ± std over seeds)")):
        lines += ["", f"{title}:", "", f"| arm | {head} |", sep]
        for r in rows:
            cells = " | ".join(ms([x[key][q] for x in r["runs"]]) for q in range(QUARTERS))
            lines.append(f"| {r['arm']} | {cells} |")
    sepr = separation(rows)
    if sepr:
        lines += ["", "End training-map success, gigpo minus each arm (separated: |difference of means| > the larger seed std):", "",
                  "| arm | difference of means | larger seed std | separated | per-seed difference, mean ± std |", "|---|---|---|---|---|"]
        for s in sepr:
            lines.append(f"| {s['arm']} | {s['diff']:+.3f} | {s['spread']:.3f} | {'yes' if s['separated'] else 'no'} "
                         f"| {s['paired_mean']:+.3f} ± {s['paired_std']:.3f} |")
    return "\n".join(lines) + "\n"


def run_comparison(out: Path, *, seeds: int | None = None, budget: int | None = None, arms: list[str] | None = None,
                   setting: str = "frozenlake", log: Callable[[str], None] | None = None) -> dict:
    """Run every arm x seed of ``setting``; write ``comparison.md``, ``comparison.json`` and ``comparison.png`` in ``out``.

    Args:
        seeds: seeds per arm (0 .. seeds-1); None: the setting's.
        budget: trajectories per run; None: the setting's.
    Returns:
        ``{"rows": [...], "separation": [...], "markdown": str, "wall_seconds"}``; each row: arm, per-run measures
        (end success on the training and held-out maps, anchor-group fraction on the first and
        last step, |A_S|, |A_E|, episode length, per-quarter success / |A_S| / |A_E|, wall seconds),
        their mean/std/min/max or means over seeds, and the arm's total wall seconds;
        ``separation``: :func:`separation`.
    """
    import time

    import ray

    from orchestrator.jobs.plots import plot_gigpo_comparison

    if setting not in SETTINGS:
        raise ValueError(f"setting: unknown {setting!r}; choose from {list(SETTINGS)}")
    say = log or (lambda msg: None)
    seeds = SETTINGS[setting]["seeds"] if seeds is None else seeds
    budget = SETTINGS[setting]["budget"] if budget is None else budget
    arms = arms or list(ARMS)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    curves: dict[str, list[list[dict]]] = {}
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    first = arm_config(arms[0], 0, out, budget, setting)
    say(f"{setting}: {len(arms)} arms x {seeds} seeds, {budget} trajectories each; starting the shared vLLM engine")
    engine = start_policy_engine(prepare_policy(first), 0)
    by_arm: dict[str, list[dict]] = {arm: [] for arm in arms}
    try:
        for seed in range(seeds):  # seed-major: an interrupted comparison still has every arm of its first seeds
            prepare_policy(arm_config(arms[0], seed, out, budget, setting))  # the seed's warm start, outside any arm's time
            for arm in arms:
                cfg = arm_config(arm, seed, out, budget, setting)
                say(f"{arm} seed {seed}: {cfg.rollout_budget} trajectories")
                s = run_gigpo_training(cfg, engine=engine)
                by_arm[arm].append(run_row(seed, s, budget))
                curves.setdefault(arm, []).append(s["steps"])
                say(f"{arm} seed {seed}: training-map success {s['start_train_success']:.3f} -> {s['end_train_success']:.3f}, "
                    f"held-out {s['start_heldout_success']:.3f} -> {s['end_heldout_success']:.3f}, "
                    f"anchor groups > 1 on the first step {by_arm[arm][-1]['start_anchor_fraction']:.3f} ({s['wall_seconds']} s)")
    finally:
        ray.kill(engine)
    rows = [arm_row(arm, runs) for arm, runs in by_arm.items()]
    markdown = comparison_markdown(rows, setting, budget)
    wall = round(time.monotonic() - t0, 1)
    markdown += f"\nWall time of the whole comparison (shared engine start, warm starts, every run): {wall:.0f} s.\n"
    (out / "comparison.md").write_text(markdown)
    sep = separation(rows)
    write_json(out / "comparison.json", {"setting": setting, "budget": budget, "seeds": seeds, "wall_seconds": wall,
                                         "rows": rows, "separation": sep})
    plot_gigpo_comparison(curves, out / "comparison.png", title=f"{setting}: {seeds} seeds per arm")
    return {"rows": rows, "separation": sep, "markdown": markdown, "wall_seconds": wall}
