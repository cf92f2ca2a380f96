"""One GiGPO batch end to end: environment rollouts, anchor index, parallel advantage workers.

:func:`run_gigpo_job` is what ``trinity-dso demo --algo gigpo`` calls. It

1. draws ``tasks`` distinct FrozenLake maps or Sokoban rooms (``cfg.env``) and rolls out ``n``
   trajectories of each in lockstep (``run_episodes`` of :mod:`orchestrator.envs.frozenlake`
   or :mod:`orchestrator.envs.sokoban`, one contract) with a seeded random policy or an
   ``act`` callable (e.g. :func:`orchestrator.envs.policies.engine_act` over the vLLM
   engine actor);
2. computes step returns (GiGPO Eq. 5) and episode advantages (Eq. 3) in the coordinator
   (cheap, one pass of :mod:`algos.gigpo`);
3. fills the anchor index - :class:`~orchestrator.anchors.redis_index.RedisAnchorIndex` when
   ``redis_url`` is set, where ``workers`` processes insert trajectory-interleaved shards
   concurrently, else :class:`~orchestrator.anchors.memory.MemoryAnchorIndex` filled by the
   coordinator and shipped to the workers as a snapshot;
4. has ``workers`` processes (``spawn``) query the index for the step advantages (Eq. 7) of
   their share of the tasks, and combines ``A = A^E + omega * A^S`` (Eq. 8);
5. checks the result against the pure function on the whole batch and returns a summary.

Given a running orchestrator actor (``run_gigpo_job(..., orchestrator=actor)``), steps 3-4 use
the orchestrator's anchor index instead: the batch key is registered with the actor,
``workers`` Ray tasks open the index from the actor's ``anchor_spec()`` (Redis, or the memory
index's own Ray actor), and the batch is dropped through the actor (``anchor_drop``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from algos.gigpo import GiGPOConfig, encode_keys, gigpo_advantages
from orchestrator.anchors.index import AnchorIndex, AnchorStep
from orchestrator.anchors.owner import make_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex, _redact
from orchestrator.core.types import Experience, Task
from orchestrator.envs import frozenlake, sokoban
from orchestrator.envs.lockstep import Act
from orchestrator.envs.policies import engine_act, random_act
from orchestrator.jobs.results import write_json

if TYPE_CHECKING:
    from orchestrator.anchors.remote import RemoteAnchorIndex

__all__ = ["GiGPOJobConfig", "GiGPOJobError", "actor_step_advantages", "run_gigpo_job", "steps_for_index"]


class GiGPOJobError(RuntimeError):
    """The job cannot run as configured (no policy for ``policy="engine"``) or its
    distributed result disagrees with the single-process computation."""


class GiGPOJobConfig(BaseModel):
    """Settings of one GiGPO demo batch.

    Attributes:
        env: the multi-turn environment: ``"frozenlake"`` (gymnasium FrozenLake,
            :mod:`orchestrator.envs.frozenlake`) or ``"sokoban"`` (textarena's Sokoban rooms
            and moves, :mod:`orchestrator.envs.sokoban`).
        tasks: number of distinct maps / rooms (tasks), >= 1.
        n: trajectories per task (group size), >= 1. verl-agent's FrozenLake-like runs use 8.
        max_steps: turn limit per trajectory, >= 1.
        map_size: FrozenLake grid side, >= 2 (4 = gymnasium's 4x4); FrozenLake only.
        room_size: Sokoban room side including the outer wall, >= 5 (6 = textarena's and
            verl-agent's 6x6); Sokoban only.
        num_boxes: Sokoban boxes (and targets) per room, >= 1 (verl-agent's GiGPO runs: 1);
            Sokoban only.
        redis_url: ``redis://host:port/db`` for a :class:`RedisAnchorIndex`; None for the
            in-process memory index.
        prefix: Redis key namespace (e.g. ``dso:<run name>``).
        batch_key: anchor-index batch key; None draws ``gigpo-<seed>-<random>``.
        ttl_s: Redis key lifetime after the last write, seconds, > 0.
        keep_batch: leave the batch in the index after the job (default: dropped).
        workers: advantage worker processes, >= 2.
        seed: map seed and random-policy seed.
        policy: ``"random"`` (seeded uniform policy, fast); ``"engine"`` (needs ``act`` or
            ``engine`` passed to :func:`run_gigpo_job`); ``"vllm"``: like ``"engine"``, but
            when neither is passed the job starts Ray (2 CPUs) and a
            :data:`~orchestrator.rollout.engine.VLLMRolloutEngine` on ``model_dir`` (default:
            :func:`orchestrator.rollout.model.ensure_smollm2`), and kills it at the end.
        model_dir: model for ``policy="vllm"``; None uses SmolLM2-135M-Instruct.
        temperature: sampling temperature for an engine actor (``chat_choice``).
        out_dir: when set, the summary (without experiences) is written to
            ``out_dir/gigpo.json``.
        invalid_prob: probability that the random policy answers an invalid word, [0, 1).
        check_tol: maximum allowed |distributed - single-process| advantage difference.
        gigpo: advantage settings (paper defaults).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    env: Literal["frozenlake", "sokoban"] = "frozenlake"
    tasks: int = Field(8, ge=1)
    n: int = Field(8, ge=1)
    max_steps: int = Field(12, ge=1)
    map_size: int = Field(4, ge=2)
    room_size: int = Field(6, ge=5)
    num_boxes: int = Field(1, ge=1)
    redis_url: str | None = None
    prefix: str = "dso:gigpo"
    batch_key: str | None = None
    ttl_s: float = Field(3600.0, gt=0)
    keep_batch: bool = False
    workers: int = Field(2, ge=2)
    seed: int = 0
    policy: Literal["random", "engine", "vllm"] = "random"
    model_dir: Path | None = None
    out_dir: Path | None = None
    temperature: float = Field(1.0, ge=0)
    invalid_prob: float = Field(0.0, ge=0, lt=1)
    check_tol: float = Field(1e-9, gt=0)
    gigpo: GiGPOConfig = Field(default_factory=GiGPOConfig)


def steps_for_index(exps: list[Experience], returns: np.ndarray) -> list[AnchorStep]:
    """One :class:`AnchorStep` per experience (``returns`` aligned with ``exps``).

    ``last`` is ``info["last"]`` when present, else derived as the largest step of the
    (task, run) within ``exps``.
    """
    last_step: dict[tuple[str, int], int] = {}
    for e in exps:
        key = (e.eid.task, e.eid.run)
        last_step[key] = max(last_step.get(key, -1), e.eid.step)
    return [
        AnchorStep(
            task=e.eid.task,
            run=e.eid.run,
            step=e.eid.step,
            state_hash=str(e.info["env_state_hash"]),
            ret=float(r),
            last=bool(e.info.get("last", e.eid.step == last_step[(e.eid.task, e.eid.run)])),
        )
        for e, r in zip(exps, returns, strict=True)
    ]


# -- worker entry points (module level: they are pickled to spawned processes)


def _ping(_: int) -> int:
    time.sleep(0.05)  # long enough that one worker cannot answer every ping
    return os.getpid()


def _insert_shard(index: AnchorIndex | RemoteAnchorIndex, batch_key: str, steps: list[AnchorStep]) -> float:
    t0 = time.perf_counter()
    index.insert(batch_key, steps)
    index.close()
    return time.perf_counter() - t0


def _query_shard(
    index: AnchorIndex | RemoteAnchorIndex, batch_key: str, rows: np.ndarray, tasks: list[str], hashes: list[str], returns: np.ndarray,
    norm: str, eps: float, n_runs: int,
) -> tuple[np.ndarray, np.ndarray, float]:
    t0 = time.perf_counter()
    adv = index.step_advantages(batch_key, tasks, hashes, returns, norm=norm, eps=eps, n_runs=n_runs)  # type: ignore[arg-type]
    index.close()
    return rows, adv, time.perf_counter() - t0


def _insert_shard_spec(spec: dict, batch_key: str, steps: list[AnchorStep]) -> float:
    from orchestrator.anchors.owner import anchor_index_from_spec

    return _insert_shard(anchor_index_from_spec(spec), batch_key, steps)


def _query_shard_spec(spec: dict, batch_key: str, *args: Any) -> tuple[np.ndarray, np.ndarray, float]:
    from orchestrator.anchors.owner import anchor_index_from_spec

    return _query_shard(anchor_index_from_spec(spec), batch_key, *args)


def run_gigpo_job(
    cfg: GiGPOJobConfig | None = None,
    *,
    act: Act | None = None,
    engine: Any = None,
    return_experiences: bool = False,
    log: Callable[[str], None] | None = None,
    orchestrator: Any = None,
) -> dict[str, Any]:
    """Run one GiGPO batch (see the module docstring) and summarise it.

    Args:
        cfg: job settings; defaults to :class:`GiGPOJobConfig` ().
        act: the policy for ``policy="engine"``: ``act(prompts, choices) -> list[dict]``.
        engine: alternatively a ``VLLMRolloutEngine`` actor; wrapped with
            :func:`~orchestrator.envs.policies.engine_act` at ``cfg.temperature``.
        return_experiences: also return the experiences, each with ``info["advantage"]``,
            ``info["episode_advantage"]``, ``info["step_advantage"]`` and ``info["return"]``.
        log: optional progress callback: one line per phase (index check, Ray / model /
            engine start-up, each rollout turn, index writes, worker queries).
        orchestrator: a running :class:`~orchestrator.service.actor.Orchestrator` actor created with
            ``anchor_index``: the job then uses *its* index (``cfg.redis_url``, ``prefix`` and
            ``ttl_s`` are ignored; ``backend`` reports the actor's), registers the batch key
            with it, and runs ``cfg.workers`` Ray tasks (``ray`` must be initialised) that open
            the index from ``anchor_spec()`` - Redis, or the memory index's own Ray actor -
            instead of spawned processes. The batch is dropped through the actor
            (``anchor_drop``, which records the group sizes in its metrics) unless ``keep_batch``.
    Returns:
        ``{"algo": "gigpo", "env": "frozenlake"|"sokoban", "backend": "memory"|"redis" (the anchor-index store),
        "policy": "random"|"engine"|"vllm" (the rollout policy, ``cfg.policy``), "workers", "batch_key", "tasks",
        "trajectories", "steps", "anchor_groups", "anchor_group_fraction" (fraction of steps
        whose anchor group has more than one member), "informative_step_fraction" (fraction of
        steps whose anchor group's returns differ, i.e. A_S != 0), "group_size_histogram" ({size: groups}),
        "mean_abs_episode_advantage", "mean_abs_step_advantage", "mean_abs_advantage",
        "success_rate" (fraction of trajectories reaching the goal / solving the room), "invalid_action_rate",
        "mean_trajectory_length", "max_abs_diff_vs_pure", "timings": {"workers_start_s",
        "rollout_s", "returns_s", "index_write_s", "advantage_s", "total_s"}}`` (seconds) plus ``"experiences"``
        when asked.
    Raises:
        GiGPOJobError: ``policy="engine"`` without ``act``/``engine``; the workers' result
            differs from the single-process one by more than ``check_tol``.
        orchestrator.anchors.index.AnchorIndexError: Redis unreachable or the URL malformed
            (checked with a PING before the engine start and the rollouts, unless
            ``orchestrator`` is given), or batch state lost.
    """
    cfg = cfg or GiGPOJobConfig()
    say = log or (lambda _msg: None)
    t_start = time.perf_counter()
    if cfg.policy == "engine" and act is None and engine is None:
        raise GiGPOJobError("policy='engine' needs an act callable or an engine actor")
    # the index is checked before the (slow) engine start and rollouts, so a bad URL fails fast
    index = None if orchestrator is not None else _open_index(cfg, say)
    started_engine = None
    try:
        if cfg.policy in ("engine", "vllm"):
            if act is None and engine is None:
                engine = started_engine = _start_vllm_engine(cfg, say)
            act = act or engine_act(engine, temperature=cfg.temperature, seed=cfg.seed)
        else:
            act = random_act(cfg.seed, invalid_prob=cfg.invalid_prob)
        result = _run(cfg, act, say, t_start, return_experiences, orchestrator, index)
    finally:
        if index is not None:
            index.close()
        if started_engine is not None:
            import ray

            ray.kill(started_engine)
    if cfg.out_dir is not None:
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        summary = {k: v for k, v in result.items() if k != "experiences"}
        write_json(cfg.out_dir / "gigpo.json", summary, indent=2, default=str)
    return result


def _open_index(cfg: GiGPOJobConfig, say: Callable[[str], None]) -> AnchorIndex:
    """The job's own anchor index, checked with one PING when it is Redis.

    Raises:
        AnchorIndexError: Redis unreachable, refusing the password, or a malformed URL (the
            message names the URL, password hidden).
    """
    index = make_anchor_index(cfg.redis_url, prefix=cfg.prefix, ttl_s=cfg.ttl_s)
    if isinstance(index, RedisAnchorIndex):
        say(f"anchor index: connecting to Redis at {_redact(cfg.redis_url or '')}")
        rtt = index.ping()
        say(f"anchor index: Redis at {_redact(cfg.redis_url or '')} answered PING in {rtt * 1e3:.1f} ms")
    else:
        say("anchor index: in memory (no --redis-url)")
    return index


def _start_vllm_engine(cfg: GiGPOJobConfig, say: Callable[[str], None]) -> Any:
    import ray

    from orchestrator.rollout.engine import start_engine

    if not ray.is_initialized():
        say("starting Ray (2 CPUs)")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="trinity-dso")
    if cfg.model_dir is None:
        from orchestrator.rollout.model import ensure_smollm2

        say("preparing SmolLM2-135M-Instruct (download or conversion on first use)")
        model_dir = ensure_smollm2()
    else:
        model_dir = cfg.model_dir
    say(f"starting vLLM engine on {model_dir} (model load and warm-up)")
    t0 = time.perf_counter()
    eng = start_engine(model_dir, seed=cfg.seed)
    say(f"vLLM engine ready in {time.perf_counter() - t0:.1f}s")
    return eng


def _announce_turns(act: Act, say: Callable[[str], None], n_traj: int, max_steps: int) -> Act:
    """``act`` that reports each rollout turn (one policy call for all live trajectories)."""
    turn = 0

    def traced(prompts: Any, choices: Any) -> Any:
        nonlocal turn
        turn += 1
        say(f"rollout turn {turn}/{max_steps}: {len(prompts)} of {n_traj} trajectories still playing")
        return act(prompts, choices)

    return traced


def actor_step_advantages(
    actor: Any,
    batch_key: str,
    steps: list[AnchorStep],
    task_ids: np.ndarray,
    hashes: np.ndarray,
    returns: np.ndarray,
    *,
    n: int,
    workers: int = 2,
    norm: str = "std",
    eps: float = 1e-6,
    keep_batch: bool = False,
    say: Callable[[str], None] = lambda _msg: None,
) -> tuple[str, np.ndarray, float, float, float]:
    """Fill and query the orchestrator actor's anchor index with ``workers`` Ray tasks.

    Same sharding as the process-pool path: trajectory-interleaved insert shards (each anchor
    group written concurrently by several workers), task-partitioned queries (GiGPO Eq. 7 in
    the index, :meth:`AnchorIndex.step_advantages`). The batch is dropped through the actor
    afterwards (its anchor-group sizes go to the actor's metrics) unless ``keep_batch``.

    Args:
        steps: (S,) the batch's steps (:func:`steps_for_index`); ``task_ids``, ``hashes``,
            ``returns``: (S,) aligned with them.
        n: trajectories per task; every task must have ``n`` complete runs in the index.
    Returns:
        backend (``"memory"`` | ``"redis"``), step advantages (S,), and the seconds of worker
        start, index writes and queries.
    Raises:
        GiGPOJobError: a task with fewer than ``n`` complete runs after the writes.
    """
    import ray

    from orchestrator.anchors.owner import anchor_index_from_spec

    spec = ray.get(actor.anchor_spec.remote())
    backend = spec["backend"]
    index = anchor_index_from_spec(spec)
    ray.get(actor.anchor_register.remote(batch_key))
    ping = ray.remote(num_cpus=0)(_ping)
    insert = ray.remote(num_cpus=0)(_insert_shard_spec)
    query = ray.remote(num_cpus=0)(_query_shard_spec)
    step_adv = np.full(len(steps), np.nan)
    try:
        t0 = time.perf_counter()
        pids = set(ray.get([ping.remote(i) for i in range(2 * workers)]))
        t_workers = time.perf_counter() - t0
        say(f"workers: {workers} Ray tasks ({len(pids)} processes warmed up) in {t_workers:.2f}s")
        t0 = time.perf_counter()
        traj, _ = encode_keys(task_ids, np.array([s.run for s in steps]))
        shards = [[s for s, t in zip(steps, traj, strict=True) if t % workers == w] for w in range(workers)]
        ray.get([insert.remote(spec, batch_key, shard) for shard in shards])
        done = index.completed_runs(batch_key)
        incomplete = {t: done.get(t, 0) for t in dict.fromkeys(task_ids.tolist()) if done.get(t, 0) != n}
        if incomplete:
            raise GiGPOJobError(f"batch {batch_key!r}: tasks with fewer than n={n} complete runs: {incomplete}")
        t_write = time.perf_counter() - t0
        say(f"index ({backend}, the orchestrator's): {len(steps)} steps written in {t_write:.2f}s")
        t0 = time.perf_counter()
        task_code, _ = encode_keys(task_ids)
        jobs = []
        for w in range(workers):
            rows = np.flatnonzero(task_code % workers == w)
            if rows.size:
                jobs.append(
                    query.remote(spec, batch_key, rows, task_ids[rows].tolist(), hashes[rows].tolist(), returns[rows], norm, eps, n)
                )
        for rows, adv, _ in ray.get(jobs):
            step_adv[rows] = adv
        t_adv = time.perf_counter() - t0
    finally:
        if not keep_batch:
            try:
                ray.get(actor.anchor_drop.remote(batch_key))
            except Exception as exc:  # noqa: BLE001 - the job's own error matters more
                say(f"could not drop batch {batch_key!r} from the orchestrator's index: {exc}")
        index.close()
    return backend, step_adv, t_workers, t_write, t_adv


def _env_tasks(cfg: GiGPOJobConfig) -> tuple[list[Task], Callable[..., list[Experience]]]:
    """The job's tasks and the ``run_episodes`` of ``cfg.env`` (both modules share its contract)."""
    if cfg.env == "sokoban":
        return sokoban.make_tasks(cfg.tasks, size=cfg.room_size, num_boxes=cfg.num_boxes, seed=cfg.seed), sokoban.run_episodes
    return frozenlake.make_tasks(cfg.tasks, size=cfg.map_size, seed=cfg.seed), frozenlake.run_episodes


def _run(
    cfg: GiGPOJobConfig,
    act: Act,
    say: Callable[[str], None],
    t_start: float,
    return_experiences: bool,
    orchestrator: Any = None,
    index: AnchorIndex | None = None,
) -> dict[str, Any]:
    g = cfg.gigpo
    batch_key = cfg.batch_key or f"gigpo-{cfg.seed}-{uuid.uuid4().hex[:8]}"

    tasks, run_episodes = _env_tasks(cfg)
    t0 = time.perf_counter()
    say(f"rollout: {len(tasks)} {cfg.env} tasks x {cfg.n} runs, up to {cfg.max_steps} turns ({cfg.policy} policy)")
    traced = _announce_turns(act, say, len(tasks) * cfg.n, cfg.max_steps)
    exps = run_episodes(tasks, cfg.n, traced, max_steps=cfg.max_steps, round_tag=batch_key)
    t_rollout = time.perf_counter() - t0
    say(f"rollout: {len(tasks)} tasks x {cfg.n} runs, {len(exps)} steps in {t_rollout:.2f}s")

    t0 = time.perf_counter()
    task_ids = np.array([e.eid.task for e in exps])
    hashes = np.array([e.info["env_state_hash"] for e in exps])
    pure = gigpo_advantages(
        task_ids,
        np.array([e.eid.run for e in exps]),
        np.array([e.eid.step for e in exps]),
        np.array([e.reward for e in exps]),
        hashes,
        invalid=np.array([bool(e.info.get("invalid_action", False)) for e in exps]),
        config=g,
    )
    steps = steps_for_index(exps, pure.returns)
    t_returns = time.perf_counter() - t0

    if orchestrator is not None:
        backend, step_adv, t_workers, t_write, t_adv = actor_step_advantages(
            orchestrator, batch_key, steps, task_ids, hashes, pure.returns, n=cfg.n, workers=cfg.workers, norm=g.norm,
            eps=g.eps, keep_batch=cfg.keep_batch, say=say,
        )
    else:
        if index is None:
            index = _open_index(cfg, say)
        backend = "redis" if cfg.redis_url else "memory"
        ctx = mp.get_context("spawn")
        step_adv = np.full(len(exps), np.nan)
        try:
            with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=ctx) as pool:
                t0 = time.perf_counter()
                pids: set[int] = set()
                for _ in range(20):  # start (and import in) every worker before timing the work
                    pids |= set(pool.map(_ping, range(2 * cfg.workers)))
                    if len(pids) >= cfg.workers:
                        break
                t_workers = time.perf_counter() - t0
                say(f"workers: {len(pids)} processes started in {t_workers:.2f}s")
                t0 = time.perf_counter()
                say(f"index ({backend}): writing {len(steps)} steps")
                if backend == "redis":
                    # trajectory-interleaved shards: the same anchor group is written concurrently
                    traj, _ = encode_keys(task_ids, np.array([e.eid.run for e in exps]))
                    shards = [[s for s, t in zip(steps, traj, strict=True) if t % cfg.workers == w] for w in range(cfg.workers)]
                    list(pool.map(_insert_shard, [index] * cfg.workers, [batch_key] * cfg.workers, shards))
                else:
                    index.insert(batch_key, steps)
                done = index.completed_runs(batch_key)
                incomplete = {t.task_id: done.get(t.task_id, 0) for t in tasks if done.get(t.task_id, 0) != cfg.n}
                if incomplete:
                    raise GiGPOJobError(f"batch {batch_key!r}: tasks with fewer than n={cfg.n} complete runs: {incomplete}")
                t_write = time.perf_counter() - t0
                say(f"index ({backend}): {len(steps)} steps written in {t_write:.2f}s")

                t0 = time.perf_counter()
                say(f"advantages: {cfg.workers} workers querying the index for {len(steps)} step advantages")
                task_code, _ = encode_keys(task_ids)
                futures = []
                for w in range(cfg.workers):
                    rows = np.flatnonzero(task_code % cfg.workers == w)
                    if rows.size == 0:
                        continue
                    futures.append(
                        pool.submit(
                            _query_shard, index, batch_key, rows, task_ids[rows].tolist(), hashes[rows].tolist(),
                            pure.returns[rows], g.norm, g.eps, cfg.n,
                        )
                    )
                for f in futures:
                    rows, adv, _ = f.result()
                    step_adv[rows] = adv
                t_adv = time.perf_counter() - t0
        finally:
            if not cfg.keep_batch:
                try:
                    index.drop(batch_key)
                except Exception as exc:  # noqa: BLE001 - the job's own error matters more
                    say(f"could not drop batch {batch_key!r} from the index: {exc}")
            index.close()

    advantages = pure.episode + g.omega * step_adv
    diff = float(np.max(np.abs(advantages - pure.advantages))) if len(exps) else 0.0
    if not diff <= cfg.check_tol:  # also catches NaN (a row no worker answered)
        raise GiGPOJobError(f"distributed advantages differ from the single-process ones by {diff:.3g} > {cfg.check_tol}")
    say(f"advantages: {cfg.workers} workers in {t_adv:.2f}s, max |diff| vs pure {diff:.2g}")

    last = np.array([e.info.get("last", False) for e in exps])
    sizes = Counter(pure.anchor_ids.tolist())
    result: dict[str, Any] = {
        "algo": "gigpo",
        "env": cfg.env,
        "backend": backend,
        "policy": cfg.policy,
        "workers": cfg.workers,
        "batch_key": batch_key,
        "tasks": len(tasks),
        "trajectories": len(tasks) * cfg.n,
        "steps": len(exps),
        "anchor_groups": len(sizes),
        "anchor_group_fraction": float(np.mean(pure.anchor_sizes > 1)) if len(exps) else 0.0,
        "informative_step_fraction": float(np.mean(step_adv != 0)) if len(exps) else 0.0,
        "group_size_histogram": dict(sorted(Counter(sizes.values()).items())),
        "mean_abs_episode_advantage": float(np.mean(np.abs(pure.episode))) if len(exps) else 0.0,
        "mean_abs_step_advantage": float(np.mean(np.abs(step_adv))) if len(exps) else 0.0,
        "mean_abs_advantage": float(np.mean(np.abs(advantages))) if len(exps) else 0.0,
        "success_rate": float(np.mean([e.metrics["success"] for e, is_last in zip(exps, last, strict=True) if is_last])),
        "invalid_action_rate": float(np.mean([e.info["invalid_action"] for e in exps])),
        "mean_trajectory_length": len(exps) / (len(tasks) * cfg.n),
        "max_abs_diff_vs_pure": diff,
        "timings": {
            "workers_start_s": t_workers,
            "rollout_s": t_rollout,
            "returns_s": t_returns,
            "index_write_s": t_write,
            "advantage_s": t_adv,
            "total_s": time.perf_counter() - t_start,
        },
    }
    if return_experiences:
        for i, e in enumerate(exps):
            e.info["advantage"] = float(advantages[i])
            e.info["episode_advantage"] = float(pure.episode[i])
            e.info["step_advantage"] = float(step_adv[i])
            e.info["return"] = float(pure.returns[i])
        result["experiences"] = exps
    return result
