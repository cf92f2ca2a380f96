"""Trinity algorithm types ``dso_dapo`` and ``dso_gigpo``, and the config glue that fills the orchestrator's policy from a Trinity config."""

from __future__ import annotations

from typing import Any

from trinity.algorithm.algorithm import AlgorithmType

from orchestrator.trinity.advantage import DsoGiGPOAdvantageFn, DsoGRPOAdvantageFn
from orchestrator.trinity.loss import DsoClipHigherPolicyLossFn
from orchestrator.trinity.registry import (
    GIGPO_ADVANTAGE_CLASS_PATH,
    GRPO_ADVANTAGE_CLASS_PATH,
    LOSS_CLASS_PATH,
    OPERATOR_CLASS_PATH,
    OPERATOR_NAME,
    SELECTOR_CLASS_PATH,
    SELECTOR_NAME,
    _NamedOnceMeta,
)


# ---------------------------------------------------------------------------------- config glue
def _is_ours(name: str | None, short: str, dotted: str) -> bool:
    return bool(name) and (name == short or name == dotted)


def configure_orchestrated_run(config: Any) -> None:
    """Fill and cross-check the orchestrator settings of a Trinity ``Config``, in place.

    Called from :meth:`DsoDAPOAlgorithm.check_config` / :meth:`DsoGiGPOAlgorithm.check_config`
    (that is, from Trinity's ``AlgorithmConfigValidator``). The orchestrator's resampling policy
    may be given in the operator's ``args.policy`` and in the selector's ``kwargs.policy``
    (whichever component starts first creates the actor with it). For each:

    * ``group_size`` defaults to ``algorithm.repeat_times`` and must equal it;
    * ``target_groups`` defaults to ``buffer.train_batch_size // repeat_times`` when
      ``train_batch_size`` is set (single-turn), else to ``buffer.batch_size``.

    With ``algorithm.loss_agg_mode`` token-mean (DAPO Eq. 12) it also sets
    ``trainer.fix_actor_microbatch_loss_scale = True``: Trinity then scales each micro-batch's
    token-mean loss by its share of the mini-batch's response tokens, so the accumulated
    gradient is the exact token mean of the mini-batch whatever the micro-batches' sizes
    (Trinity's default, ``1 / gradient_accumulation``, weights short micro-batches' tokens up).

    Raises:
        ValueError: no ``dso_orchestrator`` operator in
            ``data_processor.experience_pipeline.operators`` (an orchestrated algorithm without
            its orchestrator would silently train on unfiltered groups), or ``group_size``
            differs from ``algorithm.repeat_times`` (the message names field and values).
    """
    algo = config.algorithm
    n = int(algo.repeat_times)
    if (algo.loss_agg_mode or "token-mean") == "token-mean" and getattr(config, "trainer", None) is not None:
        config.trainer.fix_actor_microbatch_loss_scale = True
    ops = [op for op in config.data_processor.experience_pipeline.operators if _is_ours(op.name, OPERATOR_NAME, OPERATOR_CLASS_PATH)]
    if not ops:
        raise ValueError(
            f"data_processor.experience_pipeline.operators: algorithm_type {algo.algorithm_type!r} needs the "
            f"{OPERATOR_NAME!r} operator (got {[op.name for op in config.data_processor.experience_pipeline.operators]})"
        )
    if config.buffer.train_batch_size and config.buffer.train_batch_size % n == 0:
        default_target = config.buffer.train_batch_size // n
    else:
        default_target = config.buffer.batch_size
    policies: list[tuple[str, dict]] = []
    for i, op in enumerate(ops):
        op.args = dict(op.args or {})
        op.args["policy"] = dict(op.args.get("policy") or {})
        policies.append((f"data_processor.experience_pipeline.operators[{i}].args.policy", op.args["policy"]))
    tasksets = list(config.buffer.explorer_input.tasksets or [])
    if config.buffer.explorer_input.taskset is not None:
        tasksets.append(config.buffer.explorer_input.taskset)
    for ts in tasksets:
        sel = ts.data_selector
        if sel is not None and _is_ours(sel.selector_type, SELECTOR_NAME, SELECTOR_CLASS_PATH):
            sel.kwargs = dict(sel.kwargs or {})
            sel.kwargs["policy"] = dict(sel.kwargs.get("policy") or {})
            policies.append((f"buffer.explorer_input.taskset[{ts.name!r}].data_selector.kwargs.policy", sel.kwargs["policy"]))
    for where, policy in policies:
        policy.setdefault("group_size", n)
        policy.setdefault("target_groups", int(default_target))
        if int(policy["group_size"]) != n:
            raise ValueError(f"{where}.group_size: {policy['group_size']} differs from algorithm.repeat_times={n}")


# ---------------------------------------------------------------------------------- algorithms
class DsoDAPOAlgorithm(AlgorithmType, metaclass=_NamedOnceMeta):
    """DAPO with the orchestrator's dynamic sampling (arXiv 2503.14476), name ``dso_dapo``.

    Differs from Trinity's ``dapo`` (whose ``dapo_dynamic_sampling`` filter only drops groups,
    so the trainer waits on later explore steps): the ``dso_orchestrator`` operator keeps
    surplus informative groups as carry-over, emits train batches of exactly ``target_groups``
    groups, and the ``dso_orchestrator`` task selector steers which tasks are rolled out next.

    Defaults (paper, Sec. 3 and 4.1): 16 rollouts per prompt, GRPO group-relative advantages
    (``dso_grpo``: Trinity's ``grpo``, vectorised over the batch),
    clip-higher with eps_low 0.2 / eps_high 0.28, token-level loss averaging, no KL term, no
    reference model. Dual clip (``clip_ratio_c``) is off as in the paper; set it to enable.
    """

    use_critic: bool = False
    use_reference: bool = False
    compute_advantage_in_trainer: bool = False
    can_balance_batch: bool = True
    schema: str = "experience"

    @classmethod
    def default_config(cls) -> dict:
        return {
            "repeat_times": 16,
            "advantage_fn": GRPO_ADVANTAGE_CLASS_PATH,
            "advantage_fn_args": DsoGRPOAdvantageFn.default_args(),
            "sample_strategy": "default",
            "policy_loss_fn": LOSS_CLASS_PATH,
            "policy_loss_fn_args": DsoClipHigherPolicyLossFn.default_args(),
            "kl_penalty_fn": "none",
            "kl_loss_fn": "none",
            "entropy_loss_fn": "none",
            "loss_agg_mode": "token-mean",
        }

    @classmethod
    def check_config(cls, config: Any) -> None:
        """See :func:`configure_orchestrated_run`."""
        configure_orchestrated_run(config)


class DsoGiGPOAlgorithm(AlgorithmType, metaclass=_NamedOnceMeta):
    """GiGPO with the orchestrator (Feng et al., arXiv 2505.10978), name ``dso_gigpo``.

    Differs from Trinity's ``gigpo``: step-level anchor groups are keyed by (group, anchor
    state) rather than by anchor state over the whole batch (see :class:`DsoGiGPOAdvantageFn`),
    and the orchestrator filters, replenishes and records task history as for DAPO.

    Defaults (paper, Sec. 5, via :class:`algos.gigpo.GiGPOConfig`): 8 trajectories per task,
    omega = 1, gamma = 0.95, F_norm = group std; PPO clip 0.2 (symmetric), token-mean loss,
    KL loss (k2) against a reference model.
    """

    use_critic: bool = False
    use_reference: bool = True
    compute_advantage_in_trainer: bool = False
    can_balance_batch: bool = True
    schema: str = "experience"

    @classmethod
    def default_config(cls) -> dict:
        return {
            "repeat_times": 8,
            "advantage_fn": GIGPO_ADVANTAGE_CLASS_PATH,
            "advantage_fn_args": DsoGiGPOAdvantageFn.default_args(),
            "sample_strategy": "default",
            "policy_loss_fn": LOSS_CLASS_PATH,
            "policy_loss_fn_args": {
                "clip_range_low": 0.2,
                "clip_range_high": 0.2,
                "clip_ratio_c": None,
                "loss_agg_mode": "token-mean",
            },
            "kl_penalty_fn": "none",
            "kl_loss_fn": "k2",
            "entropy_loss_fn": "default",
            "loss_agg_mode": "token-mean",
        }

    @classmethod
    def check_config(cls, config: Any) -> None:
        """See :func:`configure_orchestrated_run`."""
        configure_orchestrated_run(config)


