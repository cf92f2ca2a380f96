"""`trinity-dso train` (`make demo`) serves its run's live page at the URL it prints first (a real subprocess)."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_train_prints_the_live_page_url_and_serves_it_while_it_runs(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli.app", "train", "--out", str(tmp_path / "run")], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "300"},
    )
    try:
        lines, url = [], None
        deadline = time.monotonic() + 240
        for line in proc.stdout:
            lines.append(line)
            if m := re.search(r"live page of the run: (http://127\.0\.0\.1:\d+/dashboard)", line):
                url = m.group(1)
                break
            assert time.monotonic() < deadline, "".join(lines)[-3000:]
        assert url is not None, "".join(lines)[-3000:]
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "<title>trinity-dso: live run</title>" in page.text
        # the run's actor is found by the name the page's app was deployed for, once it exists
        # the app is bound to the run's actor (dso-train-<hex>): 503 naming it until the actor is created, then 200
        stats = httpx.get(url.removesuffix("/dashboard") + "/v1/stats", timeout=60)
        assert stats.status_code == 200 or (stats.status_code == 503 and "'dso-train-" in stats.json()["message"]), stats.text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
