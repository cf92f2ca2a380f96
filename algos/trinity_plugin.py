"""Trinity-RFT adapters over the pure maths: algorithm types, a policy loss, a GiGPO advantage.

Registered into Trinity-RFT's registries (``trinity.algorithm``) under ``dso_`` names, never
over the built-ins (``dapo``, ``gigpo``, ``grpo`` keep resolving to Trinity's own classes):

=====================  ===========================  =========================================
registry               name                         class
=====================  ===========================  =========================================
``ALGORITHM_TYPE``     ``dso_dapo``                 :class:`DsoDAPOAlgorithm`
``ALGORITHM_TYPE``     ``dso_gigpo``                :class:`DsoGiGPOAlgorithm`
``POLICY_LOSS_FN``     ``dso_clip_higher``          :class:`DsoClipHigherPolicyLossFn`
``ADVANTAGE_FN``       ``dso_gigpo``                :class:`DsoGiGPOAdvantageFn`
=====================  ===========================  =========================================

Importing this module registers them (idempotently: importing, re-executing a plugin shim or
calling :func:`register` again is harmless). The adapters that talk to the running service (the
experience-pipeline operator, the task selector, the anchor-index advantage) live in
``orchestrator.trinity_adapters``, which imports this module; that is the module a plugin shim
imports. This is one of the few modules of the package that import ``trinity``.

Tested against trinity-rft 0.6.0 (``trinity.utils.registry.Registry``: a name -> class dict
plus a lazy ``default_mapping`` of built-in dotted paths; an unknown dotted ``a.b.C`` key is
imported and registered under that key on first ``get``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN
from trinity.algorithm.advantage_fn import AdvantageFn
from trinity.algorithm.algorithm import AlgorithmType, ConstantMeta
from trinity.algorithm.policy_loss_fn import PolicyLossFn
from trinity.buffer.operators import ExperienceOperator
from trinity.common.experience import Experience as TrinityExperience
from trinity.utils.registry import Registry

from algos.dapo import clip_higher_policy_loss
from algos.gigpo import GiGPOAdvantages, GiGPOConfig, encode_keys, gigpo_advantages

OPERATOR_NAME = "dso_orchestrator"
"""Registered name of the experience-pipeline operator (``orchestrator.trinity_adapters``)."""
OPERATOR_CLASS_PATH = "orchestrator.trinity_adapters.OrchestratorOperator"
SELECTOR_NAME = "dso_orchestrator"
"""Registered name of the task selector (``orchestrator.trinity_adapters``)."""
SELECTOR_CLASS_PATH = "orchestrator.trinity_adapters.OrchestratorTaskSelector"
# default_config() names our components by dotted path: they then resolve in every Trinity
# process (explorer, pipeline, trainer workers) whether or not a plugin shim was loaded there.
LOSS_CLASS_PATH = "algos.trinity_plugin.DsoClipHigherPolicyLossFn"
GIGPO_ADVANTAGE_CLASS_PATH = "algos.trinity_plugin.DsoGiGPOAdvantageFn"


class RegistryConflictError(KeyError):
    """A ``dso_`` name is already taken in a Trinity registry by a different class."""


# ---------------------------------------------------------------------------------- registration
def register_into(registry: Registry, name: str, cls: type) -> None:
    """Register ``cls`` as ``name`` in a Trinity ``Registry``, once.

    Idempotent: registering the same class again (or the same class from a reloaded module,
    same ``__module__`` and ``__qualname__``) is a no-op or a replacement, never an error.

    Raises:
        RegistryConflictError: ``name`` is a built-in of ``registry`` (we never shadow one) or
            is registered to a different class.
    """
    if name in getattr(registry, "_default_mapping", {}):
        raise RegistryConflictError(f"{registry.name}: {name!r} is a Trinity built-in; refusing to shadow it")
    existing = registry.modules.get(name)
    if existing is cls:
        return
    if existing is not None:
        same = (existing.__module__, existing.__qualname__) == (cls.__module__, cls.__qualname__)
        if not same:
            raise RegistryConflictError(f"{registry.name}: {name!r} is already registered to {existing!r}, not {cls!r}")
    registry.register_module(name, cls, force=existing is not None)


class _NamedOnceMeta(ConstantMeta):
    """Trinity's algorithm metaclass, letting the registry re-set ``_name`` without error.

    ``Registry._register_module`` writes ``cls._name = key`` on every registration, and
    Trinity's ``ConstantMeta`` forbids re-setting a class attribute. When the YAML names an
    algorithm by its dotted path, importing this module has already registered it as
    ``dso_dapo``, and the registry's second write would raise ``AttributeError``. This
    metaclass keeps the first (``dso_``) name and ignores later writes of ``_name`` only.
    """

    def __setattr__(cls, name, value):
        if name == "_name" and "_name" in cls.__dict__:
            return
        super().__setattr__(name, value)


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

    Raises:
        ValueError: no ``dso_orchestrator`` operator in
            ``data_processor.experience_pipeline.operators`` (an orchestrated algorithm without
            its orchestrator would silently train on unfiltered groups), or ``group_size``
            differs from ``algorithm.repeat_times`` (the message names field and values).
    """
    algo = config.algorithm
    n = int(algo.repeat_times)
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

    Defaults (paper, Sec. 3 and 4.1): 16 rollouts per prompt, GRPO group-relative advantages,
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
            "advantage_fn": "grpo",
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


# ---------------------------------------------------------------------------------- policy loss
class DsoClipHigherPolicyLossFn(PolicyLossFn):
    """``dso_clip_higher``: DAPO's clip-higher surrogate, :func:`algos.dapo.clip_higher_policy_loss`.

    Per token, ``ratio = exp(logprob - old_logprob)``,
    ``l = max(-A * ratio, -A * clip(ratio, 1 - clip_range_low, 1 + clip_range_high))``, and with
    ``clip_ratio_c = c`` (dual clip, Ye et al. 2020) ``l = min(l, -A * c)`` where ``A < 0``.
    The loss is the mean over all response tokens of the micro-batch (token-mean, DAPO Eq. 12).

    Same argument names as Trinity's ``ppo`` loss, so YAMLs carry over. Differences from
    Trinity's ``ppo``: dual clip is optional (``None`` disables it; Trinity's is always on at
    3.0), the log-ratio is not clamped to [-20, 20], and only ``token-mean`` aggregation exists.

    Args:
        backend: Trinity trainer backend whose tensor names are mapped (``"verl"``).
        clip_range_low, clip_range_high: eps_low in [0, 1), eps_high >= 0 (paper: 0.2, 0.28).
        clip_ratio_c: dual-clip bound c > 1, or None.
        loss_agg_mode: must be ``"token-mean"`` (Trinity writes ``algorithm.loss_agg_mode`` here).
    Raises:
        ValueError: clip values out of range, or another ``loss_agg_mode``.
    """

    def __init__(
        self,
        backend: str = "verl",
        clip_range_low: float = 0.2,
        clip_range_high: float = 0.28,
        clip_ratio_c: float | None = None,
        loss_agg_mode: str = "token-mean",
    ) -> None:
        super().__init__(backend=backend)
        if not 0 <= clip_range_low < 1 or clip_range_high < 0:
            raise ValueError(
                f"clip_range_low/clip_range_high: need 0 <= low < 1 and high >= 0, got {clip_range_low}, {clip_range_high}"
            )
        if clip_ratio_c is not None and clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c: must be > 1 or null, got {clip_ratio_c}")
        if loss_agg_mode != "token-mean":
            raise ValueError(f"loss_agg_mode: dso_clip_higher implements DAPO's 'token-mean' only, got {loss_agg_mode!r}")
        self.clip_range_low = float(clip_range_low)
        self.clip_range_high = float(clip_range_high)
        self.clip_ratio_c = None if clip_ratio_c is None else float(clip_ratio_c)
        self.loss_agg_mode = loss_agg_mode

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs,
    ) -> tuple[torch.Tensor, dict]:
        """Loss and metrics for one micro-batch.

        Args:
            logprob, old_logprob: (B, T) float. Current and behaviour log-probs of response tokens.
            action_mask: (B, T) bool or {0, 1}. Response tokens that count.
            advantages: (B, T) float.
        Returns:
            loss: () float, differentiable in ``logprob``.
            metrics: ``pg_loss``, ``pg_clipfrac`` (share of tokens where the clip bound was
            active), ``pg_clipfrac_lower`` (share where the dual clip was active), ``ppo_kl``
            (token mean of ``old_logprob - logprob``).
        """
        loss, clipfrac = clip_higher_policy_loss(
            logprob,
            old_logprob,
            advantages,
            action_mask,
            eps_low=self.clip_range_low,
            eps_high=self.clip_range_high,
            dual_clip=self.clip_ratio_c,
        )
        with torch.no_grad():
            mask = action_mask.to(logprob.dtype)
            denom = mask.sum().clamp(min=1.0)
            ppo_kl = ((old_logprob - logprob) * mask).sum() / denom
            lower = torch.zeros((), dtype=logprob.dtype)
            if self.clip_ratio_c is not None:
                ratio = torch.exp(logprob - old_logprob)
                surrogate = torch.maximum(
                    -advantages * ratio,
                    -advantages * torch.clamp(ratio, 1 - self.clip_range_low, 1 + self.clip_range_high),
                )
                hit = (advantages < 0) & (surrogate > -advantages * self.clip_ratio_c)
                lower = (hit.to(logprob.dtype) * mask).sum() / denom
        metrics = {
            "pg_loss": float(loss.detach()),
            "pg_clipfrac": float(clipfrac),
            "pg_clipfrac_lower": float(lower),
            "ppo_kl": float(ppo_kl),
        }
        return loss, metrics

    @classmethod
    def default_args(cls) -> dict:
        return {"clip_range_low": 0.2, "clip_range_high": 0.28, "clip_ratio_c": None, "loss_agg_mode": "token-mean"}


# ---------------------------------------------------------------------------------- GiGPO
_PAPER = GiGPOConfig()


class DsoGiGPOAdvantageFn(AdvantageFn, ExperienceOperator):
    """``dso_gigpo``: GiGPO advantages over one batch of Trinity experiences (arXiv 2505.10978).

    A thin adapter: it flattens the batch into per-step rows and calls
    :func:`algos.gigpo.gigpo_advantages` (see there for the equations). Rows are keyed so that

    * a *group* (GiGPO's "task" in Eq. 3) is Trinity's ``eid.tid`` (explore step and task):
      the n trajectories of one task from one round;
    * a trajectory is ``eid.rid``; its steps are ordered by ``eid.step`` (consecutive from 0);
    * the step reward is ``info[step_reward_key]``; a trajectory with none takes its last
      step's ``reward`` as a terminal reward (Trinity's convention), other steps 0;
    * the anchor state is ``info[env_state_hash_key]``; a step without one is its own anchor
      group (so A_S = 0 for it, as in Trinity).

    The scalar ``A = A_E + omega * A_S`` is broadcast over ``action_mask`` into
    ``advantages`` and ``returns`` ((T,) float32).

    Where it differs from Trinity's built-in ``gigpo`` (``GiGPOAdvantageFn``):

    * anchor groups are keyed by (group, state) (Eq. 6 groups states *within a task's group*):
      two tasks whose observations render to the same text, e.g. two FrozenLake maps where the
      agent sees the same window, are kept apart; Trinity buckets states across the whole
      batch and would compare their returns;
    * a singleton episode group gets A_E = 0 (Trinity: ``R / (1 + epsilon)``);
    * statistics are float64 (Trinity: float32);
    * defaults are the paper's (gamma 0.95, F_norm = std); Trinity's are gamma 1, F_norm 1.

    On a batch of one task with n > 1 trajectories and the same arguments the two agree up to
    float32 rounding.

    Args:
        omega: weight of the step advantage, >= 0 (paper: 1).
        gamma: discount in [0, 1] (paper: 0.95).
        fnorm: ``"std"`` (paper, Eq. 3 and 7) or ``"none"`` (F_norm = 1).
        epsilon: added to the std, > 0.
        step_reward_key, env_state_hash_key: ``Experience.info`` keys (Trinity's names).
    Raises:
        pydantic.ValidationError: out-of-range arguments (via :class:`algos.gigpo.GiGPOConfig`).
        algos.gigpo.InvalidStepError: at call time, a non-finite reward, a duplicate or
            missing step of a trajectory (the message names the row, group and run).
    """

    def __init__(
        self,
        omega: float = _PAPER.omega,
        gamma: float = _PAPER.gamma,
        fnorm: str = _PAPER.norm,
        epsilon: float = _PAPER.eps,
        step_reward_key: str = "step_reward",
        env_state_hash_key: str = "env_state_hash",
        **kwargs,
    ) -> None:
        self.config = GiGPOConfig(omega=omega, gamma=gamma, norm=fnorm, eps=epsilon)
        self.step_reward_key = step_reward_key
        self.env_state_hash_key = env_state_hash_key

    @classmethod
    def default_args(cls) -> dict:
        return {
            "omega": _PAPER.omega,
            "gamma": _PAPER.gamma,
            "fnorm": _PAPER.norm,
            "epsilon": _PAPER.eps,
            "step_reward_key": "step_reward",
            "env_state_hash_key": "env_state_hash",
        }

    @classmethod
    def compute_in_trainer(cls) -> bool:
        return False

    def __call__(self, exps, **kwargs):
        return self.process(exps)

    def rows(self, exps: list[TrinityExperience]) -> dict[str, np.ndarray]:
        """Per-step rows of a batch, one per experience, in the batch's order.

        Returns:
            ``group`` (N,) str (``eid.tid``), ``run`` (N,) str (``eid.rid``), ``step`` (N,)
            int64, ``reward`` (N,) float64 step rewards, ``state`` (N,) object anchor keys.
        """
        n = len(exps)
        group = np.array([str(e.eid.tid) for e in exps], dtype=object)
        run = np.array([str(e.eid.rid) for e in exps], dtype=object)
        step = np.array([int(e.eid.step) for e in exps], dtype=np.int64)
        infos = [e.info or {} for e in exps]
        explicit = np.array([self.step_reward_key in i for i in infos], dtype=bool)
        reward = np.array([float(i.get(self.step_reward_key, 0.0)) for i in infos], dtype=np.float64)
        run_ids, num_runs = encode_keys(run)
        # trajectories without any explicit step reward: the last step carries exp.reward
        has_explicit = np.bincount(run_ids, weights=explicit, minlength=num_runs) > 0
        last = np.full(num_runs, -1, dtype=np.int64)
        np.maximum.at(last, run_ids, step)
        terminal = np.flatnonzero(~has_explicit[run_ids] & (step == last[run_ids]))
        reward[terminal] = [float(exps[i].reward) if exps[i].reward is not None else 0.0 for i in terminal]
        state = np.array(
            [
                str(i[self.env_state_hash_key]) if i.get(self.env_state_hash_key) is not None else f"\x00solo/{k}"
                for k, i in enumerate(infos)
            ],
            dtype=object,
        )
        assert len(state) == n
        return {"group": group, "run": run, "step": step, "reward": reward, "state": state}

    def compute(self, exps: list[TrinityExperience]) -> GiGPOAdvantages:
        """GiGPO advantages of a batch, (N,) arrays in the batch's order (no side effects)."""
        r = self.rows(exps)
        return gigpo_advantages(r["group"], r["run"], r["step"], r["reward"], r["state"], config=self.config)

    def process(self, exps: list[TrinityExperience]) -> tuple[list[TrinityExperience], dict]:
        """Set ``advantages`` and ``returns`` ((T,) float32, A times ``action_mask``) on each experience.

        Returns:
            the same experiences, and metrics ``dso_gigpo/mean_abs_A_E``,
            ``dso_gigpo/mean_abs_A_S``, ``dso_gigpo/anchor_groups_total`` (anchor groups of
            states with a hash), ``dso_gigpo/anchor_groups_size_gt1`` and
            ``dso_gigpo/anchor_group_hit_ratio`` (their share of size > 1).
        """
        if not exps:
            return [], {}
        res = self.compute(exps)
        for e, a in zip(exps, res.advantages.tolist()):
            if e.action_mask is not None:
                e.advantages = e.action_mask.to(torch.float32) * a
            else:
                e.advantages = torch.tensor(a, dtype=torch.float32)
            e.returns = e.advantages.clone()
        hashed = np.array([(e.info or {}).get(self.env_state_hash_key) is not None for e in exps], dtype=bool)
        ids = np.unique(res.anchor_ids[hashed])
        sizes = np.zeros(int(res.anchor_ids.max()) + 1, dtype=np.int64)
        sizes[res.anchor_ids] = res.anchor_sizes
        total, hit = int(ids.size), int((sizes[ids] > 1).sum())
        metrics = {
            "dso_gigpo/mean_abs_A_E": float(np.abs(res.episode).mean()),
            "dso_gigpo/mean_abs_A_S": float(np.abs(res.step).mean()),
            "dso_gigpo/anchor_groups_total": total,
            "dso_gigpo/anchor_groups_size_gt1": hit,
            "dso_gigpo/anchor_group_hit_ratio": hit / total if total else 0.0,
        }
        return exps, metrics


# ---------------------------------------------------------------------------------- register
def register() -> None:
    """Register this module's classes into Trinity's registries (idempotent)."""
    register_into(ALGORITHM_TYPE, "dso_dapo", DsoDAPOAlgorithm)
    register_into(ALGORITHM_TYPE, "dso_gigpo", DsoGiGPOAlgorithm)
    register_into(POLICY_LOSS_FN, "dso_clip_higher", DsoClipHigherPolicyLossFn)
    register_into(ADVANTAGE_FN, "dso_gigpo", DsoGiGPOAdvantageFn)


register()
