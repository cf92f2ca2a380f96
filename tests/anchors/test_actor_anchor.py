"""The orchestrator's anchor index: creation, spec, completion, stats, drop and expiry run by
the orchestrator; workers reach Redis or the memory index's own Ray actor directly; on real Ray
and real Redis.

Batches use gamma = 0.5 and 0/1 rewards, so every return and shifted sum is a dyadic rational:
float additions are exact in any order, and concurrent writers must give *bit-identical*
advantages to a single in-process index. Against the two-pass pure function the index agrees
to 1e-9 (a different, one-pass formula). Lifecycle tests use the actor body in process
(``Orchestrator`` is usable without Ray; its memory index is then in process too); the
concurrency tests run it as a Ray actor, whose memory index is served by its own actor.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
import uuid

import numpy as np
import pytest
import ray

from algos.gigpo import GiGPOConfig, gigpo_advantages
from orchestrator.anchors.index import AnchorIndexError, AnchorStep
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.owner import AnchorIndexNotConfiguredError, anchor_index_from_spec, orchestrator_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.anchors.remote import RemoteAnchorIndex
from orchestrator.rollout.scripted import ScriptedTasks
from orchestrator.service.actor import Orchestrator, get_or_create_orchestrator
from orchestrator.service.metrics import DSOMetrics

POLICY = {"target_groups": 2, "group_size": 4}
TASKS = [f"task-{i}" for i in range(6)]


def make_batch(tasks=4, runs=4, max_len=8, seed=0):
    """Random step rows (0/1 rewards, 3 states per task) and AnchorSteps with the pure returns."""
    rng = np.random.default_rng(seed)
    rows = [
        (f"task-{t}", run, s, float(rng.integers(0, 2)), f"h{int(rng.integers(0, 3))}")
        for t in range(tasks)
        for run in range(runs)
        for s in range(int(rng.integers(1, max_len + 1)))
    ]
    tk, rn, st, rw, hs = (np.array(c) for c in zip(*rows))
    out = gigpo_advantages(tk, rn, st, rw, hs, config=GiGPOConfig(gamma=0.5, norm="std"))
    last: dict = {}
    for t, r, s in zip(tk, rn, st):
        last[(t, r)] = max(last.get((t, r), -1), int(s))
    steps = [
        AnchorStep(str(t), int(r), int(s), str(h), float(R), last=int(s) == last[(t, r)])
        for t, r, s, h, R in zip(tk, rn, st, hs, out.returns)
    ]
    return steps, out


def query(index, batch_key, steps, **kw):
    return index.step_advantages(batch_key, [s.task for s in steps], [s.state_hash for s in steps], [s.ret for s in steps], **kw)


def single_process(batch_key, steps, **kw):
    idx = MemoryAnchorIndex()
    idx.insert(batch_key, steps)
    return query(idx, batch_key, steps, **kw)


def metric_value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert m, f"{name} not in exposition"
    return float(m.group(1))


def orch(anchor_index=None, **kw) -> Orchestrator:
    return Orchestrator(POLICY, ScriptedTasks(TASKS), anchor_index=anchor_index, **kw)


# --------------------------------------------------------------------------- workers (Ray tasks)

# Ray workers cannot import this test module: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
def insert_worker(spec: dict, batch_key: str, steps: list, start_at: float) -> int:
    """Open the index from the spec (Redis, or the memory index's actor) and insert in chunks."""
    index = anchor_index_from_spec(spec)
    time.sleep(max(0.0, start_at - time.time()))  # both workers start together
    for lo in range(0, len(steps), 5):
        index.insert(batch_key, steps[lo : lo + 5])
    index.close()
    return os.getpid()


@ray.remote(num_cpus=0)
def query_worker(spec: dict, batch_key: str, steps: list, n_runs: int) -> np.ndarray:
    index = anchor_index_from_spec(spec)
    try:
        return query(index, batch_key, steps, n_runs=n_runs)
    finally:
        index.close()


def run_two_workers(actor, batch_key, steps, runs):
    """Trajectory-interleaved shards (every anchor group written by both), queried per task."""
    spec = ray.get(actor.anchor_spec.remote())
    shards = [[s for s in steps if s.run % 2 == w] for w in range(2)]
    start = time.time() + 1.0
    pids = ray.get([insert_worker.remote(spec, batch_key, shard, start) for shard in shards])
    by_task = [[i for i, s in enumerate(steps) if int(s.task.split("-")[1]) % 2 == w] for w in range(2)]
    parts = ray.get([query_worker.remote(spec, batch_key, [steps[i] for i in rows], runs) for rows in by_task])
    adv = np.full(len(steps), np.nan)
    for rows, part in zip(by_task, parts):
        adv[rows] = part
    return pids, adv


# --------------------------------------------------------------------------- creation and spec


def test_memory_index_is_created_from_an_empty_config():
    o = orch({})
    assert isinstance(o.anchors.anchor, MemoryAnchorIndex)
    assert o.anchor_spec() == {"backend": "memory", "ttl_s": 6 * 3600.0}


def test_redis_spec_names_url_prefix_and_ttl(redis_url, redis_namespace):
    o = orch({"redis_url": redis_url, "prefix": redis_namespace, "ttl_s": 60})
    spec = o.anchor_spec()
    guard = spec.pop("guard")
    assert spec == {"backend": "redis", "redis_url": redis_url, "prefix": redis_namespace, "ttl_s": 60.0}
    assert len(guard) == 32 and int(guard, 16) >= 0  # the run's guard key value (a uuid4 hex)
    idx = anchor_index_from_spec(spec)
    assert isinstance(idx, RedisAnchorIndex) and idx.prefix == redis_namespace


def test_without_an_anchor_index_the_calls_say_how_to_configure_it():
    with pytest.raises(AnchorIndexNotConfiguredError, match="anchor_index"):
        orch().anchor_stats()


def test_bad_anchor_settings_are_refused_at_construction():
    with pytest.raises(ValueError, match="ttl_s"):
        orch({"ttl_s": 0})
    with pytest.raises(ValueError, match="max_age_versions"):
        orch({"max_age_versions": -1})


def test_memory_spec_without_the_actor_is_refused():
    with pytest.raises(ValueError, match="actor"):
        anchor_index_from_spec({"backend": "memory", "ttl_s": 1.0})


# --------------------------------------------------------------------------- queries (memory)


def test_memory_queries_of_the_orchestrators_index_equal_the_pure_function():
    steps, out = make_batch(seed=1)
    o = orch({})
    assert o.anchors.anchor.insert("b", steps) == len(steps)
    adv = o.anchors.anchor.step_advantages("b", [s.task for s in steps], [s.state_hash for s in steps], [s.ret for s in steps], n_runs=4)
    np.testing.assert_allclose(adv, out.step, rtol=0, atol=1e-9)


def test_insert_accepts_field_dicts_and_duplicates_are_no_ops():
    steps, _ = make_batch(tasks=1, runs=2, seed=2)
    o = orch({})
    o.anchors.anchor.insert("b", [s.__dict__ for s in steps])
    assert o.anchors.anchor.insert("b", steps) == 0
    assert o.anchor_stats()["entries"] == len(steps)


# --------------------------------------------------------------------------- completion


def test_task_completes_only_when_every_run_has_its_last_step():
    # two runs of task-0: run 0 = steps 0, 1 (last); run 1 = steps 0, 1, 2 (last)
    s = [AnchorStep("task-0", 0, 0, "a", 0.5), AnchorStep("task-0", 0, 1, "b", 1.0, last=True),
         AnchorStep("task-0", 1, 0, "a", 0.0), AnchorStep("task-0", 1, 2, "c", 0.0, last=True)]
    o = orch({})
    o.anchors.anchor.insert("b", s)
    assert o.anchors.anchor.completed_runs("b") == {"task-0": 1}  # run 1 misses step 1
    assert not o.anchors.anchor.is_complete("b", "task-0", 2)
    o.anchors.anchor.insert("b", [AnchorStep("task-0", 1, 1, "b", 0.0)])
    assert o.anchors.anchor.is_complete("b", "task-0", 2)
    assert not o.anchors.anchor.is_complete("b", "task-0", 3)


# --------------------------------------------------------------------------- stats, drop, metrics


def test_stats_count_steps_groups_and_feed_the_entries_gauge():
    # task-0: states a (2 steps), b (1); task-1: state a (1): 4 steps, 3 anchor groups
    s = [AnchorStep("task-0", 0, 0, "a", 1.0, last=True), AnchorStep("task-0", 1, 0, "a", 0.0),
         AnchorStep("task-0", 1, 1, "b", 0.0, last=True), AnchorStep("task-1", 0, 0, "a", 1.0, last=True)]
    metrics = DSOMetrics()
    o = orch({}, metrics=metrics)
    o.anchor_register("b")
    o.anchors.anchor.insert("b", s)
    st = o.anchor_stats()
    assert (st["batches"], st["entries"], st["groups"], st["group_size_histogram"]) == (1, 4, 3, {1: 2, 2: 1})
    assert st["tracked_batches"] == {"b": 0}
    assert metric_value(metrics.exposition(), "dso_anchor_index_entries") == 3.0


def test_drop_forgets_the_batch_and_records_its_group_sizes():
    s = [AnchorStep("task-0", 0, 0, "a", 1.0, last=True), AnchorStep("task-0", 1, 0, "a", 0.0),
         AnchorStep("task-0", 1, 1, "b", 0.0, last=True)]
    metrics = DSOMetrics()
    o = orch({}, metrics=metrics)
    o.anchor_register("b")
    o.anchors.anchor.insert("b", s)
    assert o.anchor_drop("b") == 3
    assert o.anchor_stats()["batches"] == 0 and o.anchor_stats()["tracked_batches"] == {}
    with pytest.raises(AnchorIndexError, match="unknown"):
        o.anchors.anchor.step_advantages("b", ["task-0"], ["a"], [1.0])
    text = metrics.exposition()
    assert metric_value(text, "dso_anchor_group_size_count") == 2  # groups a (size 2), b (size 1)
    assert metric_value(text, "dso_anchor_group_size_sum") == 3


def test_redis_operations_of_the_actor_are_timed_by_op(redis_url, redis_namespace):
    metrics = DSOMetrics()
    o = orch({"redis_url": redis_url, "prefix": redis_namespace}, metrics=metrics)
    o.anchors.anchor.insert("b", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True)])
    o.anchor_stats()
    o.anchor_drop("b")
    text = metrics.exposition()
    for op in ("insert", "stats", "delete"):
        assert metric_value(text, f'dso_redis_op_duration_seconds_count{{op="{op}"}}') >= 1
    assert metric_value(text, 'dso_redis_op_errors_total{op="insert"}') == 0


# --------------------------------------------------------------------------- expiry


def test_batches_older_than_max_age_versions_are_dropped_when_the_version_advances():
    o = orch({"max_age_versions": 1})
    o.anchor_register("v0")  # opened at version 0
    o.anchors.anchor.insert("v0", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True)])
    asyncio.run(o.set_model_version(1))
    o.anchor_register("v1")
    o.anchors.anchor.insert("v1", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True)])
    assert sorted(o.anchor_stats()["tracked_batches"]) == ["v0", "v1"]  # 0 >= 1 - 1: kept
    asyncio.run(o.set_model_version(2))
    st = o.anchor_stats()
    assert st["tracked_batches"] == {"v1": 1} and st["batches"] == 1


def test_without_max_age_versions_only_the_ttl_expires_batches():
    o = orch({})
    o.anchor_register("v0")
    o.anchors.anchor.insert("v0", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True)])
    asyncio.run(o.set_model_version(50))
    assert o.anchor_expire() == [] and o.anchor_stats()["batches"] == 1
    assert o.anchor_expire(max_age_versions=10) == ["v0"]


def test_registered_redis_batch_is_expired_and_its_keys_deleted(redis_url, redis_namespace):
    import redis

    o = orch({"redis_url": redis_url, "prefix": redis_namespace, "max_age_versions": 0})
    o.anchor_register("w", model_version=3)  # a worker writes "w" to Redis directly
    RedisAnchorIndex(redis_url, prefix=redis_namespace).insert("w", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True)])
    asyncio.run(o.set_model_version(4))  # the expiry runs on the actor's Redis executor, in the background
    wait_until(lambda: o.anchor_stats()["tracked_batches"] == {})
    client = redis.Redis.from_url(redis_url)
    assert [k for k in client.scan_iter(match=f"{redis_namespace}:{{w}}*")] == []


def test_tracked_batches_survive_a_restart_from_the_checkpoint(redis_url, redis_namespace, tmp_path):
    cfg = {"redis_url": redis_url, "prefix": redis_namespace, "max_age_versions": 0}
    path = str(tmp_path / "state.json")
    first = orch(cfg, checkpoint_path=path)
    first.anchor_register("b")
    first.anchors.anchor.insert("b", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True)])
    second = orch(cfg, checkpoint_path=path)
    assert second.anchor_stats()["tracked_batches"] == {"b": 0}
    asyncio.run(second.set_model_version(1))
    wait_until(lambda: second.anchor_stats()["batches"] == 0)  # expired in the background


def wait_until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


# --------------------------------------------------------------------------- concurrent workers on Ray


@pytest.fixture
def make_actor(ray_local):
    handles = []

    def make(anchor_index, name=None):
        name = name or f"dso-anchor-{uuid.uuid4().hex[:8]}"
        h = get_or_create_orchestrator(POLICY, ScriptedTasks(TASKS), anchor_index=anchor_index, name=name)
        handles.append(h)
        return h

    yield make
    for h in handles:
        ray.kill(h)


def test_two_ray_workers_on_the_actors_memory_index_get_the_pure_advantages(make_actor):
    steps, out = make_batch(tasks=4, runs=4, seed=3)
    actor = make_actor({})
    index = orchestrator_anchor_index(actor)
    assert isinstance(index, RemoteAnchorIndex)
    pids, adv = run_two_workers(actor, "b", steps, runs=4)
    assert len(set(pids)) == 2
    np.testing.assert_array_equal(adv, single_process("b", steps))
    np.testing.assert_allclose(adv, out.step, rtol=0, atol=1e-9)
    assert index.completed_runs("b") == {f"task-{t}": 4 for t in range(4)}


def test_the_memory_index_is_served_by_its_own_named_actor(make_actor):
    name = f"dso-anchor-{uuid.uuid4().hex[:8]}"
    spec = ray.get(make_actor({}, name=name).anchor_spec.remote())
    assert spec == {"backend": "memory", "ttl_s": 6 * 3600.0, "actor": f"{name}-anchors", "namespace": "trinity-dso"}
    served = ray.get_actor(f"{name}-anchors", namespace="trinity-dso")
    assert ray.get(served.stats.remote())["backend"] == "memory"


def test_group_sizes_of_the_actors_memory_index_come_from_its_actor(make_actor):
    # states a (runs 0, 1) and b (run 1) of task-0: sizes 1, 2
    index = orchestrator_anchor_index(make_actor({}))
    index.insert("b", [AnchorStep("task-0", 0, 0, "a", 1.0, last=True), AnchorStep("task-0", 1, 0, "a", 0.0),
                       AnchorStep("task-0", 1, 1, "b", 0.0, last=True)])
    assert index.group_sizes("b").tolist() == [1, 2]


def test_two_ray_workers_on_redis_via_the_spec_get_the_pure_advantages(make_actor, redis_url, redis_namespace):
    steps, out = make_batch(tasks=4, runs=4, seed=4)
    actor = make_actor({"redis_url": redis_url, "prefix": redis_namespace})
    ray.get(actor.anchor_register.remote("b"))
    pids, adv = run_two_workers(actor, "b", steps, runs=4)
    assert len(set(pids)) == 2
    np.testing.assert_array_equal(adv, single_process("b", steps))
    np.testing.assert_allclose(adv, out.step, rtol=0, atol=1e-9)
    st = ray.get(actor.anchor_stats.remote())
    assert st["entries"] == len(steps) and st["tracked_batches"] == {"b": 0}
    assert ray.get(actor.anchor_drop.remote("b")) == len(steps)
    assert ray.get(actor.anchor_stats.remote())["batches"] == 0


# --------------------------------------------------------------------------- the GiGPO job through the actor


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_gigpo_job_runs_through_the_actors_index(make_actor, request, backend):
    from orchestrator.jobs.gigpo import GiGPOJobConfig, run_gigpo_job

    cfg = {}
    if backend == "redis":
        cfg = {"redis_url": request.getfixturevalue("redis_url"), "prefix": request.getfixturevalue("redis_namespace")}
    actor = make_actor(cfg)
    res = run_gigpo_job(GiGPOJobConfig(tasks=3, n=4, max_steps=6, workers=2, seed=1), orchestrator=actor)
    assert res["backend"] == backend and res["steps"] > 0
    assert res["max_abs_diff_vs_pure"] <= 1e-9  # the job also raises beyond check_tol
    st = ray.get(actor.anchor_stats.remote())
    assert st["batches"] == 0 and st["tracked_batches"] == {}  # dropped through the actor


# --------------------------------------------------------------------------- waiting for complete groups


def test_a_wait_through_the_actor_is_woken_by_the_insert_that_completes_the_group(ray_local):
    import threading

    from orchestrator.anchors.index import trajectory_records
    from orchestrator.anchors.remote import serve_memory_index

    index = serve_memory_index(f"dso-wait-{uuid.uuid4().hex[:8]}", "trinity-dso", ttl_s=60)
    steps, _ = make_batch(seed=3)
    tasks = sorted({s.task for s in steps})

    def records(part):
        states = sorted({s.state_hash for s in part})
        return trajectory_records(
            [tasks.index(s.task) for s in part], tasks, [s.run for s in part], [s.step for s in part],
            [states.index(s.state_hash) for s in part], states, [s.ret for s in part],
        )

    receipt = index.insert_trajectories("b", records([s for s in steps if s.run < 3]))
    assert receipt.done == dict.fromkeys(tasks, 3)
    t0 = time.monotonic()
    with pytest.raises(AnchorIndexError, match=r"fewer than 4 complete trajectories.*'task-0': 3"):
        index.wait_complete("b", tasks, 4, 1.5)  # two slices of the actor's wait, then the error
    assert time.monotonic() - t0 >= 1.5
    timer = threading.Timer(0.3, index.insert_trajectories, ("b", records([s for s in steps if s.run == 3])))
    timer.start()
    t0 = time.monotonic()
    index.wait_complete("b", tasks, 4, 30.0)
    assert 0.25 <= time.monotonic() - t0 < 5.0  # woken by the insert, not at the end of a slice
    timer.join()
    np.testing.assert_allclose(query(index, "b", steps, n_runs=4), single_process("b", steps, n_runs=4), rtol=0, atol=1e-12)
