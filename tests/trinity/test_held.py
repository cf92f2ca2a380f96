"""Held payloads (orchestrator/trinity/held.py): what is written, when, and what a killed explorer leaves.

The kill tests run the operator in a child process (as Trinity's explorer runs it), kill it with
SIGKILL at a chosen moment, and attach a new operator to the same actor and ``held_dir``.
"""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from orchestrator.service.actor import get_or_create_orchestrator
from orchestrator.tasks.taskset import IndexTaskSet
from orchestrator.trinity.held import HeldPayloads, pack, read_refs, unpack
from orchestrator.trinity.operator import OrchestratorOperator

ROOT = Path(__file__).resolve().parents[2]


def texp(batch, task, run, reward, *, index):
    return TExp(eid=EID(batch=batch, task=task, run=run, step=0), tokens=[1, 2, 3, 4], prompt_length=2,
                logprobs=[-0.1, -0.2], reward=reward, info={"model_version": 0, "task_index": {"index": index}},
                metrics={"accuracy": float(reward > 0)})


def group(batch, task, index, rewards):
    return [texp(batch, task, run, r, index=index) for run, r in enumerate(rewards)]


# ------------------------------------------------------------------------- the file format


def test_a_packed_group_comes_back_with_every_field_and_its_own_tensors():
    a = TExp(eid=EID(batch=3, task=1, run=0, step=2), tokens=torch.tensor([5, 6, 7], dtype=torch.int32), prompt_length=1,
             logprobs=torch.tensor([-0.5, -0.25]), reward=1.5, action_mask=torch.tensor([True, False]),
             info={"k": [1, {"x": None}]}, metrics={"accuracy": 1.0}, response_text="hi",
             teacher_logprobs=torch.tensor([0.5, 1.0], dtype=torch.bfloat16))
    a.routed_experts = torch.arange(24, dtype=torch.uint8).reshape(2, 3, 4)
    b = TExp(eid=EID(batch=3, task=1, run=1), tokens=[9, 8, 7, 6], prompt_length=2, reward=None)
    c = TExp(eid=EID(batch=4, task=2, run=0), tokens=[1, 2], prompt_length=1, reward=-1.0)
    back = unpack(pack([[a, b], [c]]))
    assert [len(g) for g in back] == [2, 1]
    (a2, b2), (c2,) = back
    for x, y in ((a, a2), (b, b2), (c, c2)):
        assert set(x.__dict__) == set(y.__dict__)
        for k, v in x.__dict__.items():
            w = y.__dict__[k]
            if isinstance(v, torch.Tensor):
                assert w.dtype == v.dtype and w.shape == v.shape and torch.equal(w, v), k
            else:
                assert w == v, k
    assert a2.eid.step == 2 and b2.logprobs is None and a2.routed_experts[1, 2, 3] == 23
    assert a2.tokens.untyped_storage().data_ptr() != a2.logprobs.untyped_storage().data_ptr()
    a2.tokens[0] = 0  # its own storage: the others are untouched
    assert b2.tokens.tolist() == [9, 8, 7, 6]


def test_settle_writes_only_the_held_groups_in_one_file_and_deletes_it_once_none_is_held(tmp_path):
    h = HeldPayloads(tmp_path, "s1")
    h.stage({"s1:1/0": group(1, 0, 0, [1.0, -1.0]), "s1:1/1": group(1, 1, 1, [1.0, 1.0]),
             "s1:1/2": group(1, 2, 2, [1.0, -1.0])})
    h.settle(["s1:1/0", "s1:1/2", "s0:0/9"])  # 1/1 dropped; s0:0/9 held by the actor for an earlier process
    h.wait()
    files = list(tmp_path.iterdir())
    assert [p.name for p in files] == ["s1-000001.held"] and read_refs(files[0]) == ["s1:1/0", "s1:1/2"]
    assert len(h) == 2 and "s1:1/1" not in h.memory
    assert [e.eid.run for e in h.take("s1:1/0")] == [0, 1]
    h.settle(["s1:1/2"])
    h.wait()
    assert [p.name for p in tmp_path.iterdir()] == ["s1-000001.held"]  # 1/2 still held
    h.settle([])
    h.close()
    assert list(tmp_path.iterdir()) == []


def test_recover_keeps_files_with_held_groups_deletes_the_rest_and_names_the_lost(tmp_path):
    old = HeldPayloads(tmp_path, "s0")
    old.stage({"s0:1/0": group(1, 0, 0, [1.0, -1.0])})
    old.settle(["s0:1/0"])
    old.stage({"s0:2/0": group(2, 0, 1, [1.0, -1.0])})
    old.settle(["s0:1/0", "s0:2/0"])
    old.close()
    (tmp_path / "s0-000003.held.tmp").write_bytes(b"cut off")
    new = HeldPayloads(tmp_path, "s1")
    assert new.recover(["s0:1/0", "s0:5/5"]) == ["s0:5/5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0-000001.held"]
    steps = new.take("s0:1/0")
    assert [e.eid.batch for e in steps] == ["1@s0", "1@s0"] and [e.reward for e in steps] == [1.0, -1.0]
    new.settle([])
    new.close()
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- the operator (real Ray actor)


@pytest.fixture
def actor(ray_local):
    name = f"dso-held-{uuid.uuid4().hex[:8]}"
    handle = get_or_create_orchestrator({"target_groups": 2, "group_size": 2}, IndexTaskSet.of_size(8), name=name,
                                        namespace="trinity-dso")
    yield name, handle
    ray_local.kill(handle)


def test_the_operator_never_writes_a_dropped_or_released_group(actor, ray_local, tmp_path):
    name, handle = actor
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy={"target_groups": 2, "group_size": 2},
                              held_dir=str(tmp_path))

    async def run():
        step1 = group(1, 0, 0, [1.0, -1.0]) + group(1, 1, 1, [1.0, 1.0])  # informative (carried), all correct
        step2 = group(2, 0, 2, [1.0, -1.0]) + group(2, 1, 3, [-1.0, -1.0]) + group(2, 2, 4, [1.0, -1.0])
        a = await op.process(step1)
        await op.close()
        files1 = {p.name: read_refs(p) for p in tmp_path.iterdir()}
        b = await op.process(step2)  # releases 1/0 and 2/0, carries 2/2; the candidates go with the release
        await op.close()
        return a, files1, b

    (out1, m1), files1, (out2, m2) = asyncio.run(run())
    s = op.session
    # the all-correct group is a padding candidate the actor holds: it is written too
    assert files1 == {f"{s}-000001.held": [f"{s}:1/0", f"{s}:1/1"]} and m1["dso/groups_held"] == 2
    assert [e.info["task_index"]["index"] for e in out2] == [0, 0, 2, 2]
    files2 = {p.name: read_refs(p) for p in tmp_path.iterdir()}
    assert files2 == {f"{s}-000002.held": [f"{s}:2/2"]}  # step 1's file: none of it held any more
    assert ray_local.get(handle.held_refs.remote()) == [f"{s}:2/2"] and m2["dso/groups_held"] == 1


CHILD = """
import asyncio, sys, time
import ray
ray.init(address={address!r}, namespace="trinity-dso", log_to_driver=False)
import orchestrator.trinity.held as held
from trinity.common.experience import EID, Experience
from orchestrator.trinity.operator import OrchestratorOperator
def group(batch, task, index, rewards):
    return [Experience(eid=EID(batch=batch, task=task, run=run, step=0), tokens=[1, 2, 3, 4], prompt_length=2,
                       logprobs=[-0.1, -0.2], reward=r, info={{"model_version": 0, "task_index": {{"index": index}}}},
                       metrics={{"accuracy": float(r > 0)}}) for run, r in enumerate(rewards)]
if {block!r}:
    def blocked(*args, **kwargs):  # the kill comes between the actor's commit and the write
        sys.stdout.write("writing\\n")  # one write: never interleaved with the main thread's lines
        sys.stdout.flush()
        time.sleep(3600)
    held.write_file = blocked
op = OrchestratorOperator(actor_name={name!r}, namespace="trinity-dso", held_dir={held_dir!r},
                          policy={{"target_groups": 2, "group_size": 2}})
def say(text):  # one write per line: the writer thread's line never lands inside it
    sys.stdout.write(text + "\\n")
    sys.stdout.flush()
say(f"session {{op.session}}")
async def step():
    out, _ = await op.process(group(1, 0, 0, [1.0, -1.0]))  # informative: carried over
    say(f"returned {{len(out)}}")
    op.held.wait()
    say("written")
asyncio.run(step())
time.sleep(3600)
"""


def run_child_until(ray_local, name, held_dir, block: bool, line: str) -> str:
    """Run one operator step in a child process, SIGKILL it once it prints ``line``; its session.

    The child's lines are read in a thread, so a child that never prints ``line`` fails the test
    after 120 s instead of blocking the read for ever."""
    code = CHILD.format(address=ray_local.get_runtime_context().gcs_address, name=name, held_dir=str(held_dir),
                        block=block)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for text in child.stdout:
            lines.put(text)
        lines.put(None)  # the child exited

    threading.Thread(target=read, daemon=True).start()
    session, seen = None, []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                text = lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                pytest.fail(f"the child operator never printed {line!r} in 120 s; it printed {seen}")
            if text is None:
                pytest.fail(f"the child exited before {line!r} (rc {child.wait()}); it printed {seen}")
            seen.append(text.strip())
            if text.startswith("session"):
                session = text.split()[1]
            if line in text.split():
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return session


@pytest.mark.slow
def test_an_explorer_killed_after_the_write_has_its_carried_group_released_by_the_next(actor, ray_local, tmp_path):
    name, handle = actor
    dead = run_child_until(ray_local, name, tmp_path, block=False, line="written")
    assert ray_local.get(handle.held_refs.remote()) == [f"{dead}:1/0"]
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", held_dir=str(tmp_path),
                              policy={"target_groups": 2, "group_size": 2})
    out, m = asyncio.run(op.process(group(1, 0, 3, [-1.0, 1.0])))  # the new process numbers its steps again
    assert m["dso/batches_released"] == 1
    assert [(e.eid.batch, e.reward) for e in out] == [(f"1@{dead}", 1.0), (f"1@{dead}", -1.0), (1, -1.0), (1, 1.0)]
    op.held.close()  # the dead session's file is deleted in the worker thread, after the release
    assert list(tmp_path.iterdir()) == [] and ray_local.get(handle.get_stats.remote()).dropped_by_reason["lost"] == 0


@pytest.mark.slow
def test_an_explorer_killed_between_the_commit_and_the_write_has_its_group_dropped_as_lost(actor, ray_local, tmp_path):
    name, handle = actor
    dead = run_child_until(ray_local, name, tmp_path, block=True, line="writing")
    assert ray_local.get(handle.held_refs.remote()) == [f"{dead}:1/0"]  # committed by the actor, not on disk
    assert not any(p.suffix == ".held" for p in tmp_path.iterdir())
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", held_dir=str(tmp_path),
                              policy={"target_groups": 2, "group_size": 2})
    out, m = asyncio.run(op.process(group(1, 0, 3, [-1.0, 1.0]) + group(1, 1, 4, [1.0, -1.0])))
    stats = ray_local.get(handle.get_stats.remote())
    assert stats.dropped_by_reason["lost"] == 1  # dropped at the attach, before the step submitted
    assert m["dso/batches_released"] == 1 and [e.info["task_index"]["index"] for e in out] == [3, 3, 4, 4]
    assert ray_local.get(handle.held_refs.remote()) == []
