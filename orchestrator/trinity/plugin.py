"""Register every trinity-dso component into Trinity-RFT's registries (importing this module does it).

==========================  ========================  ==================================================================
registry                    name                      class (dotted path usable in the YAML)
==========================  ========================  ==================================================================
``ALGORITHM_TYPE``          ``dso_dapo``              ``orchestrator.trinity.algorithms.DsoDAPOAlgorithm``
``ALGORITHM_TYPE``          ``dso_gigpo``             ``orchestrator.trinity.algorithms.DsoGiGPOAlgorithm``
``POLICY_LOSS_FN``          ``dso_clip_higher``       ``orchestrator.trinity.loss.DsoClipHigherPolicyLossFn``
``ADVANTAGE_FN``            ``dso_grpo``              ``orchestrator.trinity.advantage.grpo.DsoGRPOAdvantageFn``
``ADVANTAGE_FN``            ``dso_gigpo``             ``orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn``
``ADVANTAGE_FN``            ``dso_gigpo_index``       ``orchestrator.trinity.advantage.gigpo_index.DsoGiGPOIndexAdvantageFn``
``EXPERIENCE_OPERATORS``    ``dso_orchestrator``      ``orchestrator.trinity.operator.OrchestratorOperator``
``SELECTORS``               ``dso_orchestrator``      ``orchestrator.trinity.selector.OrchestratorTaskSelector``
``WORKFLOWS``               ``dso_frozenlake_steps``  ``orchestrator.trinity.workflow.DsoFrozenLakeStepsWorkflow``
==========================  ========================  ==================================================================

Idempotent: importing, re-executing a plugin shim or calling :func:`register` again is harmless.
Built-ins (``dapo``, ``gigpo``, ``grpo``) keep resolving to Trinity's own classes.

How a Trinity run uses them::

    explorer --(selector.get_indices)--> actor.plan_round / select_tasks --> task indices
    explorer --rollouts--> experience pipeline: OrchestratorOperator.process(exps)
        - the step's complete groups as one GroupTable -> actor.submit_and_pop -> keep / drop /
          carry over, and every released batch back -> the Trinity experiences of each
    --> advantage fn (dso_grpo / dso_gigpo / dso_gigpo_index) --> Trinity queue --> trainer

Task identity: Trinity's ``eid.task`` is a position within an explore step, so the stable task
id is the dataset row, ``info["task_index"]["index"]`` (set by Trinity's workflow runner), as a
string; the selector creates the actor with task ids ``"0" .. str(dataset_size - 1)``. One
training taskset per orchestrator.

The experiences' tensors stay in the pipeline process: the actor only sees per-rollout summaries
(reward, metrics, model version), which keeps its ``state_dict`` small.
"""

from __future__ import annotations

import logging

from trinity.algorithm import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN
from trinity.buffer.operators import EXPERIENCE_OPERATORS
from trinity.common.workflows import WORKFLOWS

from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn
from orchestrator.trinity.advantage.gigpo_index import DsoGiGPOIndexAdvantageFn
from orchestrator.trinity.advantage.grpo import DsoGRPOAdvantageFn
from orchestrator.trinity.algorithms import DsoDAPOAlgorithm, DsoGiGPOAlgorithm
from orchestrator.trinity.loss import DsoClipHigherPolicyLossFn
from orchestrator.trinity.operator import OrchestratorOperator
from orchestrator.trinity.registry import INDEX_ADVANTAGE_NAME, OPERATOR_NAME, SELECTOR_NAME, WORKFLOW_NAME, register_into
from orchestrator.trinity.selector import OrchestratorTaskSelector
from orchestrator.trinity.workflow import DsoFrozenLakeStepsWorkflow

log = logging.getLogger("trinity_dso.trinity")


def register() -> bool:
    """Register every component above, idempotently.

    Returns:
        True when the selector was registered too; False when Trinity's selector registry
        cannot be imported (it needs the ``datasets`` package, present in any install that
        reads tasksets) - the dotted path then still works wherever ``datasets`` is installed.
    """
    register_into(ALGORITHM_TYPE, "dso_dapo", DsoDAPOAlgorithm)
    register_into(ALGORITHM_TYPE, "dso_gigpo", DsoGiGPOAlgorithm)
    register_into(POLICY_LOSS_FN, "dso_clip_higher", DsoClipHigherPolicyLossFn)
    register_into(ADVANTAGE_FN, "dso_grpo", DsoGRPOAdvantageFn)
    register_into(ADVANTAGE_FN, "dso_gigpo", DsoGiGPOAdvantageFn)
    register_into(ADVANTAGE_FN, INDEX_ADVANTAGE_NAME, DsoGiGPOIndexAdvantageFn)
    register_into(EXPERIENCE_OPERATORS, OPERATOR_NAME, OrchestratorOperator)
    register_into(WORKFLOWS, WORKFLOW_NAME, DsoFrozenLakeStepsWorkflow)
    try:
        from trinity.buffer.selector import SELECTORS
    except ImportError as err:  # pragma: no cover - depends on the install
        log.info("Trinity's selector registry is unavailable (%s); %s not registered", err, SELECTOR_NAME)
        return False
    register_into(SELECTORS, SELECTOR_NAME, OrchestratorTaskSelector)
    return True


SELECTOR_REGISTERED = register()
