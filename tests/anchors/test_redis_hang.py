"""A 20 s Redis hang (SIGSTOP of the test's own redis-server) during a run, then Redis back empty.

A real orchestrator actor (Ray, SQLite state) behind the real REST app (Ray Serve): while Redis
is stopped, a driver submits groups through :class:`~orchestrator.service.calls.ActorCalls` (as
the Trinity operator does), the model version advances (each advance starts an anchor expiry
that reaches Redis), and ``GET /metrics`` is scraped. Commits, ``/metrics`` and the health
check never wait behind the hung Redis calls (they run on the actor's own Redis executor with
0.5 s timeouts). Afterwards Redis restarts empty: no client, old or opened afterwards from the
actor's spec, can restart the lost batch from the one run it still holds.
"""

import os
import signal
import threading
import time

import httpx
import numpy as np
import pytest

from orchestrator.anchors.index import AnchorIndexError, AnchorStep
from orchestrator.anchors.owner import AnchorBatchLostError, anchor_index_from_spec
from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.service.calls import ActorCalls

TASKS = [f"t{i}" for i in range(8)]
# one anchor state "a" reached by both runs of task t: returns 1 and 0 -> A^S = +-0.7071 (GiGPO Eq. 7, unbiased std)
STEPS = [AnchorStep("t", 0, 0, "a", 1.0, last=True), AnchorStep("t", 1, 0, "a", 0.0, last=True)]
HANG_S = 20.0


def group(task: str, tag: str) -> Group:
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=r, round_tag=tag), reward=v)
                                         for r, v in enumerate([1.0, -1.0])])


def wait_for(predicate, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError("condition not reached in time")


@pytest.mark.slow
def test_a_20_s_redis_hang_blocks_no_commit_no_scrape_and_no_client_restarts_a_lost_batch(
        dso_service, redis_server, tmp_path):
    handle = dso_service.orchestrator(
        {"target_groups": 2, "group_size": 2}, tasks=TASKS, checkpoint_path=str(tmp_path / "state.db"),
        anchor_index={"redis_url": redis_server.url, "prefix": "hang", "ttl_s": 600, "max_age_versions": 0},
    )
    calls = ActorCalls(handle, name=dso_service.actor_name)
    http = httpx.Client(base_url=dso_service.url, timeout=30)
    wait_for(lambda: calls.call("get_stats").anchor_index_up is True)
    spec = wait_for(lambda: (s := calls.call("anchor_spec")) and "guard" in s and s)
    early = anchor_index_from_spec(spec)  # a worker of before the hang: run 0 of batch b1 written, run 1 to come
    calls.call("anchor_register", "b1", 10**6)  # never expired by version
    early.insert("b1", STEPS[:1])
    for i in range(20):  # expired at every version advance: Redis work while it hangs
        calls.call("anchor_register", f"old-{i}", 0)

    submit_s: list[float] = []
    scrape_s: list[float] = []
    down_after: list[float] = []
    stop = threading.Event()

    def submitter() -> None:
        step = 0
        while not stop.is_set():
            t0 = time.monotonic()
            calls.call("submit_and_pop", [group(TASKS[step % 8], f"s{step}")], call_id=f"hang-{step}")
            submit_s.append(time.monotonic() - t0)
            if step % 5 == 0:
                calls.call("set_model_version", step)  # each advance starts an expiry that reaches Redis
            step += 1
            time.sleep(0.05)

    assert http.get("/metrics").status_code == 200  # the route's first call (cold) before the hang, not timed
    t_stop = time.monotonic()
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    worker = threading.Thread(target=submitter, daemon=True)
    worker.start()
    try:
        while time.monotonic() - t_stop < HANG_S:
            t0 = time.monotonic()
            r = http.get("/metrics")
            scrape_s.append(time.monotonic() - t0)
            assert r.status_code == 200
            if not down_after and "dso_anchor_index_up 0.0" in r.text:
                down_after.append(time.monotonic() - t_stop)
            time.sleep(0.5)
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
        stop.set()
        worker.join(timeout=60)
    p99 = float(np.percentile(submit_s, 99))
    print(f"\nRedis SIGSTOP {HANG_S:.0f} s: {len(submit_s)} submits, p99 {p99 * 1000:.0f} ms, max "
          f"{max(submit_s) * 1000:.0f} ms; {len(scrape_s)} scrapes of /metrics, max {max(scrape_s) * 1000:.0f} ms; "
          f"anchor_index_up 0 after {down_after[0] if down_after else float('nan'):.1f} s")
    assert len(submit_s) >= 50
    assert p99 < 1.0
    assert max(scrape_s) < 1.0
    assert down_after and down_after[0] < 10.0

    # Redis back, empty: the actor notices, forgets b1 and sets a new guard
    redis_server.restart()
    new_spec = wait_for(lambda: (s := calls.call("anchor_spec")).get("guard") not in (None, spec["guard"]) and s)
    assert calls.call("anchor_stats")["tracked_batches"] == {}
    fresh = anchor_index_from_spec(new_spec)  # a worker opened after Redis came back
    with pytest.raises(AnchorBatchLostError, match="lost with the anchor index's data"):
        calls.call("anchor_register", "b1")  # the documented first call of a worker refuses the lost batch
    with pytest.raises(AnchorIndexError, match="state lost|Redis lost its data"):
        early.insert("b1", STEPS[1:])  # the old worker's run 1 never restarts b1 either
    with pytest.raises(AnchorIndexError):
        fresh.step_advantages("b1", ["t"], ["a"], [1.0])  # nothing to read: never a made-up 0
    # a new batch works, with the advantages of the full data
    calls.call("anchor_register", "b2")
    fresh.insert("b2", STEPS)
    np.testing.assert_allclose(fresh.step_advantages("b2", ["t", "t"], ["a", "a"], [1.0, 0.0], n_runs=2),
                               [0.70710678, -0.70710678], atol=1e-5)
    stats = calls.call("get_stats")
    assert stats.anchor_index_up is True and stats.anchor_index_outages == 1
