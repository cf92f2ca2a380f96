"""The Redis anchor index when Redis fails: killed and restarted empty, hung (SIGSTOP).

Each test owns a private redis-server (``redis_server`` in conftest.py, no persistence). What must
hold: a clear ``AnchorIndexError`` naming the batch, never a wrong number (an empty completion,
a wrong advantage); a bounded wait on a hung server; normal service once it is back.
"""

import os
import signal
import time

import numpy as np
import pytest

from orchestrator.anchors.index import AnchorIndexError, AnchorStep
from orchestrator.anchors.redis_index import RedisAnchorIndex

# two runs of one task, two steps each, from states a -> b: returns R = [1, 0] and [0, 3]
STEPS = [AnchorStep("t", 0, 0, "a", 1.0), AnchorStep("t", 0, 1, "b", 0.0, last=True),
         AnchorStep("t", 1, 0, "a", 0.0), AnchorStep("t", 1, 1, "b", 3.0, last=True)]


def index(server, **kw):
    return RedisAnchorIndex(server.url, prefix="f", read_retries=1, socket_timeout=1.0, **kw)


def test_completion_reads_after_data_loss_are_errors_not_empty_answers(redis_server):
    idx = index(redis_server)
    idx.insert("b1", STEPS)
    assert idx.completed_runs("b1") == {"t": 2} and idx.group_sizes("b1").tolist() == [2, 2]
    redis_server.restart()  # empty
    for read in (lambda: idx.completed_runs("b1"), lambda: idx.group_sizes("b1"), lambda: idx.is_complete("b1", "t", 2)):
        with pytest.raises(AnchorIndexError, match=r"batch 'b1' state lost \(fence token .* gone"):
            read()


def test_a_fresh_client_cannot_write_into_a_batch_lost_with_redis(redis_server):
    guard, _ = index(redis_server).ensure_guard()  # the orchestrator, at the start of the run
    index(redis_server, guard=guard).insert("b1", STEPS[:2])  # worker 1: run 0
    redis_server.restart()  # run 0 is gone
    late = index(redis_server, guard=guard)  # worker 2 never saw batch b1
    with pytest.raises(AnchorIndexError, match=r"insert: batch 'b1' refused: Redis lost its data .*\(guard \w+ gone"):
        late.insert("b1", STEPS[2:])
    with pytest.raises(AnchorIndexError, match=r"query: batch 'b1' refused"):
        late.query("b1", STEPS[2:])  # the wrong answer would be [0, 0]: run 1 alone in its groups
    assert index(redis_server).completed_runs("b1") == {}  # nothing was written


def test_the_orchestrator_learns_that_redis_lost_its_data(redis_server):
    idx = index(redis_server)
    token, lost = idx.ensure_guard()
    assert not lost and idx.ensure_guard(token) == (token, False)  # set once
    redis_server.restart()
    new, lost = index(redis_server).ensure_guard(token)
    assert lost and new != token


def test_without_loss_the_guarded_numbers_are_the_pure_ones(redis_server):
    guard, _ = index(redis_server).ensure_guard()
    a, b = index(redis_server, guard=guard), index(redis_server, guard=guard)
    a.insert("b1", STEPS[:2])
    b.insert("b1", STEPS[2:])
    # group a: returns [1, 0] -> +-1/sqrt(2); group b: [0, 3] -> -+1/sqrt(2) (unbiased std, eps 1e-6)
    np.testing.assert_allclose(index(redis_server, guard=guard).query("b1", STEPS, n_runs=2),
                               [0.70711, -0.70711, -0.70711, 0.70711], atol=1e-5)


def test_a_hung_redis_gives_a_bounded_error_then_recovers(redis_server):
    idx = index(redis_server)
    idx.insert("b1", STEPS)
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(AnchorIndexError, match=r"completed runs of batch 'b1' failed after 2 attempts"):
            idx.completed_runs("b1")
        assert time.monotonic() - t0 < 10  # socket_timeout 1 s, 2 attempts
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert idx.completed_runs("b1") == {"t": 2}
