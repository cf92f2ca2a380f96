"""DAPO ablation: the full configuration, each of its four techniques switched off alone, and
plain GRPO, at the same rollout budget and over several seeds (DAPO paper, Table 1's logic).

Arms (changes to :class:`~orchestrator.jobs.dapo_train.DapoTrainConfig`):

==========================  ==============================================================
``dapo``                    clip-higher 0.2/0.28, dynamic sampling, token-mean, overlong
``no_clip_higher``          eps_high = eps_low = 0.2
``no_dynamic_sampling``     every rolled-out group trains (zero-variance ones included)
``no_token_loss``           seq-mean-token-mean aggregation
``no_overlong_shaping``     no soft overlong punishment
``grpo``                    all four off
==========================  ==============================================================
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from orchestrator.jobs.dapo_train import DapoTrainConfig, run_dapo_training
from orchestrator.jobs.results import write_json

ABLATION_BUDGET = 4_000
"""Rollouts per arm and seed by default: 6 arms x 3 seeds, sized for about 9 minutes on 2 idle
cores for the whole ablation (measured: bench/README.md, "Sizes and run times")."""

_GRPO_TRAINER = {"eps_high": 0.2, "loss_agg": "seq-mean-token-mean"}
ARMS: dict[str, dict] = {
    "dapo": {},
    "no_clip_higher": {"trainer": {"eps_high": 0.2}},
    "no_dynamic_sampling": {"dynamic_sampling": False},
    "no_token_loss": {"trainer": {"loss_agg": "seq-mean-token-mean"}},
    "no_overlong_shaping": {"overlong": False},
    "grpo": {"trainer": _GRPO_TRAINER, "dynamic_sampling": False, "overlong": False},
}


def arm_config(arm: str, seed: int, out_dir: Path, budget: int | None = None) -> DapoTrainConfig:
    """The configuration of one arm and seed (the demo's defaults plus the arm's changes)."""
    base = DapoTrainConfig().model_dump()
    change = ARMS[arm]
    data = {**base, **{k: v for k, v in change.items() if k != "trainer"}}
    data["trainer"] = {**base["trainer"], **change.get("trainer", {}), "seed": seed}
    data.update(seed=seed, out_dir=out_dir / f"{arm}-s{seed}")
    data["rollout_budget"] = ABLATION_BUDGET if budget is None else budget
    return DapoTrainConfig.model_validate(data)


def run_ablation(out: Path, *, seeds: int = 3, budget: int | None = None, arms: list[str] | None = None,
                 log: Callable[[str], None] | None = None) -> dict:
    """Run every arm x seed; write ``ablation.md``, ``ablation.json`` and ``ablation.png`` in ``out``.

    Returns:
        ``{"rows": [...], "markdown": str}``; each row: arm, per-seed final held-out accuracy,
        mean, std, min, max, rollouts and wall seconds (means over seeds).
    """
    from orchestrator.jobs.plots import plot_ablation

    say = log or (lambda msg: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, curves = [], {}
    for arm in arms or list(ARMS):
        finals, starts, rollouts, walls, arm_curves = [], [], [], [], []
        for seed in range(seeds):
            summary = run_dapo_training(arm_config(arm, seed, out, budget))
            finals.append(summary["end_heldout_acc"])
            starts.append(summary["start_heldout_acc"])
            rollouts.append(summary["rollouts"])
            walls.append(summary["wall_seconds"])
            arm_curves.append([(e["rollouts"], e["heldout_acc"]) for e in summary["evals"]])
            say(f"{arm} seed {seed}: held-out {summary['start_heldout_acc']:.3f} -> {summary['end_heldout_acc']:.3f}, "
                f"{summary['rollouts']} rollouts, {summary['wall_seconds']} s")
        curves[arm] = arm_curves
        rows.append({
            "arm": arm, "finals": finals, "starts": starts,
            "mean": statistics.fmean(finals), "std": statistics.pstdev(finals) if len(finals) > 1 else 0.0,
            "min": min(finals), "max": max(finals),
            "rollouts": statistics.fmean(rollouts), "wall_seconds": statistics.fmean(walls),
        })
    lines = [
        "| arm | start acc | final held-out acc (mean ± std) | min .. max | rollouts | wall s / run |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['arm']} | {statistics.fmean(r['starts']):.3f} | {r['mean']:.3f} ± {r['std']:.3f} | "
                     f"{r['min']:.3f} .. {r['max']:.3f} | {r['rollouts']:.0f} | {r['wall_seconds']:.0f} |")
    markdown = "\n".join(lines) + f"\n\n{seeds} seeds per arm; held-out accuracy is avg@k at temperature 1.\n"
    (out / "ablation.md").write_text(markdown)
    write_json(out / "ablation.json", {"rows": rows, "curves": curves})
    plot_ablation(curves, out / "ablation.png")
    return {"rows": rows, "markdown": markdown}
