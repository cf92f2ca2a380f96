"""``compare-sampling-trinity``: ``epoch`` against a selection usable on the Trinity route, inside Trinity's explorer.

Each arm and seed is one :func:`orchestrator.jobs.trinity_demo.run_trinity_demo` run: Trinity-RFT
0.6.0's own explorer, taskset scheduler (asking our ``dso_orchestrator`` selector), workflow
runners, experience pipeline (our operator) and queue, with our CPU trainer reading the queue,
on the task set, warm start and policy of ``compare-sampling``
(:func:`orchestrator.jobs.sampling_compare.base_config`); only the policy's ``selection`` differs
between arms (:data:`ARMS`). The answer screen and screening are refused on this route
(:meth:`orchestrator.trinity.attach.AttachConfig.resampling_policy`), so every arm here runs
beside Trinity's explorer without the rollout engine.

The held-out set is evaluated on one grid of rollouts for every arm (:func:`eval_grid`: every
:data:`EVAL_EVERY` rollouts and at each pass's end, a pass being ``train_size x group_size``
rollouts, the cost of one ``epoch`` pass). A target counts as reached at the first evaluation
from which the mean of it and the next two stays at or above the target (:func:`crossing`), so
one noisy evaluation cannot decide it. Two targets: :data:`TARGET_GAIN` (+5 points) and
:data:`LATE_GAIN`, both fixed before the runs.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from orchestrator.jobs.results import write_json

ARMS: dict[str, dict] = {
    "epoch": {},
    "pass_predictor": {"selection": "pass_predictor"},
}
"""Arm -> its change of the policy (``epoch`` first: the baseline of every ratio)."""
TRINITY_ROUTE = {"epoch": True, "pass_predictor": True}
"""Whether each arm runs on the Trinity route (all do here: the route refuses the others)."""
TARGET_GAIN = 0.05
"""+5 points of held-out accuracy over the step-0 evaluation (the same weights for every arm of a seed)."""
LATE_GAIN = {"exact": 0.07, "reasoning": None}
"""The late target by regime, fixed before the runs. Exact-answer regime: +7 points, the last gain
``compare-sampling`` reports there (``REPORT_GAINS``). Reasoning regime: ``compare-sampling``'s
``REASONING["late_gain"]`` (80 % of ``epoch``'s mean final gain on its tuning seeds) when fixed,
read at run time; None until then (the curves are kept, so it can be read off afterwards)."""
GAINS = (0.03, 0.05, 0.07, 0.10)
"""Every gain whose crossing is also reported per run (rollouts), to read any target off afterwards."""
ACCURACY = {"exact": "heldout_expected_acc", "reasoning": "heldout_acc"}
"""The held-out accuracy the crossings read, by regime: the expected accuracy where the response is
the answer alone (the exact answer's chance is the pass rate), avg@k where it reasons first."""
WINDOW = {"exact": 1, "reasoning": 3}
"""Evaluations averaged by :func:`crossing`, by regime (``compare-sampling``'s)."""
PASSES = 12
"""Passes over the training tasks in the default budget (the reasoning regime's)."""


def eval_grid(grid: list[int], budget: int, pass_rollouts: int) -> list[int]:
    """Rollout counts to evaluate at: ``compare-sampling``'s grid of the regime and each multiple of
    ``pass_rollouts`` (a pass's end), up to ``budget``; sorted, distinct."""
    return sorted({g for g in grid if g <= budget} | set(range(pass_rollouts, budget + 1, pass_rollouts)))


def crossing(evals: list[dict], gain: float, key: str, window: int) -> dict | None:
    """The crossing of ``start + gain`` (``start``: the step-0 evaluation's ``key``) as
    ``compare-sampling`` reads it (:func:`orchestrator.jobs.sampling_compare.settled_crossing`):
    the first evaluation from which the mean of it and the next ``window - 1`` is at or above.

    Args:
        evals: the run's evaluations in order, the first at step 0; each with ``rollouts``,
            ``train_wall_seconds`` and ``key``.
    Returns:
        ``{"rollouts", "seconds", "eval"}`` of that evaluation (never the step-0 one), or None.
    Raises:
        ValueError: an evaluation without ``key``.
    """
    from orchestrator.jobs.sampling_compare import settled_crossing

    if any(e.get(key) is None for e in evals):
        raise ValueError(f"evals: every evaluation needs {key!r}")
    i = settled_crossing(evals[1:], key, evals[0][key] + gain, window)
    if i is None:
        return None
    e = evals[i + 1]
    return {"rollouts": int(e["rollouts"]), "seconds": float(e["train_wall_seconds"]), "eval": i + 1}


def run_arm(arm: str, seed: int, out: Path, *, budget: int, regime: str = "exact", train_size: int | None = None,
            serve_url: str | None = None, log: Callable[[str], None] | None = None) -> dict:
    """One arm and seed inside Trinity's explorer; returns the run's summary (``trinity_demo.json``)."""
    from orchestrator.jobs.dapo_train import _policy_dir, task_sets
    from orchestrator.jobs.sampling_compare import base_config
    from orchestrator.jobs.trinity_demo import TrinityDemoConfig, run_trinity_demo
    from orchestrator.train.tiny import ensure_policy

    base = base_config(out / f"{arm}-s{seed}", seed, budget, **({"regime": regime} if regime != "exact" else {}))
    if train_size is not None:
        base = base.model_copy(update={"train_size": train_size})
    train, held, warm = task_sets(base)
    model_dir = ensure_policy(_policy_dir(base), warm, seed=seed, warm_steps=base.warm_steps, hidden=base.hidden,
                              layers=base.layers)
    policy = {**base.policy.model_dump(mode="json", include={"filter", "max_replenish_rounds", "max_staleness"}), **ARMS[arm]}
    exact = regime == "exact"  # there the exact answer's chance is the pass rate: expected accuracy, no sampling error
    cfg = TrinityDemoConfig(seed=seed, out_dir=base.out_dir, rollout_budget=budget, heldout_size=len(held),
                            train_size=len(train), max_tokens=base.max_tokens, overlong_cache=base.overlong_cache,
                            answer_format=next(iter(train)).answer_format or "number",
                            policy=policy, trainer=base.trainer, eval_samples=base.eval_samples,
                            eval_at_rollouts=eval_grid(base.eval_at_rollouts or [], budget, len(train) * base.policy.group_size),
                            eval_expected=exact, eval_samples_between=0 if exact else base.eval_samples)
    return run_trinity_demo(cfg, serve_url=serve_url, log=log, tasks=(train, held, model_dir))


def late_gain(regime: str) -> float | None:
    """The regime's late target (:data:`LATE_GAIN`; the reasoning regime's read from ``compare-sampling``)."""
    if regime == "reasoning":
        from orchestrator.jobs.sampling_compare import REASONING

        return REASONING.get("late_gain")
    return LATE_GAIN[regime]


def arm_result(summary: dict, key: str, window: int, late: float | None) -> dict:
    """What the comparison keeps of one run: crossings of both targets (and of :data:`GAINS`),
    accuracies, pass ends, the predictor's quality, the curve."""
    evals = summary["evals"]
    target = crossing(evals, TARGET_GAIN, key, window)
    late_hit = crossing(evals, late, key, window) if late is not None else None
    cfg = summary["config"]
    pass_rollouts = cfg["train_size"] * summary["trinity"]["repeat_times"]
    by_pass: dict[int, float] = {}
    for e in evals[1:]:  # the first evaluation at or past each pass's end (the grid has one there)
        k = e["rollouts"] // pass_rollouts
        if k >= 1 and k not in by_pass:
            by_pass[k] = e[key]
    metrics = summary["stats"].get("selection_metrics", {})
    return {
        "start": evals[0][key], "final": evals[-1][key], "final_rollouts": evals[-1]["rollouts"],
        "target_rollouts": target and target["rollouts"], "target_seconds": target and target["seconds"],
        "late_gain": late, "late_rollouts": late_hit and late_hit["rollouts"], "late_seconds": late_hit and late_hit["seconds"],
        "rollouts_to_gain": {f"{g:+.2f}": (c["rollouts"] if (c := crossing(evals, g, key, window)) else None) for g in GAINS},
        "rollouts_total": summary["rollouts"],
        "acc_at_pass_end": {str(k): v for k, v in sorted(by_pass.items())},
        "wall_seconds": summary["wall_seconds"],
        "prediction_corr": metrics.get("prediction_corr"), "prediction_brier": metrics.get("prediction_brier"),
        "forced_revisits": metrics.get("forced_revisits"), "predictions_scored": metrics.get("predictions_scored"),
        "prompts_from_taskset": summary["actor_checkpoint"].get("task_texts", 0),
        "curve": [[e["rollouts"], e[key]] for e in evals],
    }


def ratios(results: dict[str, dict[int, dict]], field: str) -> dict[str, dict]:
    """Per arm: ``field`` over ``epoch``'s, per seed where both reached it, and their mean."""
    base = results.get("epoch", {})
    out = {}
    for arm, per_seed in results.items():
        r = {s: per_seed[s][field] / base[s][field] for s in per_seed
             if s in base and per_seed[s][field] and base[s][field]}
        out[arm] = {"per_seed": {str(s): v for s, v in r.items()}, "mean": statistics.fmean(r.values()) if r else None}
    return out


def report(results: dict[str, dict[int, dict]], meta: dict) -> tuple[dict, str]:
    """``comparison.json``'s content and ``comparison.md``'s table."""
    data = {
        **meta,
        "targets": {"target_gain": TARGET_GAIN, "late_gain": late_gain(meta["regime"]), "window": WINDOW[meta["regime"]]},
        "arms": {arm: {"trinity_route": TRINITY_ROUTE[arm], "policy": ARMS[arm],
                       "late_rollouts_per_seed": {str(s): r["late_rollouts"] for s, r in per.items()},
                       "target_rollouts_per_seed": {str(s): r["target_rollouts"] for s, r in per.items()},
                       "late_seconds_per_seed": {str(s): r["late_seconds"] for s, r in per.items()},
                       "runs": {str(s): r for s, r in per.items()}}
                 for arm, per in results.items()},
        "late_rollouts_ratio_vs_epoch": ratios(results, "late_rollouts"),
        "target_rollouts_ratio_vs_epoch": ratios(results, "target_rollouts"),
        "late_seconds_ratio_vs_epoch": ratios(results, "late_seconds"),
    }
    seeds = sorted({s for per in results.values() for s in per})
    late = data["targets"]["late_gain"]
    lines = [f"# compare-sampling-trinity ({meta['regime']} regime, Trinity-RFT 0.6.0's explorer)", "",
             f"Targets: +{TARGET_GAIN * 100:.0f} points and late "
             f"{'(not fixed)' if late is None else f'+{late * 100:.1f} points'} of held-out accuracy "
             f"(`{meta['accuracy']}`, mean of {data['targets']['window']} evaluations at or above). Rollouts to each, per seed; "
             "ratio to `epoch` on the same seed.", "",
             "| arm | seed | start | final | rollouts to +target | x epoch | rollouts to late | x epoch | late loop s | corr | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rt, rl = data["target_rollouts_ratio_vs_epoch"], data["late_rollouts_ratio_vs_epoch"]
    fmt = lambda x, f="{:.2f}": "-" if x is None else f.format(x)  # noqa: E731
    for arm, per in results.items():
        for s in seeds:
            if s not in per:
                continue
            r = per[s]
            lines.append(f"| {arm} | {s} | {r['start']:.3f} | {r['final']:.3f} | {fmt(r['target_rollouts'], '{}')} | "
                         f"{fmt(rt[arm]['per_seed'].get(str(s)))} | {fmt(r['late_rollouts'], '{}')} | "
                         f"{fmt(rl[arm]['per_seed'].get(str(s)))} | {fmt(r['late_seconds'], '{:.0f}')} | "
                         f"{fmt(r['prediction_corr'])} | {r['wall_seconds']:.0f} |")
    lines += ["", "Mean ratios to `epoch` (seeds where both reached): " + ", ".join(
        f"{arm}: +target {fmt(rt[arm]['mean'])}, late {fmt(rl[arm]['mean'])}" for arm in results if arm != "epoch")]
    passes = max((int(k) for per in results.values() for r in per.values() for k in r["acc_at_pass_end"]), default=0)
    lines += ["", "Held-out accuracy at each pass's end:", "", "| arm | seed | " + " | ".join(
        f"pass {k}" for k in range(1, passes + 1)) + " |", "|---|---|" + "---|" * passes]
    for arm, per in results.items():
        for s in seeds:
            if s in per:
                accs = per[s]["acc_at_pass_end"]
                lines.append(f"| {arm} | {s} | " + " | ".join(fmt(accs.get(str(k)), "{:.3f}") for k in range(1, passes + 1)) + " |")
    return data, "\n".join(lines) + "\n"


def run_comparison(out: Path, *, seeds: int = 3, first_seed: int = 0, budget: int | None = None, regime: str = "reasoning",
                   train_size: int | None = None, arms: list[str] | None = None, serve_url: str | None = None,
                   log: Callable[[str], None] | None = None) -> dict:
    """Every arm x seed (seed-major: the arms of a seed run back to back), then ``comparison.json``
    and ``comparison.md`` in ``out`` (rewritten after each run, so a stopped comparison keeps what
    it finished). Returns the JSON's content.

    Raises:
        ValueError: an unknown arm.
    """
    import ray

    from orchestrator.jobs.sampling_compare import base_config

    arms = list(arms or ARMS)
    if unknown := [a for a in arms if a not in ARMS]:
        raise ValueError(f"arms: unknown {unknown}; choose from {list(ARMS)}")
    if regime not in ACCURACY:
        raise ValueError(f"regime: unknown {regime!r}; choose from {list(ACCURACY)}")
    base = base_config(Path(out), first_seed, None, **({"regime": regime} if regime != "exact" else {}))
    size = train_size or base.train_size
    budget = budget or PASSES * size * base.policy.group_size
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    say = log or (lambda m: None)
    started = time.monotonic()
    results: dict[str, dict[int, dict]] = {a: {} for a in arms}
    data: dict = {}
    for seed in range(first_seed, first_seed + seeds):
        for arm in arms:
            t0 = time.monotonic()
            say(f"== {arm} seed {seed} (budget {budget} rollouts, {size} training tasks)")
            summary = run_arm(arm, seed, out, budget=budget, regime=regime, train_size=train_size, serve_url=serve_url,
                              log=log)
            results[arm][seed] = arm_result(summary, ACCURACY[regime], WINDOW[regime], late_gain(regime))
            say(f"== {arm} seed {seed}: {time.monotonic() - t0:.0f} s; late target at {results[arm][seed]['late_rollouts']} rollouts")
            meta = {"regime": regime, "accuracy": ACCURACY[regime], "route": "trinity", "budget": budget, "train_size": size,
                    "seeds": list(range(first_seed, seed + 1)), "wall_seconds": round(time.monotonic() - started, 1),
                    "ray_cpus": ray.cluster_resources().get("CPU") if ray.is_initialized() else None}
            data, md = report(results, meta)
            write_json(out / "comparison.json", data)
            (out / "comparison.md").write_text(md)
    return data


def load(out: Path) -> dict:
    """``comparison.json`` of ``out``."""
    return json.loads((Path(out) / "comparison.json").read_text())
