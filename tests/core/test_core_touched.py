"""The rows a change wrote (:meth:`OrchestratorCore.touched_rows`): the state store compares only
these with its last commit, so a row written and not reported would be lost on resume."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import GroupTable
from tests.core.test_core_properties import OPS, TASKS, N, apply

MORE_OPS = st.one_of(
    OPS,
    st.tuples(st.just("table"), st.lists(st.tuples(st.sampled_from(TASKS), st.sampled_from([-1.0, 1.0]), st.integers(0, 2)),
                                         min_size=1, max_size=4)),
    st.tuples(st.just("next_tasks"), st.integers(1, 4)),
    st.tuples(st.just("selection"), st.sampled_from(["epoch", "informative"])),
)


def columns(core: OrchestratorCore) -> dict[str, np.ndarray]:
    """Bit-level copies of every per-task column of the core's state, by path."""
    s = core.state()
    cols = {f"history.{k}": v for k, v in s["history"].items()} | {f"passrate.{k}": v for k, v in s["passrate"].items()}
    cols["selections.informative.last_pick"] = s["selections"]["informative"]["last_pick"]
    return {k: v.view(f"u{v.dtype.itemsize}").copy() for k, v in cols.items()}


def run_op(core: OrchestratorCore, op: str, arg) -> None:
    if op == "table":  # one group per row, all runs but the first correct when its reward is 1
        rewards = np.array([[r] + [1.0] * (N - 1) for _, r, _ in arg])
        core.submit_table(GroupTable([t for t, _, _ in arg], ["r"] * len(arg), [str(i) for i in range(len(arg))],
                                     np.tile(np.arange(N), (len(arg), 1)), rewards, np.array([[v] * N for _, _, v in arg])))
    elif op == "next_tasks":
        core.next_tasks(arg)
    elif op == "selection":
        core.set_policy(core.policy.updated({"selection": arg}))
    else:
        apply(core, op, arg)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MORE_OPS, max_size=25))
def test_every_row_a_change_writes_is_reported(ops):
    policy = ResamplingPolicy(target_groups=2, group_size=N, skip_after_all_correct=1, skip_after_all_wrong=2,
                              selection="informative", passrate_trained_discount=0.5)
    core = OrchestratorCore(policy, TASKS)
    assert core.touched_rows() is None  # a new core: any row
    before = columns(core)
    for op, arg in ops:
        run_op(core, op, arg)
        after = columns(core)
        touched = set(core.touched_rows().tolist())
        for name, col in after.items():
            changed = set(np.flatnonzero(col != before[name]).tolist())
            assert changed <= touched, (op, name, changed - touched)
        before = after


def test_a_restored_core_reports_any_row():
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=N), TASKS)
    core.touched_rows()
    core.load_state_dict(core.state_dict())
    assert core.touched_rows() is None
    assert core.touched_rows().tolist() == []


def predictor_columns(core: OrchestratorCore) -> dict[str, np.ndarray]:
    s = core.state()["selections"]["pass_predictor"]
    return {k: s[k].view(f"u{s[k].dtype.itemsize}").copy() for k in ("successes", "failures", "version", "last_drawn")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(OPS, st.tuples(st.just("next_tasks"), st.integers(1, 4))), max_size=20))
def test_every_row_the_pass_predictor_writes_is_reported(ops):
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=N, selection="pass_predictor"), TASKS)
    core.touched_rows()
    before = predictor_columns(core)
    for op, arg in ops:
        run_op(core, op, arg)
        after = predictor_columns(core)
        touched = set(core.touched_rows().tolist())
        for name, col in after.items():
            changed = set(np.flatnonzero(col != before[name]).tolist())
            assert changed <= touched, (op, name, changed - touched)
        before = after
