"""The validation layer at the boundary: bad groups are refused with field, task and value named."""

import json

import numpy as np
import pytest

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group, UnknownTaskError

TASKS = ["t0", "t1"]


def group(task="t0", rewards=(1.0, -1.0), **kw):
    rollouts = [Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)]
    return Group(task_id=task, rollouts=rollouts, **kw)


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS)


def with_rollout(**changes):
    g = group()
    for k, v in changes.items():
        setattr(g.rollouts[1], k, v)
    return g


BAD = [
    (with_rollout(reward=1e308), r"reward: \|1e\+308\| exceeds max_abs_reward=1e\+06 in run 1 of task 't0'"),
    (with_rollout(reward="1"), r"rollouts\.1\.reward: expected a Python int or float, got builtins.str \(got '1'\) in group of task 't0'"),
    (with_rollout(metrics={"acc": np.float32(1.0)}), r"rollouts\.1\.metrics\.acc: .*got numpy.float32 \(got np.float32\(1.0\)\) in group of task 't0'"),
    (with_rollout(metrics={"acc": np.int64(1)}), r"rollouts\.1\.metrics\.acc: .*task 't0'"),
    (with_rollout(info=["not", "a", "dict"]), r"rollouts\.1\.info: .*task 't0'"),
    (with_rollout(tokens=[1, -2]), r"rollouts\.1\.tokens\.1: Input should be greater than or equal to 0 \(got -2\)"),
    (with_rollout(logprobs=[float("nan")]), r"rollouts\.1\.logprobs: NaN in run 1 of task 't0'"),
    (with_rollout(logprobs=[np.float32(-0.5)]), r"rollouts\.1\.logprobs: expected Python floats, got \['float32'\]"),
    (with_rollout(tokens=[1, np.int64(2)]), r"rollouts\.1\.tokens\.1: Input should be a valid integer"),
    (group(model_version=-1), r"model_version: Input should be greater than or equal to 0 \(got -1\) in group of task 't0'"),
    (group(model_version=2**63), r"model_version: Input should be less than or equal to 2147483647"),
    (group(model_version="3"), r"model_version: expected a Python int or float, got builtins.str \(got '3'\)"),
]


@pytest.mark.parametrize("index", range(len(BAD)))
def test_bad_group_refused_naming_field_task_and_value(index):
    bad, match = BAD[index]
    c = core()
    before = json.dumps(c.state_dict())
    with pytest.raises(InvalidGroupError, match=match):
        c.submit([group("t1"), bad])
    assert json.dumps(c.state_dict()) == before  # all or nothing


def test_oversize_task_id_is_cut_in_the_message():
    huge = "x" * 1_000_000
    with pytest.raises(InvalidGroupError) as err:
        core().submit([group(huge)])
    assert "task_id: String should have at most 1024 characters" in str(err.value)
    assert len(str(err.value)) < 400


def test_unknown_long_task_id_is_cut_in_the_message():
    with pytest.raises(UnknownTaskError) as err:
        core().task_stats("y" * 5000)
    assert len(str(err.value)) < 200 and "'yyyy" in str(err.value)


def test_numpy_float64_metric_is_a_float_and_accepted():
    g = group()
    for r in g.rollouts:
        r.metrics = {"acc": np.float64(r.reward > 0)}
    assert [x.reason for x in core().submit([g])] == ["informative"]


@pytest.mark.parametrize("version", [-1, 2**40, "7", 1.5, True])
def test_model_version_out_of_range_refused(version):
    with pytest.raises(ValueError, match="model_version: expected an integer"):
        core().set_model_version(version)


@pytest.mark.parametrize("changes", [{"min_keep_rate": float("nan")}, {"filter": {"std_tol": float("inf")}},
                                     {"filter": {"band": (0.0, float("inf"))}}, {"max_abs_reward": float("inf")}])
def test_policy_refuses_non_finite_numbers(changes):
    with pytest.raises(InvalidPolicyError, match="finite number"):
        ResamplingPolicy().updated(changes)
