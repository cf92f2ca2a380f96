"""The anchor key layout (orchestrator/anchors/redis_layout.py) is the one the Lua scripts write.

Each test writes through the scripts on a real Redis and reads the keys back by the layout's
Python names only: a script that writes another key or field than the layout says fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis

from orchestrator.anchors import redis_layout as layout
from orchestrator.anchors.index import AnchorStep, trajectory_records
from orchestrator.anchors.redis_index import _INSERT_LUA, RedisAnchorIndex

SCRIPTS = sorted(Path(layout.__file__).parent.glob("*.lua"))
# A task id holding the field separator '|' and a two-byte character: the length prefix counts bytes.
TASK = "t|é"


@pytest.fixture
def index(redis_url, redis_namespace):
    idx = RedisAnchorIndex(redis_url, prefix=redis_namespace)
    yield idx
    idx.close()


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_script_names_keys_and_fields_only_through_the_prelude(script):
    code = "\n".join(line for line in script.read_text().splitlines() if not line.lstrip().startswith("--"))
    assert "KEYS[" not in code
    for literal in ("'epoch'", "'run_steps'", "'#n'", "'#len'", "'#done'", "'#digest'", "\\30", "\\31"):
        assert literal not in code, f"{script.name} writes {literal} by hand"


def test_the_prelude_renders_the_python_names():
    prelude = layout.lua_prelude()
    assert "local KEY = {meta = KEYS[1], steps = KEYS[2], groups = KEYS[3], runs = KEYS[4], done = KEYS[5], events = KEYS[6]}" in prelude
    assert "local FENCE_FIELD, RUN_STEPS_FIELD = 'epoch', 'run_steps'" in prelude
    assert "local RS, FS = '\\30', '\\31'" in prelude


def test_the_field_encoding_counts_utf8_bytes():
    assert layout.step_field(TASK, 2, 0) == "4:t|é|2|0"
    assert layout.group_field(TASK, "s") == "4:t|é|s"
    assert layout.run_field(TASK, 2, "done") == "4:t|é|2#done"


def test_insert_lua_writes_the_layouts_keys_and_fields(index, client, redis_namespace):
    steps = [AnchorStep(TASK, 2, 0, "s0", 1.5), AnchorStep(TASK, 2, 1, "s0", 0.25, last=True)]
    assert index.insert("b1", steps) == 2
    keys = layout.batch_keys(redis_namespace, "b1")
    assert client.hget(keys["meta"], layout.FENCE_FIELD).decode() == index.fence("b1")
    assert client.hget(keys["steps"], layout.step_field(TASK, 2, 1)) == b"s0\x1f0.25"
    # group (TASK, s0): returns 1.5, 0.25 -> n 2, c 0.25, S1 = 1.25, S2 = 1.5625
    assert client.hget(keys["groups"], layout.group_field(TASK, "s0")).split() == [b"2", b"0.25", b"1.25", b"1.5625"]
    assert client.hget(keys["runs"], layout.run_field(TASK, 2, "n")) == b"2"
    assert client.hget(keys["runs"], layout.run_field(TASK, 2, "len")) == b"2"
    assert client.hget(keys["runs"], layout.run_field(TASK, 2, "done")) == b"1"
    assert client.hget(keys["done"], TASK) == b"1"
    assert client.sismember(layout.registry_key(redis_namespace), "b1")


def test_insert_runs_lua_writes_the_layouts_keys_and_fields(index, client, redis_namespace):
    # one trajectory of task TASK, run 3: steps (state x, R 2.0), (state x, R 1.0)
    records = trajectory_records([0, 0], [TASK], [3, 3], [0, 1], [0, 0], ["x"], [2.0, 1.0])
    receipt = index.insert_trajectories("b2", records)
    assert receipt.added == 1
    keys = layout.batch_keys(redis_namespace, "b2")
    assert client.hget(keys["meta"], layout.FENCE_FIELD).decode() == index.fence("b2")
    assert client.hget(keys["meta"], layout.RUN_STEPS_FIELD) == b"2"
    digest = f"{int(records.run_digest[0]):016x}"
    assert client.hget(keys["runs"], layout.run_field(TASK, 3, "digest")).decode() == f"2:{digest}"
    assert client.hget(keys["runs"], layout.run_field(TASK, 3, "done")) == b"1"
    # group (TASK, x): returns 2, 1 -> n 2, c 1, S1 = 1, S2 = 1
    assert client.hget(keys["groups"], layout.group_field(TASK, "x")).split() == [b"2", b"1", b"1", b"1"]
    ((_, fields),) = client.xrange(keys["events"])
    assert fields == {layout.EVENT_TASK.encode(): TASK.encode(), layout.EVENT_DONE.encode(): b"1"}


def test_a_script_called_with_other_keys_than_the_layouts_is_refused(client, redis_namespace):
    keys = list(layout.batch_keys(redis_namespace, "b3").values())[:5]
    with pytest.raises(redis.ResponseError, match=re.escape("LAYOUT expected 6 keys (meta, steps, groups, runs, done, events), got 5")):
        client.eval(_INSERT_LUA, len(keys), *keys, "1000", "", "f", "")
    assert client.exists(*keys) == 0
