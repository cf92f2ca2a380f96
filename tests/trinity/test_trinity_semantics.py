"""Semantics through Trinity's registries: every dso_gigpo option reachable and validated, loss modes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from algos.gigpo import InvalidStepError
from orchestrator.trinity.advantage.gigpo_index import DsoGiGPOIndexAdvantageFn
from orchestrator.trinity.advantage.grpo import DsoGRPOAdvantageFn
from orchestrator.trinity.plugin import register

register()


def step(task, run, t, reward, state):
    return TExp(
        eid=EID(batch=0, task=task, run=run, step=t), tokens=[1, 2, 3, 4], prompt_length=2, logprobs=[-0.1, -0.2],
        reward=0.0, info={"model_version": 0, "step_reward": reward, "env_state_hash": state},
    )


def gigpo(**args):
    return ADVANTAGE_FN.get("dso_gigpo")(**args)


# task 0: run 0 has steps with rewards 0, 1 (total 1), run 1 one step with reward 0 (total 0)
EXPS = [step(0, 0, 0, 0.0, "a"), step(0, 0, 1, 1.0, "b"), step(0, 1, 0, 0.0, "c")]


def test_gigpo_refuses_a_misspelt_argument_listing_the_valid_ones():
    with pytest.raises(ValueError, match=r"\['episode_weigting'\].*valid arguments.*'episode_weighting'"):
        gigpo(episode_weigting="step")


def test_gigpo_episode_weighting_step_reachable():
    # step rows' totals 1, 1, 0: mean 2/3 -> A_E = 1/3, 1/3, -2/3 (fnorm none, omega 0)
    res = gigpo(episode_weighting="step", fnorm="none", omega=0.0).compute(EXPS)
    assert res.advantages.tolist() == pytest.approx([1 / 3, 1 / 3, -2 / 3])


def test_gigpo_episode_weighting_trajectory_default():
    # trajectories' totals 1, 0: mean 1/2 -> A_E = 1/2, 1/2, -1/2
    res = gigpo(fnorm="none", omega=0.0).compute(EXPS)
    assert res.advantages.tolist() == pytest.approx([0.5, 0.5, -0.5])


def test_gigpo_singleton_episode_raw_reachable():
    res = gigpo(singleton_episode="raw", fnorm="none", omega=0.0).compute([step(0, 0, 0, 3.0, "a")])
    assert res.advantages.tolist() == [3.0]


def test_gigpo_penalty_timing_reachable_with_the_validity_flag():
    # rewards 0, 1; step 1 invalid (info is_action_valid = False), penalty 0.1, gamma 0.5
    exps = [step(0, 0, 0, 0.0, "a"), step(0, 0, 1, 1.0, "b")]
    exps[1].info["is_action_valid"] = False
    res = gigpo(gamma=0.5, invalid_action_penalty=0.1, penalty_timing="after_returns").compute(exps)
    assert res.returns.tolist() == pytest.approx([0.5, 0.9])


def test_gigpo_refuses_a_dict_state_hash():
    exps = [step(0, 0, 0, 0.0, {"x": 1})]
    with pytest.raises(InvalidStepError, match="env_state_hash.*str or bytes.*dict"):
        gigpo().compute(exps)


def test_gigpo_index_refuses_options_it_cannot_honour():
    with pytest.raises(ValueError, match="singleton_episode"):
        DsoGiGPOIndexAdvantageFn(singleton_episode="raw", redis_url="redis://127.0.0.1:6379/0")


def test_gigpo_index_refuses_masked_members_naming_the_policy_fields():
    exps = [step(0, 0, 0, 1.0, "a"), step(0, 1, 0, 0.0, "a")]
    exps[1].info["dso_masked"] = True
    with pytest.raises(InvalidStepError, match=r"1 steps of members the orchestrator masked.*run 1.*group_validity"):
        DsoGiGPOIndexAdvantageFn(redis_url="redis://127.0.0.1:6379/0").process_sync(exps)


def test_gigpo_index_refuses_unknown_arguments():
    with pytest.raises(ValueError, match=r"\['omgea'\]"):
        DsoGiGPOIndexAdvantageFn(omgea=1.0)


def test_clip_higher_seq_mean_token_mean_through_the_registry():
    # ratio 1, so the per-token loss is -A: sequence 0 has A = 1 on 3 tokens, sequence 1 A = 3 on 1
    # token: per-sequence means -1 and -3 -> -2 (token-mean would give (-3 - 3) / 4 = -1.5)
    fn = POLICY_LOSS_FN.get("dso_clip_higher")(backend="verl", loss_agg_mode="seq-mean-token-mean")
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]])
    loss, _ = fn(logprob=lp, old_log_probs=lp, response_mask=mask, advantages=adv)
    assert loss.item() == pytest.approx(-2.0)


def test_clip_higher_sum_norm_needs_a_length():
    with pytest.raises(ValueError, match="loss_agg_norm_length"):
        POLICY_LOSS_FN.get("dso_clip_higher")(backend="verl", loss_agg_mode="seq-mean-token-sum-norm")


# ------------------------------------------------------------------------- operator and selector (real Ray actor)
import asyncio  # noqa: E402
import types  # noqa: E402
import uuid  # noqa: E402

from orchestrator.core.machine import OrchestratorCore  # noqa: E402
from orchestrator.core.policy import ResamplingPolicy  # noqa: E402
from orchestrator.service.actor import get_or_create_orchestrator  # noqa: E402
from orchestrator.tasks.taskset import IndexTaskSet  # noqa: E402
from orchestrator.trinity.held import read_refs  # noqa: E402
from orchestrator.trinity.operator import OrchestratorOperator  # noqa: E402
from orchestrator.trinity.selector import OrchestratorTaskSelector  # noqa: E402


def texp(batch, task, run, reward, *, index, version=0):
    return TExp(
        eid=EID(batch=batch, task=task, run=run, step=0), tokens=[1, 2, 3, 4], prompt_length=2, logprobs=[-0.1, -0.2],
        reward=reward, info={"model_version": version, "task_index": {"index": index}}, metrics={},
    )


@pytest.fixture
def actor_name(ray_local):
    name = f"dso-sem-{uuid.uuid4().hex[:8]}"
    yield name
    _HANDLES.clear()
    try:
        ray_local.kill(ray_local.get_actor(name, namespace="trinity-dso"))
    except ValueError:
        pass


_HANDLES = []  # a non-detached actor dies with its last handle


def _operator(name, policy, **args):
    _HANDLES.append(get_or_create_orchestrator(policy, IndexTaskSet.of_size(4), name=name, namespace="trinity-dso"))
    return OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy=policy, **args)


def test_operator_drops_an_invalid_group_and_keeps_the_step(actor_name, ray_local):
    # task 0 has a None reward (reject policy): dropped as invalid; task 1 is informative and carried
    op = _operator(actor_name, {"target_groups": 2, "group_size": 2})
    exps = [texp(1, 0, 0, 1.0, index=0), texp(1, 0, 1, None, index=0), texp(1, 1, 0, 1.0, index=1), texp(1, 1, 1, -1.0, index=1)]
    _, m = asyncio.run(op.process(exps))
    stats = ray_local.get(ray_local.get_actor(actor_name, namespace="trinity-dso").get_stats.remote())
    assert m["dso/groups_invalid"] == 1 and m["dso/groups_kept"] == 1
    assert stats.dropped_by_reason["invalid"] == 1 and stats.groups_carried == 1


def test_operator_stamps_a_group_with_its_oldest_member(actor_name, ray_local):
    op = _operator(actor_name, {"target_groups": 2, "group_size": 2})
    table, _, _ = op.to_table([texp(1, 0, 0, 1.0, index=0, version=5), texp(1, 0, 1, -1.0, index=0, version=2)])
    assert table.versions.tolist() == [[5, 2]]
    core = OrchestratorCore(ResamplingPolicy(group_size=2, target_groups=2), ["0"])
    assert core.submit_table(table)[0].model_version == 2


def test_operator_stale_member_of_a_fresh_group_is_caught(actor_name, ray_local):
    # model version 5 seen; members of versions 5 and 2, max_staleness 1: the group is dropped as stale
    op = _operator(actor_name, {"target_groups": 1, "group_size": 2, "max_staleness": 1})
    ray_local.get(ray_local.get_actor(actor_name, namespace="trinity-dso").set_model_version.remote(5))
    out, _ = asyncio.run(op.process([texp(1, 0, 0, 1.0, index=0, version=5), texp(1, 0, 1, -1.0, index=0, version=2)]))
    stats = ray_local.get(ray_local.get_actor(actor_name, namespace="trinity-dso").get_stats.remote())
    assert out == [] and stats.dropped_by_reason["stale"] == 1


def test_operator_frees_the_payload_of_a_carried_group_dropped_as_stale(actor_name, ray_local, tmp_path):
    op = _operator(actor_name, {"target_groups": 2, "group_size": 2, "max_staleness": 1}, held_dir=str(tmp_path))
    _, m1 = asyncio.run(op.process([texp(1, 0, 0, 1.0, index=0), texp(1, 0, 1, -1.0, index=0)]))
    ray_local.get(ray_local.get_actor(actor_name, namespace="trinity-dso").set_model_version.remote(5))
    _, m2 = asyncio.run(op.process([texp(2, 1, 0, 1.0, index=1, version=5), texp(2, 1, 1, -1.0, index=1, version=5)]))
    assert m1["dso/groups_held"] == 1 and m2["dso/groups_held"] == 1  # the stale group's tensors are freed
    asyncio.run(op.close())  # the writes and deletions of the worker thread are done
    assert [read_refs(p) for p in tmp_path.glob("*.held")] == [[f"{op.session}:2/1"]]


def test_selector_signals_exhaustion_with_stop_iteration(actor_name, ray_local):
    config = types.SimpleNamespace(seed=0, kwargs={
        "actor_name": actor_name, "namespace": "trinity-dso",
        "policy": {"target_groups": 1, "group_size": 2, "max_epochs": 1},
    })
    sel = OrchestratorTaskSelector(types.SimpleNamespace(dataset_size=2), config)
    assert sorted(sel.get_indices(2)) == [0, 1]
    with pytest.raises(StopIteration, match="exhausted"):
        sel.get_indices(2)


def test_operator_masked_member_reaches_dso_grpo_with_zero_advantage(actor_name, ray_local):
    # group_validity "mask": run 1 has no reward, the other two (+1, -1) are informative
    policy = {"target_groups": 1, "group_size": 3, "group_validity": "mask", "min_valid_group_size": 2}
    op = _operator(actor_name, policy)
    out, _ = asyncio.run(op.process([texp(1, 0, 0, 1.0, index=0), texp(1, 0, 1, None, index=0), texp(1, 0, 2, -1.0, index=0)]))
    adv, _ = DsoGRPOAdvantageFn().process(out)
    by_run = {e.eid.run: e for e in adv}
    assert by_run[1].info["dso_masked"] is True and by_run[1].advantages.abs().sum().item() == 0.0
    assert by_run[1].reward == 0.0 and by_run[1].info["dso_reward"] is None  # a number for Trinity's trainer
    # the group's baseline is over its two usable members: mean 0, sample std sqrt(2)
    assert by_run[0].advantages[0].item() == pytest.approx(1.0 / (2**0.5 + 1e-6))
    assert by_run[2].advantages[0].item() == pytest.approx(-1.0 / (2**0.5 + 1e-6))


def test_operator_to_table_keeps_a_group_that_lost_a_run_under_mask():
    # 7 of 8 runs (run 3 lost): one row of 8 members, the missing one NaN, then masked by the core
    policy = {"target_groups": 1, "group_size": 8, "group_validity": "mask", "min_valid_group_size": 2}
    op = OrchestratorOperator(actor_name="unused", namespace="trinity-dso", policy=policy)
    exps = [texp(1, 0, r, 1.0 if r % 2 else -1.0, index=0, version=4) for r in range(8) if r != 3]
    table, payload, incomplete = op.to_table(exps)
    assert incomplete == 0 and table.runs.tolist() == [list(range(8))]
    assert np.isnan(table.rewards[0, 3]) and table.versions.tolist() == [[4] * 8]
    assert [e.eid.run for e in payload[table.refs[0]]] == [0, 1, 2, 4, 5, 6, 7]
    row = OrchestratorCore(ResamplingPolicy(**policy), ["0"]).submit_table(table)
    assert row.valid.tolist() == [[True, True, True, False, True, True, True, True]] and row.reasons == ["informative"]


def test_operator_to_table_leaves_out_a_group_that_lost_a_run_under_reject():
    op = OrchestratorOperator(actor_name="unused", namespace="trinity-dso", policy={"target_groups": 1, "group_size": 8})
    table, payload, incomplete = op.to_table([texp(1, 0, r, 1.0, index=0) for r in range(7)])
    assert table is None and payload == {} and incomplete == 1


def test_operator_releases_a_group_that_lost_a_run_with_the_missing_member_masked(actor_name, ray_local):
    # runs 0, 1, 2 (rewards 1, -1, 0) of 4; run 3 lost: the baseline is over the three present,
    # mean 0 and sample std 1
    policy = {"target_groups": 1, "group_size": 4, "group_validity": "mask", "min_valid_group_size": 2}
    op = _operator(actor_name, policy)
    out, m = asyncio.run(op.process([texp(1, 0, r, x, index=0) for r, x in enumerate([1.0, -1.0, 0.0])]))
    assert m["dso/groups_submitted"] == 1 and m["dso/groups_incomplete"] == 0 and m["dso/batches_released"] == 1
    adv, _ = DsoGRPOAdvantageFn().process(out)
    a = 1.0 / (1.0 + 1e-6)
    assert [e.eid.run for e in adv] == [0, 1, 2]
    assert [e.advantages[0].item() for e in adv] == pytest.approx([a, -a, 0.0])
