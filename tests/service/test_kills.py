"""Fault and load tests of the orchestrator actor on a real Ray runtime with a real SQLite sink.

Every call goes through :class:`orchestrator.service.calls.ActorCalls`, as the Trinity operator
and task selector call the actor (the same call re-sent with its call id while the actor
restarts); the tests add no retry loop of their own.

* 10 random kills (SIGKILL of the actor's process and ``ray.kill(no_restart=False)``, alternating)
  while a driver submits groups *without round tags* (``submit_groups`` with a call id) and pops
  batches (with call ids): every group is counted once (an untagged group gets its identity from
  the call id), none is emitted twice, none is lost (each informative group is in the sink or
  held), and every batch reaches the driver exactly once.
* 6 random kills while a driver calls ``submit_and_pop`` with call ids: the same, and every
  batch reaches the driver exactly once (a re-sent call gets the batches its lost answer held).
* 5 random kills while a driver calls ``next_batch`` with call ids: every batch reaches it once.
* 4 random kills while a driver calls ``submit_experiences`` with call ids: the same as the first.
* 16 concurrent submitters: the same accounting.
* a detached orchestrator created by a driver that exited (as Trinity's explorer creates it)
  restarts after a SIGKILL and resumes from its state file.
"""

import itertools
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import ray

from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks
from orchestrator.service.actor import DEFAULT_NAMESPACE, get_or_create_orchestrator
from orchestrator.service.calls import ActorCalls
from orchestrator.service.sink import SQLiteSink
from orchestrator.tasks.taskset import IndexTaskSet

TASKS = [f"t{i}" for i in range(20)]
N = 2
PATTERNS = {"informative": [1.0, -1.0], "all_wrong": [-1.0, -1.0], "all_correct": [1.0, 1.0]}


def make_group(task: str, tag: str, kind: str, tagged: bool = True) -> Group:
    """A group of ``task``; ``info["tag"]`` always names its step, ``eid.round_tag`` only when ``tagged``."""
    return Group(task_id=task, rollouts=[
        Experience(eid=ExperienceId(task=task, run=r, round_tag=tag if tagged else ""), reward=v, info={"tag": tag})
        for r, v in enumerate(PATTERNS[kind])])


def sink_groups(path) -> Counter:
    """(task, tag) of every group in the sink, counted."""
    import sqlite3

    rows = sqlite3.connect(path).execute("SELECT batch_id, group_index, task, info FROM experiences WHERE run = 0")
    import json

    return Counter((task, json.loads(info)["tag"]) for _, _, task, info in rows)


def check_accounting(calls: ActorCalls, sink_path, sent: dict[tuple[str, str], str], anon: dict | None = None) -> None:
    """``anon``: the key of each untagged group (``anon:<call id>:<position>``) -> its (task, tag)."""
    stats = calls.call("get_stats")
    state = calls.call("state_dict")
    in_sink = sink_groups(sink_path)
    assert [k for k, c in in_sink.items() if c > 1] == []  # none emitted twice
    assert stats.groups_submitted == len(sent)  # every group counted once
    assert stats.groups_submitted == stats.groups_emitted + stats.groups_padded + stats.groups_dropped + stats.groups_held
    assert sum(in_sink.values()) == stats.groups_emitted + stats.groups_padded
    held = {anon[k] if anon is not None else tuple(k.split("\x1f")[:2]) for k in state["carry"]}
    informative = {k for k, kind in sent.items() if kind == "informative"}
    assert informative == {k for k in in_sink if sent[k] == "informative"} | held  # none lost
    ids = SQLiteSink(sink_path).batch_ids()
    assert ids == list(range(len(ids)))


def start_killer(name: str, rng: random.Random, times: int) -> tuple[threading.Thread, list[str]]:
    """A thread that kills the named actor ``times`` times at random moments (SIGKILL of its
    process and ``ray.kill(no_restart=False)``, alternating), each time waiting for it to answer again."""
    kills: list[str] = []

    calls = ActorCalls(name=name)

    def killer() -> None:
        for i in range(times):
            time.sleep(rng.uniform(0.2, 1.0))
            if i % 2:
                os.kill(calls.call("__ray_call__", lambda self: os.getpid()), signal.SIGKILL)
                kills.append("SIGKILL")
            else:
                ray.kill(calls.handle, no_restart=False)
                kills.append("ray.kill")
            calls.call("ping")  # let it come back before the next kill

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    return thread, kills


def random_groups(rng: random.Random, step: int, tagged: bool = True) -> tuple[list[Group], list[str]]:
    """Five groups of step ``step`` on random tasks, and the label each should get."""
    kinds = [rng.choice(list(PATTERNS)) for _ in range(5)]
    return [make_group(t, f"s{step}", k, tagged) for t, k in zip(rng.sample(TASKS, 5), kinds)], kinds


def drive_under_kills(sink_path, name: str, seed: int, times: int, call, tagged: bool = True) -> tuple:
    """A fresh actor killed ``times`` times while the driver sends ``call(calls, groups, step)``
    (-> labels, handed batch ids) for at least 10 steps, through :class:`ActorCalls` only.

    Returns:
        the actor's calls, the label of every group sent by (task, tag), the batch ids handed
        out in order, and the kills done.
    """
    rng = random.Random(seed)
    actor = get_or_create_orchestrator({"target_groups": 4, "group_size": N}, ScriptedTasks(TASKS),
                                       sink=SQLiteSink(sink_path), name=name)
    calls = ActorCalls(actor, name=name)
    calls.call("ping")
    thread, kills = start_killer(name, rng, times)
    sent: dict[tuple[str, str], str] = {}
    handed: list[int] = []
    step = 0
    while thread.is_alive() or step < 10:
        groups, kinds = random_groups(rng, step, tagged)
        labels, ids = call(calls, groups, step)
        assert labels == kinds
        sent.update({(g.task_id, f"s{step}"): k for g, k in zip(groups, labels)})
        handed += ids
        step += 1
    thread.join()
    return calls, sent, handed, kills


@pytest.mark.slow
def test_ten_random_kills_lose_and_duplicate_no_untagged_group(ray_local, tmp_path):
    anon: dict[str, tuple[str, str]] = {}

    def submit_then_pop(calls, groups, step):
        call_id = f"submit-{step}"  # re-sent with it while the actor restarts: its untagged groups are known
        anon.update({f"anon:{call_id}:{i}": (g.task_id, f"s{step}") for i, g in enumerate(groups)})
        labels = calls.call("submit_groups", groups, call_id=call_id)
        ids = []
        for k in itertools.count():
            if (batch := calls.call("pop_batch", call_id=f"pop-{step}-{k}")) is None:
                break
            ids.append(batch.batch_id)
        return labels, ids

    calls, sent, handed, kills = drive_under_kills(tmp_path / "run.db", "dso-kills", 11, 10, submit_then_pop, tagged=False)
    assert len(kills) == 10
    assert sorted(handed) == SQLiteSink(tmp_path / "run.db").batch_ids()  # every batch handed out, once (re-sends included)
    check_accounting(calls, tmp_path / "run.db", sent, anon)
    ray.kill(calls.handle)


@pytest.mark.slow
def test_kills_during_submit_experiences_with_call_ids_lose_and_duplicate_no_group(ray_local, tmp_path):
    """``submit_experiences`` (untagged experiences, grouped by the actor) re-sent with its call id
    while the actor restarts: every group counted once, none lost, every batch handed out once."""
    anon: dict[str, tuple[str, str]] = {}

    def submit_then_pop(calls, groups, step):
        call_id = f"exps-{step}"  # its groups are numbered in the order their tasks first appear
        anon.update({f"anon:{call_id}:{i}": (g.task_id, f"s{step}") for i, g in enumerate(groups)})
        labels = calls.call("submit_experiences", [e for g in groups for e in g.rollouts], call_id=call_id)
        ids = []
        for k in itertools.count():
            if (batch := calls.call("pop_batch", call_id=f"pop-{step}-{k}")) is None:
                break
            ids.append(batch.batch_id)
        return list(labels), ids

    calls, sent, handed, kills = drive_under_kills(tmp_path / "run.db", "dso-kills-exps", 14, 4, submit_then_pop,
                                                   tagged=False)
    assert len(kills) == 4
    assert sorted(handed) == SQLiteSink(tmp_path / "run.db").batch_ids()
    check_accounting(calls, tmp_path / "run.db", sent, anon)
    ray.kill(calls.handle)


@pytest.mark.slow
def test_kills_during_submit_and_pop_with_call_ids_hand_every_batch_out_once(ray_local, tmp_path):
    def submit_and_pop(calls, groups, step):
        labels, batches = calls.call("submit_and_pop", groups, call_id=f"call-{step}")
        return labels, [b.batch_id for b in batches]

    calls, sent, handed, kills = drive_under_kills(tmp_path / "run.db", "dso-kills-pop", 12, 6, submit_and_pop)
    assert len(kills) == 6
    assert sorted(handed) == SQLiteSink(tmp_path / "run.db").batch_ids()  # every batch handed out, once (re-sends included)
    check_accounting(calls, tmp_path / "run.db", sent)
    ray.kill(calls.handle)


@pytest.mark.slow
def test_kills_during_next_batch_with_call_ids_hand_every_batch_out_once(ray_local, tmp_path):
    name, sink_path = "dso-kills-next", tmp_path / "run.db"
    script = {t: [[1.0, -1.0], [1.0, 1.0]] for t in TASKS}  # informative, then all correct, per task
    actor = get_or_create_orchestrator({"target_groups": 4, "group_size": N}, ScriptedTasks(TASKS),
                                       ScriptedRolloutSource(script), sink=SQLiteSink(sink_path), name=name)
    calls = ActorCalls(actor, name=name)
    calls.call("ping")
    thread, kills = start_killer(name, random.Random(13), 5)
    handed: list[int] = []
    k = 0
    while thread.is_alive() or k < 10:
        handed.append(calls.call("next_batch", call_id=f"next-{k}").batch_id)
        k += 1
    thread.join()
    assert len(kills) == 5
    assert sorted(handed) == SQLiteSink(sink_path).batch_ids()  # none handed out twice, none lost on the way
    assert handed == list(range(len(handed)))
    ray.kill(actor)


@pytest.mark.slow
def test_sixteen_concurrent_submitters(ray_local, tmp_path):
    sink_path = tmp_path / "run.db"
    actor = get_or_create_orchestrator({"target_groups": 8, "group_size": N}, ScriptedTasks(TASKS),
                                       sink=SQLiteSink(sink_path), name="dso-16")
    kinds = {}

    def submitter(i: int) -> None:
        rng = random.Random(i)
        for step in range(10):
            tag = f"w{i}s{step}"
            groups = [make_group(t, tag, rng.choice(list(PATTERNS))) for t in rng.sample(TASKS, 4)]
            for g in groups:
                kinds[(g.task_id, tag)] = g.rollouts and ("informative" if g.rollouts[0].reward != g.rollouts[1].reward
                                                          else "all_correct" if g.rollouts[0].reward > 0 else "all_wrong")
            ray.get(actor.submit_groups.remote(groups))
            ray.get(actor.submit_groups.remote(groups))  # sent again: not counted again

    threads = [threading.Thread(target=submitter, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_accounting(ActorCalls(actor), sink_path, kinds)
    ray.kill(actor)


@pytest.mark.slow
def test_a_detached_orchestrator_created_by_an_exited_explorer_restarts_after_a_crash(ray_local, tmp_path):
    # Trinity's explorer creates the orchestrator (detached) for a 20,000-row taskset, then exits;
    # the actor's process is then killed: Ray restarts it from its constructor arguments and it
    # resumes from its state file (arguments above ~100 KB would have died with their owner)
    name = "dso-orphan"
    code = (
        "import ray\n"
        f"ray.init(address={ray_local.get_runtime_context().gcs_address!r}, namespace={DEFAULT_NAMESPACE!r})\n"
        "from orchestrator.trinity.attach import AttachConfig, create_orchestrator\n"
        f"cfg = AttachConfig(actor_name={name!r}, checkpoint_path={str(tmp_path / 'run.db')!r},"
        " policy={'group_size': 2, 'target_groups': 1}, metrics=False)\n"
        "ray.get(create_orchestrator(cfg, 20_000).set_model_version.remote(7))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    actor = ray.get_actor(name, namespace=DEFAULT_NAMESPACE)
    try:
        pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        os.kill(pid, signal.SIGKILL)
        stats = ActorCalls(actor, deadline_s=60).call("get_stats")
        assert ray.get(actor.__ray_call__.remote(lambda self: os.getpid())) != pid
        assert stats.model_version == 7  # resumed from the state file
        assert ray.get(actor.__ray_call__.remote(lambda self: len(self.core.task_ids))) == 20_000
    finally:
        ray.kill(actor)


def test_a_detached_orchestrator_with_an_argument_in_the_object_store_is_warned_about(ray_local, tmp_path, caplog):
    tasks = IndexTaskSet([f"task-{i}" for i in range(20_000)])  # ~300 KB pickled: above Ray's inline limit
    with caplog.at_level(logging.WARNING, logger="trinity_dso.actor"):
        actor = get_or_create_orchestrator({"group_size": 2, "target_groups": 1}, tasks, name="dso-big-args",
                                           detached=True, checkpoint_path=str(tmp_path / "run.db"))
    ray.kill(actor)
    assert "cannot restart the detached actor after a crash" in caplog.text
