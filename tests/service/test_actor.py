"""The orchestrator as a real Ray actor on a local Ray runtime, with a scripted rollout source."""

import numpy as np
import pytest
import ray

from orchestrator.core.policy import InvalidPolicyError
from orchestrator.core.types import Group, UnknownTaskError
from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks
from orchestrator.service.actor import PolicyConflictError, get_or_create_orchestrator
from orchestrator.service.sink import SQLiteSink

MIXED, WRONG = [1.0, -1.0], [-1.0, -1.0]
TASKS = [f"t{i}" for i in range(6)]


@pytest.fixture
def actor(ray_local, tmp_path, request):
    # t0, t1, t2 informative; t3, t4, t5 all wrong.
    script = {t: [MIXED] for t in TASKS[:3]} | {t: [WRONG] for t in TASKS[3:]}
    handle = get_or_create_orchestrator(
        {"target_groups": 2, "group_size": 2, "max_replenish_rounds": 4},
        ScriptedTasks(TASKS),
        ScriptedRolloutSource(script),
        sink=SQLiteSink(tmp_path / "buffer.db"),
        checkpoint_path=str(tmp_path / "state.json"),
        name=f"dso-test-{request.node.name}",
    )
    yield handle
    ray.kill(handle)


def test_next_batch_is_full_and_written_to_sink(actor, tmp_path):
    batch = ray.get(actor.next_batch.remote())
    assert len(batch.groups) == 2 and not batch.partial
    assert all(g.reason == "informative" for g in batch.groups)
    rows = SQLiteSink(tmp_path / "buffer.db").read_batch(0)
    assert len(rows) == 4
    # each informative group is [1, -1]: advantages +-1/sqrt(2) (unbiased std sqrt(2), eps 1e-6)
    assert sorted(round(r["advantage"], 5) for r in rows) == [-0.70711, -0.70711, 0.70711, 0.70711]


def test_actor_found_by_name(actor, request):
    same = ray.get_actor(f"dso-test-{request.node.name}", namespace="trinity-dso")
    assert ray.get(same.ping.remote()) == "ok"


def test_stats_account_for_every_group(actor):
    ray.get(actor.next_batch.remote())
    ray.get(actor.next_batch.remote())
    s = ray.get(actor.get_stats.remote())
    assert s.batches_emitted == 2 and s.groups_emitted == 4
    assert s.groups_submitted == s.groups_emitted + s.groups_padded + s.groups_dropped + s.groups_held


def test_policy_change_and_stale_revision(actor):
    got = ray.get(actor.set_policy.remote({"target_groups": 3}, expected_revision=0))
    assert got["revision"] == 1 and got["policy"]["target_groups"] == 3
    with pytest.raises(PolicyConflictError, match="expected 0 but the policy is at revision 1"):
        ray.get(actor.set_policy.remote({"target_groups": 4}, expected_revision=0))
    with pytest.raises(InvalidPolicyError, match="target_groups"):
        ray.get(actor.set_policy.remote({"target_groups": -1}))
    assert ray.get(actor.get_policy.remote())["policy"]["target_groups"] == 3


def test_paused_replenish_runs_no_round(actor):
    ray.get(actor.set_policy.remote({"target_groups": 6, "min_keep_rate": 1.0, "replenish_paused": True}))
    assert ray.get(actor.next_batch.remote(timeout_s=0.5)) is None
    s = ray.get(actor.get_stats.remote())
    assert s.replenish_rounds == 0 and s.groups_submitted == 6  # only the initial round ran


def test_unknown_task_history(actor):
    with pytest.raises(UnknownTaskError, match="unknown task 'zz'"):
        ray.get(actor.task_history.remote("zz"))


def test_restart_resumes_from_checkpoint(ray_local, tmp_path):
    script = {t: [MIXED] for t in TASKS}
    kwargs = dict(checkpoint_path=str(tmp_path / "s.json"), name="dso-restart")
    policy = {"target_groups": 2, "group_size": 2}
    a = get_or_create_orchestrator(policy, ScriptedTasks(TASKS), ScriptedRolloutSource(script), **kwargs)
    ray.get(a.next_batch.remote())  # plans ceil(2 / 0.5) = 4 tasks: 2 emitted, 2 carried
    before = ray.get(a.get_stats.remote())
    ray.kill(a)
    b = get_or_create_orchestrator(policy, ScriptedTasks(TASKS), ScriptedRolloutSource(script), **kwargs)
    assert ray.get(b.get_stats.remote()) == before
    batch = ray.get(b.next_batch.remote())
    assert batch.batch_id == 1 and ray.get(b.get_stats.remote()).groups_submitted == 4  # the carried pair, no new round
    ray.kill(b)


def test_submit_experiences_groups_by_task_and_round(actor):
    from orchestrator.core.types import Experience, ExperienceId

    exps = [
        Experience(eid=ExperienceId(task="t0", run=r, round_tag=b), reward=v)
        for b, rewards in (("x", MIXED), ("y", WRONG))
        for r, v in enumerate(rewards)
    ]
    assert ray.get(actor.submit_experiences.remote(exps)) == ["informative", "all_wrong"]


def test_sink_database_file_alone_holds_written_batches(tmp_path):
    import shutil
    import sqlite3

    from orchestrator.core.types import Batch
    from orchestrator.rollout.scripted import ScriptedRolloutSource as Src

    sink = SQLiteSink(tmp_path / "b.db")
    group = Src(default=MIXED).generate([ScriptedTasks(["t0"]).get("t0")], 2)[0]
    sink.write(Batch(batch_id=0, groups=[group]))
    shutil.copy(tmp_path / "b.db", tmp_path / "copy.db")  # the main file only, no -wal
    rows = sqlite3.connect(tmp_path / "copy.db").execute("SELECT COUNT(*) FROM experiences").fetchone()
    assert rows == (2,)


def test_restart_mid_epoch_restores_estimates_and_selection_exactly(ray_local, tmp_path):
    import json

    from orchestrator.core.machine import OrchestratorCore
    from orchestrator.core.policy import ResamplingPolicy

    tasks = [f"u{i}" for i in range(12)]
    # varied pass rates: some always mixed, some all wrong, some all correct, some alternating
    patterns = [[MIXED], [WRONG], [[1.0, 1.0]], [MIXED, WRONG]]
    script = {t: patterns[i % 4] for i, t in enumerate(tasks)}
    path = tmp_path / "s.json"
    kwargs = dict(checkpoint_path=str(path), name="dso-restart-informative", seed=3)
    policy = {"target_groups": 3, "group_size": 2, "selection": "informative"}
    a = get_or_create_orchestrator(policy, ScriptedTasks(tasks), ScriptedRolloutSource(script), **kwargs)
    ray.get(a.next_batch.remote())
    ray.get(a.set_model_version.remote(2))
    ray.get(a.select_tasks.remote(1))  # a top-up pick: the selection stands mid-epoch
    before = ray.get(a.state_dict.remote())
    assert before["selections"]["informative"]["picks"] % len(tasks) != 0
    ray.kill(a)
    b = get_or_create_orchestrator(policy, ScriptedTasks(tasks), ScriptedRolloutSource(script), **kwargs)
    assert ray.get(b.state_dict.remote()) == before
    # the restarted actor plans exactly what the saved state plans
    reference = OrchestratorCore(ResamplingPolicy.parse(policy), tasks, seed=3)
    # planning reads only how many groups are held: stand-ins of their tasks do
    held = {k: Group(k.split("\x1f")[0], size=2, rewards=np.zeros(2), values=np.zeros(2), valid=np.ones(2, dtype=bool),
                     versions=np.zeros(2, dtype=np.int64)) for k in before["carry"] + before["candidates"]}
    reference.load_state_dict(json.loads(json.dumps(before)), groups=held)
    assert ray.get(b.plan_round.remote()) == reference.plan_round()
    row = ray.get(b.task_history.remote("u1"))
    assert row.estimate.seen == (before["history"]["groups"][1] > 0)
    ray.kill(b)


def test_the_actor_process_freezes_its_start_up_heap_out_of_collections(actor):
    frozen = ray.get(actor.__ray_call__.remote(lambda self: __import__("gc").get_freeze_count()))
    assert frozen > 10_000  # the imports alone (torch, Ray) are far more objects
