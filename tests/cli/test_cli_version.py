"""``trinity-dso --version``: what a bug report needs, from the installed distributions."""

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent / "trinity-dso"


def test_version_prints_ours_first_then_the_stack_and_exits_0():
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    out = subprocess.run([str(BIN), "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"trinity-dso {ours}"
    names = [line.split()[0] for line in lines]
    assert names[1:3] == ["trinity-rft", "ray"] and "torch" in names


def test_the_module_runs_as_the_script_does():
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli.app", "--version"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith("trinity-dso ")
