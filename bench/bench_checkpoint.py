"""Benchmark: cost of one submit against the number of held groups (16 rollouts x 2,000 tokens each).

The orchestrator commits its state after every change (``orchestrator.service.store``): the
small state holds the held groups' keys, and each group's tokens, log-probs and text are
written once, when it is accepted. So the cost of a submit should not grow with the groups
held. This measures it: the actor body (in-process, a real SQLite file as sink and state) is
filled to H held groups (``target_groups`` high, so nothing is emitted), then one more group is
submitted R times and the median wall time per submit reported, for H = 8, 64, 256, 1000.

Reference, in the same process: the old checkpoint, the whole core state with every held
group's payload serialised as JSON (``json.dumps(core.state_dict(payloads=True))``), timed at
the same H (up to 64 held groups by default: it grows by tens of ms per held group). CPU time
(``time.process_time``) is reported beside wall time: on a shared machine it is the figure that
contention does not inflate.

Usage: python bench/bench_checkpoint.py [--held 8 64 256 1000] [--repeats 10] [--reference-up-to 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

N, T = 16, 2000


def make_groups(count: int, start: int, tokens: list[int], logprobs: list[float]):
    from orchestrator.core.types import Experience, ExperienceId, Group

    out = []
    for i in range(start, start + count):
        task = f"t{i % 64}"
        rollouts = [
            Experience(eid=ExperienceId(task=task, run=r, round_tag=f"g{i}"), tokens=tokens, prompt_length=100,
                       logprobs=logprobs, reward=1.0 if r % 2 else -1.0, response_text="x" * 200)
            for r in range(N)
        ]
        out.append(Group(task_id=task, rollouts=rollouts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--held", type=int, nargs="+", default=[8, 64, 256, 1000])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--reference-up-to", type=int, default=64)
    args = ap.parse_args()

    import random

    from orchestrator.rollout.scripted import ScriptedTasks
    from orchestrator.service.actor import Orchestrator
    from orchestrator.service.sink import SQLiteSink

    rng = random.Random(0)
    tokens = [rng.randrange(50_000) for _ in range(T)]  # shared lists: the payload is serialised per group anyway
    logprobs = [-rng.random() * 3 for _ in range(T - 100)]
    with tempfile.TemporaryDirectory() as tmp:
        o = Orchestrator({"target_groups": 100_000, "group_size": N}, ScriptedTasks([f"t{i}" for i in range(64)]),
                         sink=SQLiteSink(Path(tmp) / "run.db"))
        made = 0
        print(f"one submit of 1 group ({N} x {T} tokens), median of {args.repeats}, by groups held")
        print(f"{'held':>6} {'wall ms':>10} {'CPU ms':>11} {'state KB':>9} {'old JSON CPU ms':>21} {'old MB':>7}")
        for held in sorted(args.held):
            while o.core.stats().groups_held < held:
                step = min(128, held - o.core.stats().groups_held)
                asyncio.run(o.submit_groups(make_groups(step, made, tokens, logprobs)))
                made += step
            now_held = o.core.stats().groups_held
            times, cpu = [], []
            for _ in range(args.repeats):
                one = make_groups(1, made, tokens, logprobs)
                made += 1
                t0, c0 = time.perf_counter(), time.process_time()
                asyncio.run(o.submit_groups(one))
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            state_kb = o.store._db.execute("SELECT SUM(LENGTH(value)) FROM dso_parts").fetchone()[0] / 1024
            ref = ref_mb = None
            if held <= args.reference_up_to:
                c0 = time.process_time()
                text = json.dumps(o.core.state_dict(payloads=True))
                ref, ref_mb = (time.process_time() - c0) * 1e3, len(text) / 2**20
            ref_s = f"{ref:21.0f} {ref_mb:7.1f}" if ref is not None else f"{'-':>21} {'-':>7}"
            print(f"{now_held:6d} {statistics.median(times) * 1e3:10.1f} {statistics.median(cpu) * 1e3:11.1f} "
                  f"{state_kb:9.1f} {ref_s}")


if __name__ == "__main__":
    main()
