"""The main job: a DAPO training run that learns on two CPU cores.

Parts, all real: the orchestrator actor (dynamic sampling, replenish rounds, carry-over,
staleness), a vLLM engine actor (:class:`orchestrator.train.sync.TrainableEngine`) serving the
tiny Llama of :mod:`orchestrator.train.tiny`, the CPU trainer
(:class:`orchestrator.train.trainer.PolicyTrainer`), a verified weight sync after every
``sync_every`` batches (model version + 1 in the orchestrator), and held-out evaluation
every ``eval_every`` batches (avg@k accuracy at temperature 1, as DAPO's avg@32 on AIME).

``dynamic_sampling=False`` is the GRPO baseline's data path: every rolled-out group goes into
the batch (zero-variance groups included, contributing zero advantage); the orchestrator then
only orders the tasks.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import ray
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from algos.dapo import classify_groups
from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.policy import FilterConfig, ResamplingPolicy
from orchestrator.core.types import Batch
from orchestrator.jobs.results import write_json
from orchestrator.train.trainer import TrainerConfig, has_trainable


def _train_policy() -> ResamplingPolicy:
    # Judge accuracy: the overlong penalty must not make a constant-accuracy group informative.
    return ResamplingPolicy(target_groups=8, group_size=8, max_replenish_rounds=4, max_staleness=1,
                            filter=FilterConfig(judge="accuracy"))


class DapoTrainConfig(BaseModel):
    """Embedded defaults of ``trinity-dso train`` (``make demo``), sized for about a minute on 2 idle CPU cores
    (measured: bench/README.md, "Sizes and run times")."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = Field(0, description="Seeds tasks or maps, warm start, sampling and the trainer's mini-batch shuffle (trainer.seed is replaced).")
    out_dir: Path = Path("runs/train")
    # task and policy
    task: str = Field("max", description="'max' (a,b -> max(a, b)), 'add' (a+b -> a + b) or 'mix' (the families of "
                      "``families``, orchestrator.train.tiny.mixed_tasks); see orchestrator.train.tiny.")
    families: list[str] | dict[str, int] = Field(
        default_factory=lambda: ["max1", "max2", "add1", "add2", "add3"],
        description="Task families of task='mix', '<op><digits>' (op add, max or copy), equal shares, or a mapping "
        "family -> integer weight (ignored for other tasks).")
    regime: Literal["exact", "reasoning"] = Field(
        "exact", description="task='mix': 'exact' (the response is the answer alone) or 'reasoning' (intermediate results "
        "in a varying order and form, then '#' and the answer; the scorer reads only the answer: "
        "orchestrator.train.tiny.mixed_tasks).")
    warm_pool: int = Field(600, ge=8, description="task='mix': warm-start tasks, disjoint from the training and held-out ones.")
    digits: int = Field(2, ge=1, le=4, description="Digits of each operand.")
    train_size: int = Field(2000, ge=8, description="Training tasks.")
    heldout_size: int = Field(200, ge=8, description="Held-out tasks, disjoint from the training ones.")
    hidden: int = Field(128, ge=64, description="Hidden size of the tiny Llama (multiple of 64).")
    layers: int = Field(2, ge=1, description="Layers of the tiny Llama.")
    warm_steps: int = Field(30, ge=0, description="Supervised warm-start steps (batch 128) before RL (30: starts near 25 %).")
    # sampling
    policy: ResamplingPolicy = Field(default_factory=_train_policy)
    dynamic_sampling: bool = Field(True, description="DAPO's filter (Eq. 11); False: every group trains (GRPO).")
    reference_loop: Literal["dapo_recipe", "trinity_difficulty"] | None = Field(
        None, description="Batches from a reference loop instead of the orchestrator (orchestrator.jobs.reference_loops): "
        "'dapo_recipe' (accumulate-and-truncate), 'trinity_difficulty' (the same, prompts from Trinity's "
        "difficulty_based selector); None: the orchestrator.")
    temperature: float = Field(1.0, gt=0)
    max_tokens: int = Field(5, ge=1, description="Response budget in tokens, EOS included (L_max of Eq. 13).")
    overlong: bool = Field(True, description="DAPO's soft overlong punishment (Eq. 13).")
    overlong_cache: int = Field(2, ge=1, description="L_cache of Eq. 13, tokens.")
    # training
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    rollout_budget: int = Field(12_000, ge=1, description="Stop once this many rollouts were generated (eval excluded).")
    max_steps: int = Field(10_000, ge=1, description="Upper bound on train batches.")
    sync_every: int = Field(1, ge=1, description="Weight sync (and model version + 1) after every this many batches.")
    eval_every: int = Field(5, ge=1, description="Held-out evaluation every this many batches.")
    eval_at_rollouts: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="Instead of every eval_every batches: evaluate after the first batch at or past each of these "
        "rollout counts (arms whose batches cost different rollouts are then evaluated on one grid).")
    eval_samples: int = Field(4, ge=1, description="k of avg@k on the held-out tasks.")
    eval_samples_between: int | None = Field(
        None, ge=0, description="k of avg@k at the evaluations between the first and the last (None: eval_samples; "
        "0: none there, only the expected accuracy, which needs a source that scores answers).")
    sync_tol: float = Field(1e-3, gt=0, description="Max |engine - trainer| log-prob after a sync, nats.")

    @model_validator(mode="after")
    def _reasoning_needs_mix(self) -> "DapoTrainConfig":
        if self.regime == "reasoning" and self.task != "mix":
            raise ValueError(f"regime='reasoning' needs task='mix', got task={self.task!r}")
        if self.regime == "reasoning" and (self.eval_samples_between == 0 or self.eval_samples == 0):
            raise ValueError("regime='reasoning': eval_samples_between must not be 0 (the expected accuracy needs the "
                             "response to be the answer alone; the reasoning regime's accuracy is sampled)")
        return self

    @field_validator("eval_at_rollouts")
    @classmethod
    def _increasing(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(b <= a for a, b in zip(v, v[1:])):
            raise ValueError(f"eval_at_rollouts must be strictly increasing, got {v}")
        return v


def _policy_dir(cfg: DapoTrainConfig) -> Path:
    from orchestrator.rollout.model import cache_root

    fams = cfg.families if isinstance(cfg.families, list) else [f"{f}x{w}" for f, w in cfg.families.items()]
    name = "mix-" + "-".join(fams) + f"-p{cfg.warm_pool}" if cfg.task == "mix" else f"{cfg.task}{cfg.digits}"
    name += "-reasoning" if cfg.regime == "reasoning" else ""
    return cache_root() / f"tiny-{name}-h{cfg.hidden}-l{cfg.layers}-w{cfg.warm_steps}-s{cfg.seed}"


def task_sets(cfg: DapoTrainConfig) -> tuple[Any, Any, Any]:
    """(train, held-out, warm-start) task sets of ``cfg``: train and held-out disjoint, the held-out
    set with the training mix; the warm start runs on the training tasks, or with ``task='mix'``
    on a disjoint pool of ``warm_pool`` tasks (:func:`orchestrator.train.tiny.mixed_tasks`)."""
    from orchestrator.train.tiny import addition_tasks, mixed_tasks

    if cfg.task == "mix":
        return mixed_tasks(families=cfg.families, seed=cfg.seed, train_size=cfg.train_size, heldout_size=cfg.heldout_size,
                           pool_size=cfg.warm_pool, reasoning=cfg.regime == "reasoning")
    train, held = addition_tasks(digits=cfg.digits, seed=cfg.seed, train_size=cfg.train_size, heldout_size=cfg.heldout_size,
                                 op=cfg.task)
    return train, held, train


def _evaluate(source: Any, tasks: list, k: int, version: int, tag: str, expected: bool = False) -> dict[str, Any]:
    """Held-out evaluation: ``heldout_acc`` (avg@k, k sampled responses per task at the rollout
    temperature, DAPO's avg@32 on AIME) and, with ``expected``, ``heldout_expected_acc``:
    the mean over tasks of p, the chance that one response is exactly the reference answer
    (:meth:`VLLMRolloutSource.answer_probability`, one forward pass per task, nothing sampled).

    avg@k is an estimate of the mean pass rate with a sampling error of its own (about one point
    at k = 4 on 300 tasks); p is each task's pass rate itself where the scorer accepts only the
    exact answer (otherwise a lower bound: docs/reference/sampling.md, "When p is the pass rate"), so
    ``heldout_expected_acc`` is the expectation of avg@k, without its sampling error. What an
    evaluation samples does not change the run's training (its requests are separate calls and
    seeded apart; checked in docs/results/sampling.md, "Held-out accuracy, measured exactly"). ``k = 0``: the
    expected accuracy alone (no ``heldout_acc``). ``expected`` needs a source whose engine scores
    answers (the training loop's vLLM engine actor; Trinity's engine in ``demo-trinity`` does not).
    """
    if not k and not expected:
        raise ValueError("an evaluation with no sampled response (k = 0) needs expected=True")
    family = [t.meta.get("family", t.kind) for t in tasks]
    rows = {f: [i for i, x in enumerate(family) if x == f] for f in sorted(set(family))}
    out: dict[str, Any] = {"heldout_tokens": 0, "_groups": []}
    if k:
        groups = source.generate(tasks, k, model_version=version, round_tag=tag)
        acc = np.array([[r.metrics["accuracy"] for r in g.rollouts] for g in groups])
        lengths = np.array([[r.metrics["response_length"] for r in g.rollouts] for g in groups])
        truncated = np.array([[r.info["finish_reason"] == "length" for r in g.rollouts] for g in groups])
        out = {"heldout_acc": float(acc.mean()), "heldout_acc_by_family": {f: float(acc[i].mean()) for f, i in rows.items()},
               "heldout_tokens": int(lengths.sum()), "heldout_pass_any": float(acc.max(axis=1).mean()),
               "heldout_length": float(lengths.mean()), "heldout_truncated": float(truncated.mean()), "_groups": groups}
    if expected:
        p = source.answer_probability(tasks)
        out["heldout_expected_acc"] = float(p.mean())
        out["heldout_expected_acc_by_family"] = {f: float(p[i].mean()) for f, i in rows.items()}
    return out


def start_engine(model_dir: Any, seed: int = 0) -> Any:
    """The vLLM engine actor of a training run (:class:`orchestrator.train.sync.TrainableEngineActor`), started."""
    from orchestrator.train.sync import TrainableEngineActor

    engine = TrainableEngineActor.remote(str(model_dir), dtype="float32", max_model_len=64, seed=seed,
                                         enable_prefix_caching=False)
    ray.get(engine.ready.remote(), timeout=600)
    return engine


def run_dapo_training(cfg: DapoTrainConfig, progress: Callable[[dict], None] | None = None,
                      log: Callable[[str], None] | None = None, engine: Any = None, actor_name: str | None = None) -> dict:
    """Run one training job; return its summary (also written to ``out_dir/train.json``, plots beside it).

    Args:
        cfg: the configuration.
        progress: called with each step's row (the keys of ``summary["steps"][i]``).
        log: called with start-up messages.
        engine: a running engine actor (:func:`start_engine`) of the same model shape to reuse (a
            comparison of many runs pays vLLM's start-up once): the run's warm-started weights are
            loaded into it first and verified, and it is left running.
        actor_name: the name of the run's orchestrator actor (a REST app deployed for that name
            serves it: :func:`orchestrator.service.serve.serve_actor`); default a fresh
            ``dso-train-<hex>``.
    Returns:
        ``{"config", "wall_seconds", "start_heldout_acc", "end_heldout_acc", "steps": [...],
        "evals": [...], "stats", "sync": {...}, "rollouts_per_emitted_group"}``.
    Raises:
        orchestrator.train.sync.WeightSyncError, orchestrator.train.trainer.TrainStepError.
    """
    from orchestrator.rollout.engine import VLLMRolloutSource
    from orchestrator.rollout.source import OverlongConfig, SamplingConfig
    from orchestrator.service.actor import OrchestratorActor
    from orchestrator.service.metrics import DSOMetrics
    from orchestrator.train.sync import WeightSync
    from orchestrator.train.tiny import MARKER, ensure_policy
    from orchestrator.train.trainer import PolicyTrainer

    say = log or (lambda msg: None)
    started = time.monotonic()
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")

    train, held, warm = task_sets(cfg)
    cached = (_policy_dir(cfg) / MARKER).is_file()
    say(f"warm start ({cfg.warm_steps} supervised steps{', from the cache' if cached else '; cached for the next run'})")
    model_dir = ensure_policy(_policy_dir(cfg), warm, seed=cfg.seed, warm_steps=cfg.warm_steps, hidden=cfg.hidden,
                              layers=cfg.layers)
    own_engine = engine is None
    if own_engine:
        say("starting the vLLM engine")
        engine = start_engine(model_dir, cfg.seed)
    overlong = OverlongConfig(max_response_length=cfg.max_tokens, cache_length=cfg.overlong_cache) if cfg.overlong else None
    sampling = SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=cfg.seed, overlong=overlong)
    source = VLLMRolloutSource(engine, train, sampling)
    held_source = VLLMRolloutSource(engine, held, SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                                                 seed=cfg.seed + 1))
    held_tasks = list(held)
    actor = OrchestratorActor.options(name=actor_name or f"dso-train-{uuid.uuid4().hex[:8]}").remote(
        cfg.policy, train, source, seed=cfg.seed, metrics=DSOMetrics())
    trainer = PolicyTrainer(model_dir, cfg.trainer.model_copy(update={"seed": cfg.seed}))  # the run's seed, everywhere
    if not own_engine:
        ray.get(engine.load_weights.remote(trainer.named_weights()), timeout=120)  # this run's warm start
    tokens_at_start = ray.get(engine.generated.remote())
    eval_tokens = 0
    eval_seconds = 0.0
    trained_tokens = useful_tokens = 0
    tasks_trained: set = set()  # distinct tasks with an informative group trained on so far

    # the expected accuracy (the reference answer's likelihood) is the pass rate only where the
    # response is the answer alone: the reasoning regime's accuracy is sampled (avg@k)
    expected = cfg.regime == "exact"
    first = _evaluate(held_source, held_tasks, cfg.eval_samples, 0, "eval0", expected=expected)
    eval_tokens += first["heldout_tokens"]
    probes = [g.rollouts[0] for g in first.pop("_groups")[:8]]
    sync = WeightSync(engine, actor, probes, tol=cfg.sync_tol)
    start_diff = sync.check(trainer, 0)
    say(f"engine and trainer agree at start: max |d logprob| = {start_diff:.2e}")
    evals = [{"step": 0, "rollouts": 0, "model_version": 0, **first}]
    steps: list[dict] = []
    prev = ray.get(actor.get_stats.remote()).model_dump()
    local = {"rollouts": 0, "groups": 0, "kept": 0}
    ref_loop = None
    if cfg.reference_loop is not None:
        from orchestrator.jobs.reference_loops import DapoRecipeLoop, TrinityDifficultyLoop

        kind = DapoRecipeLoop if cfg.reference_loop == "dapo_recipe" else TrinityDifficultyLoop
        ref_loop = kind(source, list(train), cfg.policy.target_groups, cfg.policy.group_size, cfg.policy.target_groups,
                        seed=cfg.seed)
        ref_prev = {"classified": 0, "kept": 0, "dropped": dict(ref_loop.dropped)}
    version = 0
    step = 0
    grid = 0  # next index of cfg.eval_at_rollouts
    while step < cfg.max_steps:
        t0 = time.monotonic()
        if ref_loop is not None:
            batch = ref_loop.next_batch(step, version)
        elif cfg.dynamic_sampling:
            batch: Batch = ray.get(actor.next_batch.remote())
        else:
            task_ids = ray.get(actor.select_tasks.remote(cfg.policy.target_groups))
            groups = source.generate([train.get(t) for t in task_ids], cfg.policy.group_size, model_version=version,
                                     round_tag=f"b{step}r0")
            acc = np.array([[r.metrics["accuracy"] for r in g.rollouts] for g in groups])
            keep, reasons = classify_groups(acc)
            for g, code in zip(groups, reasons):
                g.reason = GroupOutcome(int(code)).label
            batch = Batch(step, groups, model_version=version)
        rollout_s = time.monotonic() - t0
        t1 = time.monotonic()
        # a batch of padding only (no informative group in the orchestrator's rounds) trains nothing:
        # the step is counted and marked, the weights stay as they are
        metrics = trainer.train_batch(batch) if has_trainable(batch) else {"train_skipped": 1.0}
        # response tokens of the groups trained on, and of those with a non-zero advantage (informative)
        informative = [g for g in batch.groups if not g.padding and g.reason == "informative"]
        trained_tokens += sum(len(e.tokens) - e.prompt_length for g in batch.groups if not g.padding for e in g.rollouts)
        useful_tokens += sum(len(e.tokens) - e.prompt_length for g in informative for e in g.rollouts)
        tasks_trained.update(g.task_id for g in informative)
        # what the step learned from: its informative groups by task family and by correct rollouts in the group
        by_family = Counter(train.get(g.task_id).meta.get("family", "") for g in informative)
        by_correct = Counter(str(sum(e.metrics.get("accuracy", 0.0) > 0 for e in g.rollouts)) for g in informative)
        train_s = time.monotonic() - t1
        step += 1
        sync_row: dict[str, float] = {}
        if step % cfg.sync_every == 0:
            sync_row = sync.sync(trainer, step)
            version = sync.version
        stats = ray.get(actor.get_stats.remote()).model_dump()
        if ref_loop is not None:
            rollouts = ref_loop.rollouts
            classified = ref_loop.classified - ref_prev["classified"]
            kept = ref_loop.kept - ref_prev["kept"]
            dropped = {r: ref_loop.dropped[r] - ref_prev["dropped"][r] for r in ref_loop.dropped}
            reward_all = reward_kept = math.nan
            ref_prev = {"classified": ref_loop.classified, "kept": ref_loop.kept, "dropped": dict(ref_loop.dropped)}
        elif cfg.dynamic_sampling:
            rollouts = stats["rollouts_total"]
            classified = stats["groups_submitted"] - prev["groups_submitted"]
            kept = stats["groups_kept_classified"] - prev["groups_kept_classified"]
            dropped = {r: stats["dropped_by_reason"][r] - prev["dropped_by_reason"][r] for r in stats["dropped_by_reason"]}
            n_all = stats["reward_count_all"] - prev["reward_count_all"]
            n_kept = stats["reward_count_kept"] - prev["reward_count_kept"]
            reward_all = (stats["reward_sum_all"] - prev["reward_sum_all"]) / n_all if n_all else math.nan
            reward_kept = (stats["reward_sum_kept"] - prev["reward_sum_kept"]) / n_kept if n_kept else math.nan
        else:
            local["rollouts"] += sum(len(g.rollouts) for g in batch.groups)
            rollouts = local["rollouts"]
            classified = len(batch.groups)
            kept = sum(g.reason == "informative" for g in batch.groups)
            dropped = {r.label: sum(g.reason == r.label for g in batch.groups) for r in GroupOutcome if r.label != "informative"}
            rewards = [[e.reward for e in g.rollouts] for g in batch.groups]
            reward_all = float(np.mean(rewards))
            inf = [r for g, r in zip(batch.groups, rewards) if g.reason == "informative"]
            reward_kept = float(np.mean(inf)) if inf else math.nan
        prev = stats
        row = {
            "step": step, "rollouts": int(rollouts), "model_version": version,
            "keep_rate": kept / classified if classified else math.nan, "groups_classified": classified,
            "dropped": dropped, "reward_all": reward_all, "reward_kept": reward_kept,
            "batch_rounds": batch.rounds, "batch_padding": batch.num_padding, "distinct_tasks_trained": len(tasks_trained),
            "informative_by_family": dict(by_family), "informative_by_correct": dict(by_correct),
            # answers scored by the answer screen so far (one forward pass each, not rollouts)
            "answers_scored": stats.get("answers_scored", 0) if ref_loop is None and cfg.dynamic_sampling else 0,
            "rollout_seconds": rollout_s, "train_seconds": train_s,
            "wall_seconds": time.monotonic() - started, **metrics, **sync_row,
        }
        due = cfg.eval_at_rollouts is None and step % cfg.eval_every == 0
        if cfg.eval_at_rollouts is not None and grid < len(cfg.eval_at_rollouts) and rollouts >= cfg.eval_at_rollouts[grid]:
            due = True
            while grid < len(cfg.eval_at_rollouts) and rollouts >= cfg.eval_at_rollouts[grid]:
                grid += 1
        if due or rollouts >= cfg.rollout_budget or step >= cfg.max_steps:
            t2 = time.monotonic()
            last = rollouts >= cfg.rollout_budget or step >= cfg.max_steps
            between = cfg.eval_samples if cfg.eval_samples_between is None else cfg.eval_samples_between
            ev = _evaluate(held_source, held_tasks, cfg.eval_samples if last else between, version, f"eval{step}",
                           expected=expected)
            ev.pop("_groups")
            eval_tokens += ev["heldout_tokens"]
            generated = ray.get(engine.generated.remote()) - tokens_at_start - eval_tokens
            # wall time without the evaluations (what a run without held-out checks would take)
            # groups rolled out per training task so far (the orchestrator's history, in task order):
            # which tasks a skip left out, and whether they came back
            rolled = ray.get(actor.state_dict.remote())["history"]["groups"] if ref_loop is None else None
            evals.append({"step": step, "rollouts": int(rollouts), "model_version": version,
                          "train_wall_seconds": row["wall_seconds"] - eval_seconds, "generated_tokens": generated,
                          "trained_tokens": trained_tokens, "useful_tokens": useful_tokens, "task_groups": rolled, **ev})
            eval_seconds += time.monotonic() - t2
            row.update({k: ev[k] for k in ("heldout_acc", "heldout_expected_acc") if k in ev})
        steps.append(row)
        actor.report_training.remote(step, {k: v for k, v in row.items() if not isinstance(v, dict)})
        if progress is not None:
            progress(row)
        if rollouts >= cfg.rollout_budget:
            break

    stats = ray.get(actor.get_stats.remote()).model_dump()
    (cfg.out_dir / "metrics.prom").write_text(ray.get(actor.metrics_text.remote()))
    generated = ray.get(engine.generated.remote()) - tokens_at_start - eval_tokens
    ray.kill(actor)
    if own_engine:
        ray.kill(engine)
    rollouts_total = steps[-1]["rollouts"] if steps else 0
    groups_trained = int(sum(s.get("sequences", 0) for s in steps)) // cfg.policy.group_size
    summary = {
        "config": json.loads(cfg.model_dump_json()),
        "wall_seconds": round(time.monotonic() - started, 1),
        "start_heldout_acc": evals[0]["heldout_acc"],
        "end_heldout_acc": evals[-1]["heldout_acc"],
        "start_heldout_expected_acc": evals[0].get("heldout_expected_acc"),
        "end_heldout_expected_acc": evals[-1].get("heldout_expected_acc"),
        "steps_done": len(steps),
        "eval_seconds": round(eval_seconds, 1),
        "generated_tokens": generated,
        "trained_tokens": trained_tokens,
        "useful_tokens": useful_tokens,
        "trained_token_share": trained_tokens / generated if generated else None,
        "useful_token_share": useful_tokens / generated if generated else None,
        "rollouts": rollouts_total,
        "groups_trained": groups_trained,
        "rollouts_per_trained_group": rollouts_total / groups_trained if groups_trained else None,
        "rollouts_per_emitted_group": (stats["rollouts_per_emitted_group"] if cfg.dynamic_sampling and ref_loop is None
                                       else rollouts_total / max(groups_trained, 1)),
        "sync": {"method": "collective_rpc('reload_weights') + reset_prefix_cache, verified on probes",
                 "count": len(sync.seconds), "mean_seconds": float(np.mean(sync.seconds)) if sync.seconds else None,
                 "max_seconds": float(np.max(sync.seconds)) if sync.seconds else None,
                 "start_max_abs_diff": start_diff,
                 "max_abs_diff": max((s.get("max_abs_diff", 0.0) for s in steps), default=0.0)},
        "stats": stats if cfg.dynamic_sampling and ref_loop is None else None,
        "evals": evals,
        "steps": steps,
        "task_ids": list(train.task_ids),
    }
    write_json(cfg.out_dir / "train.json", summary)
    from orchestrator.jobs.plots import plot_training

    summary["plots"] = [str(p) for p in plot_training(summary, cfg.out_dir)]
    write_json(cfg.out_dir / "train.json", summary)
    return summary
