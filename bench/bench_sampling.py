"""Benchmark: rollouts spent per emitted informative group, by sampling strategy.

A reference run and ours in the same process, on the same simulated model (per-task pass
rates drawn from a Beta distribution, one Bernoulli draw per rollout), reported as ratios:

* reference - the DAPO recipe's loop (verl ``recipe/dapo``): roll out a whole generation batch
  of ``gen_batch_size`` prompts, keep informative groups, repeat until ``train_batch_size``
  groups are kept, then truncate: the surplus is discarded.
* ours, ``fresh_tasks`` - rounds sized by the predicted keep rate, surplus carried over.
* ours, ``fresh_tasks`` + skip rules - tasks that were all correct / all wrong twice in a row
  sit out an epoch.

The figure that matters is rollouts per emitted informative group (lower is cheaper). Usage:
python bench/bench_sampling.py [--batches 200] [--target 32] [--n 16]
"""

from __future__ import annotations

import argparse

import numpy as np

from algos.dapo import classify_groups
from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.stats import Stats
from orchestrator.rollout.scripted import BernoulliRolloutSource, ScriptedTasks


def reference_dapo(source, tasks, batches: int, target: int, n: int, gen_batch: int, on_batch=None, seed: int = 1) -> dict:
    """verl DAPO's accumulate-then-truncate loop; returns rollouts and groups emitted.

    ``on_batch(task_ids)``, when given, is called with the task ids of each emitted batch
    (the first ``target`` informative groups), e.g. to train a simulated model.
    """
    order = np.random.default_rng(seed).permutation(len(tasks.task_ids))
    cursor, rollouts, emitted, discarded = 0, 0, 0, 0
    for _ in range(batches):
        kept: list[str] = []
        while len(kept) < target:
            ids = [tasks.task_ids[order[(cursor + i) % len(order)]] for i in range(gen_batch)]
            cursor += gen_batch
            groups = source.generate([tasks.get(t) for t in ids], n)
            rollouts += gen_batch * n
            values = np.array([[r.metrics["accuracy"] for r in g.rollouts] for g in groups])
            keep, _ = classify_groups(values)
            kept += [g.task_id for g, k in zip(groups, keep, strict=True) if k]
        discarded += len(kept) - target
        emitted += target
        if on_batch is not None:
            on_batch(kept[:target])
    return {"rollouts": rollouts, "emitted": emitted, "discarded_informative": discarded}


def drive_core(core: OrchestratorCore, source, tasks, batches: int, on_batch=None) -> Stats:
    """Run the orchestrator's plan / roll out / submit / emit loop until ``batches`` batches.

    ``on_batch(task_ids)`` is called with each emitted batch's task ids. Returns the core's stats.
    """
    emitted = 0
    while emitted < batches:
        batch = core.try_emit()
        if batch is not None:
            emitted += 1
            if on_batch is not None:
                on_batch([g.task_id for g in batch.groups])
            continue
        plan = core.plan_round()
        groups = source.generate([tasks.get(t) for t in plan.task_ids], core.policy.group_size)
        for g in groups:
            g.purpose = plan.purpose
        core.submit(groups)
    return core.stats()


def ours(source, tasks, batches: int, target: int, n: int, **policy) -> dict:
    core = OrchestratorCore(
        ResamplingPolicy(target_groups=target, group_size=n, filter={"judge": "accuracy"}, **policy), tasks.task_ids
    )
    s = drive_core(core, source, tasks, batches)
    return {"rollouts": s.rollouts_total, "emitted": s.groups_emitted, "discarded_informative": 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--target", type=int, default=32, help="train batch size in groups")
    ap.add_argument("--n", type=int, default=16, help="rollouts per group (DAPO: 16)")
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--gen-batch", type=int, default=96, help="reference generation batch (DAPO recipe: 3x train batch)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    # A weak model on a mixed set: many prompts near 0 or near 1, some in between.
    p = rng.beta(0.4, 0.6, size=args.tasks)
    tasks = ScriptedTasks([f"t{i}" for i in range(args.tasks)])
    rates = dict(zip(tasks.task_ids, p.tolist(), strict=True))

    runs = {
        "reference (DAPO recipe)": reference_dapo(BernoulliRolloutSource(rates, 7), tasks, args.batches, args.target, args.n, args.gen_batch),
        "ours fresh_tasks": ours(BernoulliRolloutSource(rates, 7), tasks, args.batches, args.target, args.n),
        "ours fresh_tasks + skip rules": ours(
            BernoulliRolloutSource(rates, 7), tasks, args.batches, args.target, args.n,
            skip_after_all_correct=2, skip_after_all_wrong=2, cooldown_epochs=1,
        ),
    }
    ref = runs["reference (DAPO recipe)"]["rollouts"] / runs["reference (DAPO recipe)"]["emitted"]
    print(f"{args.batches} batches of {args.target} groups x {args.n} rollouts; {args.tasks} tasks, pass rates ~ Beta(0.4, 0.6)")
    print(f"{'strategy':34} {'rollouts/group':>14} {'ratio':>6} {'surplus discarded':>18}")
    for name, r in runs.items():
        per = r["rollouts"] / r["emitted"]
        print(f"{name:34} {per:14.2f} {per / ref:6.3f} {r['discarded_informative']:18d}")


if __name__ == "__main__":
    main()
