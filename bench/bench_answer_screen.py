"""Benchmark: what the answer screen's scoring costs, against the rollouts it replaces.

On the comparison's warm-started tiny policy (seed 0 of ``make compare-sampling``, one vLLM
engine), alternating in one loop: scoring k tasks' reference answers
(:meth:`orchestrator.rollout.engine.VLLMRolloutSource.answer_probability`, one forward pass
each) and rolling the same k tasks out with a group of 8 (:meth:`VLLMRolloutSource.generate`,
up to 5 tokens each, the comparison's settings). Every score is checked to be a probability.
Prints medians, and the cost of one scored task in rollouts (the ratio the comparison's loop
seconds depend on: the screen pays in time only where a scored task costs much less than the
rollouts a skip saves). Run: ``python bench/bench_answer_screen.py [--reps 7]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import ray

from orchestrator.jobs.dapo_train import _policy_dir, start_engine, task_sets
from orchestrator.jobs.sampling_compare import base_config
from orchestrator.rollout.engine import VLLMRolloutSource
from orchestrator.rollout.source import SamplingConfig
from orchestrator.train.tiny import ensure_policy

SIZES = (1, 20, 60)
"""Tasks per call (a round of the comparison scores about 20-60)."""
GROUP = 8


def main(reps: int) -> None:
    cfg = base_config(Path("runs/bench-answer-screen"), 0)
    train, _, warm = task_sets(cfg)
    model = ensure_policy(_policy_dir(cfg), warm, seed=0, warm_steps=cfg.warm_steps, hidden=cfg.hidden, layers=cfg.layers)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    engine = start_engine(model, 0)
    tasks = list(train)
    source = VLLMRolloutSource(engine, train, SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=3))
    times: dict[tuple[str, int], list[float]] = {}
    for rep in range(reps + 1):  # the first repetition warms up and is not counted
        for k in SIZES:
            some = tasks[rep * k % len(tasks):][:k]
            t0 = time.perf_counter()
            p = source.answer_probability(some)
            t1 = time.perf_counter()
            groups = source.generate(some, GROUP, round_tag=f"bench{rep}")
            t2 = time.perf_counter()
            assert p.shape == (len(some),) and np.all((p >= 0) & (p <= 1)), p
            assert [len(g.rollouts) for g in groups] == [GROUP] * len(some)
            if rep:
                times.setdefault(("score", k), []).append(t1 - t0)
                times.setdefault(("rollouts", k), []).append(t2 - t1)
    ray.kill(engine)
    print(f"{'tasks':>5} | {'score ms (median)':>17} | {'8 rollouts each, ms':>19} | a scored task costs, in rollouts")
    for k in SIZES:
        s, g = statistics.median(times[("score", k)]), statistics.median(times[("rollouts", k)])
        print(f"{k:>5} | {1000 * s:17.1f} | {1000 * g:19.1f} | {s / (g / GROUP):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    main(ap.parse_args().reps)
