"""`trinity-dso serve` as a user runs it (a real subprocess: local Ray, the actor, Ray Serve)."""

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent / "trinity-dso"
CONFIG = Path(__file__).resolve().parents[2] / "examples/service/service.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ctrl_c_during_start_up_stops_the_service_once_it_is_up(tmp_path):
    proc = subprocess.Popen(
        [str(BIN), "serve", "--config", str(CONFIG), "--port", str(free_port())], cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )
    try:
        lines = []
        for line in proc.stdout:  # Ray Serve has started; the app is being deployed
            lines.append(line)
            if "Started Serve in namespace" in line:
                proc.send_signal(signal.SIGINT)
                break
        out = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert out.index("trinity-dso REST service at") < out.index("stopping the REST service")
