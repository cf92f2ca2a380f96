"""GiGPO that learns: a FrozenLake agent trained on two CPU cores with step credit from anchor states.

Parts, all real: a vLLM engine actor (:class:`orchestrator.train.sync.TrainableEngine`) serving
the tiny FrozenLake policy (:func:`orchestrator.train.tiny.ensure_frozenlake_policy`), the
lockstep FrozenLake environment (:mod:`orchestrator.envs.frozenlake`: one experience per step,
each with its ``env_state_hash``), the orchestrator actor holding the anchor index (in memory by
default, Redis with ``redis_url``), ``workers`` Ray tasks that write every step into that index
and query it for the step advantages (:func:`orchestrator.jobs.gigpo.actor_step_advantages`),
the CPU trainer (:meth:`orchestrator.train.trainer.PolicyTrainer.train_on`) and a verified
weight sync after every step (model version + 1 in the orchestrator). With ``env="sokoban"``
the same loop plays textarena's Sokoban rooms (:mod:`orchestrator.envs.sokoban`) with the tiny
Sokoban policy (:func:`orchestrator.train.tiny.ensure_sokoban_policy`).

One training step (GiGPO, arXiv 2505.10978, Algorithm 1):

1. ``n`` trajectories of each training map at temperature 1 (the policy answers one action
   letter per turn; a non-action token is an invalid action: the agent stays and the step is
   penalised by ``gigpo.invalid_action_penalty``, verl-agent's ``invalid_action_penalty_coef``);
2. step returns (Eq. 5) and episode advantages A^E (Eq. 3) in the coordinator, step advantages
   A^S (Eq. 7) through the anchor index by the workers (checked against the single-process
   A^S to 1e-9 every step), ``A = A^E + omega * A^S`` (Eq. 8);
   ``advantage="multi_step_grpo"`` instead broadcasts the last step's group-relative reward to
   every step of its trajectory (Trinity's ``multi_step_grpo``,
   :func:`algos.gigpo.multi_step_grpo_advantages`);
3. ``trainer.mini_batches`` clipped policy-gradient updates, one sample per environment step;
4. weight sync and check of the engine's log-probs against the trainer's.

Success rates are measured at temperature 1: on the training maps from the step's own rollouts,
on held-out maps (disjoint, never trained on) every ``eval_every`` steps.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from algos.gigpo import GiGPOConfig, gigpo_advantages, multi_step_grpo_advantages
from orchestrator.core.types import Experience
from orchestrator.jobs.results import write_json
from orchestrator.train.trainer import TrainerConfig

__all__ = ["GiGPOTrainConfig", "prepare_policy", "run_gigpo_training", "start_policy_engine", "step_summary"]


def _gigpo() -> GiGPOConfig:
    # synchronous loop: every step of a batch comes from one model version (spread 0 is checked)
    return GiGPOConfig(invalid_action_penalty=0.1, max_version_spread=0)


def _trainer() -> TrainerConfig:
    # symmetric PPO clip as verl-agent's GiGPO runs (clip_ratio 0.2); token-mean over all steps.
    # Measured on seed 2 (75 steps): lr 1e-3 x 4 updates per batch reached 0.5 and then collapsed
    # to a deterministic policy with success 0; lr 1e-3 x 2 updates plateaued near 0.35; an
    # entropy bonus of 0.01 near 0.4; lr 5e-4 x 4 updates rose to 0.61 without collapsing.
    return TrainerConfig(lr=5e-4, eps_high=0.2, mini_batches=4, micro_batch_seqs=256)


class GiGPOTrainConfig(BaseModel):
    """Embedded defaults of ``trinity-dso train-gigpo`` (``make demo-gigpo``), sized for about 2 minutes on 2 idle cores
    (measured: bench/README.md, "Sizes and run times")."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = Field(0, description="Seeds tasks or maps, warm start, sampling and the trainer's mini-batch shuffle (trainer.seed is replaced).")
    out_dir: Path = Path("runs/gigpo")
    # environment
    env: Literal["frozenlake", "sokoban"] = Field("frozenlake", description="gymnasium's FrozenLake maps or textarena's Sokoban rooms.")
    map_size: int = Field(4, ge=2, le=5, description="FrozenLake grid side (gymnasium's 4x4 by default); FrozenLake only.")
    map_p: float = Field(0.8, gt=0, le=1, description="Probability that a cell is frozen (gymnasium's p); FrozenLake only.")
    room_size: int = Field(6, ge=5, le=7, description="Sokoban room side with its outer wall (textarena's and verl-agent's 6); "
                                                       "at most 7: the policy sees 64 positions; Sokoban only.")
    num_boxes: int = Field(1, ge=1, description="Sokoban boxes per room (verl-agent's GiGPO runs: 1); Sokoban only.")
    train_maps: int = Field(8, ge=1, description="Fixed training maps or rooms (tasks).")
    heldout_maps: int = Field(16, ge=1, description="Held-out maps or rooms, disjoint from the training ones.")
    n: int = Field(8, ge=2, description="Trajectories per map and step (the group size).")
    max_turns: int = Field(12, ge=1, description="Turn limit per trajectory.")
    # policy
    hidden: int = Field(128, ge=64, description="Hidden size of the tiny Llama (multiple of 64).")
    layers: int = Field(2, ge=1, description="Layers of the tiny Llama.")
    warm_steps: int = Field(20, ge=0, description="Warm start: supervised steps on uniformly random action letters "
                                                   "(teaches the answer format, not the task: the start is a random walk).")
    temperature: float = Field(1.0, gt=0)
    # advantage
    advantage: Literal["gigpo", "multi_step_grpo"] = "gigpo"
    gigpo: GiGPOConfig = Field(default_factory=_gigpo)
    workers: int = Field(2, ge=2, description="Advantage workers (Ray tasks) querying the anchor index.")
    redis_url: str | None = Field(None, description="Anchor index in Redis (redis://host:port/db); None: in memory.")
    # training
    trainer: TrainerConfig = Field(default_factory=_trainer)
    rollout_budget: int = Field(4_800, ge=1, description="Stop once this many trajectories were generated (eval excluded; 75 steps of 64).")
    max_steps: int = Field(10_000, ge=1, description="Upper bound on train steps.")
    eval_every: int = Field(10, ge=1, description="Held-out evaluation every this many steps.")
    eval_runs: int = Field(8, ge=1, description="Trajectories per held-out map at an evaluation.")
    sync_tol: float = Field(1e-3, gt=0, description="Max |engine - trainer| log-prob after a sync, nats.")


def _policy_dir(cfg: GiGPOTrainConfig) -> Path:
    from orchestrator.rollout.model import cache_root

    if cfg.env == "sokoban":
        return cache_root() / f"tiny-sokoban{cfg.room_size}b{cfg.num_boxes}-h{cfg.hidden}-l{cfg.layers}-w{cfg.warm_steps}-s{cfg.seed}"
    return cache_root() / f"tiny-frozenlake-h{cfg.hidden}-l{cfg.layers}-w{cfg.warm_steps}-s{cfg.seed}"


def start_policy_engine(model_dir: Path, seed: int) -> Any:
    """A :data:`~orchestrator.train.sync.TrainableEngineActor` serving the tiny policy in ``model_dir``, ready (Ray must be up)."""
    import ray

    from orchestrator.train.sync import TrainableEngineActor

    engine = TrainableEngineActor.remote(str(model_dir), dtype="float32", max_model_len=64, seed=seed, enable_prefix_caching=False)
    ray.get(engine.ready.remote(), timeout=600)
    return engine


def prepare_policy(cfg: GiGPOTrainConfig) -> Path:
    """The run's warm-started tiny policy (built once per setting and seed, then read from the cache)."""
    return _environment(cfg)[3](_policy_dir(cfg))


def _environment(cfg: GiGPOTrainConfig) -> tuple[list, Callable[..., list[Experience]], tuple[str, ...], Callable[[Path], Path]]:
    """The run's tasks (training then held-out), its ``run_episodes``, action letters and policy builder."""
    from orchestrator.envs import frozenlake, sokoban
    from orchestrator.train import tiny

    count = cfg.train_maps + cfg.heldout_maps
    kw = {"seed": cfg.seed, "warm_steps": cfg.warm_steps, "hidden": cfg.hidden, "layers": cfg.layers}
    if cfg.env == "sokoban":
        return (sokoban.make_tasks(count, size=cfg.room_size, num_boxes=cfg.num_boxes, seed=1000 * cfg.seed),
                sokoban.run_episodes, tiny.SOKOBAN_ACTIONS,
                lambda d: tiny.ensure_sokoban_policy(d, size=cfg.room_size, num_boxes=cfg.num_boxes, **kw))
    return (frozenlake.make_tasks(count, size=cfg.map_size, p=cfg.map_p, seed=1000 * cfg.seed), frozenlake.run_episodes,
            tiny.FROZENLAKE_ACTIONS, lambda d: tiny.ensure_frozenlake_policy(d, size=cfg.map_size, **kw))


def step_summary(exps: list[Experience], episode: np.ndarray, step_adv: np.ndarray, anchor_sizes: np.ndarray) -> dict[str, float]:
    """Per-step GiGPO measures of one batch of step experiences (all (S,) aligned with ``exps``).

    Returns:
        ``success_rate`` (trajectories reaching the goal), ``episode_length`` (mean turns),
        ``anchor_group_fraction`` (steps whose anchor group has more than one member),
        ``mean_abs_step_advantage`` (|A^S|), ``mean_abs_episode_advantage`` (|A^E|),
        ``invalid_action_rate``.
    """
    last = [e for e in exps if e.info["last"]]
    return {
        "success_rate": float(np.mean([e.metrics["success"] for e in last])),
        "episode_length": len(exps) / len(last),
        "anchor_group_fraction": float(np.mean(anchor_sizes > 1)),
        "mean_abs_step_advantage": float(np.mean(np.abs(step_adv))),
        "mean_abs_episode_advantage": float(np.mean(np.abs(episode))),
        "invalid_action_rate": float(np.mean([e.info["invalid_action"] for e in exps])),
    }


def _columns(exps: list[Experience]) -> dict[str, np.ndarray]:
    return {
        "task_ids": np.array([e.eid.task for e in exps]),
        "run_ids": np.array([e.eid.run for e in exps]),
        "step_ids": np.array([e.eid.step for e in exps]),
        "rewards": np.array([e.reward for e in exps], dtype=np.float64),
        "hashes": np.array([e.info["env_state_hash"] for e in exps]),
        "invalid": np.array([bool(e.info["invalid_action"]) for e in exps]),
        "versions": np.array([int(e.info["model_version"]) for e in exps]),
    }


def run_gigpo_training(cfg: GiGPOTrainConfig, progress: Callable[[dict], None] | None = None,
                       log: Callable[[str], None] | None = None, engine: Any = None) -> dict:
    """Run one GiGPO training job; return its summary (also ``out_dir/gigpo_train.json``, plots beside it).

    Args:
        cfg: the configuration.
        progress: called with each step's row (the keys of ``summary["steps"][i]``).
        log: called with start-up messages.
        engine: a running :data:`~orchestrator.train.sync.TrainableEngineActor` of a policy with the
            same shape (a comparison starts one for all its runs, an engine start saved on each); the run
            loads its own starting weights into it first and leaves it running. None: the run
            starts its own engine and kills it at the end.
    Returns:
        ``{"config", "wall_seconds", "start_train_success", "end_train_success",
        "start_heldout_success", "end_heldout_success", "steps_done", "trajectories", "backend"
        ("memory" | "redis"), "anchor_prefix" (the Redis key namespace), "sync", "evals", "steps",
        "plots"}``; the Prometheus exposition of the orchestrator at the end is in ``out_dir/metrics.prom``.
    Raises:
        orchestrator.train.sync.WeightSyncError, orchestrator.train.trainer.TrainStepError,
        orchestrator.anchors.index.AnchorIndexError (Redis unreachable),
        orchestrator.jobs.gigpo.GiGPOJobError (a task without ``n`` complete runs in the index).
    """
    import ray

    from orchestrator.anchors.owner import AnchorIndexConfig
    from orchestrator.core.policy import ResamplingPolicy
    from orchestrator.envs.policies import engine_sample_act
    from orchestrator.jobs.gigpo import GiGPOJobError, actor_step_advantages, steps_for_index
    from orchestrator.service.actor import OrchestratorActor
    from orchestrator.service.metrics import DSOMetrics
    from orchestrator.tasks.taskset import TaskSet
    from orchestrator.train.sync import WeightSync
    from orchestrator.train.tiny import MARKER
    from orchestrator.train.trainer import PolicyTrainer

    say = log or (lambda msg: None)
    started = time.monotonic()
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")

    maps, run_episodes, letters, ensure_policy = _environment(cfg)
    train_tasks, held_tasks = maps[: cfg.train_maps], maps[cfg.train_maps:]
    side = cfg.room_size if cfg.env == "sokoban" else cfg.map_size
    say(f"{cfg.train_maps} training and {cfg.heldout_maps} held-out {side}x{side} {cfg.env} tasks; "
        f"policy warm start ({cfg.warm_steps} steps on random action letters"
        f"{', from the cache' if (_policy_dir(cfg) / MARKER).is_file() else '; cached for the next run'})")
    model_dir = ensure_policy(_policy_dir(cfg))
    trainer = PolicyTrainer(model_dir, cfg.trainer.model_copy(update={"seed": cfg.seed}))  # the run's seed, everywhere
    own_engine = engine is None
    if own_engine:
        say("starting the vLLM engine")
        engine = start_policy_engine(model_dir, cfg.seed)
    else:  # the shared engine gets this run's starting weights (checked on the first rollouts, below)
        ray.get(engine.load_weights.remote(trainer.named_weights()), timeout=600)
    prefix = f"dso:gigpo-train-{uuid.uuid4().hex[:8]}"
    index_cfg = AnchorIndexConfig(redis_url=cfg.redis_url, prefix=prefix)
    actor = OrchestratorActor.options(name=f"dso-gigpo-{uuid.uuid4().hex[:8]}").remote(
        ResamplingPolicy(target_groups=cfg.train_maps, group_size=cfg.n), TaskSet(train_tasks), seed=cfg.seed,
        metrics=DSOMetrics(), anchor_index=index_cfg)
    backend = ray.get(actor.anchor_spec.remote())["backend"]
    say(f"anchor index: {backend} (the orchestrator's), {cfg.workers} advantage workers")
    act = engine_sample_act(engine, temperature=cfg.temperature, seed=cfg.seed)
    eval_act = engine_sample_act(engine, temperature=cfg.temperature, seed=cfg.seed + 7_777_777)

    def evaluate(version: int, tag: str) -> float:
        exps = run_episodes(held_tasks, cfg.eval_runs, eval_act, max_steps=cfg.max_turns, round_tag=tag,
                            model_version=version, choices=letters)
        return float(np.mean([e.metrics["success"] for e in exps if e.info["last"]]))

    g = cfg.gigpo
    evals = [{"step": 0, "trajectories": 0, "model_version": 0, "heldout_success": evaluate(0, "eval0")}]
    say(f"held-out success of the starting policy: {evals[0]['heldout_success']:.3f}")
    steps: list[dict] = []
    sync: WeightSync | None = None
    trajectories = 0
    version = 0
    step = 0
    try:
        while step < cfg.max_steps and trajectories < cfg.rollout_budget:
            t0 = time.monotonic()
            batch_key = f"s{step}-{uuid.uuid4().hex[:6]}"
            exps = run_episodes(train_tasks, cfg.n, act, max_steps=cfg.max_turns, round_tag=batch_key,
                                model_version=version, choices=letters)
            rollout_s = time.monotonic() - t0
            t1 = time.monotonic()
            c = _columns(exps)
            pure = gigpo_advantages(c["task_ids"], c["run_ids"], c["step_ids"], c["rewards"], c["hashes"],
                                    invalid=c["invalid"], model_versions=c["versions"], config=g)
            _, step_adv, _, _, _ = actor_step_advantages(
                actor, batch_key, steps_for_index(exps, pure.returns), c["task_ids"], c["hashes"], pure.returns,
                n=cfg.n, workers=cfg.workers, norm=g.norm, eps=g.eps)
            # the in-process A^S is the check of the distributed one (as run_gigpo_job checks it)
            diff = float(np.max(np.abs(step_adv - pure.step))) if len(exps) else 0.0
            if not diff <= 1e-9:  # also catches NaN (a row no worker answered)
                raise GiGPOJobError(f"step {step + 1}: step advantages from the anchor index differ from the "
                                    f"single-process ones by {diff:.3g}")
            if cfg.advantage == "gigpo":
                advantages = pure.episode + g.omega * step_adv
            else:
                advantages = multi_step_grpo_advantages(c["task_ids"], c["run_ids"], c["step_ids"], c["rewards"], eps=g.eps)
            advantage_s = time.monotonic() - t1
            t2 = time.monotonic()
            if step == 0 and not own_engine:  # the shared engine rolled out this run's starting weights
                WeightSync(engine, None, exps[:8], tol=cfg.sync_tol).check(trainer, 0)
            metrics = trainer.train_on(exps, advantages)
            train_s = time.monotonic() - t2
            step += 1
            trajectories += cfg.train_maps * cfg.n
            if sync is None:
                sync = WeightSync(engine, actor, exps[:8], tol=cfg.sync_tol)
            sync_row = sync.sync(trainer, step)
            version = sync.version
            row = {
                "step": step, "trajectories": trajectories, "model_version": version,
                **step_summary(exps, pure.episode, step_adv, pure.anchor_sizes),
                "mean_abs_advantage": float(np.mean(np.abs(advantages))), "max_abs_diff_vs_pure": diff,
                "rollout_seconds": rollout_s, "advantage_seconds": advantage_s, "train_seconds": train_s,
                "wall_seconds": time.monotonic() - started, **metrics, **sync_row,
            }
            if step % cfg.eval_every == 0 or trajectories >= cfg.rollout_budget or step >= cfg.max_steps:
                row["heldout_success"] = evaluate(version, f"eval{step}")
                evals.append({"step": step, "trajectories": trajectories, "model_version": version,
                              "heldout_success": row["heldout_success"]})
            steps.append(row)
            ray.get(actor.report_training.remote(step, row))
            if progress is not None:
                progress(row)
        metrics_text = ray.get(actor.metrics_text.remote())
    finally:
        ray.kill(actor)
        if own_engine:
            ray.kill(engine)
    (cfg.out_dir / "metrics.prom").write_text(metrics_text)

    def window(key: str, rows: list[dict]) -> float:
        vals = [r[key] for r in rows if key in r]
        return float(np.mean(vals)) if vals else math.nan

    k = max(1, min(5, len(steps) // 4))  # success on the training maps: mean of the first / last k steps
    summary = {
        "config": json.loads(cfg.model_dump_json()),
        "wall_seconds": round(time.monotonic() - started, 1),
        "backend": backend,
        "anchor_prefix": prefix,
        "start_train_success": window("success_rate", steps[:k]),
        "end_train_success": window("success_rate", steps[-k:]),
        "start_heldout_success": evals[0]["heldout_success"],
        "end_heldout_success": evals[-1]["heldout_success"],
        "steps_done": len(steps),
        "trajectories": trajectories,
        "sync": {"count": len(sync.seconds) if sync else 0,
                 "mean_seconds": float(np.mean(sync.seconds)) if sync and sync.seconds else None,
                 "max_abs_diff": max((s.get("max_abs_diff", 0.0) for s in steps), default=0.0)},
        "evals": evals,
        "steps": steps,
    }
    write_json(cfg.out_dir / "gigpo_train.json", summary)
    from orchestrator.jobs.plots import plot_gigpo_training

    summary["plots"] = [str(p) for p in plot_gigpo_training(summary, cfg.out_dir)]
    write_json(cfg.out_dir / "gigpo_train.json", summary)
    return summary
