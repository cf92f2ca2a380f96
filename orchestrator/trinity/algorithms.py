"""Trinity algorithm types ``dso_dapo`` and ``dso_gigpo``, and the config glue that fills the orchestrator's policy from a Trinity config."""

from __future__ import annotations

import os
from typing import Any

from trinity.algorithm.algorithm import AlgorithmType

from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn
from orchestrator.trinity.advantage.grpo import DsoGRPOAdvantageFn
from orchestrator.trinity.attach import AttachConfig
from orchestrator.trinity.loss import DsoClipHigherPolicyLossFn
from orchestrator.trinity.registry import (
    GIGPO_ADVANTAGE_CLASS_PATH,
    GRPO_ADVANTAGE_CLASS_PATH,
    INDEX_ADVANTAGE_CLASS_PATH,
    INDEX_ADVANTAGE_NAME,
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


ATTACH_KEYS = frozenset(AttachConfig.model_fields)


def _sync_style(config: Any) -> str:
    style = config.synchronizer.sync_style
    return str(getattr(style, "value", style)).lower()


def _sync_method(config: Any) -> str:
    method = config.synchronizer.sync_method
    return str(getattr(method, "value", method)).lower()


def default_state_file(job_dir: str) -> str:
    """``<job_dir>/dso/orchestrator.db``, or ``<job_dir>/dso/orchestrator.json`` when only that one
    exists: the same SQLite state file as earlier versions named it, so that their runs resume."""
    state, earlier = os.path.join(job_dir, "dso", "orchestrator.db"), os.path.join(job_dir, "dso", "orchestrator.json")
    return earlier if os.path.exists(earlier) and not os.path.exists(state) else state


def configure_orchestrated_run(config: Any, *, step_wise: bool = False) -> None:
    """Fill and cross-check the orchestrator settings of a Trinity ``Config``, in place.

    Called from :meth:`DsoDAPOAlgorithm.check_config` / :meth:`DsoGiGPOAlgorithm.check_config`
    (Trinity's ``AlgorithmConfigValidator``, after ``checkpoint_job_dir`` is known and before
    ``buffer.train_batch_size`` gets its default). The orchestrator settings
    (:class:`~orchestrator.trinity.attach.AttachConfig`) may be written in the operator's
    ``args`` and in the selector's ``kwargs``; they are merged (the same key with two different
    values is refused), completed and written back to both, so whichever component starts
    first creates the one actor with the same settings:

    * ``run`` = ``<project>/<name>``; ``checkpoint_path`` = ``<checkpoint_job_dir>/dso/orchestrator.db``
      (the actor's SQLite state file; a run started by an earlier version, which named it
      ``orchestrator.json``, keeps that file);
      ``held_dir`` = ``<checkpoint_job_dir>/dso/held`` (the actor and the held experiences
      survive an explorer restart, and Trinity's resume continues from them);
    * ``policy.group_size`` = ``algorithm.repeat_times``; ``policy.target_groups`` defaults to
      ``buffer.train_batch_size / repeat_times`` when ``train_batch_size`` is set, else to
      ``buffer.batch_size`` (Trinity then sets ``train_batch_size = batch_size x repeat_times``).
      Both are *pinned*: the actor refuses a live change of them (REST 409), since the trainer
      reads exactly ``train_batch_size`` experiences per step;
    * ``step_wise`` (``dso_gigpo``: one experience per step of a multi-turn trajectory): a batch
      holds ``target_groups x repeat_times`` trajectories of 1 or more steps, so no
      ``train_batch_size`` in experiences can match it. ``train_batch_size`` is then left to the
      user (the trainer reads a batch in one or more steps; advantages are computed on whole
      batches in the pipeline), ``target_groups`` defaults to ``buffer.batch_size``, and only
      ``group_size`` is pinned;
    * with ``advantage_fn: dso_gigpo_index``: its ``actor_name`` / ``namespace`` / ``group_size``
      are set to the orchestrator's, and the orchestrator must have an ``anchor_index``.

    With ``algorithm.loss_agg_mode`` token-mean (DAPO Eq. 12) it also sets
    ``trainer.fix_actor_microbatch_loss_scale = True``: Trinity then scales each micro-batch's
    token-mean loss by its share of the mini-batch's response tokens, so the accumulated
    gradient is the exact token mean of the mini-batch whatever the micro-batches' sizes
    (Trinity's default, ``1 / gradient_accumulation``, weights short micro-batches' tokens up).

    Raises:
        ValueError, naming the fields and values: no ``dso_orchestrator`` operator in
            ``data_processor.experience_pipeline.operators``; conflicting settings;
            ``group_size`` != ``repeat_times``; ``target_groups x repeat_times !=
            train_batch_size`` (not ``step_wise``); ``dso_gigpo_index`` without an anchor index or with a policy that
            masks members (``group_validity`` / ``stale_members`` ``"mask"``); ``mode: both``
            with a synchronisation that waits for the trainer at fixed steps (``sync_style``
            other than ``trainer_driven`` with ``sync_method: nccl``, or ``fully_async``): the
            trainer waits for a batch the filter has not released yet while the explorer waits
            for the trainer.
    """
    algo = config.algorithm
    n = int(algo.repeat_times)
    if (algo.loss_agg_mode or "token-mean") == "token-mean" and getattr(config, "trainer", None) is not None:
        config.trainer.fix_actor_microbatch_loss_scale = True
    pipeline_ops = config.data_processor.experience_pipeline.operators
    ops = [op for op in pipeline_ops if _is_ours(op.name, OPERATOR_NAME, OPERATOR_CLASS_PATH)]
    if not ops:
        raise ValueError(
            f"data_processor.experience_pipeline.operators: algorithm_type {algo.algorithm_type!r} needs the "
            f"{OPERATOR_NAME!r} operator (got {[op.name for op in pipeline_ops]})"
        )
    places: list[tuple[str, Any, str]] = [
        (f"data_processor.experience_pipeline.operators[{i}].args", op, "args") for i, op in enumerate(ops)
    ]
    tasksets = list(config.buffer.explorer_input.tasksets or [])
    if config.buffer.explorer_input.taskset is not None:
        tasksets.append(config.buffer.explorer_input.taskset)
    for ts in tasksets:
        sel = ts.data_selector
        if sel is not None and _is_ours(sel.selector_type, SELECTOR_NAME, SELECTOR_CLASS_PATH):
            places.append((f"buffer.explorer_input.taskset[{ts.name!r}].data_selector.kwargs", sel, "kwargs"))

    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, obj, attr in places:
        given = dict(getattr(obj, attr) or {})
        unknown = sorted(set(given) - ATTACH_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown orchestrator setting(s) {unknown} (known: {sorted(ATTACH_KEYS)})")
        for key, value in given.items():
            if key in merged and merged[key] != value:
                raise ValueError(f"{where}.{key}: {value!r} differs from {origin[key]}.{key}: {merged[key]!r}")
            merged.setdefault(key, value)
            origin.setdefault(key, where)

    job_dir = getattr(config, "checkpoint_job_dir", None) or config.get_checkpoint_job_dir()
    merged.setdefault("run", "/".join(p for p in (config.project, config.group, config.name) if p))
    merged.setdefault("checkpoint_path", default_state_file(job_dir))
    merged.setdefault("held_dir", os.path.join(job_dir, "dso", "held"))
    policy = dict(merged.get("policy") or {})
    where_policy = f"{origin.get('policy', places[0][0])}.policy"
    if int(policy.get("group_size", n)) != n:
        raise ValueError(f"{where_policy}.group_size: {policy['group_size']} differs from algorithm.repeat_times={n}")
    tbs = 0 if step_wise else int(config.buffer.train_batch_size or 0)
    if "target_groups" in policy:
        target = int(policy["target_groups"])
    else:
        target = tbs // n if tbs else int(config.buffer.batch_size)
    if tbs and target * n != tbs:
        raise ValueError(
            f"{where_policy}.target_groups x algorithm.repeat_times = {target} x {n} = {target * n} but "
            f"buffer.train_batch_size = {tbs}: the trainer reads train_batch_size experiences per step, "
            "so the orchestrator's batches must have exactly that many"
        )
    policy.update(group_size=n, target_groups=target)
    merged["policy"] = policy
    if step_wise:
        merged["pinned"] = {"group_size": n}
        merged["pinned_by"] = f"a group is algorithm.repeat_times = {n} trajectories"
    else:
        merged["pinned"] = {"group_size": n, "target_groups": target}
        merged["pinned_by"] = (
            f"the trainer reads buffer.train_batch_size = target_groups x algorithm.repeat_times = {target} x {n} "
            "experiences per step"
        )
    cfg = AttachConfig.parse(merged, places[0][0])
    policy = cfg.resampling_policy()  # an invalid policy fails here, at config time
    settings = cfg.model_dump(mode="json")
    for _, obj, attr in places:
        setattr(obj, attr, dict(settings))

    if algo.advantage_fn in (INDEX_ADVANTAGE_NAME, INDEX_ADVANTAGE_CLASS_PATH):
        args = dict(algo.advantage_fn_args or {})
        if cfg.anchor_index is None and not args.get("redis_url"):
            raise ValueError(
                f"algorithm.advantage_fn: {INDEX_ADVANTAGE_NAME!r} needs the orchestrator's anchor index: set "
                f"{places[0][0]}.anchor_index (e.g. {{redis_url: redis://host:6379/0, prefix: dso:<run>}}, or {{}} "
                "for one in the actor's memory)"
            )
        if policy.group_validity == "mask" or policy.stale_members == "mask":
            raise ValueError(
                f"{places[0][0]}.policy: group_validity {policy.group_validity!r} / stale_members "
                f"{policy.stale_members!r}: {INDEX_ADVANTAGE_NAME!r} cannot leave masked members out of its anchor "
                "groups (they wait for every run of a task); use group_validity 'reject' and stale_members 'oldest', "
                "or advantage_fn 'dso_gigpo'"
            )
        args.update(actor_name=cfg.actor_name, namespace=cfg.namespace, group_size=n)
        algo.advantage_fn_args = args

    mode = str(getattr(config, "mode", "both"))
    if mode in ("both", "colocate"):
        style, method = _sync_style(config), _sync_method(config)
        if not (style == "fully_async" or (style == "trainer_driven" and method == "nccl")):
            raise ValueError(
                f"synchronizer.sync_style: {style!r} with sync_method {method!r} can stall an orchestrated run: "
                "at each sync step the explorer waits for the trainer, which waits for a batch the filter has not "
                "released yet. Use sync_style: trainer_driven with sync_method: nccl, or sync_style: fully_async"
            )


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
        configure_orchestrated_run(config, step_wise=True)


