"""Semantics through the real Ray actor and the REST service: end of data, invalid groups, multi-turn, config checks."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import ray

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import DataExhaustedError
from orchestrator.core.policy import InvalidPolicyError
from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks
from orchestrator.rollout.source import OverlongConfig, SamplingConfig
from orchestrator.service.actor import Orchestrator, get_or_create_orchestrator

MIXED, WRONG = [1.0, -1.0], [-1.0, -1.0]


@pytest.fixture
def ending_actor(ray_local, request):
    # 3 informative tasks, one epoch, batches of 2: one full batch, then a last partial one of 1
    handle = get_or_create_orchestrator(
        {"target_groups": 2, "group_size": 2, "max_epochs": 1, "on_cap": "partial"},
        ScriptedTasks(["t0", "t1", "t2"]),
        ScriptedRolloutSource({t: [MIXED] for t in ("t0", "t1", "t2")}),
        name=f"dso-end-{request.node.name}",
    )
    yield handle
    ray.kill(handle)


def test_end_of_data_emits_the_last_partial_batch(ending_actor):
    first = ray.get(ending_actor.next_batch.remote())
    last = ray.get(ending_actor.next_batch.remote())
    assert len(first.groups) == 2 and not first.partial
    assert len(last.groups) == 1 and last.partial


def test_after_the_last_batch_next_batch_says_exhausted(ending_actor):
    ray.get(ending_actor.next_batch.remote())
    ray.get(ending_actor.next_batch.remote())
    with pytest.raises(DataExhaustedError, match="exhausted: no task left .*max_epochs=1"):
        ray.get(ending_actor.next_batch.remote())
    assert ray.get(ending_actor.exhausted.remote()) is True


def test_direct_api_stays_all_or_nothing(ending_actor):
    good = Group("t0", [Experience(ExperienceId("t0", r), reward=v) for r, v in enumerate(MIXED)])
    bad = Group("t1", [Experience(ExperienceId("t1", 0), reward=1.0), Experience(ExperienceId("t1", 1), reward=float("nan"))])
    with pytest.raises(InvalidGroupError, match="non-finite value nan in run 1 of task 't1'"):
        ray.get(ending_actor.submit_groups.remote([good, bad]))
    assert ray.get(ending_actor.get_stats.remote()).groups_submitted == 0


def test_submit_experiences_judges_multi_turn_trajectories(ending_actor):
    # run 0: 3 steps (0, 0, 1) -> outcome 1; run 1: 1 step (1) -> outcome 1: all correct, 2 rollouts
    exps = [Experience(ExperienceId("t0", 0, step=k), reward=r) for k, r in enumerate([0.0, 0.0, 1.0])]
    exps.append(Experience(ExperienceId("t0", 1), reward=1.0))
    assert ray.get(ending_actor.submit_experiences.remote(exps)) == ["all_correct"]
    assert ray.get(ending_actor.get_stats.remote()).rollouts_initial == 2


def test_judge_the_source_does_not_produce_is_refused_at_construction():
    with pytest.raises(InvalidPolicyError, match=r"filter.judge: ScriptedRolloutSource produces metrics \['accuracy', 'response_length'\], not 'acc'"):
        Orchestrator({"group_size": 2, "filter": {"judge": "acc"}}, ScriptedTasks(["t0"]), ScriptedRolloutSource({}))


def test_judge_the_source_does_not_produce_is_refused_at_run_time():
    orch = Orchestrator({"group_size": 2}, ScriptedTasks(["t0"]), ScriptedRolloutSource({}))
    with pytest.raises(InvalidPolicyError, match="filter.judge"):
        asyncio.run(orch.set_policy({"filter": {"judge": "acc"}}))
    assert orch.get_policy()["policy"]["filter"]["judge"] == "auto"


def test_overlong_budget_below_the_ramp_is_refused():
    # ramp starts at 20 - 4 = 16 tokens; a 16-token budget never reaches it
    with pytest.raises(ValueError, match=r"max_tokens \(16\) must be > .*\(20 - 4 = 16\)"):
        SamplingConfig(max_tokens=16, overlong=OverlongConfig(max_response_length=20, cache_length=4))


def test_rest_stats_report_exhaustion(dso_service):
    handle = dso_service.orchestrator({"target_groups": 1, "group_size": 2, "max_epochs": 1}, {"t0": [MIXED]})
    ray.get(handle.next_batch.remote())
    headers = {"Authorization": f"Bearer {dso_service.token}"} if dso_service.token else {}
    got = httpx.get(f"{dso_service.url}/v1/stats", headers=headers, timeout=30).json()
    assert got["exhausted"] is True and got["last_batch"]["coverage"] == 1.0


def test_sink_keeps_a_masked_member_out_of_the_baseline(tmp_path):
    # valid rewards 1, -1, 3: mean 1, centred 0, -2, 2, sample std 2 -> 0, -2 / (2 + eps), 2 / (2 + eps); the NaN member 0
    from orchestrator.core.types import Batch
    from orchestrator.service.sink import SQLiteSink

    rollouts = [Experience(ExperienceId("t0", r), reward=v) for r, v in enumerate([1.0, float("nan"), -1.0, 3.0])]
    rollouts[1].info.update(dso_masked="invalid", dso_loss_weight=0.0)
    sink = SQLiteSink(tmp_path / "b.db")
    sink.write(Batch(batch_id=0, groups=[Group("t0", rollouts)]))
    adv = [row["advantage"] for row in sink.read_batch(0)]
    assert adv == pytest.approx([0.0, 0.0, -2 / (2 + 1e-6), 2 / (2 + 1e-6)], abs=1e-12)


def test_status_table_lists_the_last_batch_under_its_titles():
    from rich.console import Console

    from orchestrator.cli.service import status_table
    from orchestrator.core.machine import OrchestratorCore
    from orchestrator.core.policy import ResamplingPolicy

    core = OrchestratorCore(ResamplingPolicy(target_groups=1, group_size=2), ["t0"])
    core.submit([Group("t0", [Experience(ExperienceId("t0", r), reward=v) for r, v in enumerate(MIXED)])])
    core.try_emit()
    console = Console(width=200, record=True)
    console.print(status_table(core.stats().model_dump(mode="json")))
    text = console.export_text()
    assert "batch coverage (trained / generated rollouts)" in text and "data exhausted" in text


def test_status_table_rounds_the_numbers_inside_a_record():
    from rich.console import Console

    from orchestrator.cli.service import status_table

    stats = {"last_round": {"tasks": 4, "predicted_keep_rate": 0.8186837193328665, "realised_keep_rate": 0.75}}
    console = Console(width=200, record=True)
    console.print(status_table(stats))
    text = console.export_text()
    assert "tasks 4, predicted_keep_rate 0.8187, realised_keep_rate 0.75" in text and "0.81868" not in text
