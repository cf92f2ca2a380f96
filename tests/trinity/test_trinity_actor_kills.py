"""Trinity-RFT 0.6.0's real ``Explorer`` run outlives five kills of the orchestrator actor.

One run of Trinity's launcher ``explore()`` (the setup of ``test_trinity_explorer``: our vLLM
engine behind Trinity's model wrapper, our selector and operator). While it runs, the
orchestrator actor is killed five times, alternately by SIGKILL of its process and by
``ray.kill(no_restart=False)``, each time at a different delay after an explore step's groups
reached it (0 to 1 s: in the middle of the operator's ``submit_and_pop`` reply, of its next
calls, or of the selector's request of the next step's tasks). Ray restarts the actor from its
state file; the operator and selector re-send their calls with the same call ids
(:class:`orchestrator.service.calls.ActorCalls`). The run reaches ``total_steps`` and the
trainer side, reading the queue with Trinity's ``QueueReader``, sees every emitted batch
exactly once (the explorer never restarts, so no batch is in the unconfirmed window).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter

import pytest
import ray
import test_trinity_explorer as base
import yaml

from orchestrator.service.calls import ActorCalls

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

tiny_model = base.tiny_model  # the same module fixtures (one engine per module)
engine_model = base.engine_model
ACTOR = "dso-trinity-kills"
STEPS = 40  # a kill costs one to several steps (the explorer rolls out meanwhile; on an idle machine 16 steps ended after 3 kills): room for five
DELAYS = [0.0, 0.6, 0.05, 1.0, 0.3]  # after a step's groups reached the actor: one kill each


def test_five_kills_of_the_orchestrator_during_a_trinity_run_lose_and_duplicate_no_batch(tmp_path, tiny_model, engine_model):
    from trinity.buffer.buffer import get_buffer_reader
    from trinity.cli.launcher import explore

    path = base.write_config(tmp_path, tiny_model, f"kills-{uuid.uuid4().hex[:6]}")
    raw = yaml.safe_load(path.read_text())
    raw["buffer"]["total_steps"] = STEPS
    raw["buffer"]["explorer_input"]["taskset"]["data_selector"]["kwargs"]["actor_name"] = ACTOR
    path.write_text(yaml.safe_dump(raw))
    cfg = base.load(path)
    base.fresh_synchronizer()
    reader = get_buffer_reader(cfg.buffer.trainer_input.experience_buffer)
    pgs_before = base.live_placement_groups()
    out: dict = {}

    def run() -> None:
        try:
            out["status"] = explore(cfg)
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            out["raised"] = exc

    explorer = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    explorer.start()
    calls = ActorCalls(name=ACTOR)
    kills: list[tuple[str, float, float]] = []  # (how, delay, seconds until a new process answered)
    getpid = lambda _actor: os.getpid()  # noqa: E731 - pickled by value into the actor

    def submitted() -> int:
        if not explorer.is_alive():
            raise RuntimeError(f"the explorer stopped early: {out}")
        try:
            return calls.call("get_stats", wait_s=30).groups_submitted
        except ValueError:  # not created yet
            return 0

    for i, delay in enumerate(DELAYS):
        before = submitted()
        base.wait_for(lambda b=before: submitted() > b, 900, f"explore step before kill {i + 1}", every=0.05)
        time.sleep(delay)
        k0 = time.monotonic()
        pid = calls.call("__ray_call__", getpid)
        if i % 2:
            os.kill(pid, signal.SIGKILL)
            how = "SIGKILL"
        else:
            ray.kill(calls.handle, no_restart=False)
            how = "ray.kill"
        base.wait_for(lambda p=pid: calls.call("__ray_call__", getpid) != p, 300, f"restart after kill {i + 1}", every=0.05)
        kills.append((how, delay, round(time.monotonic() - k0, 1)))
    explorer.join(timeout=900)
    wall = time.monotonic() - t0
    stats = calls.call("get_stats")
    state = calls.call("state_dict")
    base.end_explorer(cfg.explorer.name)
    base.release_placement_groups(pgs_before)
    batches = base.read_all(reader)
    ray.kill(calls.handle)
    print(f"\n{len(kills)} kills {kills}; run {wall:.0f} s; {stats.batches_emitted} batches emitted, "
          f"{len(batches)} read")

    assert "status" in out and out["status"].success, out
    assert base._explorer_step(cfg) == STEPS
    assert len(kills) == 5 and {k[0] for k in kills} == {"SIGKILL", "ray.kill"}
    released = [e for b in batches for e in b]
    keys = Counter((e.info["dso_batch_id"], e.eid.tid, e.eid.run) for e in released)
    assert [k for k, c in keys.items() if c > 1] == []  # no experience read twice
    per_batch = Counter(e.info["dso_batch_id"] for e in released)
    assert set(per_batch) == set(range(stats.batches_emitted))  # every emitted batch read: none lost
    assert set(per_batch.values()) == {base.B * base.N}  # each one whole, once
    assert state["attachment"].get("unconfirmed", {}) == {}  # one explorer process: no unconfirmed window
    assert stats.errors.get("operator", 0) == 0 and stats.errors.get("selector", 0) == 0
