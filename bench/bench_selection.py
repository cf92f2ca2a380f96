"""Benchmark: which tasks to roll out. Rollouts per informative group, and what the model learnt.

Every strategy runs in the same process on the same simulated model (same task mix, same
seed): each task has a pass rate, each rollout is one Bernoulli draw
(:class:`orchestrator.rollout.scripted.BernoulliRolloutSource`). In the *learning* mixes the model
trains on every emitted batch: a task's pass rate rises (in logit) each time one of its
informative groups is trained on, and every task's rises a little per train step. Each
strategy trains for the same number of batches, so the figures are:

* rollouts per emitted informative group (lower is cheaper);
* the mean pass rate over all tasks at the end (a sampler must not win by avoiding the hard
  tasks that the model could learn).

Strategies (n rollouts per group, ``target`` informative groups per train batch):

* ``DAPO recipe`` - verl ``recipe/dapo``: whole generation batches of ``3 * target`` prompts in
  shuffled order until ``target`` informative groups, surplus discarded (``bench_sampling.reference_dapo``).
* ``drop and carry`` - Trinity 0.6's loop: its ``ShuffleSelector`` hands out ``target`` tasks per
  explore step, uninformative groups are dropped, informative ones carried until a batch is full.
* ``cooldown`` - the orchestrator, epoch order, a task sits out one epoch after one all-correct
  or all-wrong group (``skip_after_all_correct = skip_after_all_wrong = 1``).
* ``Trinity difficulty_based`` - Trinity 0.6's ``DifficultyBasedSelector`` (BOTS; its
  ``InterpolationBetaPREstimator``) with the settings of Trinity's selector tutorial
  (m=16, lamb=0.2, rho=0.2, target_reward=0.9, tau=0.5, do_sample=true), fed the per-task pass
  rate of every group (its ``pass_rate_calculator``), with drop and carry. Its two offline
  features are the tasks' pass rates under a weaker and a stronger reference model (initial
  logit -1 / +1), each measured from 16 rollouts.
* ``oracle`` - knows every task's current pass rate: each round takes the tasks of highest
  true informativeness ``1 - p**n - (1-p)**n`` until their sum covers the missing groups.
* ``ours, epoch`` - the orchestrator's default (for reference).
* ``ours, informative`` - ``selection="informative"`` with the policy's defaults
  (``selection_revisit_epochs=8``); and with a tighter revisit bound
  (``selection_revisit_epochs=4``), to show what a tighter bound costs.

Usage: python bench/bench_selection.py [--seeds 3] [--batches 80] [--tasks 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sampling import drive_core, reference_dapo  # noqa: E402

from algos.dapo import classify_groups  # noqa: E402
from orchestrator.core.machine import OrchestratorCore  # noqa: E402
from orchestrator.core.passrate import plugin_informativeness  # noqa: E402
from orchestrator.core.policy import ResamplingPolicy  # noqa: E402
from orchestrator.core.selection import SelectionContext, TaskSelection  # noqa: E402
from orchestrator.rollout.scripted import BernoulliRolloutSource, ScriptedTasks  # noqa: E402


def _logit(p: np.ndarray) -> np.ndarray:
    return np.log(p) - np.log1p(-p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SimulatedModel:
    """Per-task pass rates that rise with training: ``p_t = sigmoid(theta_t)``.

    ``train(task_ids)`` (one train step on one batch): ``theta_t += step`` for each task trained
    on (once per group), ``theta += drift`` for all, model version + 1. ``step = drift = 0``
    gives a static model.
    """

    def __init__(self, task_ids: list[str], p0: np.ndarray, seed: int, step: float = 0.0, drift: float = 0.0):
        self.task_ids = task_ids
        self.index = {t: i for i, t in enumerate(task_ids)}
        self.theta = _logit(np.clip(p0, 1e-3, 1 - 1e-3))
        self.step, self.drift = step, drift
        self.version = 0
        self.source = BernoulliRolloutSource(dict(zip(task_ids, self.rates.tolist(), strict=True)), seed)

    @property
    def rates(self) -> np.ndarray:
        return _sigmoid(self.theta)

    def generate(self, tasks, n: int, **_) -> list:
        return self.source.generate(tasks, n, model_version=self.version)

    def train(self, task_ids: list[str]) -> None:
        np.add.at(self.theta, [self.index[t] for t in task_ids], self.step)
        self.theta += self.drift
        self.version += 1
        self.source.pass_rates = dict(zip(self.task_ids, self.rates.tolist(), strict=True))


MIXES = {
    "thirds, learning": dict(step=0.3, drift=0.01),
    "Beta(0.4, 0.6), static": dict(step=0.0, drift=0.0),
}


def draw_mix(name: str, num_tasks: int, rng: np.random.Generator) -> np.ndarray:
    """Initial pass rates. ``thirds``: a third nearly always solved (p in [0.97, 0.999]), a third
    nearly never (p in [0.001, 0.03]), a third in between (p in [0.1, 0.9]). ``Beta``: a weak
    model on a mixed set, as ``bench_sampling``."""
    if name.startswith("thirds"):
        k = rng.integers(0, 3, num_tasks)
        lo = np.array([0.97, 0.001, 0.1])[k]
        hi = np.array([0.999, 0.03, 0.9])[k]
        return rng.uniform(lo, hi)
    return rng.beta(0.4, 0.6, num_tasks)


def _values(groups) -> np.ndarray:
    return np.array([[r.metrics["accuracy"] for r in g.rollouts] for g in groups])


def drop_and_carry(model, tasks, batches: int, target: int, n: int, seed: int, selector=None) -> int:
    """Trinity's explore loop: ``target`` tasks per explore step from ``selector`` (Trinity's
    ``ShuffleSelector`` by default), informative groups carried until a batch is full; returns
    rollouts spent. The selector gets each task's pass rate back through ``feedback``."""
    from trinity.buffer.selector.selector import ShuffleSelector
    from trinity.common.config import DataSelectorConfig

    if selector is None:
        data = SimpleNamespace(dataset_size=len(tasks.task_ids))
        selector = ShuffleSelector(data, DataSelectorConfig(selector_type="shuffle", seed=seed))
    carry: list[str] = []
    rollouts = emitted = 0
    while emitted < batches:
        if len(carry) >= target:
            model.train(carry[:target])
            carry = carry[target:]
            emitted += 1
            continue
        idx = [int(i) for i in selector.get_indices(target)]
        groups = model.generate([tasks.get(tasks.task_ids[i]) for i in idx], n)
        rollouts += len(groups) * n
        values = _values(groups)
        selector.feedback(idx, values.mean(axis=1).tolist())
        keep, _ = classify_groups(values)
        carry += [g.task_id for g, k in zip(groups, keep, strict=True) if k]
    return rollouts


def trinity_difficulty(model, tasks, batches: int, target: int, n: int, seed: int, p0: np.ndarray) -> int:
    from trinity.buffer.selector.selector import DifficultyBasedSelector
    from trinity.common.config import DataSelectorConfig

    rng = np.random.default_rng([seed, 99])
    theta0 = _logit(np.clip(p0, 1e-3, 1 - 1e-3))
    weak = rng.binomial(16, _sigmoid(theta0 - 1.0)) / 16
    strong = rng.binomial(16, _sigmoid(theta0 + 1.0)) / 16
    data = SimpleNamespace(dataset_size=len(p0), dataset={"weak_pass_rate": weak, "strong_pass_rate": strong})
    config = DataSelectorConfig(
        selector_type="difficulty_based",
        seed=seed,
        feature_keys=["weak_pass_rate", "strong_pass_rate"],
        kwargs={"m": n, "lamb": 0.2, "rho": 0.2, "target_reward": 0.9, "tau": 0.5, "do_sample": True},
    )
    return drop_and_carry(model, tasks, batches, target, n, seed, DifficultyBasedSelector(data, config))


class OracleSelection(TaskSelection):
    """Knows the true pass rates: highest true informativeness first, rounds sized by its sum."""

    name = "oracle"

    def __init__(self, model: SimulatedModel, n: int, seed: int):
        super().__init__(len(model.task_ids), seed)
        self.model, self.n = model, n
        self.rng = np.random.default_rng([seed, 7])

    @property
    def epoch(self) -> int:
        return 0

    def _order(self) -> tuple[np.ndarray, np.ndarray]:
        true = plugin_informativeness(self.model.rates, self.n)
        order = np.lexsort((self.rng.random(len(true)), -true))  # ties broken at random
        return order, true[order]

    def select(self, count: int, ctx: SelectionContext) -> np.ndarray:
        return self._drawn(self._order()[0][:count])

    def fill(self, need: float, limit: int, ctx: SelectionContext) -> np.ndarray:
        order, true = self._order()
        count = int(np.searchsorted(np.cumsum(true), need - 1e-12)) + 1
        return self._drawn(order[: min(count, limit)])

    def _drawn(self, chosen: np.ndarray) -> np.ndarray:
        self.picked_epochs = np.zeros(len(chosen), dtype=np.int64)  # one endless epoch (the base contract)
        return chosen


def run_core(model, tasks, a, oracle: bool = False, **policy) -> int:
    core = OrchestratorCore(
        ResamplingPolicy(target_groups=a.target, group_size=a.n, filter={"judge": "accuracy"}, **policy),
        tasks.task_ids, seed=a.seed,
    )
    if oracle:
        core.selections["informative"] = OracleSelection(model, a.n, seed=a.seed)
        core.set_policy(core.policy.updated({"selection": "informative"}))
    return drive_core(core, model, tasks, a.batches, on_batch=model.train).rollouts_total


STRATEGIES = {
    "DAPO recipe": lambda m, t, a: reference_dapo(m, t, a.batches, a.target, a.n, 3 * a.target, on_batch=m.train, seed=a.seed)["rollouts"],
    "drop and carry": lambda m, t, a: drop_and_carry(m, t, a.batches, a.target, a.n, a.seed),
    "cooldown": lambda m, t, a: run_core(m, t, a, skip_after_all_correct=1, skip_after_all_wrong=1, cooldown_epochs=1),
    "Trinity difficulty_based": lambda m, t, a: trinity_difficulty(m, t, a.batches, a.target, a.n, a.seed, a.p0),
    "oracle": lambda m, t, a: run_core(m, t, a, oracle=True),
    "ours, epoch": lambda m, t, a: run_core(m, t, a),
    "ours, informative": lambda m, t, a: run_core(m, t, a, selection="informative"),
    "ours, informative, revisit 4": lambda m, t, a: run_core(m, t, a, selection="informative", selection_revisit_epochs=4),
}
REFERENCES = ("DAPO recipe", "drop and carry", "cooldown", "Trinity difficulty_based")


def run(args) -> dict:
    """{mix: {strategy: {"per_group": [per seed], "end_pass": [per seed], "seconds": float}}}."""
    out: dict = {}
    for mix in args.mixes:
        out[mix] = {name: {"per_group": [], "end_pass": [], "seconds": 0.0} for name in args.strategies}
        for seed in range(args.seeds):
            p0 = draw_mix(mix, args.tasks, np.random.default_rng([seed, 1]))
            tasks = ScriptedTasks([f"t{i}" for i in range(args.tasks)])
            for name in args.strategies:
                model = SimulatedModel(tasks.task_ids, p0, seed=1000 + seed, **MIXES[mix])
                started = time.perf_counter()
                rollouts = STRATEGIES[name](model, tasks, SimpleNamespace(**vars(args), seed=seed, p0=p0))
                r = out[mix][name]
                r["seconds"] += time.perf_counter() - started
                r["per_group"].append(rollouts / (args.batches * args.target))
                r["end_pass"].append(float(model.rates.mean()))
            print(f"  {mix}, seed {seed} done", file=sys.stderr, flush=True)
    return out


def report(out: dict, args) -> bool:
    ok = True
    for mix, rows in out.items():
        print(f"\n{mix}: {args.tasks} tasks, {args.batches} batches of {args.target} groups x {args.n} rollouts, {args.seeds} seeds")
        oracle = np.mean(rows["oracle"]["per_group"]) if "oracle" in rows else None
        print("| strategy | rollouts per informative group | vs oracle | end mean pass rate |")
        print("|---|---|---|---|")
        for name, r in rows.items():
            per, end = np.array(r["per_group"]), np.array(r["end_pass"])
            ratio = f"{per.mean() / oracle:.2f}x" if oracle else "-"
            print(f"| {name} | {per.mean():.1f} ± {per.std():.1f} | {ratio} | {end.mean():.3f} ± {end.std():.3f} |")
        if "ours, informative" in rows and oracle:
            ours = rows["ours, informative"]
            per = np.mean(ours["per_group"])
            refs = {k: np.mean(rows[k]["per_group"]) for k in REFERENCES if k in rows}
            checks = {
                f"<= 1.25x oracle ({per / oracle:.2f}x)": per <= 1.25 * oracle,
                "cheaper than every reference": all(per < v for v in refs.values()),
            }
            if "cooldown" in rows:
                checks["end pass rate >= cooldown's"] = np.mean(ours["end_pass"]) >= np.mean(rows["cooldown"]["end_pass"])
            for what, good in checks.items():
                print(f"  target {what}: {'holds' if good else 'MISSED'}")
                ok &= bool(good)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=80)
    ap.add_argument("--target", type=int, default=32, help="informative groups per train batch")
    ap.add_argument("--n", type=int, default=16, help="rollouts per group (DAPO: 16)")
    ap.add_argument("--tasks", type=int, default=512)
    ap.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--json", type=Path, help="also write the raw figures here")
    args = ap.parse_args()
    out = run(args)
    ok = report(out, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print("\nall targets hold" if ok else "\nsome targets missed")


if __name__ == "__main__":
    main()
