"""Benchmark: does the orchestrator actor keep answering while it processes a 10,000-group submit?

A real Ray actor (SQLite sink and state file) receives one ``submit_groups`` call of G groups
(8 rollouts of 64 tokens each, half informative); meanwhile the driver pings it in a loop
(``ping``: one actor round trip) and records each ping's latency. The submit is processed
in slices of ``SLICE_ROLLOUTS`` rollouts, each committed, with the event loop free between
slices. Reference, same process: the ping latency of the idle actor just before.

``--in-process`` measures the same without Ray: the actor body on an asyncio loop, and a ping
coroutine every 10 ms timing how late the loop lets it run (what a Ray ping would wait for,
minus Ray's own round trip and the transfer of the 10,000 groups to the actor).

Usage: python bench/bench_submit_ping.py [--groups 10000] [--in-process]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--in-process", action="store_true")
    args = ap.parse_args()

    import ray

    from orchestrator.core.types import Experience, ExperienceId, Group
    from orchestrator.rollout.scripted import ScriptedTasks
    from orchestrator.service.actor import get_or_create_orchestrator
    from orchestrator.service.sink import SQLiteSink

    n = 8
    tasks = [f"t{i}" for i in range(1000)]
    groups = []
    for i in range(args.groups):
        t = tasks[i % len(tasks)]
        rewards = [1.0, -1.0] * (n // 2) if i % 2 else [-1.0] * n
        groups.append(Group(task_id=t, rollouts=[
            Experience(eid=ExperienceId(task=t, run=r, round_tag=f"s{i}"), tokens=list(range(64)), prompt_length=32,
                       logprobs=[-0.5] * 32, reward=v) for r, v in enumerate(rewards)]))
    if args.in_process:
        return in_process(groups, tasks, n)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        actor = get_or_create_orchestrator({"target_groups": 64, "group_size": n}, ScriptedTasks(tasks),
                                           sink=SQLiteSink(Path(tmp) / "run.db"), name="bench-ping")

        def ping_ms() -> float:
            t0 = time.perf_counter()
            ray.get(actor.ping.remote())
            return (time.perf_counter() - t0) * 1e3

        ray.get(actor.ping.remote())  # the actor is up: the idle sample times pings, not its start
        idle = [ping_ms() for _ in range(50)]
        t0 = time.perf_counter()
        ref = actor.submit_groups.remote(groups)
        busy = []
        while not ray.wait([ref], timeout=0)[0]:
            busy.append(ping_ms())
        labels = ray.get(ref)
        wall = time.perf_counter() - t0
        stats = ray.get(actor.get_stats.remote())
        ray.kill(actor)
    ray.shutdown()
    assert len(labels) == args.groups and stats.groups_submitted == args.groups

    def q(xs: list[float], p: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]

    print(f"submit of {args.groups} groups ({n} rollouts each): {wall:.1f} s, {stats.batches_emitted} batches")
    print(f"{'ping ms':>12} {'median':>8} {'p99':>8} {'max':>8} {'count':>6}")
    print(f"{'idle':>12} {statistics.median(idle):8.1f} {q(idle, 0.99):8.1f} {max(idle):8.1f} {len(idle):6d}")
    print(f"{'during':>12} {statistics.median(busy):8.1f} {q(busy, 0.99):8.1f} {max(busy):8.1f} {len(busy):6d}")


def in_process(groups, tasks, n) -> None:
    import asyncio

    from orchestrator.rollout.scripted import ScriptedTasks
    from orchestrator.service.actor import Orchestrator
    from orchestrator.service.sink import SQLiteSink

    async def run(orch) -> tuple[list[float], float]:
        late: list[float] = []
        done = False

        async def pinger() -> None:
            while not done:
                t0 = time.perf_counter()
                await asyncio.sleep(0.01)
                late.append((time.perf_counter() - t0 - 0.01) * 1e3)

        task = asyncio.create_task(pinger())
        t0 = time.perf_counter()
        await orch.submit_groups(groups)
        wall = time.perf_counter() - t0
        done = True
        await task
        return late, wall

    with tempfile.TemporaryDirectory() as tmp:
        orch = Orchestrator({"target_groups": 64, "group_size": n}, ScriptedTasks(tasks), sink=SQLiteSink(Path(tmp) / "run.db"))
        late, wall = asyncio.run(run(orch))
        assert orch.core.stats().groups_submitted == len(groups)
    late.sort()
    print(f"in-process submit of {len(groups)} groups ({n} rollouts each): {wall:.1f} s")
    print(f"event-loop delay of a 10 ms ping, ms: median {statistics.median(late):.1f}, "
          f"p99 {late[min(len(late) - 1, int(0.99 * len(late)))]:.1f}, max {late[-1]:.1f} ({len(late)} pings)")


if __name__ == "__main__":
    main()
