"""`trinity-dso demo --algo gigpo` as a user meets it: fail-fast index check, progress, table.

The CLI tests run the real command in a subprocess with the seeded random policy (no model).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.anchors.index import AnchorIndexError
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.cli.app import gigpo_table
from orchestrator.jobs.gigpo import GiGPOJobConfig, run_gigpo_job

BIN = Path(sys.executable).parent / "trinity-dso"


def closed_port_url(password: str | None = None) -> str:
    """A redis:// URL on a 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    auth = f":{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{port}/0"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN), "demo", "--algo", "gigpo", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "COLUMNS": "200"},
    )


def render(table) -> str:
    con = Console(record=True, width=200)
    con.print(table)
    return con.export_text()


# -- the index check


def test_ping_of_a_closed_port_names_the_url_and_hides_the_password():
    url = closed_port_url(password="hunter2")
    with pytest.raises(AnchorIndexError) as err:
        RedisAnchorIndex(url, socket_timeout=2).ping()
    msg = str(err.value)
    assert "hunter2" not in msg
    assert url.replace(":hunter2@", "***@") in msg and "PING failed" in msg and "refused" in msg.lower()


def test_ping_of_a_url_without_scheme_is_a_malformed_url_error():
    with pytest.raises(AnchorIndexError, match=r"RedisAnchorIndex\(localhost:6379\): malformed URL"):
        RedisAnchorIndex("localhost:6379").ping()


def test_ping_hides_a_password_given_as_query_option():
    with pytest.raises(AnchorIndexError) as err:
        RedisAnchorIndex("redis://127.0.0.1:6379/0?password=hunter2&bogus=1").ping()
    assert "hunter2" not in str(err.value) and "password=***" in str(err.value)


def test_ping_of_a_live_server_returns_the_round_trip(redis_server):
    rtt = RedisAnchorIndex(redis_server.url).ping()
    assert 0 < rtt < 5


def test_memory_index_ping_is_free():
    assert MemoryAnchorIndex().ping() == 0.0


def test_job_checks_the_index_before_any_rollout():
    calls = []

    def act(prompts, choices):  # the policy must never be asked
        calls.append(len(prompts))
        raise AssertionError("rolled out before the index check")

    logs: list[str] = []
    with pytest.raises(AnchorIndexError, match="PING failed"):
        run_gigpo_job(GiGPOJobConfig(policy="engine", redis_url=closed_port_url()), act=act, log=logs.append)
    assert calls == []
    assert not any(m.startswith("rollout") for m in logs)


# -- summary and progress


def test_summary_names_policy_and_index_store_and_progress_is_reported():
    logs: list[str] = []
    r = run_gigpo_job(GiGPOJobConfig(tasks=2, n=3, max_steps=4, workers=2, seed=3), log=logs.append)
    assert (r["policy"], r["backend"]) == ("random", "memory")
    assert logs[0] == "anchor index: in memory (no --redis-url)"
    # one line per policy call; the first turn has all 2 x 3 trajectories live
    turns = [m for m in logs if m.startswith("rollout turn ")]
    assert turns[0] == "rollout turn 1/4: 6 of 6 trajectories still playing"
    assert 1 <= len(turns) <= 4
    assert any(m.startswith("index (memory): writing ") for m in logs)
    assert any(m.startswith("advantages: 2 workers querying") for m in logs)


def test_gigpo_table_labels_the_index_store_policy_and_informative_steps():
    summary = {
        "algo": "gigpo", "backend": "redis", "policy": "random", "workers": 2, "batch_key": "b",
        "tasks": 1, "trajectories": 2, "steps": 4, "anchor_groups": 3, "anchor_group_fraction": 0.5,
        "informative_step_fraction": 0.25, "group_size_histogram": {1: 2, 2: 1},
        "timings": {"rollout_s": 1.5, "total_s": 2.0},
    }
    text = render(gigpo_table(summary))
    lines = {ln.split("│")[1].strip(): ln.split("│")[2].strip() for ln in text.splitlines() if ln.count("│") == 3}
    assert lines["anchor index"] == "redis"
    assert lines["rollout policy"] == "random"
    assert lines["informative steps (A_S != 0)"] == "0.250"
    assert lines["time: rollout (s)"] == "1.500"
    assert "backend" not in lines and "random policy, 2.0 s" in text


# -- the CLI, as a subprocess


def test_cli_bad_redis_url_fails_fast_with_one_red_line_and_exit_1(tmp_path):
    url = closed_port_url(password="hunter2")
    t0 = time.monotonic()
    proc = cli("--backend", "random", "--redis-url", url, "--out", str(tmp_path))
    assert time.monotonic() - t0 < 30
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout and "hunter2" not in proc.stderr + proc.stdout
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert err[0].startswith("error: RedisAnchorIndex(" + url.replace(":hunter2@", "***@") + "): PING failed")
    assert "rollout" not in proc.stdout and not (tmp_path / "gigpo.json").exists()


def test_cli_shows_progress_and_the_labelled_table(tmp_path):
    proc = cli("--backend", "random", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for line in ("anchor index: in memory", "rollout turn 1/12: 64 of 64", "index (memory): writing ", "advantages: 2 workers querying"):
        assert line in out, out
    assert out.index("rollout turn 1/12") < out.index("advantages: 2 workers querying") < out.index("rollout policy")
    summary = json.loads((tmp_path / "gigpo.json").read_text())
    assert (summary["policy"], summary["backend"]) == ("random", "memory")
    assert "informative steps (A_S != 0)" in out and "anchor index" in out
