"""Benchmark: GiGPO advantages for 64 tasks x 8 runs x 50 steps (25,600 steps).

Times, in one process on the same synthetic batch:

* ``reference`` - a naive dict-and-loop Python implementation (the baseline, ratio 1.0);
* ``pure`` - :func:`algos.gigpo.gigpo_advantages` (returns, A^E, anchor groups, A^S, A);
* ``memory index`` / ``redis index`` - :class:`orchestrator.anchors.memory.MemoryAnchorIndex`
  and :class:`~orchestrator.anchors.redis_index.RedisAnchorIndex`: insert all steps (returns
  given), then query every step's A^S; reported as insert, query and total;
* ``memory actor`` - the memory index served by its own Ray actor, reached through
  :class:`~orchestrator.anchors.remote.RemoteAnchorIndex` (how an orchestrator actor's workers
  reach it without Redis): the same calls, each one Ray round trip;
* ``redis whole trajectories`` - the path ``dso_gigpo_index`` takes:
  :func:`~orchestrator.anchors.index.trajectory_records` (prepared in numpy) and
  :meth:`~orchestrator.anchors.index.AnchorIndex.insert_trajectories` (one record per
  trajectory and per anchor group), whose reply carries the groups' moments: A^S without a
  second read.

Each entry is the best of ``--repeats`` runs; ratios are ``time / reference time`` (below 1
is faster). Every variant's step advantages are checked against the reference (max |diff|).

    python bench/bench_gigpo.py [--redis-url redis://127.0.0.1:6379/0] [--repeats 3] [--no-ray]
"""

from __future__ import annotations

import argparse
import math
import time
import uuid
from collections import defaultdict

import numpy as np

from algos.gigpo import GiGPOConfig, encode_keys, gigpo_advantages
from orchestrator.anchors.index import AnchorIndexError, AnchorStep, trajectory_records
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.redis_index import RedisAnchorIndex


def make_batch(tasks: int = 64, runs: int = 8, steps: int = 50, states: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    shape = (tasks, runs, steps)
    task_ids = np.broadcast_to(np.arange(tasks)[:, None, None], shape).reshape(-1)
    run_ids = np.broadcast_to(np.arange(runs)[None, :, None], shape).reshape(-1)
    step_ids = np.broadcast_to(np.arange(steps)[None, None, :], shape).reshape(-1)
    rewards = (rng.random(task_ids.size) < 0.05).astype(np.float64)
    hashes = np.array([f"{t}-{h}" for t, h in zip(task_ids, rng.integers(0, states, task_ids.size))])
    perm = rng.permutation(task_ids.size)  # rows arrive in no particular order
    tasks_s = np.array([f"task-{t}" for t in task_ids])
    return tasks_s[perm], run_ids[perm], step_ids[perm], rewards[perm], hashes[perm]


def reference(tasks, runs, steps, rewards, hashes, gamma, eps=1e-6):
    """Naive GiGPO (std normalisation), dicts and Python loops (verl-agent style)."""
    n = len(tasks)
    traj = defaultdict(list)
    for i in range(n):
        traj[(tasks[i], runs[i])].append((steps[i], i))
    ret, total = [0.0] * n, {}
    for key, rows in traj.items():
        run = 0.0
        for _, i in sorted(rows, reverse=True):
            run = rewards[i] + gamma * run
            ret[i] = run
        total[key] = sum(rewards[i] for _, i in rows)

    def norm(x, xs):
        if len(xs) < 2:
            return 0.0
        m = sum(xs) / len(xs)
        return (x - m) / (math.sqrt(sum((v - m) ** 2 for v in xs) / (len(xs) - 1)) + eps)

    by_task, by_anchor = defaultdict(list), defaultdict(list)
    for (t, _), v in total.items():
        by_task[t].append(v)
    for i in range(n):
        by_anchor[(tasks[i], hashes[i])].append(ret[i])
    stats_task = {k: v for k, v in by_task.items()}
    ep = [norm(total[(tasks[i], runs[i])], stats_task[tasks[i]]) for i in range(n)]
    st = [norm(ret[i], by_anchor[(tasks[i], hashes[i])]) for i in range(n)]
    return np.array(ep) + np.array(st), np.array(st), np.array(ret)


def best_of(fn, repeats):
    best, out = math.inf, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_index(index, tasks, runs, steps, hashes, returns, batch_prefix, repeats):
    last = steps == steps.max()
    records = [
        AnchorStep(str(t), int(r), int(s), str(h), float(R), bool(lst))
        for t, r, s, h, R, lst in zip(tasks, runs, steps, hashes, returns, last)
    ]
    t_ins, t_q, out = math.inf, math.inf, None
    for k in range(repeats):
        key = f"{batch_prefix}-{k}"
        t0 = time.perf_counter()
        index.insert(key, records)
        t1 = time.perf_counter()
        out = index.step_advantages(key, tasks, hashes, returns, n_runs=int(runs.max()) + 1)
        t2 = time.perf_counter()
        index.drop(key)
        t_ins, t_q = min(t_ins, t1 - t0), min(t_q, t2 - t1)
    return t_ins, t_q, out


def bench_trajectories(index, tasks, runs, steps, hashes, returns, batch_prefix, repeats):
    """Whole-trajectory insert (records prepared from integer codes) and A^S from its reply."""
    task_names, task_ids = np.unique(tasks, return_inverse=True)
    state_names, state_ids = np.unique(hashes, return_inverse=True)
    n_runs = int(runs.max()) + 1
    t_ins, t_q, out = math.inf, math.inf, None
    for k in range(repeats):
        key = f"{batch_prefix}-traj-{k}"
        t0 = time.perf_counter()
        recs = trajectory_records(task_ids, task_names.tolist(), runs, steps, state_ids, state_names.tolist(), returns)
        receipt = index.insert_trajectories(key, recs)
        t1 = time.perf_counter()
        gid, _ = encode_keys(task_ids, state_ids)
        out = receipt.step_advantages(gid, returns, n_runs=n_runs)
        t2 = time.perf_counter()
        index.drop(key)
        t_ins, t_q = min(t_ins, t1 - t0), min(t_q, t2 - t1)
    return t_ins, t_q, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0", help="'' to skip the Redis index")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=64)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True, help="also time the memory index's Ray actor")
    args = ap.parse_args()

    tasks, runs, steps, rewards, hashes = make_batch(args.tasks, args.runs, args.steps)
    cfg = GiGPOConfig()
    print(f"GiGPO advantages, {args.tasks} tasks x {args.runs} runs x {args.steps} steps = {tasks.size} steps, best of {args.repeats}")

    t_ref, (ref_adv, ref_step, _ref_ret) = best_of(
        lambda: reference(tasks.tolist(), runs.tolist(), steps.tolist(), rewards.tolist(), hashes.tolist(), cfg.gamma),
        max(1, args.repeats // 2),
    )
    rows = [("reference (dict + loops)", t_ref, 0.0)]
    t_pure, out = best_of(lambda: gigpo_advantages(tasks, runs, steps, rewards, hashes, config=cfg), args.repeats * 3)
    rows.append(("pure gigpo_advantages", t_pure, float(np.max(np.abs(out.advantages - ref_adv)))))

    ins, q, adv = bench_index(MemoryAnchorIndex(), tasks, runs, steps, hashes, out.returns, "bench", args.repeats)
    d = float(np.max(np.abs(adv - ref_step)))
    rows += [("memory index: insert", ins, d), ("memory index: query", q, d), ("memory index: total", ins + q, d)]

    if args.ray:
        import ray

        from orchestrator.anchors.remote import serve_memory_index

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="bench-gigpo")
        try:
            remote = serve_memory_index("bench-anchors", "bench-gigpo", ttl_s=3600.0)
            ins, q, adv = bench_index(remote, tasks, runs, steps, hashes, out.returns, "bench", args.repeats)
            d = float(np.max(np.abs(adv - ref_step)))
            rows += [("memory actor: insert", ins, d), ("memory actor: query", q, d), ("memory actor: total", ins + q, d)]
        finally:
            ray.shutdown()

    if args.redis_url:
        idx = RedisAnchorIndex(args.redis_url, prefix=f"bench:{uuid.uuid4().hex[:8]}")
        try:
            ins, q, adv = bench_index(idx, tasks, runs, steps, hashes, out.returns, "bench", args.repeats)
            d = float(np.max(np.abs(adv - ref_step)))
            rows += [("redis index: insert", ins, d), ("redis index: query", q, d), ("redis index: total", ins + q, d)]
            ins, q, adv = bench_trajectories(idx, tasks, runs, steps, hashes, out.returns, "bench", args.repeats)
            d = float(np.max(np.abs(adv - ref_step)))
            rows += [("redis whole trajs: insert", ins, d), ("redis whole trajs: A^S", q, d),
                     ("redis whole trajs: total", ins + q, d)]
        except AnchorIndexError as exc:
            print(f"(redis index skipped: {exc})")
        finally:
            idx.close()

    print(f"{'variant':<28}{'seconds':>10}{'ratio':>9}{'max|diff|':>12}")
    for name, t, diff in rows:
        print(f"{name:<28}{t:>10.4f}{t / t_ref:>9.3f}{diff:>12.1e}")


if __name__ == "__main__":
    main()
