"""Registering our classes into Trinity-RFT's registries under ``dso_`` names, never over a built-in.

Tested against trinity-rft 0.6.0 (``trinity.utils.registry.Registry``: a name -> class dict
plus a lazy ``default_mapping`` of built-in dotted paths; an unknown dotted ``a.b.C`` key is
imported and registered under that key on first ``get``).
"""

from __future__ import annotations

from trinity.algorithm.algorithm import ConstantMeta
from trinity.utils.registry import Registry

OPERATOR_NAME = "dso_orchestrator"
"""Registered name of the experience-pipeline operator."""
OPERATOR_CLASS_PATH = "orchestrator.trinity.operator.OrchestratorOperator"
SELECTOR_NAME = "dso_orchestrator"
"""Registered name of the task selector."""
SELECTOR_CLASS_PATH = "orchestrator.trinity.selector.OrchestratorTaskSelector"
INDEX_ADVANTAGE_NAME = "dso_gigpo_index"
"""Registered name of the GiGPO advantage computed through the orchestrator's anchor index."""
# default_config() names our components by dotted path: they then resolve in every Trinity
# process (explorer, pipeline, trainer workers) whether or not a plugin shim was loaded there.
LOSS_CLASS_PATH = "orchestrator.trinity.loss.DsoClipHigherPolicyLossFn"
GIGPO_ADVANTAGE_CLASS_PATH = "orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn"
INDEX_ADVANTAGE_CLASS_PATH = "orchestrator.trinity.advantage.gigpo_index.DsoGiGPOIndexAdvantageFn"
GRPO_ADVANTAGE_CLASS_PATH = "orchestrator.trinity.advantage.grpo.DsoGRPOAdvantageFn"
WORKFLOW_NAME = "dso_frozenlake_steps"
"""Registered name of the step-wise FrozenLake workflow (one experience per environment step)."""
WORKFLOW_CLASS_PATH = "orchestrator.trinity.workflow.DsoFrozenLakeStepsWorkflow"


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


