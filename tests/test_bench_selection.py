"""``bench/bench_selection.py`` runs every strategy (``make bench`` stopped at the oracle once:
its selection did not set ``picked_epochs``)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_strategy_of_the_selection_bench_runs(tmp_path):
    out = tmp_path / "sel.json"
    subprocess.run([sys.executable, "bench/bench_selection.py", "--seeds", "1", "--batches", "3", "--target", "4", "--n", "4",
                    "--tasks", "32", "--json", str(out)], cwd=ROOT, check=True, capture_output=True, timeout=300)
    text = out.read_text()
    assert "oracle" in text and "ours, informative" in text
    assert json.loads(text)
