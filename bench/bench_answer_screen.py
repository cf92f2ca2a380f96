"""Benchmark: what the answer screen's scoring costs, against the rollouts it replaces.

On the comparison's warm-started tiny policy (seed 0 of ``make compare-sampling``, one vLLM
engine actor), alternating in one loop: scoring k tasks' reference answers with the engine's
torch copy of its weights (the default, :meth:`orchestrator.train.sync.TrainableEngine.answer_logprobs`),
scoring them with vLLM's ``prompt_logprobs`` (``answer_scorer="vllm"``,
:meth:`orchestrator.rollout.engine.VLLMEngine.answer_logprobs`, run on the same actor), and
rolling the same k tasks out with a group of 8 (:meth:`VLLMRolloutSource.generate`, up to 5
tokens each, the comparison's settings). Checked: every score is a probability, and the two
scorers agree to 1e-4 in log-probability. Prints medians, and the cost of one scored task in
rollouts (the ratio the comparison's loop seconds depend on: the screen pays in time only
where a scored task costs much less than the rollouts a skip saves).
Run: ``python bench/bench_answer_screen.py [--reps 7]``.
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
from orchestrator.rollout.engine import VLLMEngine, VLLMRolloutSource
from orchestrator.rollout.source import SamplingConfig
from orchestrator.train.tiny import ensure_policy

SIZES = (1, 20, 60)
"""Tasks per call (a round of the comparison scores about 20-60)."""
GROUP = 8


def _vllm_score(engine: VLLMEngine, prompts: list, answers: list) -> list[float]:
    """vLLM's ``prompt_logprobs`` path, run on the trainable engine actor (``__ray_call__``)."""
    return VLLMEngine.answer_logprobs(engine, prompts, answers)


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
            ref = ray.get(engine.__ray_call__.remote(_vllm_score, [t.prompt for t in some], [t.answer for t in some]))
            t2 = time.perf_counter()
            groups = source.generate(some, GROUP, round_tag=f"bench{rep}")
            t3 = time.perf_counter()
            assert p.shape == (len(some),) and np.all((p >= 0) & (p <= 1)), p
            assert np.allclose(np.log(np.maximum(p, 1e-300)), ref, atol=1e-4), (np.log(p), ref)
            assert [len(g.rollouts) for g in groups] == [GROUP] * len(some)
            if rep:
                times.setdefault(("torch", k), []).append(t1 - t0)
                times.setdefault(("vllm", k), []).append(t2 - t1)
                times.setdefault(("rollouts", k), []).append(t3 - t2)
    ray.kill(engine)
    print(f"{'tasks':>5} | {'torch score ms':>14} | {'vLLM score ms':>13} | {'8 rollouts each, ms':>19} | "
          "a scored task costs, in rollouts (torch; vLLM)")
    for k in SIZES:
        t, v, g = (statistics.median(times[(what, k)]) for what in ("torch", "vllm", "rollouts"))
        print(f"{k:>5} | {1000 * t:14.1f} | {1000 * v:13.1f} | {1000 * g:19.1f} | {t / (g / GROUP):.2f}; {v / (g / GROUP):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=7)
    main(ap.parse_args().reps)
