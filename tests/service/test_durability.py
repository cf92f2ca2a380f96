"""Exactly-once emission and recovery from the state file, in-process (no Ray): the actor body
(:class:`Orchestrator`) on a real SQLite file, restarted by building it again on the same file."""

import asyncio
import os
import pickle
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from algos.dapo import InvalidGroupError
from orchestrator.core.types import Experience, ExperienceId, Group, GroupTable, unpack_groups
from orchestrator.rollout.scripted import ScriptedTasks
from orchestrator.service.actor import Orchestrator
from orchestrator.service.sink import SQLiteSink
from orchestrator.service.store import Change, StateStore

TASKS = [f"t{i}" for i in range(8)]
POLICY = {"target_groups": 2, "group_size": 2}
MIXED, WRONG = [1.0, -1.0], [-1.0, -1.0]


def group(task, rewards=MIXED, tag="r0", tokens=()):
    rollouts = [Experience(eid=ExperienceId(task=task, run=i, round_tag=tag), reward=r, tokens=list(tokens),
                           logprobs=[-0.5] * len(tokens)) for i, r in enumerate(rewards)]
    return Group(task_id=task, rollouts=rollouts)


def orch(tmp_path, **kw):
    return Orchestrator(POLICY, ScriptedTasks(TASKS), sink=SQLiteSink(tmp_path / "run.db"), **kw)


def run(coro):
    return asyncio.run(coro)


def invariant(s):
    return s.groups_submitted == s.groups_emitted + s.groups_padded + s.groups_dropped + s.groups_held


def test_retried_submit_counts_each_group_once(tmp_path):
    o = orch(tmp_path)
    first = run(o.submit_groups([group("t0"), group("t1", WRONG)]))
    again = run(o.submit_groups([group("t0"), group("t1", WRONG), group("t2")]))  # a retry plus one new group
    assert first == ["informative", "all_wrong"] and again == ["informative", "all_wrong", "informative"]
    s = o.get_stats()
    assert s.groups_submitted == 3 and s.batches_emitted == 1 and invariant(s)


def test_a_task_twice_in_one_round_is_two_groups(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0"), group("t0", WRONG)]))
    assert o.get_stats().groups_submitted == 2
    run(o.submit_groups([group("t0"), group("t0", WRONG)]))  # the same call again: a retry
    assert o.get_stats().groups_submitted == 2


def test_a_task_three_times_in_one_table_is_three_groups_and_a_retry_adds_none(tmp_path):
    o = orch(tmp_path)
    table = lambda: GroupTable(["t0", "t1", "t0", "t0"], ["r0"] * 4, ["a", "b", "c", "d"],  # noqa: E731
                               np.tile(np.arange(2), (4, 1)), np.array([MIXED, WRONG, WRONG, MIXED]), np.zeros((4, 2), dtype=np.int64))
    first = run(o.submit_groups(table()))
    assert first.tolist() == ["informative", "all_wrong", "all_wrong", "informative"]
    assert o.get_stats().groups_submitted == 4
    again = run(o.submit_groups(table()))  # the same call again: a retry, each row recognised by its own key
    assert again.tolist() == first.tolist() and o.get_stats().groups_submitted == 4


def test_ready_batches_and_held_groups_survive_a_restart(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t, tokens=range(5)) for t in TASKS[:5]]))  # 2 batches ready, 1 group carried
    before = o.get_stats()
    o2 = orch(tmp_path)  # "restart": a new actor body on the same file
    assert o2.get_stats() == before
    assert [run(o2.pop_batch()).batch_id for _ in range(2)] == [0, 1] and run(o2.pop_batch()) is None
    assert [g.task_id for g in o2.core.carry] == ["t4"] and o2.core.carry[0].rollouts[0].tokens == [0, 1, 2, 3, 4]
    # handed out is committed too
    assert run(orch(tmp_path).pop_batch()) is None
    assert SQLiteSink(tmp_path / "run.db").batch_ids() == [0, 1]


def test_state_holds_ids_not_payloads(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0", tokens=range(20_000))]))
    db = sqlite3.connect(tmp_path / "run.db")
    parts = dict(db.execute("SELECT name, value FROM dso_parts"))
    assert pickle.loads(parts["carry"]) == ["t0\x1fr0\x1f0,1"] and sum(map(len, parts.values())) < 5_000
    (held,) = db.execute("SELECT held FROM dso_log").fetchone()
    assert len(held) > 20_000 * 2  # the tokens live in the log row of the commit that accepted the group


def test_one_log_row_per_commit_whatever_its_groups(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t, WRONG) for t in TASKS[:6]]))  # 6 groups, 2 kept as padding candidates
    rows = sqlite3.connect(tmp_path / "run.db").execute("SELECT seen, held FROM dso_log").fetchall()
    assert len(rows) == 1
    keys, labels = pickle.loads(rows[0][0])
    assert keys == [f"t{i}\x1fr0\x1f0,1" for i in range(6)] and labels == ["all_wrong"] * 6


def test_emitted_groups_payload_released(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0", tokens=range(50)), group("t1", tokens=range(50))]))
    rows = sqlite3.connect(tmp_path / "run.db").execute("SELECT seen, held IS NULL FROM dso_log").fetchall()
    assert [(sorted(zip(*pickle.loads(seen))), cleared) for seen, cleared in rows] == [
        ([("t0\x1fr0\x1f0,1", "informative"), ("t1\x1fr0\x1f0,1", "informative")], 1)
    ]


def test_a_log_row_keeps_its_payload_until_its_last_group_leaves(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t) for t in TASKS[:3]]))  # one batch of 2 out, t2 carried: its row stays
    db = sqlite3.connect(tmp_path / "run.db")
    assert db.execute("SELECT held IS NULL FROM dso_log").fetchall() == [(0,)]
    o2 = orch(tmp_path)  # the row still holds t0 and t1, emitted: only t2 is held again
    assert [g.task_id for g in o2.core.held_groups()] == ["t2"]
    run(o2.submit_groups([group("t3")]))  # t2 leaves in the next batch: the row is cleared
    assert db.execute("SELECT held IS NULL FROM dso_log ORDER BY seq").fetchall() == [(1,), (1,)]
    assert [g.task_id for g in run(o2.pop_batch()).groups] == ["t0", "t1"]
    assert [g.task_id for g in run(o2.pop_batch()).groups] == ["t2", "t3"]


def test_rejected_submit_changes_nothing_on_disk(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0")]))
    db = sqlite3.connect(tmp_path / "run.db")
    before = db.execute("SELECT seq, state FROM dso_state").fetchone()
    bad = group("t1")
    bad.rollouts[1].metrics = {"x": np.float32(0.5)}  # json.dumps cannot store it
    with pytest.raises(InvalidGroupError, match=r"rollouts\.1\.metrics\.x: expected a Python int or float, got numpy\.float32"):
        run(o.submit_groups([group("t2"), bad]))
    assert db.execute("SELECT seq, state FROM dso_state").fetchone() == before


def test_failed_commit_goes_back_to_the_last_commit(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0")]))
    before = o.get_stats()
    # a foreign row holding batch id 0 makes the sink insert of the next batch fail
    sink = SQLiteSink(tmp_path / "run.db")
    sink._db.execute("INSERT INTO batches VALUES (0, 0, 0, 0, 0, 0, 0.0)")
    with pytest.raises(sqlite3.IntegrityError):
        run(o.submit_groups([group("t1")]))
    after = o.get_stats()
    assert after.errors["commit"] == 1 and after.last_error["kind"] == "commit"  # the failure is visible
    assert after.model_copy(update={"errors": before.errors, "last_error": None}) == before and o.ready.batches == []
    assert orch(tmp_path).get_stats() == before


def test_a_failed_first_commit_leaves_nothing_the_next_commit_relies_on(tmp_path):
    o = orch(tmp_path)
    sink = SQLiteSink(tmp_path / "run.db")
    sink._db.execute("INSERT INTO batches VALUES (0, 0, 0, 0, 0, 0, 0.0)")  # the first commit's batch 0 fails
    with pytest.raises(sqlite3.IntegrityError):
        run(o.submit_groups([group("t0"), group("t1")]))
    sink._db.execute("DELETE FROM batches")
    run(o.submit_groups([group("t0")]))
    restored = orch(tmp_path).core.state_dict()
    assert restored["history"] == o.core.state_dict()["history"] and o.core.history.groups[0] == 1


def test_a_held_group_is_written_as_it_was_when_its_commit_was_prepared(tmp_path):
    o = orch(tmp_path)
    prepare = o.commits._prepare

    def prepare_then_change():  # the event loop goes on changing groups while the commit is written
        write, done = prepare()
        o.core.carry.reasons[:] = ["stale"] * len(o.core.carry)  # the held rows' own list, in place
        return write, done

    o.commits._prepare = prepare_then_change
    run(o.submit_groups([group("t0")]))
    assert [g.reason for g in orch(tmp_path).core.carry] == ["informative"]


def test_a_padding_candidate_is_written_without_the_flags_of_a_later_release(tmp_path):
    o = orch(tmp_path)
    prepare = o.commits._prepare

    def prepare_then_pad():  # the candidate is released as padding while its commit is written
        write, done = prepare()
        if o.core.candidates:
            o.core.close_at_cap()
        return write, done

    o.commits._prepare = prepare_then_pad
    run(o.submit_groups([group("t0"), group("t1", WRONG)]))
    (candidate,) = orch(tmp_path).core.candidates  # restarted from that commit: held, not yet released
    assert [r.info for r in candidate.rollouts] == [{}, {}]


CRASH_IN_COMMIT = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, os.getcwd())
    import orchestrator.service.store as store
    from tests.service.test_durability import orch, group
    from pathlib import Path
    o = orch(Path(sys.argv[1]))
    real = store.pickle.dumps
    def die(*a, **k):  # the ready batch and the state are pickled after the sink's rows: die in the window
        if o.store.sink._db.in_transaction and o.store.sink._db.execute("SELECT COUNT(*) FROM batches").fetchone()[0]:
            os._exit(9)
        return real(*a, **k)
    store.pickle.dumps = die
    asyncio.run(o.submit_groups([group("t1"), group("t2")]))
""")


def test_crash_between_sink_write_and_state_commit_loses_and_duplicates_nothing(tmp_path):
    run(orch(tmp_path).submit_groups([group("t0", WRONG)]))
    proc = subprocess.run([sys.executable, "-c", CRASH_IN_COMMIT, str(tmp_path)], cwd=os.getcwd(), env=os.environ)
    assert proc.returncode == 9
    o = orch(tmp_path)  # restarted: neither the batch nor the groups were committed
    assert SQLiteSink(tmp_path / "run.db").batch_ids() == [] and o.get_stats().groups_submitted == 1
    assert run(o.submit_groups([group("t1"), group("t2")])) == ["informative", "informative"]  # the caller's retry
    assert run(o.pop_batch()).batch_id == 0 and SQLiteSink(tmp_path / "run.db").batch_ids() == [0]
    assert invariant(o.get_stats())


def test_task_columns_are_written_by_changed_rows_and_restored_exactly(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0")]))
    db = sqlite3.connect(tmp_path / "run.db", isolation_level=None)
    db.execute("DELETE FROM dso_column_changes")  # only what the next commit writes
    run(o.submit_groups([group("t3", tag="r1")]))
    rows = {name: np.frombuffer(idx, dtype=np.int32).tolist()
            for name, idx in db.execute("SELECT name, rows FROM dso_column_changes")}
    assert rows["history.groups"] == [TASKS.index("t3")] and rows["history.rollouts"] == [TASKS.index("t3")]
    restored = orch(tmp_path).core.state_dict()
    assert restored["history"] == o.core.state_dict()["history"]
    assert restored["passrate"] == o.core.state_dict()["passrate"]


def test_staged_columns_are_copies_taken_when_staged(tmp_path):
    # the core hands the store its own arrays: what a commit writes is what they held when staged
    store = StateStore(tmp_path / "s.db")
    live = {"history": {"groups": np.array([1, 2, 3]), "mean": np.array([0.5, 0.0, 0.0])}}
    store.commit(Change(*store.stage(live)))  # both columns written whole
    live["history"]["groups"][2] = 7
    small, columns = store.stage(live)
    assert list(columns.rows) == ["history.groups"] and columns.whole == {}
    live["history"]["groups"][:] = 0  # changed again before the commit is written
    live["history"]["mean"][:] = 9.0
    store.commit(Change(small, columns))
    saved = StateStore(tmp_path / "s.db").load().state["history"]
    assert saved["groups"].tolist() == [1, 2, 7] and saved["mean"].tolist() == [0.5, 0.0, 0.0]


def test_column_changes_of_older_files_with_int64_rows_are_replayed(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0")]))
    db = sqlite3.connect(tmp_path / "run.db", isolation_level=None)
    rows = [TASKS.index("t5"), TASKS.index("t6")]
    db.execute("INSERT INTO dso_column_changes VALUES (?, ?, ?, ?)",
               (o.store.seq, "history.groups", np.array(rows, dtype=np.int64).tobytes(), np.array([7, 9], dtype=np.int64).tobytes()))
    assert orch(tmp_path).core.history.groups[rows].tolist() == [7, 9]


def test_concurrent_submits_are_committed_when_they_return_and_share_commits(tmp_path):
    o = orch(tmp_path)

    async def eight():
        return await asyncio.gather(*(o.submit_groups([group(t, WRONG, tag=f"c{i}")]) for i, t in enumerate(TASKS)))

    assert run(eight()) == [["all_wrong"]] * 8
    assert orch(tmp_path).get_stats().groups_submitted == 8  # every acknowledged submit is on disk
    assert o.store.seq < 8  # submits made while a commit was written waited for one shared commit


def test_submit_and_pop_returns_the_labels_and_every_ready_batch_committed(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t) for t in TASKS[:2]]))  # batch 0 ready, not handed out
    labels, batches = run(o.submit_and_pop([group(t) for t in TASKS[2:7]] + [group("t7", WRONG)]))
    assert labels == ["informative"] * 5 + ["all_wrong"]
    assert [(b.batch_id, [g.task_id for g in b.groups]) for b in batches] == [(0, ["t0", "t1"]), (1, ["t2", "t3"]), (2, ["t4", "t5"])]
    o2 = orch(tmp_path)  # the hand-outs were committed with the groups
    assert run(o2.pop_batch()) is None and [g.task_id for g in o2.core.carry] == ["t6"]


def test_rejected_submit_and_pop_hands_nothing_out(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t) for t in TASKS[:2]]))
    bad = group("t3", [1.0, float("nan")])
    with pytest.raises(InvalidGroupError, match=r"reward: non-finite value nan in run 1 of task 't3'"):
        run(o.submit_and_pop([group("t2"), bad]))
    assert run(orch(tmp_path).pop_batch()).batch_id == 0


def test_a_file_of_the_earlier_layout_resumes_and_clears_its_payloads(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t) for t in TASKS[:3]]))  # a batch of 2 ready, t2 carried
    before = o.get_stats()
    # rewrite the file as the earlier layout kept it: the whole small state in dso_state, one
    # dso_groups row per accepted group (its payload while held)
    db = sqlite3.connect(tmp_path / "run.db", isolation_level=None)
    state = {name: pickle.loads(value) for name, value in db.execute("SELECT name, value FROM dso_parts")}
    rows, held_keys = [], set(state["carry"] + state["candidates"])
    for seen, held in db.execute("SELECT seen, held FROM dso_log").fetchall():
        payloads = {g.key: pickle.dumps(g) for g in unpack_groups(pickle.loads(held)) if g.key in held_keys} if held else {}
        rows += [(k, label, payloads.get(k)) for k, label in zip(*pickle.loads(seen))]
    db.execute("UPDATE dso_state SET state = ?", (pickle.dumps(state),))
    db.executemany("INSERT INTO dso_groups VALUES (?, ?, ?)", rows)
    db.execute("DELETE FROM dso_parts")
    db.execute("DELETE FROM dso_log")
    assert db.execute("SELECT COUNT(*) FROM dso_groups WHERE payload IS NOT NULL").fetchone() == (1,)
    o2 = orch(tmp_path)
    assert o2.get_stats() == before and [g.task_id for g in o2.core.carry] == ["t2"]
    run(o2.submit_groups([group("t0")]))  # a retry: recognised from the earlier rows, not counted
    run(o2.submit_groups([group("t3")]))  # t2 leaves in the next batch: its earlier payload is cleared
    assert db.execute("SELECT COUNT(*) FROM dso_groups WHERE payload IS NOT NULL").fetchone() == (0,)
    assert o2.get_stats().groups_submitted == 4
    assert [[g.task_id for g in run(o2.pop_batch()).groups] for _ in range(2)] == [["t0", "t1"], ["t2", "t3"]]


def test_a_retried_submit_and_pop_gets_the_batches_its_lost_answer_held(tmp_path):
    o = orch(tmp_path)
    labels, batches = run(o.submit_and_pop([group(t) for t in TASKS[:4]], call_id="c1"))
    assert [b.batch_id for b in batches] == [0, 1]
    o2 = orch(tmp_path)  # the actor died after the commit, before its answer: Ray retries on the new one
    labels2, batches2 = run(o2.submit_and_pop([group(t) for t in TASKS[:4]], call_id="c1"))
    assert labels2 == labels == ["informative"] * 4 and o2.get_stats().groups_submitted == 4
    assert [[g.task_id for g in b.groups] for b in batches2] == [["t0", "t1"], ["t2", "t3"]]
    assert run(o2.submit_and_pop([], call_id="c2")) == ([], [])  # another call: those batches are not its own


def test_a_retried_pop_batch_gets_the_batch_its_lost_answer_held(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group(t) for t in TASKS[:4]]))
    assert run(o.pop_batch(call_id="p1")).batch_id == 0
    o2 = orch(tmp_path)  # died after the commit, before the answer
    assert run(o2.pop_batch(call_id="p1")).batch_id == 0  # the same batch, not batch 1
    assert run(o2.pop_batch(call_id="p2")).batch_id == 1
    assert run(o2.pop_batch(call_id="p3")) is None


def test_an_empty_pop_does_not_wait_for_another_calls_commit(tmp_path):
    o = orch(tmp_path)
    blocker = sqlite3.connect(tmp_path / "run.db", isolation_level=None)

    async def scenario():
        blocker.execute("BEGIN EXCLUSIVE")  # the submit's commit waits for this lock (busy timeout 5 s)
        try:
            submit = asyncio.create_task(o.submit_groups([group("t0", WRONG)]))
            await asyncio.sleep(0.2)  # its change made, its commit under way
            popped = await asyncio.wait_for(o.pop_batch(), timeout=2)
        finally:
            blocker.execute("COMMIT")
        return popped, await submit

    assert run(scenario()) == (None, ["all_wrong"])
    assert orch(tmp_path).get_stats().groups_submitted == 1


def test_a_retried_next_tasks_gets_the_tasks_its_lost_answer_held(tmp_path):
    o = orch(tmp_path)
    first = run(o.next_tasks(3, call_id="n1"))
    o2 = orch(tmp_path)  # died after the commit, before the answer: Ray retries on the new one
    assert run(o2.next_tasks(3, call_id="n1")) == first  # the same three, not the next three
    rest = run(o2.next_tasks(3, call_id="n2")) + run(o2.next_tasks(2))
    assert sorted(first + rest) == TASKS  # the epoch: every task handed out once, none skipped


def test_a_retried_close_batch_gets_the_batch_it_closed(tmp_path):
    o = orch(tmp_path)
    run(o.submit_groups([group("t0"), group("t1", WRONG)]))  # one informative group of the two a batch needs
    closed = run(o.close_batch(call_id="c1"))  # on_cap "pad": t0, padded with the dropped t1
    assert (closed.batch_id, [g.task_id for g in closed.groups], closed.num_padding) == (0, ["t0", "t1"], 1)
    run(o.submit_groups([group("t2")]))  # held for the next batch
    o2 = orch(tmp_path)  # died after the commit, before the answer
    again = run(o2.close_batch(call_id="c1"))
    assert (again.batch_id, [g.task_id for g in again.groups]) == (0, ["t0", "t1"])
    assert o2.get_stats().batches_emitted == 1 and o2.get_stats().groups_held == 1  # t2 not closed into a second batch


def snapshot(src, dst):
    """A consistent copy of the SQLite file as it is now (what a crash at this instant leaves)."""
    dst.parent.mkdir()
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)


def during_a_commit(o, tmp_path, call):
    """Run ``call()`` while a submit's commit is being written in a worker thread; return its
    answer and a copy of the file taken the moment it answered."""

    async def overlap():
        submit = asyncio.create_task(o.submit_groups([group("t7", WRONG, tag="bg")]))
        while not o.commits.committing:  # the submit's commit is in the worker thread, the lock is free
            await asyncio.sleep(0)
        out = await call()
        snapshot(tmp_path / "run.db", tmp_path / "crash" / "run.db")
        await submit
        return out

    return run(overlap())


def test_next_tasks_made_during_a_commit_answers_once_its_tasks_are_on_disk(tmp_path):
    o = orch(tmp_path)
    first = during_a_commit(o, tmp_path, lambda: o.next_tasks(3, call_id="n1"))
    crashed = orch(tmp_path / "crash")  # the actor died right after answering
    assert sorted(first + run(crashed.next_tasks(5))) == TASKS  # the epoch goes on after them: none handed out twice


def test_a_policy_change_made_during_a_commit_answers_once_it_is_on_disk(tmp_path):
    o = orch(tmp_path)
    answer = during_a_commit(o, tmp_path, lambda: o.set_policy({"target_groups": 3}))
    assert answer["revision"] == 1
    crashed = orch(tmp_path / "crash")
    assert crashed.get_policy()["revision"] == 1 and crashed.get_policy()["policy"]["target_groups"] == 3


def test_a_model_version_set_during_a_commit_answers_once_it_is_on_disk(tmp_path):
    o = orch(tmp_path)
    during_a_commit(o, tmp_path, lambda: o.set_model_version(5))
    crashed = orch(tmp_path / "crash")
    assert crashed.get_stats().model_version == 5


def key(task):
    return f"{task}\x1fr0\x1f0,1"


def test_a_group_older_than_the_retry_window_counts_as_new(tmp_path):
    o = orch(tmp_path, retry_window=2)
    for t in TASKS[:4]:  # the actor keeps the last 2 keys
        run(o.submit_groups([group(t, WRONG)]))
    assert list(o.ledger.seen) == [key("t2"), key("t3")]
    run(o.submit_groups([group("t2", WRONG), group("t3", WRONG)]))  # within the window: retries
    assert o.get_stats().groups_submitted == 4
    run(o.submit_groups([group("t0", WRONG)]))  # forgotten: a new group
    assert o.get_stats().groups_submitted == 5


def test_the_retry_window_holds_after_a_restart(tmp_path):
    o = orch(tmp_path, retry_window=2)
    for t in TASKS[:4]:  # one commit each; the file keeps the keys of the newest commits holding 2
        run(o.submit_groups([group(t, WRONG)]))
    db = sqlite3.connect(tmp_path / "run.db")
    assert [pickle.loads(s)[0] for (s,) in db.execute("SELECT seen FROM dso_log ORDER BY seq")] == [[key("t2")], [key("t3")]]
    o2 = orch(tmp_path, retry_window=2)  # restart
    assert list(o2.ledger.seen) == [key("t2"), key("t3")]
    run(o2.submit_groups([group("t3", WRONG)]))
    assert o2.get_stats().groups_submitted == 4
    run(o2.submit_groups([group("t1", WRONG)]))
    assert o2.get_stats().groups_submitted == 5


def test_log_rows_keep_their_held_groups_after_their_keys_go(tmp_path):
    o = orch(tmp_path, retry_window=1)
    run(o.submit_groups([group("t0", tokens=range(3))]))  # informative: carried, its payload held
    run(o.submit_groups([group("t1", WRONG)]))
    db = sqlite3.connect(tmp_path / "run.db")
    assert db.execute("SELECT seen IS NULL, held IS NULL FROM dso_log ORDER BY seq").fetchall() == [(1, 0), (0, 0)]
    o2 = orch(tmp_path, retry_window=1)
    assert [g.task_id for g in o2.core.carry] == ["t0"] and o2.core.carry[0].rollouts[0].tokens == [0, 1, 2]


def test_retry_window_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="retry_window: must be an int of at least 1, got 0"):
        orch(tmp_path, retry_window=0)


CRASH_WHILE_FORGETTING = textwrap.dedent("""
    import asyncio, os, sys
    sys.path.insert(0, os.getcwd())
    import orchestrator.service.store as store
    from tests.service.test_durability import orch, group, WRONG
    from pathlib import Path
    o = orch(Path(sys.argv[1]), retry_window=2)
    first = int(sys.argv[2])
    real = store.pickle.dumps
    def die(*a, **k):  # the state is pickled last in the transaction: die once the oldest keys are cleared
        db = o.store._db
        if db.in_transaction and db.execute("SELECT MIN(seq) FROM dso_log WHERE seen IS NOT NULL").fetchone()[0] > first:
            os._exit(9)
        return real(*a, **k)
    store.pickle.dumps = die
    asyncio.run(o.submit_groups([group("t2", WRONG)]))
""")


def test_a_crash_while_keys_are_forgotten_keeps_them(tmp_path):
    o = orch(tmp_path, retry_window=2)
    run(o.submit_groups([group("t0", WRONG)]))
    run(o.submit_groups([group("t1", WRONG)]))
    (first,) = sqlite3.connect(tmp_path / "run.db").execute("SELECT MIN(seq) FROM dso_log").fetchone()
    proc = subprocess.run([sys.executable, "-c", CRASH_WHILE_FORGETTING, str(tmp_path), str(first)],
                          cwd=os.getcwd(), env=os.environ)
    assert proc.returncode == 9
    o2 = orch(tmp_path, retry_window=2)  # restarted from the commit before: t0's key kept, t2 not accepted
    assert list(o2.ledger.seen) == [key("t0"), key("t1")] and o2.get_stats().groups_submitted == 2
    run(o2.submit_groups([group("t2", WRONG)]))  # the caller's retry: accepted once, t0 forgotten now
    run(o2.submit_groups([group("t1", WRONG), group("t2", WRONG)]))
    assert o2.get_stats().groups_submitted == 3 and list(o2.ledger.seen) == [key("t1"), key("t2")]


def test_a_key_accepted_again_after_it_was_forgotten_keeps_its_new_place_after_a_restart(tmp_path):
    o = orch(tmp_path, retry_window=2)
    run(o.submit_groups([group(t, WRONG) for t in ("t0", "t1", "t2")]))  # one commit; the actor keeps t1, t2
    run(o.submit_groups([group("t0", WRONG)]))  # forgotten: accepted again (the file still has the first)
    o2 = orch(tmp_path, retry_window=2)
    run(o2.submit_groups([group("t3", WRONG)]))  # the window now: t0 (accepted the second time), t3
    run(o2.submit_groups([group("t0", WRONG)]))  # a retry: recognised
    assert o2.get_stats().groups_submitted == 5 and list(o2.ledger.seen) == [key("t0"), key("t3")]


def test_the_pass_predictors_model_evidence_and_prompts_survive_a_restart(tmp_path):
    o = orch(tmp_path)
    run(o.set_task_texts([f"{i}+{i}" for i in range(len(TASKS))]))
    run(o.set_policy({"selection": "pass_predictor"}))
    run(o.submit_groups([group("t0"), group("t3", WRONG)]))
    run(o.submit_groups([group("t5", tag="r1")]))
    restored = orch(tmp_path)  # a new actor body on the same file: the store's columns and small state
    assert restored.core.task_texts == [f"{i}+{i}" for i in range(len(TASKS))]
    assert restored.core.state_dict()["selections"] == o.core.state_dict()["selections"]
    assert restored.core.task_stats("t3").selection_row == o.core.task_stats("t3").selection_row
