"""GPU smoke test of trinity-dso in a real Trinity-RFT run (called by deploy/gpu/smoke.sh).

``check-vllm``: the installed vLLM lies inside Trinity-RFT 0.6.0's supported range (read from
its package metadata), and our engine code (:class:`orchestrator.rollout.engine.VLLMEngine`:
``LLM.chat``, ``SamplingParams``, ``StructuredOutputsParams``) runs on it: one sampled and one
constrained generation with the tiny model.

``run``: the taskset and tiny model of ``tests/trinity/test_trinity_explorer.py`` through
Trinity's own vLLM engine and verl trainer with the ``dso_orchestrator`` selector and operator.
With 2+ GPUs: ``mode: both`` (trainer-driven NCCL sync). With 1 GPU: ``mode: explore`` into a
SQLite buffer, then ``mode: train`` from it (the same experiences, one stage after the other).
Checks: the orchestrator released batches of exactly ``target_groups x repeat_times``
experiences and the trainer finished its steps.

Not run in the CPU sessions that wrote it (no GPU there); written for a GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

B, N, STEPS = 4, 4, 3


def vllm_range() -> tuple[str, str]:
    for req in importlib.metadata.requires("trinity-rft") or []:
        m = re.match(r"vllm\s*>=\s*([\d.]+)\s*,\s*<=\s*([\d.]+)", req.replace(" ", ""))
        if m:
            return m.group(1), m.group(2)
    return "0.19.1", "0.23.0"  # trinity-rft 0.6.0


def check_vllm(model: Path) -> None:
    import vllm
    from packaging.version import Version

    lo, hi = vllm_range()
    v = Version(vllm.__version__.split("+")[0])
    assert Version(lo) <= v <= Version(hi), f"vllm {v} is outside Trinity's range [{lo}, {hi}]"
    from orchestrator.rollout.engine import VLLMEngine

    engine = VLLMEngine(str(model), max_model_len=256, dtype="float32", gpu_memory_utilization=0.2)
    (samples,) = engine.generate([[{"role": "user", "content": "hi"}]], 2, {"max_tokens": 4, "temperature": 1.0})
    assert len(samples) == 2 and all(len(s["logprobs"]) == len(s["token_ids"]) for s in samples)
    (choice,) = engine.chat_choice([[{"role": "user", "content": "left or right?"}]], ["left", "right"])
    print(f"vllm {v} in [{lo}, {hi}]; VLLMEngine.generate and chat_choice work: {choice['text']!r}")


def tiny(out: Path) -> Path:
    from orchestrator.rollout.model import build_tiny_model, ensure_smollm2

    return build_tiny_model(out / "tiny", ensure_smollm2())


def config(out: Path, model: Path, mode: str, buffer: dict) -> Path:
    from test_trinity_explorer import label  # the CPU test's labels: same taskset

    data = out / "tasks"
    data.mkdir(exist_ok=True)
    (data / "train.jsonl").write_text("".join(json.dumps({"prompt": f"Say something about {i}.", "label": label(i)}) + "\n"
                                              for i in range(48)))
    cfg = {
        "mode": mode, "project": "dso-gpu-smoke", "name": "smoke", "checkpoint_root_dir": str(out / "ckpt"),
        "continue_from_checkpoint": True,
        "model": {"model_path": str(model), "max_response_tokens": 8, "max_model_len": 256},
        "algorithm": {"algorithm_type": "dso_dapo", "repeat_times": N},
        "buffer": {
            "total_steps": STEPS, "batch_size": B,
            "explorer_input": {
                "taskset": {"name": "labels", "storage_type": "file", "path": str(data), "split": "train",
                            "format": {"prompt_key": "prompt", "response_key": "label"},
                            "rollout_args": {"temperature": 1.0, "max_tokens": 8},
                            "data_selector": {"selector_type": "dso_orchestrator",
                                              "kwargs": {"actor_name": "dso-gpu-smoke", "policy": {"filter": {"judge": "accuracy"}}}}},
                "default_workflow_type": "simple_workflow",
                "default_reward_fn_type": "dso_trinity_harness.LabelReward",
            },
            "trainer_input": {"experience_buffer": buffer},
        },
        "data_processor": {"experience_pipeline": {"operators": [{"name": "dso_orchestrator", "args": {}}]}},
        "explorer": {"rollout_model": {"engine_num": 1, "dtype": "float32", "gpu_memory_utilization": 0.3}},
        "synchronizer": {"sync_style": "trainer_driven", "sync_method": "nccl", "sync_interval": 1},
        "trainer": {"save_interval": 100},
        "monitor": {"monitor_type": "tensorboard"},
    }
    path = out / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def trinity(path: Path) -> None:
    subprocess.run(["trinity", "run", "--config", str(path), "--plugin-dir", "examples/plugin_dir"], check=True, timeout=420)


def run(out: Path) -> None:
    import ray
    import torch

    model = tiny(out)
    subprocess.run(["ray", "start", "--head", "--disable-usage-stats"], check=True)
    if torch.cuda.device_count() >= 2:
        trinity(config(out, model, "both", {"name": "smoke_q", "storage_type": "queue"}))
    else:  # one GPU: explore into SQLite, then train from it
        db = {"name": "smoke_db", "storage_type": "sql", "path": f"sqlite:///{out}/buffer.db"}
        trinity(config(out, model, "explore", db))
        trinity(config(out, model, "train", db))
    ray.init(address="auto", namespace="trinity-dso")
    stats = ray.get(ray.get_actor("dso-gpu-smoke").get_stats.remote())
    print(stats.model_dump_json(include={"batches_emitted", "groups_emitted", "groups_dropped", "groups_submitted"}))
    assert stats.batches_emitted >= STEPS - 1, stats
    trainer_step = (out / "ckpt/dso-gpu-smoke/smoke/latest_checkpointed_iteration.txt")
    print("trainer checkpoint:", trainer_step.read_text() if trainer_step.exists() else "(none: see run.log)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["check-vllm", "run"])
    p.add_argument("--out", type=Path, default=Path("/tmp/dso-gpu-smoke"))
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "trinity"))
    if a.cmd == "check-vllm":
        check_vllm(tiny(a.out))
    else:
        run(a.out)


if __name__ == "__main__":
    main()
