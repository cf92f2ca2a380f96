"""``compare-sampling``: which tasks to roll out, measured in real training (the CPU DAPO loop).

Every arm runs :func:`orchestrator.jobs.dapo_train.run_dapo_training` on the same task set,
warm start, seeds and rollout budget; only the way groups are chosen differs:

=======================  ===================================================================
``epoch``                drop and carry over, epoch order (what Trinity's ``dapo_dynamic_sampling`` does)
``informative``          tasks drawn by their predicted chance of an informative group
``predicted_skip``       epoch order, tasks skipped by their predicted chance (:mod:`orchestrator.core.skip`)
``greso_prior``          ours combined: GRESO's streak skip for tasks rolled out before, the prior's skip for the rest
``screening``            epoch order, each task screened with ``SCREEN_K`` rollouts first (SPEED-RL; ``screen: rollouts``)
``answer_screen``        epoch order, tasks skipped by the policy's own chance of the exact answer (one forward pass each; ``screen: answer``)
``pass_predictor``       epoch order, tasks skipped by a pass-rate model shared by all tasks (:mod:`orchestrator.core.pass_predictor`)
``greso``                epoch order with GRESO's probabilistic skip (arXiv 2506.02177)
``trinity_difficulty``   Trinity 0.6's ``difficulty_based`` selector, accumulate-and-truncate
``dapo_recipe``          the DAPO recipe's accumulate-and-truncate loop
``grpo``                 no filter: every rolled group trains
=======================  ===================================================================

The arms are derived from the mode registries (:mod:`orchestrator.jobs.sampling_arms`): every
registered selection and screen is one, at its defaults.

``informative_screen``, ``skip_screen`` and ``informative_grpo`` (screens and the unfiltered
``informative`` draws combined) were arms of the comparisons up to the eleventh session, the three
slowest to the target of ours in both full runs (docs/results/sampling.md); they left the default set
to keep the comparison under an hour. Their settings are single policy fields, still valid.

The task set (:func:`orchestrator.train.tiny.mixed_tasks`) mixes operations and operand sizes
so that, on the warm-started policy, a quarter or more of the tasks are nearly always solved,
a quarter or more nearly never, the rest between (:func:`measure_spread`); the held-out set has
the same mix. The budget makes at least five passes over the training tasks.

:data:`TARGET_GAIN` is fixed before the runs: the held-out accuracy gain whose first crossing
(rollouts and wall time, evaluations excluded) the table reports.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from algos.dapo import classify_groups
from orchestrator.core.passrate import keep_probability, plugin_informativeness
from orchestrator.core.screens import AnswerScreenOptions
from orchestrator.jobs.dapo_train import DapoTrainConfig, run_dapo_training
from orchestrator.jobs.results import write_json
from orchestrator.jobs.sampling_arms import ARMS, OURS, REFERENCES, SCREEN_K  # noqa: F401  (the comparison's arms, re-exported)

FAMILIES = {"copy3": 1, "max2": 2, "add3": 1}
"""The task mix: a quarter ``copy3`` (copy a 3-digit number: mostly solved after the warm start),
a half ``max2`` (the larger of two 2-digit numbers: spread, and learnable by RL), a quarter
``add3`` (3-digit addition: never solved by this policy)."""
TRAIN_SIZE = 300
"""Training tasks (75 copy3, 150 max2, 75 add3)."""
HELDOUT_SIZE = 300
"""Held-out tasks, the same mix, disjoint from the training ones."""
WARM_POOL = 8000
"""Warm-start tasks, disjoint from both: a large pool, so the warm start teaches the families
and not the answers (a 600-task pool memorised and RL gains did not carry over to held-out)."""
BUDGET = 12_000
"""Rollouts per arm and seed: five passes of 8 rollouts over the 300 training tasks."""
TARGET_GAIN = 0.05
"""The target, fixed before the runs: held-out accuracy 5 points above the warm-started policy's
(the step-0 evaluation, the same for every arm of a seed: same weights). The table reports its
first crossing, measured by :data:`ACCURACY`."""
ACCURACY = "heldout_expected_acc"
"""Which held-out accuracy decides the crossings: the expected accuracy, the mean over held-out
tasks of the chance p that one response is the exact answer (:func:`orchestrator.jobs.dapo_train._evaluate`;
p is the pass rate on these tasks: docs/results/sampling.md). Earlier comparisons read the crossings
from avg@4 (:data:`SAMPLED`), whose sampling error (about one point on 300 tasks, against a
5-point target) moved a crossing by hundreds to thousands of rollouts where the curve is flat. avg@4 is
still measured at the first and the last evaluation (``sampled_start``, ``sampled_final``);
between them only the expected accuracy is (``eval_samples_between=0``: 300 forward passes
instead of 1,200 rollouts an evaluation, which halves the comparison's time)."""
SAMPLED = "heldout_acc"
"""avg@4 held-out accuracy (4 sampled responses per task), at the first and the last evaluation."""
REPORT_GAINS = (0.03, 0.05, 0.07)
"""Every gain whose first crossing is also reported (rollouts and loop seconds, paired with
``epoch`` by seed): :data:`TARGET_GAIN`, one nearer the start and one nearer the end of
``epoch``'s learning (its final gain averages +7.7 points), which falls later in training, where
tasks have histories a skip can use. Unlike :data:`TARGET_GAIN`, +3 and +7 were chosen after
reading the runs of these seeds (docs/results/sampling.md): they describe, they do not test."""
WARM_STEPS = 250
"""Supervised warm-start steps (family-balanced). Measured on seed 0 (``--spread``, 16 rollouts
per task): see ``spread.json`` of a comparison and docs/results/sampling.md."""
LR = 1.5e-4
"""Trainer learning rate of every arm (3e-4, the ``max`` demo's, made the arms that train most
lose accuracy late in the budget)."""
EVAL_AT = [*range(256, 4097, 256), *range(5120, 12_001, 1024)]
"""Held-out evaluations: after the first batch at or past each of these rollout counts, for every
arm (one grid in rollouts, whatever a batch costs an arm): every 256 rollouts up to 4,096, where
every pilot run crossed the target, then every 1,024; and at the end of the budget."""
REGIMES = ("exact", "reasoning")
"""``--regime``: ``exact`` (the response is the answer alone: the constants above) and ``reasoning``
(intermediate results before the answer: :data:`REASONING`)."""

REASONING: dict = {
    "families": FAMILIES, "train_size": 192, "heldout_size": 128, "warm_pool": WARM_POOL, "warm_steps": 450,
    "max_tokens": 16, "lr": 3e-4, "budget": 192 * 8 * 12,
    "eval_at": [*range(768, 4 * 1536 + 1, 768), *range(5 * 1536, 192 * 8 * 12 + 1, 1536)], "eval_samples": 4,
    "late_gain": 0.052,
}
"""The reasoning regime (``--regime reasoning``): the same families and mix as :data:`FAMILIES`,
answered with reasoning first (:func:`orchestrator.train.tiny.sample_reasoning`; the scorer reads
only the number after the last ``#``). 192 training tasks and a budget of 12 passes (192 tasks x 8
rollouts x 12 = 18,432 rollouts); 128 held-out tasks, the same mix. Held-out accuracy is avg@4 (the
reference response's likelihood is not the pass rate here) every half pass (768 rollouts) up to 4
passes, then every pass, and crossings are read from the mean of three consecutive evaluations
(:func:`settled_crossing`). ``max_tokens`` 16: the longest reasoning (``add3``, ``999,999#1998``) is
12 characters and EOS. ``late_gain``: the late target (:data:`LATE_SHARE` of ``epoch``'s mean final
gain on :data:`TUNING_SEEDS`), fixed before the comparison's runs.

Chosen on the tuning seeds (docs/sampling-reasoning.md, "Settings"): with 64 training tasks (the
settings up to session 13) ``epoch`` made 16-37 trainer steps in 12 passes and its held-out accuracy
moved by less than the evaluation's noise on most seeds; with 192 tasks it makes about 50 and
gains +5 to +9 points; 450 warm-start steps (not 800) leave ``max2`` far from its ceiling."""

REASONING_ARMS = ["epoch", "pass_predictor", "greso"]
"""The reasoning regime's default arms (``--regime reasoning``): ``epoch``, the arm built for the
Trinity route (``pass_predictor``) and the published reference (``greso``), so that five seeds fit
the hour ``make compare-sampling`` has; every other arm that runs on the Trinity route
(:func:`runs_on_trinity`: ``greso_prior``, ``predicted_skip``, ``informative``) is one ``--arms`` away.
The answer screen and screening cannot run there."""
TUNING_SEEDS = (100, 101)
"""Seeds the late target was fixed from (``epoch`` only, ``--first-seed 100 --seeds 2 --arms epoch``),
disjoint from the evaluation seeds 0-9: ``epoch``'s final gains there were +8.1 and +4.9 points
(mean of the last three evaluations against the start), so ``late_gain`` = 0.8 x 0.065 = 0.052."""
LATE_SHARE = 0.8
"""The late target: this share of ``epoch``'s mean final gain on :data:`TUNING_SEEDS`."""
WINDOW = 3
"""The reasoning regime's crossings: the first evaluation from which the mean of it and the next
two is at or above the target (:func:`settled_crossing`)."""


def runs_on_trinity(cfg: DapoTrainConfig) -> bool:
    """Whether an arm's configuration runs on the Trinity route (the orchestrator beside Trinity's
    explorer, :mod:`orchestrator.trinity.attach`): not with screening or the answer screen (refused
    there: Trinity's workflow rolls a whole group, and the orchestrator does not hold its engine), not
    the DAPO recipe's own loop; every selection mode and Trinity's ``difficulty_based`` selector do."""
    return cfg.policy.screen == "none" and cfg.reference_loop != "dapo_recipe"


def late_gain(runs: list[dict], share: float = LATE_SHARE, window: int = WINDOW, key: str = SAMPLED) -> float:
    """The late target from ``epoch``'s tuning runs: ``share`` x the mean over runs of the final gain,
    each run's mean ``key`` over its last ``window`` evaluations minus its step-0 value (the mean of
    three, as the crossings read it, so one noisy last evaluation does not set the target).

    Args:
        runs: ``train.json`` summaries (``evals`` with ``key``), at least one.
    Raises:
        ValueError: no run.
    """
    if not runs:
        raise ValueError("late_gain needs at least one tuning run")
    gains = [float(np.mean([e[key] for e in r["evals"][-window:]])) - float(r["evals"][0][key]) for r in runs]
    return share * float(np.mean(gains))


def summary_options(regime: str) -> dict:
    """:func:`run_summary`'s keywords for a regime: the exact-answer regime reads the expected
    accuracy, first crossing; the reasoning regime avg@4, :data:`WINDOW`-evaluation crossings, and
    the late target (:data:`REASONING` ``late_gain``, None until fixed)."""
    if regime == "reasoning":
        return {"accuracy": SAMPLED, "window": WINDOW, "late_gain": REASONING.get("late_gain")}
    return {"accuracy": ACCURACY}




def base_config(out_dir: Path, seed: int = 0, budget: int | None = None, regime: str = "exact") -> DapoTrainConfig:
    """The comparison's defaults: the mixed task set (:data:`FAMILIES`), 8 groups of 8 per batch, evaluations at
    :data:`EVAL_AT` rollouts; with ``regime="reasoning"`` the settings of :data:`REASONING`.

    Raises:
        ValueError: ``regime`` not one of :data:`REGIMES`.
    """
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {REGIMES}, got {regime!r}")
    if regime == "reasoning":
        r = REASONING
        return DapoTrainConfig(seed=seed, out_dir=out_dir, task="mix", regime="reasoning", families=r["families"],
                               train_size=r["train_size"], heldout_size=r["heldout_size"], warm_pool=r["warm_pool"],
                               warm_steps=r["warm_steps"], max_tokens=r["max_tokens"],
                               rollout_budget=r["budget"] if budget is None else budget, eval_at_rollouts=r["eval_at"],
                               eval_samples=r["eval_samples"], eval_samples_between=r["eval_samples"], trainer={"lr": r["lr"]})
    cfg = DapoTrainConfig(seed=seed, out_dir=out_dir, task="mix", families=FAMILIES, train_size=TRAIN_SIZE,
                          heldout_size=HELDOUT_SIZE, warm_pool=WARM_POOL, warm_steps=WARM_STEPS,
                          rollout_budget=BUDGET if budget is None else budget, eval_at_rollouts=EVAL_AT, eval_samples=4,
                          eval_samples_between=0,
                          trainer={"lr": LR})
    return cfg


def arm_config(arm: str, seed: int, out: Path, budget: int | None = None, regime: str = "exact") -> DapoTrainConfig:
    """One arm's configuration: :func:`base_config` plus the arm's changes (policy merged key by key)."""
    base = base_config(out / f"{arm}-s{seed}", seed, budget, regime).model_dump()
    change = ARMS[arm]
    data = {**base, **{k: v for k, v in change.items() if k != "policy"}}
    data["policy"] = {**base["policy"], **change.get("policy", {})}
    return DapoTrainConfig.model_validate(data)


def pass_costs(outcomes: np.ndarray, family: np.ndarray, n: int = 8, k: int = SCREEN_K,
               answer_prob: np.ndarray | None = None, answer: AnswerScreenOptions | None = None) -> dict:
    """Rollouts per informative group that ways of choosing tasks spend on one policy, from 2n
    judged rollouts of every task: the first n are what an earlier pass saw of the task (its
    history), the last n the group a rule rolls (its first k the screen). No model of pass rates
    is assumed; every figure is a count over the tasks.

    A group is informative when it is neither all correct nor all wrong (DAPO, Eq. 11). Rules:

    * ``full``: every task rolled in full, as ``epoch`` does in its first pass: cost n;
    * ``screen``: a screen of k completed when mixed (SPEED-RL, :mod:`orchestrator.rollout.screening`):
      cost k, plus n - k when completed; it yields only completed groups;
    * ``family_skip_screen``: as ``screen``, with the families whose earlier groups were
      informative less than 5 % of the time skipped (what a family prior finds);
    * ``history_skip``: only the tasks whose earlier group was informative rolled in full: what a
      skip that remembers one earlier group per task (a second pass) can do at best;
    * ``answer_screen`` (with ``answer_prob``): each task rolled in full with the answer screen's
      chance ``clip((I / keep_at) ** power, floor, 1)``, ``I = 1 - p**n - (1-p)**n`` of its answer
      probability p (``answer``: the answer screen's options, its defaults when None;
      :meth:`orchestrator.core.rounds.Rounds.answer_screen`): expected
      cost ``sum(keep) n`` over expected informative groups ``sum(keep * informative)``; the
      scoring's forward passes are not counted.

    Args:
        outcomes: (T, 2n) bool, correct or not.
        family: (T,) each task's family.
    Returns:
        rule -> ``{"rollouts_per_informative": total cost / informative groups yielded, "x_full": ratio to full}``.
    """
    outcomes = np.asarray(outcomes, dtype=bool)
    family = np.asarray(family)
    if outcomes.ndim != 2 or outcomes.shape[1] != 2 * n:
        raise ValueError(f"outcomes: expected shape (tasks, {2 * n}), got {outcomes.shape}")

    def mixed(x: np.ndarray) -> np.ndarray:  # DAPO's filter on 0/1 judged values: kept = not all equal
        return np.asarray(classify_groups(x.astype(np.float64))[0], dtype=bool)

    earlier, group = outcomes[:, :n], outcomes[:, n:]
    was, full, screened = mixed(earlier), mixed(group), mixed(group[:, :k])
    share = {f: was[family == f].mean() for f in set(family.tolist())}
    skip = np.array([share[f] < 0.05 for f in family.tolist()])
    screen_cost = k + (n - k) * screened
    rules = {
        "full": (np.full(len(full), n), full),
        "screen": (screen_cost, screened),
        "family_skip_screen": (np.where(skip, 0, screen_cost), screened & ~skip),
        "history_skip": (np.where(was, n, 0), full & was),
    }
    if answer_prob is not None:
        answer = answer or AnswerScreenOptions()
        keep = keep_probability(plugin_informativeness(answer_prob, n), answer.keep_at, answer.floor, answer.keep_power)
        rules["answer_screen"] = (keep * n, keep * full)
    per = {r: float(c.sum() / (y.sum() if y.sum() > 0 else 1)) for r, (c, y) in rules.items()}
    return {r: {"rollouts_per_informative": v, "x_full": v / per["full"]} for r, v in per.items()}


def _correct_responses(group) -> list[tuple[int, ...]]:
    """The response token ids (prompt cut off) of a group's correct rollouts."""
    return [tuple(e.tokens[e.prompt_length:]) for e in group.rollouts if e.metrics.get("accuracy", 0.0) >= 0.5]


def top_response_share(groups: list) -> float | None:
    """How much of a task's pass rate its most frequent correct response holds, averaged over the
    tasks with a correct rollout: for each, the count of its most frequent correct response (same
    token ids) over its correct rollouts. 1.0 where every task has one correct response (the
    exact-answer regime); the reasoning regime needs it well under 1/2 (no single response holds
    most of the pass rate). None when no rollout is correct.

    Args:
        groups: rolled groups (:class:`orchestrator.core.types.Group`), rollouts with ``tokens``,
            ``prompt_length`` and ``metrics["accuracy"]``.
    """
    from collections import Counter

    shares = [Counter(c).most_common(1)[0][1] / len(c) for g in groups for c in [_correct_responses(g)] if c]
    return float(np.mean(shares)) if shares else None


def distinct_correct(groups: list) -> float | None:
    """Mean number of distinct correct responses per task, over the tasks with a correct rollout."""
    counts = [len(set(c)) for g in groups for c in [_correct_responses(g)] if c]
    return float(np.mean(counts)) if counts else None


def measure_spread(cfg: DapoTrainConfig, samples: int = 16, engine=None) -> dict:
    """Pass rate of every training and held-out task on the warm-started policy (``samples``
    rollouts each, temperature of ``cfg``): shares nearly always solved (>= 0.9), nearly never
    (<= 0.1) and between, overall and per family; and for the training tasks, what one pass
    would cost per informative group by each rule of :func:`pass_costs` (with ``samples`` = 2 x
    group size: the first half as the task's history, the second as its group)."""
    import ray

    from orchestrator.jobs.dapo_train import _policy_dir, start_engine, task_sets
    from orchestrator.rollout.engine import VLLMRolloutSource
    from orchestrator.rollout.source import SamplingConfig
    from orchestrator.train.tiny import ensure_policy

    train, held, warm = task_sets(cfg)
    model_dir = ensure_policy(_policy_dir(cfg), warm, seed=cfg.seed, warm_steps=cfg.warm_steps, hidden=cfg.hidden, layers=cfg.layers)
    own = engine is None
    engine = start_engine(model_dir, cfg.seed) if own else engine
    if not own:
        from orchestrator.train.trainer import PolicyTrainer

        ray.get(engine.load_weights.remote(PolicyTrainer(model_dir, cfg.trainer).named_weights()))
    out = {}
    for name, ts in (("train", train), ("heldout", held)):
        source = VLLMRolloutSource(engine, ts, SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed + 7))
        tasks = list(ts)
        groups = source.generate(tasks, samples, round_tag="spread")
        rate = np.array([np.mean([r.metrics["accuracy"] for r in g.rollouts]) for g in groups])
        fam = np.array([t.meta.get("family", t.kind) for t in tasks])
        row = {"tasks": len(tasks), "mean": float(rate.mean()), "solved": float((rate >= 0.9).mean()),
               "unsolved": float((rate <= 0.1).mean()), "between": float(((rate > 0.1) & (rate < 0.9)).mean()),
               "families": {}}
        for f in sorted(set(fam)):
            r = rate[fam == f]
            row["families"][f] = {"mean": float(r.mean()), "solved": float((r >= 0.9).mean()), "unsolved": float((r <= 0.1).mean())}
        answer = source.answer_probability(tasks)
        # how well the answer probability (one forward pass) predicts the pass rate of `samples` rollouts;
        # in the reasoning regime, the reference response's likelihood (reasoning, '#', answer)
        row["answer_prob_corr"] = float(np.corrcoef(answer, rate)[0, 1]) if rate.std() > 0 and answer.std() > 0 else None
        row["answer_prob_mean"] = float(answer.mean())
        row["top_response_share"] = top_response_share(groups)
        row["distinct_correct_responses"] = distinct_correct(groups)
        if name == "train" and samples == 2 * cfg.policy.group_size:
            outcomes = np.array([[r.metrics["accuracy"] >= 0.5 for r in g.rollouts] for g in groups])
            row["pass_costs"] = pass_costs(outcomes, fam, cfg.policy.group_size, answer_prob=answer)
        out[name] = row
    if own:
        ray.kill(engine)
    return out


PASS_WINDOWS = 5
"""Windows of one ``epoch`` pass (``train_size x group_size`` rollouts) in the by-pass table; the
last holds the rest of the budget."""


def pass_windows(steps: list[dict], window: int, count: int = PASS_WINDOWS) -> list[dict[str, int]]:
    """Rollouts spent and informative groups classified in each window of ``window`` rollouts.

    A step's rollouts and groups count in the window where the step started (its rollouts before
    it); the last window takes everything from ``(count - 1) x window`` on.

    Args:
        steps: a run's ``train.json`` steps, each with cumulative ``rollouts``,
            ``groups_classified`` and ``dropped`` (reason -> groups).
        window: rollouts per window, > 0.
        count: windows, >= 1.
    Returns:
        ``count`` dicts ``{"rollouts", "informative"}``.
    """
    out = [{"rollouts": 0, "informative": 0} for _ in range(count)]
    before = 0
    for x in steps:
        w = out[min(before // window, count - 1)]
        w["rollouts"] += int(x["rollouts"]) - before
        w["informative"] += int(x.get("groups_classified", 0)) - int(sum(x.get("dropped", {}).values()))
        before = int(x["rollouts"])
    return out


def _stats(xs: list[float]) -> dict[str, float] | None:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def settled_crossing(evals: list[dict], key: str, target: float, window: int = 1) -> int | None:
    """Index of the first evaluation from which the mean of ``key`` over it and the next
    ``window - 1`` evaluations is at or above ``target`` (window 1: the first evaluation at or
    above it). A crossing one noisy evaluation cannot decide: with ``window = 3`` a lone high
    reading between low ones does not count. None when no full window reaches it.

    Args:
        evals: a run's evaluations in order, each with ``key``.
        window: >= 1.
    Raises:
        ValueError: ``window < 1``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    vals = [float(e[key]) for e in evals]
    return next((i for i in range(len(vals) - window + 1) if sum(vals[i:i + window]) / window >= target - 1e-9), None)


def pass_end_evals(evals: list[dict], pass_rollouts: int, passes: int | None = None) -> list[dict]:
    """The evaluation that ends each pass: for k = 1 .. ``passes`` (default: ceil(last evaluation's
    rollouts / ``pass_rollouts``); a run's budget in passes, so the last batch's overshoot past the
    budget adds none), the first evaluation at or past ``k x pass_rollouts`` rollouts (equal
    rollouts for every arm, whatever its selection's own epochs), else the last one (the end of the
    budget). A batch that spans a pass's end gives two passes the same evaluation. Each as
    ``{"pass": k, "rollouts", "evaluation": index}``."""
    if not evals or evals[-1]["rollouts"] <= 0:
        return []
    out = []
    last = -(-int(evals[-1]["rollouts"]) // pass_rollouts)
    for k in range(1, (last if passes is None else min(passes, last)) + 1):
        i = next((i for i, e in enumerate(evals) if e["rollouts"] >= k * pass_rollouts), len(evals) - 1)
        out.append({"pass": k, "rollouts": evals[i]["rollouts"], "evaluation": i})
    return out


def task_returns(evals: list[dict], task_ids: list[str], pass_rollouts: int, passes: int | None = None) -> dict | None:
    """Which training tasks each pass-sized window of rollouts rolled out, per family (the family is
    the task id up to its first ``-``, e.g. ``max2``), from the orchestrator's group count per task
    at each pass's end (``evals[i]["task_groups"]``): ``rolled_share`` per window (the share of the
    family's tasks rolled out at least once in it), ``left_out`` (task-windows after the first in
    which a task was not rolled out), ``came_back`` (of those, the share rolled out in a later
    window), ``never_after_first`` (share of tasks not rolled out after the first window). None
    without the counts (a reference loop)."""
    ends = pass_end_evals(evals, pass_rollouts, passes)
    counts = [evals[e["evaluation"]].get("task_groups") for e in ends]
    if not counts or any(c is None for c in counts):
        return None
    # a window shares its evaluation with the next where one batch spans both passes' ends: both
    # take the rollouts between the previous distinct evaluation and that one
    prev, last, rolled = np.zeros(len(task_ids), dtype=np.int64), None, []
    for e, c in zip(ends, counts):
        if e["evaluation"] != last:
            c = np.asarray(c, dtype=np.int64)
            seg, prev, last = c - prev > 0, c, e["evaluation"]
        rolled.append(seg)
    rolled = np.array(rolled)  # (windows, T)
    family = np.array([t.split("-", 1)[0] for t in task_ids])
    out = {}
    for f in sorted(set(family.tolist())):
        r = rolled[:, family == f]
        later = r[1:]
        left = [(w, t) for w in range(1, len(r)) for t in range(r.shape[1]) if not r[w, t]]
        back = [r[w + 1:, t].any() for w, t in left if w + 1 < len(r)]
        out[f] = {"rolled_share": [float(x) for x in r.mean(axis=1)], "left_out": len(left),
                  "came_back": float(np.mean(back)) if back else None,
                  "never_after_first": float((~later.any(axis=0)).mean()) if len(later) else None}
    return out


def run_summary(s: dict, gain: float, accuracy: str = ACCURACY, *, late_gain: float | None = None, window: int = 1) -> dict:
    """The figures of one run: first crossing of the start accuracy + ``gain`` (rollouts, and the
    seconds the training loop spent to get there: rollouts, trainer steps and weight syncs, without
    start-up or evaluations), final held-out accuracy, rollouts per emitted group, token shares;
    and where the crossing falls: passes over the training tasks, trainer steps, informative
    groups classified up to it (their rollouts are what a skip knowing every outcome in advance
    would have spent), distinct tasks trained on up to it and in the run.

    ``accuracy``: the evaluations' key that decides crossings, start and final (:data:`ACCURACY`;
    :data:`SAMPLED` reads a run of the earlier comparisons, evaluated by avg@4 throughout);
    start and final by :data:`SAMPLED` (avg@4) are ``sampled_start`` and ``sampled_final``.
    """
    evals = s["evals"]
    loop = [x.get("rollout_seconds", 0.0) + x.get("train_seconds", 0.0) + x.get("sync_seconds", 0.0) + x.get("verify_seconds", 0.0)
            for x in s.get("steps", [])]

    def crossing(g: float) -> dict | None:
        i = settled_crossing(evals, accuracy, evals[0][accuracy] + g, window)
        return None if i is None else evals[i]

    hit = crossing(gain)
    cfg = s.get("config", {})
    n = cfg.get("policy", {}).get("group_size", 8)
    by_gain = {f"{g:.2f}": {"to_target_rollouts": h["rollouts"] if h else None,
                            "to_target_seconds": float(sum(loop[: h["step"]])) if h else None}
               for g in REPORT_GAINS for h in [crossing(g)]}
    late = crossing(late_gain) if late_gain is not None else None
    pass_rollouts = cfg["train_size"] * n if cfg.get("train_size") else None
    passes = -(-int(cfg["rollout_budget"]) // pass_rollouts) if pass_rollouts and cfg.get("rollout_budget") else None
    ends = pass_end_evals(evals, pass_rollouts, passes) if pass_rollouts else []
    extra = {} if late_gain is None else {
        "late_gain": late_gain, "to_late_rollouts": late["rollouts"] if late else None,
        "to_late_seconds": float(sum(loop[: late["step"]])) if late else None,
        "to_late_passes": late["rollouts"] / pass_rollouts if late and pass_rollouts else None}
    if ends:
        # held-out accuracy at the end of each pass (equal rollouts), overall and per family
        extra["heldout_at_pass_end"] = [evals[e["evaluation"]][accuracy] for e in ends]
        fam_key = f"{accuracy}_by_family" if f"{accuracy}_by_family" in evals[0] else None
        if fam_key:
            extra["heldout_by_family_at_pass_end"] = {f: [evals[e["evaluation"]][fam_key][f] for e in ends]
                                                     for f in evals[0][fam_key]}
        if s.get("task_ids"):
            extra["task_returns"] = task_returns(evals, s["task_ids"], pass_rollouts, passes)
    before = s.get("steps", [])[: hit["step"]] if hit else []
    informative = sum(x.get("groups_classified", 0) - sum(x.get("dropped", {}).values()) for x in before)
    return {
        "to_target_rollouts": hit["rollouts"] if hit else None,
        # trainer steps up to the crossing (rollouts to target = steps x rollouts per step)
        "to_target_steps": hit["step"] if hit else None,
        # where the crossing falls: passes over the training tasks (history-based skips need one)
        "to_target_passes": hit["rollouts"] / (cfg["train_size"] * n) if hit and cfg.get("train_size") else None,
        # rollouts up to the crossing in groups that turned out informative: what a skip that knew
        # every outcome in advance would have spent on the same groups (a lower bound)
        "to_target_informative_groups": informative if hit else None,
        "to_target_informative_rollouts": n * informative if hit else None,
        # distinct tasks trained on (an informative group emitted) up to the crossing, and in the run
        # answers the answer screen scored up to the crossing (a forward pass each, no rollout)
        "to_target_answers_scored": before[-1].get("answers_scored", 0) if before else (0 if hit else None),
        "to_target_distinct_tasks": before[-1].get("distinct_tasks_trained") if before else (0 if hit else None),
        "distinct_tasks_trained": s["steps"][-1].get("distinct_tasks_trained") if s.get("steps") else None,
        # the training loop's own time up to the crossing: rollouts (with screens and replenish
        # rounds), trainer steps and weight syncs; start-up and evaluations left out
        "to_target_seconds": float(sum(loop[: hit["step"]])) if hit else None,
        # the same from the run's start (warm-start load, engine load, step-0 evaluation included)
        "to_target_wall_seconds": (hit.get("train_wall_seconds", 0.0) if hit["step"] else 0.0) if hit else None,
        "seed": cfg.get("seed"), "start": evals[0][accuracy], "final": evals[-1][accuracy],
        # start and end by avg@4 (SAMPLED), the estimate with a sampling error
        "sampled_start": evals[0][SAMPLED], "sampled_final": evals[-1][SAMPLED],
        "rollouts": s["rollouts"], "rollouts_per_emitted_group": s["rollouts_per_emitted_group"],
        "trained_token_share": s.get("trained_token_share"), "useful_token_share": s.get("useful_token_share"),
        "wall_seconds": s["wall_seconds"], "eval_seconds": s.get("eval_seconds"),
        "curve": [(e["rollouts"], e[accuracy]) for e in evals],
        # the first crossing of every gain of REPORT_GAINS
        "by_gain": by_gain,
        # rollouts and informative groups in each pass-sized window of the run (where the saving lands)
        "by_pass": pass_windows(s.get("steps", []), pass_rollouts,
                                max(PASS_WINDOWS, -(-int(cfg.get("rollout_budget", 0)) // pass_rollouts)))
        if pass_rollouts else None,
        **extra,
    }


def paired_ratio(runs: list[dict], base: list[dict], key: str = "to_target_rollouts", *, resamples: int = 10_000,
                 seed: int = 0) -> dict | None:
    """An arm's ``key`` over ``base``'s, paired by seed (a run's ``seed``, else its position):
    over the seeds where both have a value,
    the ratio of the means, every seed's own ratio, and a 95 % percentile bootstrap interval of the
    ratio of the means (seeds resampled with replacement, the same seeds for both arms; Efron and
    Tibshirani 1993, ch. 13). With 5 seeds the interval says whether a ratio is told apart from 1
    at all; it is not exact (a percentile bootstrap on few samples runs narrow).

    Returns:
        ``{"ratio", "low", "high", "per_seed": [ratio or None per seed], "n"}``; None with no common seed.
    """
    def by_seed(rs: list[dict]) -> dict:
        return {i if r.get("seed") is None else r["seed"]: r.get(key) for i, r in enumerate(rs)}

    mine, theirs = by_seed(runs), by_seed(base)
    pairs = [(mine.get(sd), theirs.get(sd)) for sd in sorted(set(mine) | set(theirs))]
    both = np.array([(x, y) for x, y in pairs if x is not None and y is not None and y > 0], dtype=float).reshape(-1, 2)
    if len(both) == 0:
        return None
    idx = np.random.default_rng(seed).integers(0, len(both), size=(resamples, len(both)))
    boot = both[idx, 0].mean(axis=1) / both[idx, 1].mean(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    return {"ratio": float(both[:, 0].mean() / both[:, 1].mean()), "low": float(low), "high": float(high), "n": len(both),
            "per_seed": [None if x is None or y is None or y <= 0 else x / y for x, y in pairs]}


def table(results: dict[str, list[dict]], gain: float) -> tuple[list[dict], str]:
    """Per-arm means ± std over seeds, and the markdown table (rollouts to target: over the seeds that
    reached it; "x epoch": :func:`paired_ratio`'s ratio of the means over the seeds where both did)."""
    rows = []
    for arm, runs in results.items():
        rows.append({
            "arm": arm, "seeds": len(runs), "reached": sum(r["to_target_rollouts"] is not None for r in runs),
            **{k: _stats([r.get(k) for r in runs]) for k in ("to_target_rollouts", "to_target_seconds", "to_target_wall_seconds", "final",
                                                         "rollouts_per_emitted_group", "trained_token_share",
                                                         "useful_token_share", "start", "to_target_passes", "to_target_steps",
                                                         "sampled_start", "sampled_final",
                                                         "to_target_informative_groups", "to_target_informative_rollouts",
                                                         "to_target_distinct_tasks",
                                                         "distinct_tasks_trained")},
            "per_seed": [{k: v for k, v in r.items() if k != "curve"} for r in runs],
        })
    if "epoch" in results:
        for r in rows:
            r["paired_x_epoch"] = {k: paired_ratio(results[r["arm"]], results["epoch"], k)
                                   for k in ("to_target_rollouts", "to_target_seconds")}

    def f(st, fmt):
        return "-" if st is None else f"{format(st['mean'], fmt)} ± {format(st['std'], fmt)}"

    base = next((r for r in rows if r["arm"] == "epoch"), None)

    def ratio(r, key):  # paired: over the seeds where both reached the target (an unpaired ratio of
        # means over different seeds mixes seed difficulty into the arms' difference)
        pr = r.get("paired_x_epoch", {}).get(key)
        return "-" if pr is None else f"{pr['ratio']:.2f}x"

    lines = [f"| arm | seeds reaching start + {gain:.2f} | rollouts to target | x epoch (paired) | loop s to target | x epoch (paired) "
             "| final held-out acc | rollouts / emitted group | generated tokens trained on | ... with non-zero advantage |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arm']} | {r['reached']}/{r['seeds']} | {f(r['to_target_rollouts'], '.0f')} | {ratio(r, 'to_target_rollouts')} "
                     f"| {f(r['to_target_seconds'], '.1f')} | {ratio(r, 'to_target_seconds')} "
                     f"| {f(r['final'], '.3f')} | {f(r['rollouts_per_emitted_group'], '.1f')} | {f(r['trained_token_share'], '.2f')} "
                     f"| {f(r['useful_token_share'], '.2f')} |")
    lines += ["", "Where the crossing falls (seeds that reached the target): passes over the training tasks; trainer "
              "steps; informative groups classified up to it, and their rollouts over `epoch`'s rollouts to target (what "
              "a skip knowing every outcome in advance would have spent); distinct tasks trained on up to it, and in the "
              "whole run.", "",
              "| arm | passes to target | trainer steps to target | informative groups to target | their rollouts x epoch "
              "| distinct tasks trained to target | distinct tasks trained in the run |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = r["to_target_informative_rollouts"]
        over = ("-" if base is None or bound is None or base["to_target_rollouts"] is None or base["to_target_rollouts"]["mean"] == 0
                else f"{bound['mean'] / base['to_target_rollouts']['mean']:.2f}x")
        lines.append(f"| {r['arm']} | {f(r['to_target_passes'], '.2f')} | {f(r['to_target_steps'], '.1f')} "
                     f"| {f(r['to_target_informative_groups'], '.0f')} | {over} "
                     f"| {f(r['to_target_distinct_tasks'], '.0f')} | {f(r['distinct_tasks_trained'], '.0f')} |")
    if base is not None:
        def p(x):
            return "-" if x is None else f"{x['ratio']:.2f}x [{x['low']:.2f}, {x['high']:.2f}] ({x['n']})"
        lines += ["", "Paired with `epoch` by seed (the seeds where both reached the target): ratio of the means, 95 % "
                  "bootstrap interval over seeds (`paired_ratio`), seeds; then each seed's own ratio of rollouts.", "",
                  "| arm | rollouts to target x epoch | loop s to target x epoch | per seed (rollouts) "
                  "| start, avg@4 | final, avg@4 |", "|---|---|---|---|---|---|"]
        for r in rows:
            pr = r["paired_x_epoch"]
            seeds = ", ".join("-" if x is None else f"{x:.2f}" for x in pr["to_target_rollouts"]["per_seed"]) if pr["to_target_rollouts"] else "-"
            lines.append(f"| {r['arm']} | {p(pr['to_target_rollouts'])} | {p(pr['to_target_seconds'])} | {seeds} "
                         f"| {f(r['sampled_start'], '.3f')} | {f(r['sampled_final'], '.3f')} |")
        gains = sorted({g for runs in results.values() for r in runs for g in r.get("by_gain", {})})
        if gains:
            lines += ["", "Rollouts to each reported gain, paired with `epoch` by seed as above (seeds reaching it: the "
                      "arm's / `epoch`'s):", "",
                      "| arm | " + " | ".join(f"+{100 * float(g):.0f} points" for g in gains) + " |", "|---|" + "---|" * len(gains)]
            def at(runs: list[dict], g: str) -> list[dict]:  # each run's crossing of gain g, with its seed
                return [{"seed": r.get("seed"), **r.get("by_gain", {}).get(g, {})} for r in runs]

            def reached(xs: list[dict]) -> int:
                return sum(x.get("to_target_rollouts") is not None for x in xs)

            epoch_at = {g: at(results["epoch"], g) for g in gains}
            for arm, runs in results.items():
                cells = [f"{p(paired_ratio(mine, epoch_at[g]))}, {reached(mine)}/{reached(epoch_at[g])}"
                         for g in gains for mine in [at(runs, g)]]
                lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines += by_pass_table(results)
    return rows, "\n".join(lines) + "\n"


def by_pass_table(results: dict[str, list[dict]]) -> list[str]:
    """Markdown lines: rollouts per informative group in each pass-sized window (:func:`pass_windows`),
    per arm, summed over its seeds; and x ``epoch``, over the same seeds."""
    if not any(r.get("by_pass") for runs in results.values() for r in runs):
        return []
    epoch = {r.get("seed"): r["by_pass"] for r in results["epoch"] if r.get("by_pass")}
    count = len(next(iter(epoch.values()))) if epoch else 0

    def cost(windows: list[list[dict]], w: int) -> float | None:
        rollouts, informative = (sum(x[w][k] for x in windows) for k in ("rollouts", "informative"))
        return rollouts / informative if informative else None

    lines = ["", "Rollouts per informative group in each window of one `epoch` pass of rollouts (the training tasks x "
             "the group size; the last window holds the rest of the budget), summed over the seeds; x `epoch` over "
             "the same seeds. Where in the run an arm saves:", "",
             "| arm | " + " | ".join(f"pass {w + 1}" for w in range(count)) + " |", "|---|" + "---|" * count]
    for arm, runs in results.items():
        mine = [r for r in runs if r.get("by_pass") and r.get("seed") in epoch]
        cells = []
        for w in range(count):
            c, e = cost([r["by_pass"] for r in mine], w), cost([epoch[r.get("seed")] for r in mine], w)
            cells.append("-" if c is None else f"{c:.1f}" + ("" if e is None or arm == "epoch" else f" ({c / e:.2f}x)"))
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def pass_costs_table(per_seed: dict[str, dict]) -> str:
    """Markdown: :func:`pass_costs` per rule, mean ± std over seeds (``per_seed``: seed -> rule -> figures)."""
    lines = ["", "What one pass allows, on each seed's warm-started policy (16 rollouts per training task: the first 8 "
             "as an earlier group, the last 8 as the group rolled; `pass_costs`):", "",
             "| rule | rollouts per informative group | x full |", "|---|---|---|"]
    for rule in next(iter(per_seed.values())):
        v = _stats([s[rule]["rollouts_per_informative"] for s in per_seed.values()])
        x = _stats([s[rule]["x_full"] for s in per_seed.values()])
        lines.append(f"| {rule} | {v['mean']:.1f} ± {v['std']:.1f} | {x['mean']:.2f} ± {x['std']:.2f} |")
    return "\n".join(lines) + "\n"


def write_outputs(out: Path, results: dict[str, list[dict]], gain: float, extra: dict) -> str:
    """comparison.json / .md / .png in ``out``; returns the markdown."""
    from orchestrator.jobs.plots import plot_ablation

    rows, md = table(results, gain)
    if extra.get("pass_costs"):
        md += pass_costs_table(extra["pass_costs"])
    per_seed = ["", "Per seed (rollouts to target; loop seconds to target; final held-out accuracy):", ""]
    for r in rows:
        per_seed.append(f"- {r['arm']}: " + ", ".join(
            f"s{i if x.get('seed') is None else x['seed']}: {x['to_target_rollouts'] if x['to_target_rollouts'] is not None else '-'}; "
            f"{format(x['to_target_seconds'], '.1f') if x['to_target_seconds'] is not None else '-'}; {x['final']:.3f}"
            for i, x in enumerate(r["per_seed"])))
    md = md + "\n".join(per_seed) + "\n"
    if extra.get("regime") == "reasoning":
        md += late_tables(results, extra.get("on_trinity", {}))
    for r in rows:  # each arm: does it run on the Trinity route
        r["on_trinity"] = extra.get("on_trinity", {}).get(r["arm"])
    (out / "comparison.md").write_text(md)
    write_json(out / "comparison.json", {"target_gain": gain, **extra, "rows": rows,
                                         "curves": {a: [r["curve"] for r in runs] for a, runs in results.items()}})
    # gain over each run's own step-0 accuracy: the seeds' warm starts differ by up to 11 points,
    # which would hide the arms' differences in the spread
    gains = {a: [[(x, y - r["curve"][0][1]) for x, y in r["curve"]] for r in runs] for a, runs in results.items()}
    plot_ablation(gains, out / "comparison.png", xlabel="rollouts generated",
                  ylabel=("avg@4" if extra.get("regime") == "reasoning" else "expected") + " held-out accuracy - step-0 accuracy")
    return md


def late_tables(results: dict[str, list[dict]], on_trinity: dict[str, bool]) -> str:
    """Markdown of the reasoning regime: rollouts and loop seconds to the late target per seed and
    x ``epoch`` (paired), held-out accuracy at each pass's end (mean ± std over seeds), the same per
    family, and how often the tasks a pass left out came back (:func:`task_returns`)."""
    lines = ["", "Late target (start + `late_gain`, the mean of three consecutive evaluations), per seed: rollouts "
             "(x `epoch` on that seed); loop seconds. Paired ratio over the seeds both reached, 95 % bootstrap interval.", "",
             "| arm | on Trinity route | per seed: rollouts to late target (x epoch); loop s | rollouts x epoch | loop s x epoch |",
             "|---|---|---|---|---|"]
    epoch = {r.get("seed"): r for r in results.get("epoch", [])}

    def p(x):
        return "-" if x is None else f"{x['ratio']:.2f}x [{x['low']:.2f}, {x['high']:.2f}] ({x['n']})"

    for arm, runs in results.items():
        cells = []
        for r in runs:
            e = epoch.get(r.get("seed"), {}).get("to_late_rollouts")
            x = r.get("to_late_rollouts")
            ratio = f" ({x / e:.2f}x)" if x is not None and e else ""
            sec = "-" if r.get("to_late_seconds") is None else f"{r['to_late_seconds']:.0f}"
            cells.append(f"s{r.get('seed')}: {'-' if x is None else x}{ratio}; {sec}")
        ep = results.get("epoch", [])
        lines.append(f"| {arm} | {on_trinity.get(arm, '-')} | " + ", ".join(cells)
                     + f" | {p(paired_ratio(runs, ep, 'to_late_rollouts'))} | {p(paired_ratio(runs, ep, 'to_late_seconds'))} |")
    passes = max((len(r.get("heldout_at_pass_end") or []) for runs in results.values() for r in runs), default=0)
    if passes:
        lines += ["", "Held-out accuracy (avg@4) at the end of each pass (equal rollouts: the training tasks x 8), mean ± std over seeds:", "",
                  "| arm | " + " | ".join(f"pass {k + 1}" for k in range(passes)) + " |", "|---|" + "---|" * passes]

        def col(runs, k, get):
            xs = [get(r)[k] for r in runs if get(r) and len(get(r)) > k]
            st = _stats(xs)
            return "-" if st is None else f"{st['mean']:.3f} ± {st['std']:.3f}"

        for arm, runs in results.items():
            lines.append(f"| {arm} | " + " | ".join(col(runs, k, lambda r: r.get("heldout_at_pass_end")) for k in range(passes)) + " |")
        fams = sorted({f for runs in results.values() for r in runs for f in (r.get("heldout_by_family_at_pass_end") or {})})
        for f in fams:
            lines += ["", f"`{f}` held-out accuracy at each pass's end:", "",
                      "| arm | " + " | ".join(f"pass {k + 1}" for k in range(passes)) + " |", "|---|" + "---|" * passes]
            for arm, runs in results.items():
                lines.append(f"| {arm} | " + " | ".join(
                    col(runs, k, lambda r, f=f: (r.get("heldout_by_family_at_pass_end") or {}).get(f)) for k in range(passes)) + " |")
    lines += ["", "Tasks left out and coming back, per family (summed over seeds): share of the family's tasks rolled out "
              "in each pass-sized window (mean over seeds), task-windows after the first that left a task out, the share of "
              "those rolled out again later, tasks never rolled out after the first window.", "",
              "| arm | family | rolled share per window | left out | came back | never after first |", "|---|---|---|---|---|---|"]
    for arm, runs in results.items():
        tr = [r["task_returns"] for r in runs if r.get("task_returns")]
        for f in sorted({f for t in tr for f in t}):
            xs = [t[f] for t in tr if f in t]
            share = np.mean([x["rolled_share"] for x in xs], axis=0) if len({len(x["rolled_share"]) for x in xs}) == 1 else []
            back = [x["came_back"] for x in xs if x["came_back"] is not None]
            never = [x["never_after_first"] for x in xs if x["never_after_first"] is not None]
            lines.append(f"| {arm} | {f} | {' '.join(f'{v:.2f}' for v in share)} | {sum(x['left_out'] for x in xs)} "
                         f"| {'-' if not back else f'{np.mean(back):.2f}'} | {'-' if not never else f'{np.mean(never):.2f}'} |")
    return "\n".join(lines) + "\n"


def rebuild(out: Path, gain: float = TARGET_GAIN, regime: str | None = None) -> str:
    """Rewrite comparison.json / .md / .png of ``out`` from its runs' ``<arm>-s<seed>/train.json``
    (after a change of the summary figures, or of an interrupted comparison); arms in
    :data:`ARMS` order, seeds in order. Returns the markdown."""
    old = json.loads((out / "comparison.json").read_text()) if (out / "comparison.json").is_file() else {}
    regime = regime or old.get("regime", "exact")
    results: dict[str, list[dict]] = {}
    for arm in ARMS:
        files = sorted(out.glob(f"{arm}-s*/train.json"), key=lambda p: int(p.parent.name.rsplit("-s", 1)[1]))
        if files:
            results[arm] = [run_summary(json.loads(p.read_text()), gain, **summary_options(regime)) for p in files]
    if not results:
        raise FileNotFoundError(f"{out}: no <arm>-s<seed>/train.json of the arms {list(ARMS)}")
    extra = {**{k: v for k, v in old.items() if k not in ("target_gain", "rows", "curves")}, "arms": list(results),
             "regime": regime}
    return write_outputs(out, results, gain, extra)


def run_comparison(out: Path, *, seeds: int = 5, budget: int | None = None, arms: list[str] | None = None,
                   gain: float = TARGET_GAIN, spread: bool = True, first_seed: int = 0,
                   log: Callable[[str], None] | None = None, regime: str = "exact") -> dict:
    """Every arm x seed (seeds ``first_seed`` .. ``first_seed + seeds - 1``; another range than the
    default 0-4 checks a finding on seeds it was not read from), seed-major (all arms of the first
    seed first, so a partial run compares like with like), one vLLM engine for all runs (each run
    loads its own warm start into it); the outputs are rewritten after every run. With ``spread``,
    the task set's difficulty spread on the first seed's warm-started policy is measured first
    (``spread.json``), and every seed's :func:`pass_costs` before its runs (``comparison.json``'s
    ``pass_costs``, a table in ``comparison.md``).

    Returns:
        ``{"rows": [...], "markdown": str}``.
    """
    import ray

    from orchestrator.jobs.dapo_train import _policy_dir, start_engine, task_sets
    from orchestrator.train.tiny import ensure_policy

    say = log or (lambda msg: None)
    out.mkdir(parents=True, exist_ok=True)
    chosen = arms or (REASONING_ARMS if regime == "reasoning" else list(ARMS))
    opts = summary_options(regime)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    first = arm_config(chosen[0], first_seed, out, budget, regime)
    ensure_policy(_policy_dir(first), task_sets(first)[2], seed=first_seed, warm_steps=first.warm_steps, hidden=first.hidden,
                  layers=first.layers)
    engine = start_engine(_policy_dir(first), 0)
    results: dict[str, list[dict]] = {a: [] for a in chosen}
    started = time.monotonic()
    md = ""
    extra: dict = {"regime": regime, "budget": first.rollout_budget, "seeds": seeds, "first_seed": first_seed, "arms": chosen,
                   "on_trinity": {a: runs_on_trinity(arm_config(a, first_seed, out, budget, regime)) for a in chosen},
                   "accuracy": opts["accuracy"], "crossing_window": opts.get("window", 1)}
    if regime == "reasoning":
        extra.update(late_target_gain=opts["late_gain"], late_share=LATE_SHARE, tuning_seeds=list(TUNING_SEEDS))
    try:
        if spread:
            extra["spread"] = measure_spread(base_config(out / "spread", first_seed, budget, regime), engine=engine)
            write_json(out / "spread.json", extra["spread"])
            say(f"spread on the warm-started policy: {json.dumps({k: {x: round(v[x], 3) for x in ('mean', 'solved', 'unsolved', 'between')} for k, v in extra['spread'].items()})}")
        for seed in range(first_seed, first_seed + seeds):
            if spread:
                cfg = base_config(out / "spread", seed, budget, regime)
                costs = extra["spread"]["train"]["pass_costs"] if seed == first_seed else measure_spread(cfg, engine=engine)["train"]["pass_costs"]
                extra.setdefault("pass_costs", {})[str(seed)] = costs
                say(f"seed {seed}, one pass: " + ", ".join(f"{r} {v['rollouts_per_informative']:.1f} ({v['x_full']:.2f}x)" for r, v in costs.items()))
            for arm in chosen:
                cfg = arm_config(arm, seed, out, budget, regime)
                try:
                    s = run_dapo_training(cfg, engine=engine)
                except Exception as exc:  # one failed run is reported, the comparison goes on
                    say(f"{arm} seed {seed}: FAILED: {type(exc).__name__}: {exc}")
                    extra.setdefault("failed", []).append({"arm": arm, "seed": seed, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                r = run_summary(s, gain, **opts)
                results[arm].append(r)
                say(f"{arm} seed {seed}: held-out {r['start']:.3f} -> {r['final']:.3f}, to +{gain:.2f}: "
                    f"{r['to_target_rollouts']} rollouts / {r['to_target_seconds']} s, "
                    f"{r['rollouts_per_emitted_group']:.1f} rollouts per group ({s['wall_seconds']} s; "
                    f"{time.monotonic() - started:.0f} s in all)")
                md = write_outputs(out, {a: v for a, v in results.items() if v}, gain,
                                   {**extra, "elapsed_seconds": time.monotonic() - started})
    finally:
        ray.kill(engine)
    rows, _ = table({a: v for a, v in results.items() if v}, gain)
    return {"rows": rows, "markdown": md}
