"""Held groups as columns (``GroupRows``): taking, joining, packing and sealing rows."""

import math
import pickle

import numpy as np
import pytest

from orchestrator.core.machine import OrchestratorCore, rollout_lags
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.rows import GroupRows
from orchestrator.core.types import Batch, Experience, ExperienceId, Group, GroupTable, pack_groups

TASKS = [f"t{i}" for i in range(6)]


def core(**policy) -> OrchestratorCore:
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 3, **policy}), TASKS)


def checked_rows(rewards, tasks=("t0", "t1", "t2"), versions=None) -> GroupRows:
    rewards = np.asarray(rewards, dtype=np.float64)
    g, n = rewards.shape
    versions = np.zeros((g, n), dtype=np.int64) if versions is None else np.asarray(versions)
    t = GroupTable(list(tasks), ["r"] * g, [f"ref-{x}" for x in tasks], np.tile(np.arange(n), (g, 1)), rewards, versions)
    return core(group_size=n).check_table(t).rows


def test_take_by_slice_mask_and_row_numbers_keeps_the_rows_asked_for_in_order():
    rows = checked_rows([[1, -1, 1], [1, 1, 1], [-1, -1, 1]])
    assert rows.take(slice(1, None)).task_ids == ["t1", "t2"]
    assert rows.take(np.array([True, False, True])).refs == ["ref-t0", "ref-t2"]
    picked = rows.take([2, 0])
    assert picked.task_ids == ["t2", "t0"] and picked.rewards.tolist() == [[-1, -1, 1], [1, -1, 1]]
    assert picked.task_index.tolist() == [2, 0]


def test_concat_puts_the_second_rows_after_the_first_and_skips_empty_ones():
    rows = checked_rows([[1, -1, 1], [1, 1, 1], [-1, -1, 1]])
    joined = GroupRows.concat(rows.take([1]), rows.take([0, 2]))
    assert joined.task_ids == ["t1", "t0", "t2"] and joined.valid.shape == (3, 3)
    empty = GroupRows.empty(3)
    assert GroupRows.concat(empty, rows) is rows and GroupRows.concat(rows, empty) is rows and len(empty) == 0


def test_a_row_as_a_group_has_the_rows_fields_and_columns():
    rows = checked_rows([[1, -1, 1], [1, 1, 1], [-1, -1, 1]], versions=[[3, 2, 5], [0, 0, 0], [1, 1, 1]])
    g = rows[0]
    assert (g.task_id, g.ref, g.model_version, g.size) == ("t0", "ref-t0", 2, 3)
    assert g.rewards.tolist() == [1, -1, 1] and g.versions.tolist() == [3, 2, 5]
    assert [x.task_id for x in rows] == ["t0", "t1", "t2"] and rows[-1].task_id == "t2"
    with pytest.raises(TypeError, match="take"):
        rows[0:2]


def test_rows_pack_byte_for_byte_as_the_groups_made_of_them():
    # a NaN member (values differ from rewards), integer rewards that narrow, and a list-route row with rollouts
    rows = checked_rows([[1, math.nan, 1], [0.5, 0.25, 1], [-1, -1, 1]], versions=[[0, 0, 0], [300, 1, 2], [0, 0, 0]])
    rows.keys = ["k0", "k1", "k2"]
    rollouts = [Experience(ExperienceId("t3", run), tokens=[1, 2], reward=1.0) for run in range(3)]
    listed = Group("t3", rollouts, 4, "replenish", 2, "informative", False, "k3", "", 3, np.ones(3), np.ones(3),
                   np.ones(3, dtype=bool), np.full(3, 4, dtype=np.int64))
    rows = GroupRows.concat(rows, GroupRows.from_groups([listed], np.array([3])))
    assert pickle.dumps(rows.pack()) == pickle.dumps(pack_groups(rows.groups()))
    assert pickle.dumps(rows.take([3, 1]).pack()) == pickle.dumps(pack_groups(rows.take([3, 1]).groups()))


def test_a_batch_of_rows_seals_as_the_batch_of_their_groups():
    rows = checked_rows([[1, -1, 1], [1, 1, 1], [-1, -1, 1]])
    from_rows, from_groups = Batch(4, rows, rounds=1), Batch(4, rows.groups(), rounds=1)
    from_rows.seal()
    from_groups.seal()
    assert pickle.dumps(from_rows) == pickle.dumps(from_groups)
    back = pickle.loads(pickle.dumps(from_rows))
    assert [g.task_id for g in back.groups] == ["t0", "t1", "t2"] and back.rounds == 1


def test_a_batch_reads_its_columns_without_making_its_groups():
    rows = checked_rows([[1, -1, 1], [1, 1, 1], [-1, -1, 1]])
    rows.padding = [False, True, False]
    batch = Batch(0, rows)
    versions, padding = batch.columns("versions", "padding")
    assert padding.tolist() == [False, True, False] and versions.shape == (3, 3) and batch.num_padding == 1
    assert batch._groups is None  # nothing made yet
    assert [v.tolist() for v in Batch(0, rows.groups()).columns("padding")] == [[False, True, False]]


def test_an_empty_batch_has_no_lags_whether_made_of_rows_or_of_groups():
    assert rollout_lags(Batch(0, GroupRows.empty(3))).tolist() == [] and rollout_lags(Batch(0, [])).tolist() == []
