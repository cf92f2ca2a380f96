"""`trinity-dso demo` as a user runs it (a real subprocess, real local Ray), scripted backend."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent / "trinity-dso"


@pytest.mark.slow
def test_scripted_demo_prints_table_and_writes_consistent_json(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run(
        [str(BIN), "demo", "--backend", "scripted", "--batches", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "batches emitted" in proc.stdout and "rollouts wasted" in proc.stdout
    summary = json.loads((out / "demo.json").read_text())
    s = summary["stats"]
    assert s["batches_emitted"] == 2 and s["groups_emitted"] == 16  # target 8 groups per batch
    assert [b["groups"] for b in summary["batches"]] == [8, 8]
    assert s["groups_submitted"] == s["groups_emitted"] + s["groups_padded"] + s["groups_dropped"] + s["groups_held"]
    # scripted tasks cycle all-correct / all-wrong / informative: both drop reasons occur
    assert s["classified_by_reason"]["all_correct"] > 0 and s["classified_by_reason"]["all_wrong"] > 0
    assert s["rollouts_total"] == 8 * s["groups_submitted"]


@pytest.mark.slow
def test_a_second_demo_in_the_same_directory_says_it_starts_afresh(tmp_path):
    out = tmp_path / "demo"
    runs = [
        subprocess.run([str(BIN), "demo", "--backend", "scripted", "--batches", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
        for _ in range(2)
    ]
    assert [p.returncode for p in runs] == [0, 0], runs[1].stderr[-2000:]
    assert "starting afresh" not in runs[0].stdout
    assert f"starting afresh: the previous run's {out / 'buffer.db'} is replaced" in runs[1].stdout
    assert json.loads((out / "demo.json").read_text())["stats"]["batches_emitted"] == 1
