"""Benchmark: orchestrator actor ingest through Ray, checkpointing on.

Callers send calls of ``--call-groups`` groups of ``--n`` rollouts, each one
:class:`~orchestrator.core.types.GroupTable` as the Trinity operator sends them (rewards +-1,
about half the groups informative), and take every released batch; the actor commits every
call to its state file (``checkpoint_path`` set) before it answers, and keeps its Prometheus
metrics (``DSOMetrics``), as the Trinity route deploys it. Two call patterns:
``submit_and_pop`` (the operator's: one call per step), and ``submit_groups`` then
``pop_batch`` until None. Reported: groups per second from one caller and from ``--callers``
concurrent callers (threads of this driver, each its own sequence of calls), against the
same core in this process without Ray or checkpoint (the reference, ratio 1), best of
``--repeats``. Targets: 20k groups/s from one caller, 50k from 16.

Two ceilings are measured too. The actor's own: its class in this process, without Ray, fed
by one coroutine per caller (each call's table unpickled, as Ray hands it over). The
transport's: an echo actor that takes the same calls and answers each with what the
orchestrator answers it (the labels, and as many batches of the same size as the core
released on that call), doing nothing else. No orchestrator through Ray can be faster than
either.

Other processes on the machine inflate the seconds; the ratios are measured side by side.

    python bench/bench_actor.py [--calls 256] [--callers 16] [--call-groups 256] [--n 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np
import ray

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Batch, GroupTable
from orchestrator.service.actor import Orchestrator, get_or_create_orchestrator
from orchestrator.service.metrics import DSOMetrics
from orchestrator.tasks.taskset import IndexTaskSet


def make_calls(calls: int, call_groups: int, n: int, num_tasks: int, seed: int) -> list[GroupTable]:
    """One :class:`GroupTable` per call (the Trinity operator's transport): rewards +-1 with
    p(correct) in {0, 0.5, 1} per group, so about half the groups are informative."""
    rng = np.random.default_rng(seed)
    out = []
    for c in range(calls):
        tasks = rng.integers(0, num_tasks, size=call_groups)
        p = rng.choice([0.0, 0.5, 1.0], size=call_groups)
        rewards = np.where(rng.random((call_groups, n)) < p[:, None], 1.0, -1.0)
        out.append(GroupTable(
            [str(t) for t in tasks.tolist()], [str(c)] * call_groups, [f"{c}:{i}" for i in range(call_groups)],
            np.tile(np.arange(n), (call_groups, 1)), rewards, np.zeros((call_groups, n), dtype=np.int64),
        ))
    return out


def in_process(policy: dict, num_tasks: int, calls: list[GroupTable]) -> tuple[float, list[int], Batch | None]:
    """Seconds for the core alone; also the batches released per call, and the first batch."""
    core = OrchestratorCore(ResamplingPolicy.parse(policy), [str(i) for i in range(num_tasks)])
    released, first = [], None
    t0 = time.perf_counter()
    for table in calls:
        core.submit_table(table)
        k = 0
        while (batch := core.try_emit()) is not None:
            first = first or batch
            k += 1
        released.append(k)
    return time.perf_counter() - t0, released, first


@ray.remote(num_cpus=0)
class Echo:
    """The transport alone: answers each call as the orchestrator does (labels and ``k``
    batches), sealed as the orchestrator seals them, computing nothing."""

    def __init__(self, batch: Batch) -> None:
        batch.seal()
        self.batch = batch

    async def submit_and_pop(self, table: GroupTable, on_invalid: str = "raise", call_id: str | None = None,
                             k: int = 0) -> tuple:
        return np.full(len(table), "informative"), [self.batch] * k


def echo(per_caller: list[list[tuple[GroupTable, int]]], batch: Batch) -> float:
    actor = Echo.remote(batch)
    ray.get(actor.submit_and_pop.remote(per_caller[0][0][0], k=1))

    def caller(calls):
        for table, k in calls:
            ray.get(actor.submit_and_pop.remote(table, on_invalid="drop", call_id=uuid.uuid4().hex, k=k))

    return timed_callers(actor, caller, per_caller)


def timed_callers(actor: ray.actor.ActorHandle, caller: Any, per_caller: list[list]) -> float:
    """Seconds for every caller (one thread each) to run ``caller`` over its calls; then the actor is killed."""
    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(per_caller)) as pool:
            list(pool.map(caller, per_caller))
        return time.perf_counter() - t0
    finally:
        ray.kill(actor)


def warm_up_call(per_caller: list[list[GroupTable]], num_tasks: int) -> GroupTable:
    """The untimed first call: a table shaped like the timed ones, under its own round tag (not a
    retry of a timed call)."""
    warm = make_calls(1, len(per_caller[0][0]), per_caller[0][0].runs.shape[1], num_tasks, seed=1)[0]
    warm.round_tags = ["warm-up"] * len(warm)
    return warm


def through_ray(policy: dict, num_tasks: int, per_caller: list[list[GroupTable]], ckpt_dir: str, pattern: str) -> float:
    name = f"dso-ingest-{uuid.uuid4().hex[:8]}"
    actor = get_or_create_orchestrator(
        policy, IndexTaskSet.of_size(num_tasks), name=name, namespace="trinity-dso",
        checkpoint_path=os.path.join(ckpt_dir, f"{name}.db"), metrics=DSOMetrics(),
    )
    # one call before the clock starts, as for the echo actor: the first commit writes every
    # per-task column whole (seconds with 1,000,000 tasks), later ones only the rows that changed
    ray.get(actor.submit_and_pop.remote(warm_up_call(per_caller, num_tasks), on_invalid="drop"))

    def caller(calls):
        for groups in calls:
            if pattern == "submit_and_pop":  # with a call id, as the operator calls it
                ray.get(actor.submit_and_pop.remote(groups, on_invalid="drop", call_id=uuid.uuid4().hex))
                continue
            ray.get(actor.submit_groups.remote(groups, on_invalid="drop"))
            while ray.get(actor.pop_batch.remote()) is not None:
                pass

    return timed_callers(actor, caller, per_caller)


def body_in_process(policy: dict, num_tasks: int, per_caller: list[list[GroupTable]], ckpt_dir: str) -> float:
    """Seconds for the actor's own class (:class:`Orchestrator`, state file on) in this process,
    without Ray: one coroutine per caller, each call's table unpickled from bytes as Ray would
    hand it over. What the actor costs without the transport: the ceiling of any Ray route."""
    blobs = [[pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL) for t in calls] for calls in per_caller]
    warm = warm_up_call(per_caller, num_tasks)

    async def run() -> float:
        body = Orchestrator(policy, IndexTaskSet.of_size(num_tasks),
                            checkpoint_path=os.path.join(ckpt_dir, f"body-{uuid.uuid4().hex[:8]}.db"), metrics=DSOMetrics())
        await body.submit_and_pop(warm, on_invalid="drop")

        async def caller(calls: list[bytes]) -> None:
            for blob in calls:
                await body.submit_and_pop(pickle.loads(blob), on_invalid="drop", call_id=uuid.uuid4().hex)

        t0 = time.perf_counter()
        await asyncio.gather(*map(caller, blobs))
        return time.perf_counter() - t0

    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=256, help="calls per measurement (split over the callers)")
    ap.add_argument("--callers", type=int, default=16)
    ap.add_argument("--call-groups", type=int, default=256)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--tasks", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    policy = {"group_size": args.n, "target_groups": 256}
    calls = make_calls(args.calls, args.call_groups, args.n, args.tasks, seed=0)
    total = args.calls * args.call_groups
    ray.init(namespace="trinity-dso", include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    t_core, released, first = in_process(policy, args.tasks, calls)
    t_core = min([t_core] + [in_process(policy, args.tasks, calls)[0] for _ in range(args.repeats - 1)])
    split = [calls[i :: args.callers] for i in range(args.callers)]
    rows = [("core in process (reference)", t_core, None)]
    answered = list(zip(calls, released))
    for name, per_caller in (("Ray transport alone (echo), 1 caller", [answered]),
                             (f"Ray transport alone (echo), {args.callers} callers",
                              [answered[i :: args.callers] for i in range(args.callers)])):
        rows.append((name, min(echo(per_caller, first) for _ in range(args.repeats)), None))
    with tempfile.TemporaryDirectory() as ckpt:
        rows.append((f"actor class in process (no Ray), {args.callers} callers",
                     min(body_in_process(policy, args.tasks, split, ckpt) for _ in range(args.repeats)), None))
        for pattern in ("submit_and_pop", "submit_groups + pop_batch"):
            for name, per_caller, target in ((f"{pattern}, 1 caller", [calls], 20_000),
                                             (f"{pattern}, {args.callers} callers", split, 50_000)):
                t = min(through_ray(policy, args.tasks, per_caller, ckpt, pattern) for _ in range(args.repeats))
                rows.append((name, t, target))
    print(f"Actor ingest through Ray: {args.calls} calls of {args.call_groups} groups x {args.n} ({total} groups), "
          f"state file on, best of {args.repeats}")
    print(f"  {'variant':<44}{'groups/s':>12}{'vs core':>10}{'target':>10}")
    for name, t, target in rows:
        rate = total / t
        mark = "" if target is None else f"{target:>9,}{'  ok' if rate >= target else '  MISSED'}"
        print(f"  {name:<44}{rate:>12,.0f}{t_core / t:>9.2f}x {mark}")


if __name__ == "__main__":
    main()
