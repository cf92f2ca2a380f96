"""Trinity 0.6's actor loss path under verl 0.8 (the GPU route's pin), on CPU: run as a script.

It needs verl 0.8.0 and tensordict on ``sys.path`` (``make install`` puts them, without their
dependencies, in ``.venv/verl-engine``; the rest of the suite runs without verl, as the CPU
route does). What it drives, in the order a Trinity trainer step does:

1. Trinity ``Experience`` objects released by our operator (:func:`stamp_batch_counts`: the
   loss counts and Trinity's ``CustomField``);
2. Trinity's ``trinity.trainer.verl.utils.to_data_proto`` (the custom field becomes a batch
   tensor) and ``DataProto.to_tensordict``; verl's ``left_right_2_no_padding`` (as Trinity's
   ``_update_actor``);
3. micro-batches of ``micro`` rows with verl's ``tensordict_utils.chunk_tensordict`` (what
   verl's ``prepare_micro_batches`` does without dynamic batch sizes);
4. per micro-batch, Trinity's own ``TrinityPolicyLoss`` (``trinity/trainer/verl/losses.py``,
   the callable verl's engine gets through ``set_loss_fn``) over ``dso_clip_higher`` from
   Trinity's registry, its loss back-propagated as returned (verl's engine,
   ``forward_backward_batch``: no per-micro-batch scale).

The "model" is a leaf tensor of per-token log-probs (one row per experience, one column per
token position), so the gradient is exact and comparable. Prints one JSON object: per case
(``mode/empty_seqs/placement/micro``), the summed loss and the gradient, flattened.
"""

from __future__ import annotations

import json
import logging
import sys

import torch


def experiences(placement: str) -> list:
    """Two kept groups of 2 (uneven response lengths) and one padding group of 2, the padding
    rows first, last or spread."""
    from trinity.common.experience import EID, Experience

    def exp(task, run, prompt, response, reward, adv, padding=False):
        n = len(response)
        return Experience(eid=EID(batch=0, task=task, run=run), tokens=torch.tensor(prompt + response),
                          logprobs=torch.linspace(-1.5, -0.5, n), prompt_length=len(prompt), reward=reward,
                          action_mask=torch.zeros(n) if padding else torch.ones(n),
                          advantages=torch.full((n,), adv), info={"dso_padding": True} if padding else {})

    kept = [exp("a", 0, [5, 6], [7], 1.0, 0.7), exp("a", 1, [5, 6], [8, 9, 10], -1.0, -0.7),
            exp("b", 0, [6], [7, 7], 1.0, 0.7), exp("b", 1, [6], [9, 9, 9, 2], -1.0, -0.7)]
    pad = [exp("p", 0, [5], [7, 8], 1.0, 0.0, True), exp("p", 1, [5], [9], -1.0, 0.0, True)]
    if placement == "first":
        return pad + kept
    if placement == "last":
        return kept + pad
    if placement == "spread":
        return [kept[0], pad[0], kept[1], kept[2], pad[1], kept[3]]
    return kept  # "none"


def run_case(mode: str, empty: str, placement: str, micro: int) -> tuple[float, list[float]]:
    from trinity.algorithm import POLICY_LOSS_FN  # noqa: F401  (registry filled by the plugin)
    from trinity.common.config import AlgorithmConfig
    from trinity.trainer.verl.losses import TrinityPolicyLoss
    from trinity.trainer.verl.utils import to_data_proto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    from orchestrator.trinity.operator import stamp_batch_counts

    exps = experiences(placement)
    stamp_batch_counts(exps)
    proto = to_data_proto(exps, pad_token_id=0, model=torch.nn.Linear(1, 1), logger=logging.getLogger("t"))
    proto.batch["old_log_probs"] = proto.batch["rollout_log_probs"]
    proto.batch["row"] = torch.arange(len(exps))
    data = left_right_2_no_padding(proto.to_tensordict())
    args = {"loss_agg_mode": mode, "loss_agg_empty_seqs": empty, "clip_range_low": 0.2, "clip_range_high": 0.28}
    if mode == "seq-mean-token-sum-norm":
        args["loss_agg_norm_length"] = 4
    loss_fn = TrinityPolicyLoss(AlgorithmConfig(policy_loss_fn="dso_clip_higher", policy_loss_fn_args=args,
                                                kl_loss_fn="none", kl_loss_fn_args={}, entropy_loss_fn="none",
                                                entropy_loss_fn_args={"entropy_coef": 0.0}, loss_agg_mode=mode))
    lengths = proto.batch["attention_mask"].sum(-1)
    theta = torch.linspace(-2.0, -0.2, len(exps) * lengths.max().item(), dtype=torch.float32)
    theta = theta.reshape(len(exps), -1).clone().requires_grad_(True)
    total = 0.0
    for mb in tu.chunk_tensordict(data, len(exps) // micro):
        rows = mb["row"].tolist()
        values = torch.cat([theta[r, : lengths[r]] for r in rows])
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths[rows].cumsum(0)])
        log_probs = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
        loss, _ = loss_fn({"log_probs": log_probs}, mb)
        loss.backward()  # verl's engine: as returned
        total += float(loss.detach())
    return total, theta.grad.flatten().tolist()


def use_verl_padding_helpers() -> None:
    """verl's ``unpad_input`` / ``index_first_axis`` dispatch to ``flash_attn.bert_padding`` on
    CUDA (a GPU wheel) and to verl's own pure-torch ``npu_flash_attn_utils`` on Ascend: on CPU
    its dispatch is pointed at the latter (the same functions, torch only)."""
    from verl.utils import attention_utils, npu_flash_attn_utils as m

    attention_utils._get_attention_functions = lambda: (m.index_first_axis, m.pad_input, m.rearrange, m.unpad_input)


def main() -> None:
    import orchestrator.trinity.plugin  # noqa: F401

    use_verl_padding_helpers()
    out = {}
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        for empty in ("skip", "count"):
            for placement in ("first", "last", "spread"):
                for micro in (1, 2, 3, 6):
                    out[f"{mode}/{empty}/{placement}/{micro}"] = run_case(mode, empty, placement, micro)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
