"""Anchor index (orchestrator/anchors/index.py): memory and real Redis, concurrency, failures.

Most batches use gamma = 0.5 and 0/1 rewards, so every return and every shifted sum is a
dyadic rational and float addition is exact in any order: concurrent inserts must then give
*bit-identical* advantages to a single-process index (a lost or double-counted update cannot
hide). Against the two-pass pure function the index agrees to 1e-9 (different formula).
"""

from __future__ import annotations

import multiprocessing as mp
import pickle

import numpy as np
import pytest
import redis

from algos.gigpo import GiGPOConfig, anchor_group_ids, gigpo_advantages, step_advantages
from orchestrator.anchors.index import AnchorConflictError, AnchorIndexError, AnchorStep, trajectory_records
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.owner import make_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex


def make_batch(tasks=4, runs=4, max_len=8, seed=0, gamma=0.5):
    """Random step rows plus AnchorSteps carrying the pure function's returns."""
    rng = np.random.default_rng(seed)
    rows = [
        (f"task-{t}", run, s, float(rng.integers(0, 2)), f"h{int(rng.integers(0, 3))}")
        for t in range(tasks)
        for run in range(runs)
        for s in range(int(rng.integers(1, max_len + 1)))
    ]
    tk, rn, st, rw, hs = (np.array(c) for c in zip(*rows))
    out = gigpo_advantages(tk, rn, st, rw, hs, config=GiGPOConfig(gamma=gamma, norm="std"))
    last = {}
    for t, r, s in zip(tk, rn, st):
        last[(t, r)] = max(last.get((t, r), -1), int(s))
    steps = [
        AnchorStep(str(t), int(r), int(s), str(h), float(R), last=int(s) == last[(t, r)])
        for t, r, s, h, R in zip(tk, rn, st, hs, out.returns)
    ]
    return steps, out


def pure_step_advantages(steps, norm):
    ids, _ = anchor_group_ids([s.task for s in steps], [s.state_hash for s in steps])
    return step_advantages([s.ret for s in steps], ids, norm=norm)


def query(index, batch, steps, **kw):
    return index.query(batch, steps, **kw)


# --------------------------------------------------------------------------- memory


@pytest.mark.parametrize("norm", ["std", "none"])
def test_memory_index_matches_pure_function(norm):
    steps, _ = make_batch(gamma=0.9)
    idx = MemoryAnchorIndex()
    idx.insert("b", steps)
    pure = pure_step_advantages(steps, norm)
    np.testing.assert_allclose(query(idx, "b", steps, norm=norm, n_runs=4), pure, rtol=0, atol=1e-9)


def test_reinserting_the_same_steps_changes_nothing():
    steps, _ = make_batch()
    idx = MemoryAnchorIndex()
    assert idx.insert("b", steps) == len(steps)
    before = query(idx, "b", steps)
    assert idx.insert("b", steps[::-1]) == 0
    np.testing.assert_array_equal(query(idx, "b", steps), before)
    assert idx.stats()["entries"] == len(steps)


def test_conflicting_duplicate_is_refused_and_nothing_written():
    idx = MemoryAnchorIndex()
    idx.insert("b", [AnchorStep("t", 0, 0, "h", 1.0)])
    with pytest.raises(AnchorConflictError, match=r"task 't', run 0, step 0"):
        idx.insert("b", [AnchorStep("t", 1, 0, "h", 0.0), AnchorStep("t", 0, 0, "h", 0.5)])
    assert idx.stats()["entries"] == 1


def test_task_complete_only_when_all_runs_have_all_steps():
    idx = MemoryAnchorIndex()
    # run 0's last step arrives before its first: not complete until step 0 is stored
    idx.insert("b", [AnchorStep("t", 0, 1, "h1", 1.0, last=True), AnchorStep("t", 1, 0, "h0", 0.0, last=True)])
    assert idx.completed_runs("b") == {"t": 1}
    assert not idx.is_complete("b", "t", 2)
    idx.insert("b", [AnchorStep("t", 0, 0, "h0", 0.5)])
    assert idx.is_complete("b", "t", 2)


def test_query_of_incomplete_task_with_n_runs_is_refused():
    idx = MemoryAnchorIndex()
    idx.insert("b", [AnchorStep("t", 0, 0, "h", 1.0, last=True)])
    with pytest.raises(AnchorIndexError, match=r"task 't' of batch 'b' has 1 complete runs, expected 2"):
        idx.step_advantages("b", ["t"], ["h"], [1.0], n_runs=2)


def test_query_of_unknown_anchor_group_is_refused():
    idx = MemoryAnchorIndex()
    idx.insert("b", [AnchorStep("t", 0, 0, "h", 1.0, last=True)])
    with pytest.raises(AnchorIndexError, match=r"anchor group \(task 't', state 'other'\) is not in batch 'b'"):
        idx.step_advantages("b", ["t"], ["other"], [1.0])
    with pytest.raises(AnchorIndexError, match=r"batch 'nope' is unknown"):
        idx.step_advantages("nope", ["t"], ["h"], [1.0])


def test_identical_returns_give_exactly_zero_in_index():
    idx = MemoryAnchorIndex()
    idx.insert("b", [AnchorStep("t", r, 0, "h", 0.1, last=True) for r in range(3)])
    assert np.all(idx.step_advantages("b", ["t"] * 3, ["h"] * 3, [0.1] * 3) == 0.0)


def test_stats_histogram_and_drop():
    idx = MemoryAnchorIndex()
    idx.insert("b", [AnchorStep("t", 0, 0, "x", 1.0), AnchorStep("t", 1, 0, "x", 0.0), AnchorStep("t", 0, 1, "y", 1.0)])
    st = idx.stats()
    assert (st["batches"], st["entries"], st["groups"], st["group_size_histogram"]) == (1, 3, 2, {1: 1, 2: 1})
    assert idx.drop("b") == 3
    assert idx.stats()["entries"] == 0


def test_group_sizes_count_steps_per_anchor_group():
    # task t: state x at run 0 and 1, state y once; task u: state x at runs 0-2 -> sizes 2, 1, 3
    idx = MemoryAnchorIndex()
    idx.insert("b", [AnchorStep("t", 0, 0, "x", 1.0), AnchorStep("t", 1, 0, "x", 0.0), AnchorStep("t", 0, 1, "y", 1.0),
                     AnchorStep("u", 0, 0, "x", 0.0), AnchorStep("u", 1, 0, "x", 0.0), AnchorStep("u", 2, 0, "x", 1.0)])
    idx.insert("b", [AnchorStep("t", 1, 0, "x", 0.0)])  # duplicate: not counted again
    sizes = idx.group_sizes("b")
    assert sizes.dtype == np.int64 and sizes.tolist() == [1, 2, 3]
    assert idx.group_sizes("unknown").tolist() == []


def test_bad_step_is_refused_naming_field():
    idx = MemoryAnchorIndex()
    with pytest.raises(ValueError, match=r"state_hash: missing \(''\) for task 't' run 0 step 2"):
        idx.insert("b", [AnchorStep("t", 0, 2, "", 1.0)])
    with pytest.raises(ValueError, match=r"ret: non-finite value nan"):
        idx.insert("b", [AnchorStep("t", 0, 2, "h", float("nan"))])


def test_memory_index_pickles_as_a_snapshot():
    steps, _ = make_batch()
    idx = MemoryAnchorIndex()
    idx.insert("b", steps)
    copy = pickle.loads(pickle.dumps(idx))
    np.testing.assert_array_equal(query(copy, "b", steps), query(idx, "b", steps))


def test_insertion_order_does_not_change_the_bits():
    # dyadic returns: exact sums, so the min-shifted moments are order independent
    steps, _ = make_batch(seed=4)
    a, b = MemoryAnchorIndex(), MemoryAnchorIndex()
    a.insert("b", steps)
    b.insert("b", [steps[i] for i in np.random.default_rng(1).permutation(len(steps))])
    np.testing.assert_array_equal(query(a, "b", steps), query(b, "b", steps))


# --------------------------------------------------------------------------- redis (shared server)


@pytest.mark.parametrize("norm", ["std", "none"])
def test_redis_index_matches_pure_function(redis_url, redis_namespace, norm):
    steps, _ = make_batch(gamma=0.9, seed=3)
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace, chunk_size=7)
    assert idx.insert("b1", steps) == len(steps)
    pure = pure_step_advantages(steps, norm)
    np.testing.assert_allclose(query(idx, "b1", steps, norm=norm, n_runs=4), pure, rtol=0, atol=1e-9)


def test_redis_keys_are_namespaced_and_expire(redis_url, redis_namespace):
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace, ttl_s=120)
    idx.insert("b1", [AnchorStep("t", 0, 0, "h", 1.0, last=True)])
    client = redis.Redis.from_url(redis_url)
    keys = [k.decode() for k in client.scan_iter(match=f"{redis_namespace}*")]
    assert sorted(keys) == sorted(
        [f"{redis_namespace}:{{b1}}:{k}" for k in ("meta", "steps", "groups", "runs", "done")] + [f"{redis_namespace}:batches"]
    )
    assert all(0 < client.pttl(k) <= 120_000 for k in keys)


def test_redis_stats_and_drop(redis_url, redis_namespace):
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    idx.insert("b1", [AnchorStep("t", 0, 0, "x", 1.0), AnchorStep("t", 1, 0, "x", 0.0), AnchorStep("t", 0, 1, "y", 1.0)])
    st = idx.stats()
    assert (st["batches"], st["entries"], st["groups"], st["group_size_histogram"]) == (1, 3, 2, {1: 1, 2: 1})
    assert idx.drop("b1") == 3
    assert idx.stats()["batches"] == 0


def test_redis_group_sizes_count_steps_per_anchor_group(redis_url, redis_namespace):
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    idx.insert("b1", [AnchorStep("t", 0, 0, "x", 1.0), AnchorStep("t", 1, 0, "x", 0.0), AnchorStep("t", 0, 1, "y", 1.0),
                      AnchorStep("u", 0, 0, "x", 0.0), AnchorStep("u", 1, 0, "x", 0.0), AnchorStep("u", 2, 0, "x", 1.0)])
    sizes = idx.group_sizes("b1")
    assert sizes.dtype == np.int64 and sizes.tolist() == [1, 2, 3]
    idx.drop("b1")
    assert idx.group_sizes("b1").tolist() == []


def test_redis_conflicting_duplicate_is_refused(redis_url, redis_namespace):
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    idx.insert("b1", [AnchorStep("t", 0, 0, "h", 1.0)])
    assert idx.insert("b1", [AnchorStep("t", 0, 0, "h", 1.0)]) == 0
    with pytest.raises(AnchorConflictError, match="CONFLICT"):
        idx.insert("b1", [AnchorStep("t", 1, 0, "h", 0.0), AnchorStep("t", 0, 0, "h2", 1.0)])
    assert idx.stats()["entries"] == 1


def test_redis_identical_returns_give_exactly_zero(redis_url, redis_namespace):
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    idx.insert("b1", [AnchorStep("t", r, 0, "h", 0.1, last=True) for r in range(3)])
    assert np.all(idx.step_advantages("b1", ["t"] * 3, ["h"] * 3, [0.1] * 3, norm="std") == 0.0)


def _insert_worker(url, prefix, batch, steps, chunk):
    idx = RedisAnchorIndex(url, prefix=prefix, chunk_size=chunk)
    for lo in range(0, len(steps), chunk):  # many small round trips: writers interleave
        idx.insert(batch, steps[lo : lo + chunk])
    idx.close()


def test_concurrent_worker_processes_give_single_process_advantages(redis_url, redis_namespace):
    steps, out = make_batch(tasks=6, runs=6, max_len=10, seed=5)
    rng = np.random.default_rng(0)
    workers = 3
    shards = [[s for i, s in enumerate(steps) if i % workers == w] for w in range(workers)]
    # each worker also re-inserts a random 40% of the batch: duplicates race with originals
    jobs = [shard + [steps[i] for i in rng.choice(len(steps), len(steps) * 2 // 5, replace=False)] for shard in shards]
    jobs = [[job[i] for i in rng.permutation(len(job))] for job in jobs]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_insert_worker, args=(redis_url, redis_namespace, "b1", job, 5)) for job in jobs]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * workers
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    assert idx.stats()["entries"] == len(steps)
    assert idx.completed_runs("b1") == {f"task-{t}": 6 for t in range(6)}
    single = MemoryAnchorIndex()
    single.insert("b1", steps)
    np.testing.assert_array_equal(query(idx, "b1", steps, n_runs=6), query(single, "b1", steps, n_runs=6))
    np.testing.assert_allclose(query(idx, "b1", steps), out.step, rtol=0, atol=1e-9)


# --------------------------------------------------------------------------- redis failures (own server)


def test_redis_restart_mid_batch_is_an_error_not_wrong_numbers(redis_server):
    steps, _ = make_batch(seed=7)
    half = len(steps) // 2
    idx = RedisAnchorIndex(redis_server.url, prefix="t", read_retries=2)
    idx.insert("b1", steps[:half])
    redis_server.restart()  # no persistence: the first half is gone
    with pytest.raises(AnchorIndexError, match=r"state lost"):
        idx.insert("b1", steps[half:])
    reader = RedisAnchorIndex(redis_server.url, prefix="t")
    with pytest.raises(AnchorIndexError):
        query(reader, "b1", steps, n_runs=4)


def test_redis_restart_then_drop_and_reinsert_gives_correct_numbers(redis_server):
    steps, _ = make_batch(seed=7)
    idx = RedisAnchorIndex(redis_server.url, prefix="t")
    idx.insert("b1", steps[: len(steps) // 2])
    redis_server.restart()
    with pytest.raises(AnchorIndexError):
        idx.insert("b1", steps[len(steps) // 2 :])
    idx.drop("b1")  # the retry: forget the lost fence token, write the whole batch again
    idx.insert("b1", steps)
    np.testing.assert_allclose(query(idx, "b1", steps, n_runs=4), pure_step_advantages(steps, "std"), rtol=0, atol=1e-9)


def test_the_fence_token_is_kept_in_the_field_earlier_versions_wrote(redis_server):
    # the meta hash field keeps its stored name 'epoch', so batches written before the rename stay readable
    steps, _ = make_batch(seed=8)
    writer = RedisAnchorIndex(redis_server.url, prefix="t")
    writer.insert("b1", steps)
    token = writer.fence("b1")
    assert len(token) == 32 and redis.Redis.from_url(redis_server.url).hget("t:{b1}:meta", "epoch").decode() == token
    reader = RedisAnchorIndex(redis_server.url, prefix="t")  # learns the token from that field, as from an older writer
    np.testing.assert_array_equal(query(reader, "b1", steps, n_runs=4), query(writer, "b1", steps, n_runs=4))


def test_query_by_a_reader_across_a_restart_is_refused(redis_server):
    steps, _ = make_batch(seed=8)
    writer = RedisAnchorIndex(redis_server.url, prefix="t")
    writer.insert("b1", steps)
    reader = RedisAnchorIndex(redis_server.url, prefix="t")
    query(reader, "b1", steps, n_runs=4)  # the reader learns the batch's fence token
    redis_server.restart()
    other = RedisAnchorIndex(redis_server.url, prefix="t")
    other.insert("b1", steps[:3])  # a fresh writer starts a new fence token on the empty server
    with pytest.raises(AnchorIndexError, match=r"state lost \(fence token changed"):
        query(reader, "b1", steps[:3])


def test_redis_down_names_url_and_operation(redis_server):
    idx = RedisAnchorIndex(redis_server.url, prefix="t", read_retries=1, socket_timeout=1.0)
    idx.insert("b1", [AnchorStep("t", 0, 0, "h", 1.0, last=True)])
    redis_server.kill()
    with pytest.raises(AnchorIndexError, match=rf"127\.0\.0\.1:{redis_server.port}.*insert of 1 steps into batch 'b1'"):
        idx.insert("b1", [AnchorStep("t", 1, 0, "h", 0.0, last=True)])
    with pytest.raises(AnchorIndexError, match=rf"127\.0\.0\.1:{redis_server.port}.*query .* failed after 2 attempts"):
        idx.step_advantages("b1", ["t"], ["h"], [1.0])


def test_make_anchor_index_picks_backend():
    assert isinstance(make_anchor_index(None), MemoryAnchorIndex)
    assert isinstance(make_anchor_index("redis://127.0.0.1:1/0", prefix="x"), RedisAnchorIndex)


def test_redis_non_ascii_and_separator_like_ids(redis_url, redis_namespace):
    # the task id is length-prefixed in hash fields: 'é|x' + state 'y' cannot collide with 'é' + state 'x|y'
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    idx.insert("b1", [AnchorStep("é|x", 0, 0, "y", 1.0, last=True), AnchorStep("é", 0, 0, "x|y", 0.0, last=True)])
    idx.insert("b1", [AnchorStep("é|x", 1, 0, "y", 0.0, last=True), AnchorStep("é", 1, 0, "x|y", 0.0, last=True)])
    np.testing.assert_array_equal(idx.step_advantages("b1", ["é|x", "é"], ["y", "x|y"], [1.0, 0.0], norm="none", n_runs=2), [0.5, 0.0])


# --------------------------------------------------------------------------- whole trajectories


def columns(steps):
    """The integer-coded columns of AnchorSteps, for ``trajectory_records``."""
    tasks = sorted({s.task for s in steps})
    states = sorted({s.state_hash for s in steps})
    t_code, h_code = {t: i for i, t in enumerate(tasks)}, {h: i for i, h in enumerate(states)}
    return (
        [t_code[s.task] for s in steps], tasks, [s.run for s in steps], [s.step for s in steps],
        [h_code[s.state_hash] for s in steps], states, [s.ret for s in steps],
    )


def test_trajectory_records_hand_computed():
    # task a: run 0 = steps (state x, R 3), (state y, R 1); run 1 = (x, 1). Group (a, x): returns 3, 1
    # -> n 2, c 1, S1 = 2, S2 = 4; group (a, y): n 1, c 1, S1 = S2 = 0.
    rec = trajectory_records([0, 0, 0], ["a"], [0, 1, 0], [1, 0, 0], [1, 0, 0], ["x", "y"], [1.0, 1.0, 3.0])
    assert rec.run_id.tolist() == [0, 1] and rec.run_length.tolist() == [2, 1]
    assert [rec.state_names[h] for h in rec.group_state.tolist()] == ["x", "y"]
    np.testing.assert_array_equal(rec.moments, [[2, 1, 2, 4], [1, 1, 0, 0]])
    assert rec.columns[5].tolist() == [True, True, False]  # the last step of each trajectory
    # the digest depends on each step's state and return, not on row order
    again = trajectory_records([0, 0, 0], ["a"], [0, 0, 1], [0, 1, 0], [0, 1, 0], ["x", "y"], [3.0, 1.0, 1.0])
    assert again.run_digest.tolist() == rec.run_digest.tolist()
    other = trajectory_records([0, 0, 0], ["a"], [0, 0, 1], [0, 1, 0], [0, 1, 0], ["x", "y"], [3.0, 1.5, 1.0])
    assert other.run_digest.tolist()[0] != rec.run_digest.tolist()[0]
    assert other.run_digest.tolist()[1] == rec.run_digest.tolist()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (([0, 0], ["a"], [0, 0], [0, 2], [0, 0], ["x"], [0.0, 0.0]), r"task 'a' run 0 step 2 \(row 1\): expected step 1"),
        (([0, 0], ["a"], [3, 3], [0, 0], [0, 0], ["x"], [0.0, 1.0]), r"task 'a' run 3 step 0 .*duplicate"),
        (([0], ["a"], [0], [1], [0], ["x"], [0.0]), r"expected step 0; a call must hold whole trajectories"),
        (([0], ["a"], [0], [0], [0], ["x"], [float("inf")]), r"ret: non-finite value inf for task 'a' run 0 step 0"),
        (([0], ["a\x1fb"], [0], [0], [0], ["x"], [0.0]), r"task: empty, not a str, or with a control character"),
        (([0], ["a"], [0], [0], [1], ["x"], [0.0]), r"state_ids: code 1 at row 0 is not an index into its 1 names"),
    ],
)
def test_trajectory_records_refuse_bad_input_naming_it(args, message):
    with pytest.raises(ValueError, match=message):
        trajectory_records(*args)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_whole_trajectories_give_the_per_step_statistics(backend, request):
    if backend == "redis":
        make = lambda: RedisAnchorIndex(request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("redis_namespace"))  # noqa: E731
    else:
        shared = MemoryAnchorIndex()
        make = lambda: shared  # noqa: E731
    steps, _ = make_batch(gamma=0.9, seed=3)
    per_step, whole = make(), make()
    per_step.insert("steps", steps)
    rec = trajectory_records(*columns(steps))
    receipt = whole.insert_trajectories("whole", rec)
    assert receipt.added == 16 and receipt.done == {f"task-{t}": 4 for t in range(4)}
    for norm in ("std", "none"):
        a = query(per_step, "steps", steps, norm=norm, n_runs=4)
        b = query(whole, "whole", steps, norm=norm, n_runs=4)
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b, pure_step_advantages(steps, norm), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(whole.group_sizes("whole"), per_step.group_sizes("steps"))
    assert whole.insert_trajectories("whole", rec).added == 0  # identical: a no-op
    np.testing.assert_array_equal(whole.group_sizes("whole"), per_step.group_sizes("steps"))


def test_redis_whole_trajectories_in_two_calls_merge_moments(redis_url, redis_namespace):
    # runs 0-1 then runs 2-3 of each task: the second call's moments are merged into the first's
    steps, _ = make_batch(gamma=0.9, seed=4)
    index = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    first = index.insert_trajectories("b", trajectory_records(*columns([s for s in steps if s.run < 2])))
    assert first.done == {f"task-{t}": 2 for t in range(4)}
    second = index.insert_trajectories("b", trajectory_records(*columns([s for s in steps if s.run >= 2])))
    assert second.done == {f"task-{t}": 4 for t in range(4)} and second.cursor != first.cursor
    np.testing.assert_allclose(query(index, "b", steps, n_runs=4), pure_step_advantages(steps, "std"), rtol=0, atol=1e-9)
    assert index.stats()["entries"] == len(steps)
    assert index.drop("b") == len(steps)


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_call_mixing_stored_and_new_trajectories_counts_only_the_new(backend, request):
    steps, _ = make_batch(gamma=0.9, seed=5)
    if backend == "redis":
        index = RedisAnchorIndex(request.getfixturevalue("redis_url"), prefix=request.getfixturevalue("redis_namespace"))
    else:
        index = MemoryAnchorIndex()
    index.insert_trajectories("b", trajectory_records(*columns([s for s in steps if s.run == 0])))
    receipt = index.insert_trajectories("b", trajectory_records(*columns(steps)))  # run 0 again, runs 1-3 new
    assert receipt.added == 12 and receipt.done == {f"task-{t}": 4 for t in range(4)}
    np.testing.assert_allclose(query(index, "b", steps, n_runs=4), pure_step_advantages(steps, "std"), rtol=0, atol=1e-9)


def test_redis_a_trajectory_stored_with_other_steps_is_refused(redis_url, redis_namespace):
    steps, _ = make_batch(seed=6)
    index = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    index.insert_trajectories("b", trajectory_records(*columns(steps)))
    changed = [AnchorStep(s.task, s.run, s.step, s.state_hash, s.ret + (s.run == 1 and s.step == 0), s.last) for s in steps]
    with pytest.raises(AnchorConflictError, match=r"trajectory 6:task-0\|1 already stored as"):
        index.insert_trajectories("b", trajectory_records(*columns(changed)))
    with pytest.raises(AnchorConflictError, match=r"run 6:task-0\|0 was stored whole"):
        index.insert("b", [steps[0]])
    other = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    other.insert("c", steps)
    with pytest.raises(AnchorConflictError, match="written one by one"):
        other.insert_trajectories("c", trajectory_records(*columns(steps)))


def test_redis_wait_complete_blocks_until_the_event_and_times_out_naming_groups(redis_url, redis_namespace):
    import threading
    import time

    steps, _ = make_batch(seed=7)
    index = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    receipt = index.insert_trajectories("b", trajectory_records(*columns([s for s in steps if s.run < 3])))
    t0 = time.monotonic()
    with pytest.raises(AnchorIndexError, match=r"fewer than 4 complete trajectories.*'task-0': 3"):
        index.wait_complete("b", ["task-0", "task-1"], 4, 0.3, receipt=receipt)
    assert time.monotonic() - t0 >= 0.3
    writer = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    timer = threading.Timer(0.2, writer.insert_trajectories, ("b", trajectory_records(*columns([s for s in steps if s.run == 3]))))
    timer.start()
    t0 = time.monotonic()
    index.wait_complete("b", ["task-0", "task-1"], 4, 20.0, receipt=receipt)
    assert 0.15 <= time.monotonic() - t0 < 5.0
    timer.join()
    index.wait_complete("b", ["task-0"], 4, 0.0)  # without a receipt: reads the counts
