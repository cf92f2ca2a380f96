"""Groups submitted as columns (``GroupTable``, the Trinity route) against the list route."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import (
    Batch,
    Experience,
    ExperienceId,
    Group,
    GroupTable,
    UnknownTaskError,
    narrow,
    pack_groups,
    packed_keys,
    unpack_groups,
)

TASKS = [f"t{i}" for i in range(8)]


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS, seed=0)


def table(tasks, rewards, runs=None, versions=None, tag="b1", accuracy=None):
    rewards = np.asarray(rewards, dtype=np.float64)
    g, n = rewards.shape
    runs = np.tile(np.arange(n), (g, 1)) if runs is None else np.asarray(runs)
    versions = np.zeros((g, n), dtype=np.int64) if versions is None else np.asarray(versions)
    metrics = {} if accuracy is None else {"accuracy": np.asarray(accuracy, dtype=np.float64)}
    return GroupTable(list(tasks), [tag] * g, [f"ref-{t}" for t in tasks], runs, rewards, versions, metrics)


def as_groups(t: GroupTable) -> list[Group]:
    return [
        Group(task, [Experience(ExperienceId(task, int(run), round_tag=tag), reward=float(r), info={"model_version": int(v)},
                                metrics={k: float(m[i, j]) for k, m in t.metrics.items()})
                     for j, (run, r, v) in enumerate(zip(t.runs[i], t.rewards[i], t.versions[i]))],
              model_version=int(t.versions[i].min()))
        for i, (task, tag) in enumerate(zip(t.task_ids, t.round_tags))
    ]


def test_table_rows_are_classified_in_row_order():
    c = core()
    out = c.submit_table(table(["t0", "t1", "t2"], [[1.0, -1.0], [1.0, 1.0], [-1.0, 1.0]]))
    assert [g.reason for g in out] == ["informative", "all_correct", "informative"]
    assert [g.ref for g in c.try_emit().groups] == ["ref-t0", "ref-t2"]


def test_table_members_are_put_in_run_order():
    c = core(target_groups=1)
    (g,) = c.submit_table(table(["t0"], [[-1.0, 1.0]], runs=[[1, 0]], versions=[[3, 5]]))
    assert g.rewards.tolist() == [1.0, -1.0] and g.versions.tolist() == [5, 3] and g.model_version == 3


def test_table_judges_accuracy_under_auto():
    # rewards differ, accuracy does not: all wrong by accuracy
    c = core()
    (g,) = c.submit_table(table(["t0"], [[0.5, -0.5]], accuracy=[[0.0, 0.0]]))
    assert g.reason == "all_wrong"


def test_table_nan_reward_dropped_as_invalid_naming_run_and_task():
    c = core()
    out = c.submit_table(table(["t0", "t1"], [[1.0, math.nan], [1.0, -1.0]]))
    assert [g.reason for g in out] == ["invalid", "informative"]
    assert c.stats().dropped_by_reason["invalid"] == 1


def test_table_nan_reward_raises_under_raise_and_changes_nothing():
    c = core()
    with pytest.raises(InvalidGroupError, match=r"reward: non-finite value nan in run 1 of task 't0'"):
        c.submit_table(table(["t0", "t1"], [[1.0, math.nan], [1.0, -1.0]]), on_invalid="raise")
    assert c.stats().groups_submitted == 0


def test_table_unknown_task_raises_unknown_task_error():
    with pytest.raises(UnknownTaskError, match="unknown task 'nope'"):
        core().submit_table(table(["nope"], [[1.0, -1.0]]), on_invalid="raise")


def test_table_duplicate_runs_refused():
    with pytest.raises(InvalidGroupError, match=r"eid.run: run ids \[0, 0\] of task 't0'"):
        core().submit_table(table(["t0"], [[1.0, -1.0]], runs=[[0, 0]]), on_invalid="raise")


def test_table_wrong_width_refused():
    with pytest.raises(InvalidGroupError, match="has 3 rollouts, expected group_size=2"):
        core().submit_table(table(["t0"], [[1.0, -1.0, 1.0]]), on_invalid="raise")


def test_table_masks_a_nan_member_under_mask():
    c = core(group_size=3, group_validity="mask", min_valid_group_size=2, target_groups=1)
    (g,) = c.submit_table(table(["t0"], [[1.0, math.nan, -1.0]]))
    assert g.reason == "informative" and g.valid.tolist() == [True, False, True]
    assert c.stats().rollouts_masked == 1


def test_ragged_table_columns_refused_naming_the_field():
    with pytest.raises(InvalidGroupError, match=r"rewards: expected \(1, 2\)"):
        GroupTable(["t0"], ["b"], ["r"], np.array([[0, 1]]), np.array([[1.0, -1.0, 0.0]]), np.array([[0, 0]]))


def test_string_rewards_refused_naming_the_field():
    with pytest.raises(InvalidGroupError, match="rewards: expected"):
        GroupTable(["t0"], ["b"], ["r"], np.array([[0, 1]]), np.array([["1", "2"]]), np.array([[0, 0]]))


def test_table_keys_match_group_keys_of_the_list_route():
    from orchestrator.core.types import group_key

    t = table(["t0", "t1"], [[1.0, -1.0], [1.0, 1.0]], runs=[[1, 0], [0, 1]])
    assert t.keys() == [group_key(g) for g in as_groups(t)]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(TASKS), st.lists(st.sampled_from([1.0, -1.0, 0.5, math.nan]), min_size=3, max_size=3),
                  st.permutations([0, 1, 2]), st.integers(0, 3)),
        min_size=1, max_size=12,
    ),
    st.sampled_from([{}, {"group_validity": "mask", "min_valid_group_size": 2}, {"max_staleness": 1}]),
)
def test_table_route_decides_as_the_list_route(rows, extra):
    # same groups through both routes: same reasons, same batches (task, rewards by run, valid), same stats
    policy = {"group_size": 3, "target_groups": 2, **extra}
    t = table([r[0] for r in rows], [r[1] for r in rows], runs=[r[2] for r in rows], versions=[[r[3]] * 3 for r in rows])
    a, b = core(**policy), core(**policy)
    got_a = [g.reason for g in a.submit_table(t)]
    got_b = [g.reason for g in b.submit(as_groups(t), on_invalid="drop")]
    assert got_a == got_b
    def batches(c):
        return [[(g.task_id, np.nan_to_num(g.rewards, nan=9).tolist(), g.valid.tolist()) for g in batch.groups]
                for batch in iter(c.try_emit, None)]

    assert batches(a) == batches(b)
    assert a.stats() == b.stats()
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(a.state()["history"].values(), b.state()["history"].values()))


def test_held_groups_saved_without_member_columns_are_judged_again_on_load():
    c = core(target_groups=3)
    c.submit([Group("t0", [Experience(ExperienceId("t0", r), reward=x) for r, x in enumerate([1.0, -1.0])])])
    state = c.state_dict()
    for name in ("rewards", "values", "valid", "versions"):  # as a checkpoint written before the columns
        del state["carry"][0][name]
    restored = core(target_groups=3)
    restored.load_state_dict(state)
    g = restored.carry[0]
    assert g.rewards.tolist() == [1.0, -1.0] and g.valid.tolist() == [True, True] and g.size == 2


def same_group(a: Group, b: Group) -> bool:
    cols = ("rewards", "values", "valid", "versions")
    return a._fields() == b._fields() and all(
        (x is None and y is None) or (x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True))
        for x, y in ((getattr(a, c), getattr(b, c)) for c in cols)
    )


def test_packed_groups_come_back_equal_dtypes_included():
    c = core(group_size=3, group_validity="mask", min_valid_group_size=2)
    rewards, accuracy = [[0.9, math.nan, 0.1], [0.2, 0.8, 0.7]], [[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]]
    groups = c.check_table(table(["t0", "t1"], rewards, versions=[[3, 2**40, 1], [0, 1, 2]], accuracy=accuracy)).rows.groups()
    assert groups[1].values.tolist() == [0.0, 1.0, 1.0] and math.isnan(groups[0].values[1])  # judged on accuracy, masked
    assert groups[0].versions.dtype == np.int64
    back = pickle.loads(pickle.dumps(pack_groups(groups)))
    assert all(same_group(a, b) for a, b in zip(groups, unpack_groups(back), strict=True))


def test_packed_groups_of_mixed_widths_and_missing_columns_come_back_equal():
    groups = [Group("t0", size=2, rewards=np.array([1.0, 0.0]), versions=np.array([1, 2])),
              Group("t1", size=3, rewards=np.array([1.0, 0.0, 1.0]), versions=np.array([1, 2, 3], dtype=np.int32)),
              Group("t2", reason="informative", key="k")]
    back = unpack_groups(pickle.loads(pickle.dumps(pack_groups(groups))))
    assert all(same_group(a, b) for a, b in zip(groups, back, strict=True)) and unpack_groups(pack_groups([])) == []


def test_packed_keys_are_the_groups_keys_in_order():
    groups = [Group("t0", key="b"), Group("t1", key="a"), Group("t0", key="c")]
    assert packed_keys(pack_groups(groups)) == ["b", "a", "c"]
    assert packed_keys(pack_groups([])) == [] and packed_keys(()) == []


def test_a_batch_of_256_groups_of_16_pickles_under_rays_inline_limit():
    rng = np.random.default_rng(0)
    tasks = [f"t{i % 8}" for i in range(256)]
    groups = core(group_size=16).check_table(table(tasks, rng.choice([-1.0, 1.0], size=(256, 16)))).rows.groups()
    batch = Batch(0, groups)
    blob = pickle.dumps(batch)
    back = pickle.loads(blob)
    assert len(blob) < 100 * 1024 and all(same_group(a, b) for a, b in zip(groups, back.groups, strict=True))


def test_a_sealed_batch_unpickles_to_the_groups_it_had_when_sealed():
    rng = np.random.default_rng(1)
    groups = core(group_size=4).check_table(table(["t0", "t1", "t2"], rng.choice([-1.0, 1.0], size=(3, 4)))).rows.groups()
    batch = Batch(7, groups, rounds=2)
    batch.seal()
    groups[0].reason = "changed after the seal"
    back = pickle.loads(pickle.dumps(batch))
    assert back.batch_id == 7 and back.rounds == 2 and back.groups[0].reason == ""
    assert all(same_group(a, b) for a, b in zip(groups[1:], back.groups[1:], strict=True))



@pytest.mark.parametrize(("values", "dtype", "narrowed"), [
    ([0, 15], np.int64, np.int8),
    ([-129, 5], np.int64, np.int16),
    ([0, 2**31 - 1], np.int64, np.int32),
    ([0, 2**31], np.int64, np.int64),
    ([1.0, -1.0, 0.5, -0.0, math.nan, math.inf], np.float64, np.float32),
    ([0.1], np.float64, np.float64),
    ([1e39], np.float64, np.float64),
])
def test_narrow_takes_the_smallest_dtype_that_keeps_every_bit(values, dtype, narrowed):
    col = np.array(values, dtype=dtype)
    small = narrow(col)
    assert small.dtype == narrowed
    assert small.astype(dtype).tobytes() == col.tobytes()


def test_a_table_of_256_groups_of_16_with_a_metric_crosses_ray_in_under_48_kb():
    rng = np.random.default_rng(3)
    correct = rng.random((256, 16)) < 0.5
    t = GroupTable([f"t{i}" for i in range(256)], ["r"] * 256, [f"0:{i}" for i in range(256)], np.tile(np.arange(16), (256, 1)),
                   np.where(correct, 1.0, -1.0), np.zeros((256, 16), dtype=np.int64), {"accuracy": correct.astype(float)})
    assert len(pickle.dumps(t)) < 48 * 1024
