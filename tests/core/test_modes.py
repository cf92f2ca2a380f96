"""The policy's mode registries (``orchestrator.core.modes``): names refused or accepted, and a
new mode of each kind, one class, taken by the core (hand-computed scenarios, no Ray)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import OrchestratorCore, rollout_lags
from orchestrator.core.modes import (
    GROUP_VALIDITY,
    MODES,
    ON_CAP,
    REPLENISH,
    STALE_MEMBERS,
    GroupValidity,
    OnCap,
    PadOnCap,
    Replenish,
    StaleMembers,
    register_group_validity,
    register_on_cap,
    register_replenish,
    register_stale_members,
)
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group, GroupTable

TASKS = [f"t{i}" for i in range(6)]
MIXED, CORRECT, WRONG = [1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]


def group(task, rewards, versions=None):
    versions = versions or [None] * len(rewards)
    return Group(task_id=task, rollouts=[
        Experience(eid=ExperienceId(task=task, run=i), reward=r, info={} if v is None else {"model_version": v})
        for i, (r, v) in enumerate(zip(rewards, versions))])


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS, seed=0)


@pytest.fixture
def registries():
    """Every registry as it was before the test (a test registers throw-away modes)."""
    before = {field: dict(reg) for field, reg in MODES.items()}
    yield
    for field, reg in MODES.items():
        reg.clear()
        reg.update(before[field])


def test_each_registry_holds_its_built_in_modes():
    assert set(GROUP_VALIDITY) == {"reject", "mask"}
    assert set(STALE_MEMBERS) == {"oldest", "mask"}
    assert set(REPLENISH) == {"fresh_tasks", "same_tasks", "none"}
    assert set(ON_CAP) == {"pad", "partial", "raise"}
    assert set(MODES) == {"selection", "screen", "group_validity", "stale_members", "replenish", "on_cap"}


@pytest.mark.parametrize("field, expected", [
    ("group_validity", "'reject' or 'mask'"),
    ("stale_members", "'oldest' or 'mask'"),
    ("replenish", "'fresh_tasks', 'same_tasks' or 'none'"),
    ("on_cap", "'pad', 'partial' or 'raise'"),
])
def test_an_unknown_mode_is_refused_naming_the_field_and_the_registered_names(field, expected):
    message = f"invalid resampling policy: {field}: Input should be {expected} (got 'bogus')"
    with pytest.raises(InvalidPolicyError, match=f"^{re.escape(message)}$") as err:
        ResamplingPolicy.parse({field: "bogus"})
    assert err.value.errors == [{"loc": [field], "msg": f"Input should be {expected}", "type": "literal_error"}]
    with pytest.raises(InvalidPolicyError, match=re.escape(f"{field}: Input should be {expected} (got 3)")):
        ResamplingPolicy().updated({field: 3})  # a run-time change (REST PATCH, CLI)


def test_a_registered_mode_is_accepted_listed_in_the_refusal_and_in_the_json_schema(registries):
    @register_on_cap
    class NoPad(OnCap):
        name = "test_no_pad"

        def padding(self, core, kept):
            return 0

    assert ResamplingPolicy.parse({"on_cap": "test_no_pad"}).on_cap == "test_no_pad"
    with pytest.raises(InvalidPolicyError, match=re.escape("on_cap: Input should be 'pad', 'partial', 'raise' or 'test_no_pad'")):
        ResamplingPolicy.parse({"on_cap": "bogus"})
    assert ResamplingPolicy.model_json_schema()["properties"]["on_cap"]["enum"] == ["pad", "partial", "raise", "test_no_pad"]


def test_the_built_in_names_are_accepted_as_before():
    p = ResamplingPolicy.parse({"group_validity": "mask", "stale_members": "mask", "replenish": "same_tasks", "on_cap": "raise"})
    assert (p.group_validity, p.stale_members, p.replenish, p.on_cap) == ("mask", "mask", "same_tasks", "raise")


def test_a_registry_refuses_a_second_class_under_a_taken_name_and_a_class_of_another_kind(registries):
    class Other(OnCap):
        name = "pad"

    with pytest.raises(ValueError, match=r"on_cap 'pad' is already registered \(PadOnCap\)"):
        register_on_cap(Other)
    with pytest.raises(TypeError, match="on_cap: .* is not a subclass of OnCap"):
        register_on_cap(Replenish)
    assert register_on_cap(PadOnCap) is PadOnCap and ON_CAP["pad"] is PadOnCap  # the same class again: a no-op


def test_a_new_on_cap_mode_is_selectable_and_closes_the_batch(registries):
    @register_on_cap
    class HalfPad(OnCap):
        name = "test_half_pad"

        def padding(self, core, kept):
            return min((core.policy.target_groups - len(kept)) // 2, len(core.candidates))

    c = core(target_groups=4, on_cap="test_half_pad")
    c.submit([group("t0", MIXED), group("t1", CORRECT), group("t2", CORRECT), group("t3", WRONG)])
    batch = c.close_at_cap()
    # 1 kept, 3 missing: (4 - 1) // 2 = 1 padding group, the most recent candidate (t3); t1, t2 dropped
    assert [g.task_id for g in batch.groups] == ["t0", "t3"] and [g.padding for g in batch.groups] == [False, True]
    assert batch.partial and c.stats().groups_dropped == 2


def test_a_new_group_validity_mode_is_selectable_on_both_routes(registries):
    @register_group_validity
    class Majority(GroupValidity):
        name = "test_majority"

        def min_usable(self, policy, width):
            return width // 2 + 1

        def refusal(self, task, usable, policy, problems):
            return None if 2 * usable > policy.group_size else f"test_majority: task {task!r}: {usable} usable ({problems[0]})"

    nan = float("nan")
    c = core(group_size=4, target_groups=1, group_validity="test_majority")
    kept = group("t0", [1.0, nan, -1.0, 1.0])  # 3 of 4 usable: kept, run 1 masked
    c.submit([kept])
    assert kept.reason == "informative" and kept.valid.tolist() == [True, False, True, True]
    message = "test_majority: task 't1': 2 usable (reward: non-finite value nan in run 1 of task 't1')"
    with pytest.raises(InvalidGroupError, match=re.escape(message)):
        c.submit([group("t1", [1.0, nan, nan, -1.0])])
    rewards = np.array([[1.0, nan, -1.0, 1.0], [1.0, nan, nan, -1.0]])
    table = GroupTable(["t0", "t1"], ["b"] * 2, ["r0", "r1"], np.tile(np.arange(4), (2, 1)), rewards, np.zeros((2, 4), dtype=np.int64))
    checked = c.check_table(table)
    assert checked.errors == {1: message} and checked.rows.valid[0].tolist() == [True, False, True, True]


def test_a_new_stale_members_mode_is_selectable_at_assembly(registries):
    @register_stale_members
    class KeepStale(StaleMembers):
        name = "test_keep_stale"

        def keep(self, core, rows, i, stale):
            return rows.valid[i]

    c = core(group_size=3, target_groups=1, max_staleness=1, stale_members="test_keep_stale")
    c.set_model_version(3)
    c.submit([group("t0", [1.0, -1.0, 1.0], versions=[3, 3, 1])])
    batch = c.try_emit()
    assert rollout_lags(batch).tolist() == [0, 0, 2]  # the member of lag 2 > max_staleness 1 stays


def test_a_new_replenish_mode_is_selectable_for_rounds_hand_outs_and_the_cap(registries):
    @register_replenish
    class NewestFirst(Replenish):
        name = "test_newest_first"

        def rerolls(self, core, take):
            newest = core.dropped_task_ids[::-1]
            core.dropped_task_ids = newest[take:][::-1]
            return newest[:take]

        def capped(self, rounds_started, max_rounds):
            return rounds_started > 1

    c = core(replenish="test_newest_first", max_tasks_per_round=3)
    assert not c.cap_reached() and c.plan_round().purpose == "initial" and not c.cap_reached()
    c.submit([group("t0", CORRECT), group("t1", WRONG)])  # both dropped, in this order
    plan = c.plan_round()
    # keep rate (0 + 1) / (2 + 2) = 0.25: ceil(2 / 0.25) = 8 tasks, 3 at most: t1, t0, then one fresh
    assert plan.purpose == "replenish" and plan.task_ids[:2] == ["t1", "t0"] and len(plan.task_ids) == 3
    assert c.dropped_task_ids == [] and c.cap_reached()  # two rounds started: capped whatever max_replenish_rounds (0)

    d = core(replenish="test_newest_first")
    d.submit([group("t0", CORRECT), group("t1", WRONG), group("t2", WRONG)])
    assert d.next_tasks(2) == ["t2", "t1"] and d.next_tasks(1) == ["t0"] and d.dropped_task_ids == []


def test_the_same_tasks_mode_leaves_out_tasks_in_a_cooldown():
    c = core(replenish="same_tasks", skip_after_all_wrong=1)
    c.submit([group("t0", CORRECT), group("t1", WRONG)])  # t1 all wrong once: cooling down for an epoch
    assert c.next_tasks(1) == ["t0"] and c.dropped_task_ids == []  # t1 left the list: not re-rolled later either
