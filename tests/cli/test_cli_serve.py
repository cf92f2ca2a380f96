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


def refused_before_ray(tmp_path, config_text: str) -> str:
    """Run ``serve`` on a config that must be refused: exit code 2, no traceback, Ray never named; its output."""
    config = tmp_path / "serve.yaml"
    config.write_text(config_text)
    done = subprocess.run([str(BIN), "serve", "--config", str(config)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "COLUMNS": "200"}, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert "Traceback" not in out and "Ray" not in out
    return out


def test_an_invalid_policy_in_the_config_is_refused_in_one_line_before_ray_starts(tmp_path):
    out = refused_before_ray(tmp_path, "orchestrator:\n  policy: {max_replenish_rounds: -1}\n")
    assert "orchestrator.policy.max_replenish_rounds: Input should be greater than or equal to 0 (got -1)" in out


def test_two_actor_names_in_the_config_are_refused_in_one_line_before_ray_starts(tmp_path):
    out = refused_before_ray(tmp_path, "orchestrator: {name: run-a}\nservice: {actor_name: other}\n")
    assert "service.actor_name 'other' differs from orchestrator.name 'run-a'" in out
