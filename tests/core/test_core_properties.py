"""Property tests (hypothesis) of the state machine: the accounting invariant under random operation
sequences, and a state_dict round trip that changes nothing."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.core.machine import OrchestratorCore, ReplenishCapError
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group

TASKS = [f"t{i}" for i in range(6)]
N = 3
REWARDS = st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=N, max_size=N)
OPS = st.one_of(
    st.tuples(st.just("submit"), st.lists(st.tuples(st.sampled_from(TASKS), REWARDS, st.integers(0, 4)), max_size=5)),
    st.tuples(st.just("plan"), st.none()),
    st.tuples(st.just("emit"), st.none()),
    st.tuples(st.just("close"), st.sampled_from(["pad", "partial", "raise"])),
    st.tuples(st.just("target"), st.integers(1, 5)),
    st.tuples(st.just("version"), st.integers(0, 6)),
    st.tuples(st.just("staleness"), st.one_of(st.none(), st.integers(0, 3))),
)


def group(task, rewards, version):
    return Group(task_id=task, model_version=version,
                 rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def apply(core: OrchestratorCore, op: str, arg) -> int:
    """Run one operation; returns the groups it emitted or padded in a batch."""
    out = 0
    if op == "submit":
        core.submit([group(*g) for g in arg])
    elif op == "plan":
        core.plan_round()
    elif op == "emit":
        batch = core.try_emit()
        out = len(batch.groups) if batch else 0
    elif op == "close":
        core.set_policy(core.policy.updated({"on_cap": arg}))
        try:
            out = len(core.close_at_cap().groups)
        except ReplenishCapError:
            pass
    elif op == "target":
        core.set_policy(core.policy.updated({"target_groups": arg}))
    elif op == "version":
        core.set_model_version(arg)
    elif op == "staleness":
        core.set_policy(core.policy.updated({"max_staleness": arg}))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, max_size=30))
def test_every_group_is_emitted_padded_dropped_or_held(ops):
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=N), TASKS)
    released = 0
    for op, arg in ops:
        released += apply(core, op, arg)
        s = core.stats()
        assert s.groups_submitted == s.groups_emitted + s.groups_padded + s.groups_dropped + s.groups_held
        assert released == s.groups_emitted + s.groups_padded
        assert s.groups_held == len(core.carry) + len(core.candidates) and s.groups_carried <= s.groups_held


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS, max_size=20))
def test_state_dict_round_trip_is_exact(ops):
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=N), TASKS)
    for op, arg in ops:
        apply(core, op, arg)
    state = core.state_dict()
    copy = OrchestratorCore(ResamplingPolicy(), TASKS)
    copy.load_state_dict(json.loads(json.dumps(state)))
    assert copy.stats() == core.stats() and copy.state_dict() == state
