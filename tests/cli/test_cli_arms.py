"""``--arms`` of ``ablate-dapo`` and ``compare-gigpo``: the help names every arm the job runs."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.jobs import ablation, gigpo_compare

BIN = Path(sys.executable).parent / "trinity-dso"


@pytest.mark.parametrize(("command", "arms"), [("ablate-dapo", ablation.ARMS), ("compare-gigpo", gigpo_compare.ARMS)])
def test_arms_help_lists_the_arms_of_the_job_in_order(command, arms):
    out = subprocess.run([str(BIN), command, "--help"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "COLUMNS": "400"})
    assert out.returncode == 0, out.stderr
    listed = re.search(r"Comma-separated arms among (.*?) \(default: all\)", out.stdout).group(1)
    assert listed.split(", ") == list(arms)
